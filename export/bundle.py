"""Checkpoint -> bundle directory: the two graphs, the tokenizers and bundle.json, written atomically."""

from __future__ import annotations

import gc
import json
import platform
import shutil
from importlib import metadata
from pathlib import Path

import sentencepiece as spm
import torch

from seq2onnx.model import checkpoint
from seq2onnx.model.tokenizer import SOURCE_MODEL, TARGET_MODEL
from seq2onnx.runtime import bundle as fmt
from seq2onnx import atomic
from seq2onnx.runtime.checks import tokenizer_fingerprint
from seq2onnx.runtime.signature import graph_signature

from .fused import export_fused_decoder, graph_domains
from .graphs import OPSET, export_graphs
from .quantize_files import quantize_graphs
from .quantize_nbits import ACTIVATIONS, quantize_graphs_nbits
from .weights import STAGING_FILE, TensorWriter, check_stored_graph, store_weights

DECODERS = ("both", "standard")  # export_bundle's `decoder`: which decoder graphs a bundle gets
DECODING_DEFAULTS = {
    "beam_size": 4,
    "length_penalty": 1.0,
    "max_length_a": 1.5,
    "max_length_b": 10,
    "min_length": 0,
}
# What `verify` holds each kind of bundle to. fp32 is held to 1e-4 on log-probabilities (we aim for
# 1e-5); reduced precision is judged by its own bounds plus agreement with the fp32 model.
TOLERANCES = {
    "float32": {"tensor_atol": 1e-4, "min_greedy_agreement": 1.0, "max_bleu_drop": 0.0},
    "float16": {"tensor_atol": 5e-2, "min_greedy_agreement": 0.9, "max_bleu_drop": 2.0},
    "int8": {"tensor_atol": 1.0, "min_greedy_agreement": 0.8, "max_bleu_drop": 5.0},
    # int4 (export/quantize_nbits.py): held to agreement and BLEU, as int8 is; its log-probs move more
    "int4": {"tensor_atol": 2.0, "min_greedy_agreement": 0.6, "max_bleu_drop": 5.0},
}
QUANTIZATIONS = ("int8", "int4")


class ExportError(ValueError):
    """An export that cannot be done: the message names the problem and the fix."""


def _is_bundle(path: Path) -> bool:
    """A bundle directory (written before outputs were marked: atomic.MARKER)."""
    try:
        return json.loads((path / fmt.BUNDLE_JSON).read_text(encoding="utf-8")).get("format") == fmt.FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def building(out: Path, force: bool, what: str, ckpt: str | Path):
    """atomic.building with ExportError: the locked temporary directory an export writes into.

    Refuses an output that overlaps the checkpoint (or its run), and `--force` over a directory
    that is neither empty nor an export's (a bundle or a model directory seq2onnx wrote).

    Args:
        out: the directory to write.
        force: replace an existing `out`.
        what: what is written, for messages ("bundle", ...).
        ckpt: the checkpoint read, which the output may not overlap.

    Returns:
        A context manager yielding the temporary directory.

    Raises:
        ExportError: as atomic.building raises its `error`.
    """
    return atomic.building(
        out, force, what, error=ExportError, inputs={"the checkpoint": ckpt}, ours=_is_bundle
    )


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def variant(dtype: str, quantize: str | None) -> str:
    """Returns the bundle's variant, the key of TOLERANCES: the quantization when quantized, else the dtype.

    Args:
        dtype: "float32" or "float16".
        quantize: "int8", "int4" or None.
    """
    return quantize if quantize in QUANTIZATIONS else dtype


def export_bundle(
    ckpt: str | Path,
    out: str | Path,
    *,
    dtype: str = "float32",
    quantize: str | None = None,
    force: bool = False,
    decoder: str = "both",
    table_bits: int | None = None,
    block_size: int | None = None,
    activations: str | None = None,
) -> Path:
    """Exports a checkpoint (a step-* directory or a run directory's `last`) into the bundle `out`.

    The bundle is validated (hashes, graph loading, one decoding step) before it is moved into place.
    The whole export holds a lock beside `out`, so of two exports to one place started together
    exactly one succeeds, with or without force; the other raises ExportError.

    Args:
        ckpt: the checkpoint (or run) directory.
        out: the bundle directory to write.
        dtype: "float32", or "float16", which keeps LayerNorm, softmax and log-softmax in fp32 (for CUDA).
        quantize: "int8" rewrites the fp32 graphs' linear layers with per-row activation scales and
            per-channel weights (export/quantize.py: for the CPU, and batch-invariant); "int4": each linear
            layer one MatMulNBits node with 4-bit block-wise weights, the tables 8-bit through
            GatherBlockQuantized (export/quantize_nbits.py; every graph then needs com.microsoft kernels);
            None: none.
        force: replace an existing `out` (only an empty directory or an export's).
        decoder: "both" writes the standard-opset decoder.onnx and, for fp32 and int8 bundles (the
            contrib attention kernels are fp32-only on the CPU), decoder_fused.onnx (docs/fused-decoder.md);
            "standard" writes decoder.onnx alone, for hosts without onnxruntime's com.microsoft operators.
        table_bits: with "int4", the tables' bits, 8 (None: the default) or 4.
        block_size: with "int4", values per block of weights: 16, 32 (None: the default), 64 or 128.
        activations: with "int4", "int8" (None: the default; MatMulNBits' accuracy level 4) or "float32"
            (level 0: onnxruntime-web's arithmetic, on every host).

    Returns:
        The bundle directory, `out`.

    Raises:
        ExportError: an unknown dtype, quantization or decoder, int8 from float16, an existing output
            without force, an output another export is writing, or an unwritable location.
        CheckpointError: a bad checkpoint.
    """
    fused = check_options(dtype, quantize, decoder, table_bits, block_size, activations)
    out = Path(out)
    with building(out, force, "bundle", ckpt) as tmp:
        model, _, ckpt_dir = checkpoint.load(ckpt)
        cfg, owner = model.cfg, [model]
        del model  # write_graphs_owned lets it go once its graphs are staged
        scheme = write_graphs_owned(owner, tmp, dtype, quantize, fused, table_bits, block_size, activations)
        shutil.copyfile(ckpt_dir / SOURCE_MODEL, tmp / fmt.SOURCE_SPM)
        shutil.copyfile(ckpt_dir / TARGET_MODEL, tmp / fmt.TARGET_SPM)
        write_meta(tmp, cfg, source=ckpt_dir.name, dtype=dtype, quantize=quantize, fused=fused, scheme=scheme)
        validate(tmp)
    return out


def check_options(
    dtype: str,
    quantize: str | None,
    decoder: str,
    table_bits: int | None = None,
    block_size: int | None = None,
    activations: str | None = None,
) -> bool:
    """Checks export options; returns whether the fused decoder is written.

    Raises:
        ExportError: an unknown dtype, quantization or decoder, int8 from float16, or table bits other than
            8 or 4, a block size other than 16, 32, 64 or 128, or activations other than int8 or float32, or
            one of those three without int4.
    """
    if activations is not None and (quantize != "int4" or activations not in ACTIVATIONS):
        raise ExportError(
            f"--activations {activations}: give {' or '.join(ACTIVATIONS)}, with --quantize int4 (the int8 "
            "bundle's activations are int8 per row)"
        )
    if block_size is not None and (quantize != "int4" or block_size not in (16, 32, 64, 128)):
        raise ExportError(f"--block-size {block_size}: give 16, 32, 64 or 128, with --quantize int4")
    if table_bits is not None and (quantize != "int4" or table_bits not in (8, 4)):
        raise ExportError(
            f"--table-bits {table_bits}: give 8 or 4, with --quantize int4 (the int8 bundle's "
            "tables are int8 per row)"
        )
    if dtype not in ("float32", "float16"):
        raise ExportError(f"--dtype {dtype}: choose float32 or float16")
    if quantize not in (None, *QUANTIZATIONS):
        raise ExportError(f"--quantize {quantize}: choose one of {', '.join(QUANTIZATIONS)}")
    if quantize and dtype != "float32":
        raise ExportError(f"--quantize {quantize} starts from float32 graphs; drop --dtype float16")
    if decoder not in DECODERS:
        raise ExportError(f"--decoder {decoder}: choose {' or '.join(DECODERS)}")
    # int8 quantizes the fused graph's GEMMs, not its attention
    return decoder == "both" and dtype == "float32"


def write_graphs(model, directory: Path, dtype: str, quantize: str | None, fused: bool) -> dict | None:
    """Writes the encoder, the decoder step and (when fused) the fused decoder, quantized when asked, their
    large initializers in one weights file, each distinct tensor once (export/weights.py).

    The caller keeps `model`; write_graphs_owned lets it go as soon as its graphs are staged.

    Returns:
        The quantization scheme (export/quantize.py), or None.
    """
    return write_graphs_owned([model], directory, dtype, quantize, fused)


def _graph_files(fused: bool) -> dict[str, str]:
    graphs = {**fmt.FILE_KEYS, **(fmt.OPTIONAL_GRAPH_KEYS if fused else {})}
    return {k: v for k, v in graphs.items() if v.endswith(".onnx")}


def write_graphs_owned(
    owner: list,
    directory: Path,
    dtype: str,
    quantize: str | None,
    fused: bool,
    table_bits: int | None = None,
    block_size: int | None = None,
    activations: str | None = None,
) -> dict | None:
    """write_graphs, taking the model out of `owner` (a one-item list holding the caller's only reference):
    the model is let go once its graphs are staged, so that the int8 rewrite and the store run without it
    (at OPUS-MT size its 296 MB were the int8 export's peak, beside the table being quantized).

    Streamed: each tensor goes to a staging file as it is made (no graph is held with its weights, so any
    size past protobuf's 2 GiB is fine), then the tensors the graphs use are copied into the weights file
    and the staging file is removed.

    Returns:
        The quantization scheme (export/quantize.py), or None.
    """
    graphs = _graph_files(fused)
    scheme = None
    with TensorWriter(directory / STAGING_FILE) as writer:
        model = owner.pop()
        export_graphs(
            model, directory, dtype=torch.float16 if dtype == "float16" else torch.float32, writer=writer
        )
        if fused:
            export_fused_decoder(model, directory, writer)
        del model  # the staged graphs hold its tensors from here on
        gc.collect()
        if quantize == "int8":
            scheme = quantize_graphs(
                directory, graphs, contrib_labels=tuple(fmt.OPTIONAL_GRAPH_KEYS), writer=writer
            )
        elif quantize == "int4":
            block = {"block": block_size} if block_size else {}  # else export/quantize_nbits.py's BLOCK
            level = ACTIVATIONS[activations or "int8"]
            scheme = quantize_graphs_nbits(
                directory, graphs, bits=4, table_bits=table_bits or 8, writer=writer, level=level, **block
            )
    store_graphs(directory, fused)
    return scheme


def store_graphs(directory: Path, fused: bool) -> None:
    """Copies the tensors the staged graphs use into the weights file, each distinct one once, removes the
    staging file, and checks each graph again from its file with its external data."""
    graphs = _graph_files(fused)
    # the fused decoder first: its stacked QKV weights are stored whole, the standard decoder's Q, K, V
    # as their parts
    store_weights(directory, sorted(graphs.values(), key=lambda name: name != fmt.FUSED_DECODER_FILE))
    for name in graphs.values():
        check_stored_graph(directory / name)


def write_meta(
    directory: Path,
    cfg,
    *,
    source: str,
    dtype: str,
    quantize: str | None,
    fused: bool,
    scheme: dict | None = None,
    decoding: dict | None = None,
    extra: dict | None = None,
) -> None:
    """Writes bundle.json (and config.json, for humans) for the files in `directory`.

    Args:
        directory: the bundle being written; the vocabulary maps are listed when present.
        cfg: the exported Transformer's ModelConfig.
        source: what it was exported from (bundle.json's source_checkpoint).
        dtype, quantize, fused, scheme: as exported.
        decoding: the decoding defaults (DECODING_DEFAULTS when None).
        extra: more top-level fields (an imported model's tokens and origin).
    """
    keys, files = _file_entries(directory, fused)
    graphs = _graph_entries(directory, cfg, dtype, fused, keys)
    meta = {
        "format": fmt.FORMAT,
        "format_version": fmt.FORMAT_VERSION,
        "model": cfg.to_dict(),
        "special_ids": {
            "pad": cfg.pad_id,
            "unk": cfg.unk_id,
            "bos": cfg.bos_id,
            "eos": cfg.eos_id,
            "decoder_start": cfg.decoder_start_id,
        },
        "max_positions": cfg.max_positions,
        "dtype": dtype,
        "quantization": quantize,
        # export/quantize.py's SCHEME and the layers per graph; None unquantized
        "quantization_scheme": scheme,
        "variant": variant(dtype, quantize),
        "tolerances": TOLERANCES[variant(dtype, quantize)],
        "files": files,
        "tokenizers": {
            side: tokenizer_fingerprint(spm.SentencePieceProcessor(model_file=str(directory / path)))
            for side, path in (("source", fmt.SOURCE_SPM), ("target", fmt.TARGET_SPM))
        },
        "graphs": graphs,
        "decoding": DECODING_DEFAULTS if decoding is None else decoding,
        "source_checkpoint": source,
        "producer": _producer(),
    }
    meta.update(extra or {})
    (directory / fmt.BUNDLE_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    cfg.save(directory / "config.json")  # the same config, beside the graphs, for humans


def _file_entries(directory: Path, fused: bool) -> tuple[dict[str, str], dict[str, dict]]:
    """bundle.json's files: {key: path} of the bundle's files (the optional ones present), and each one's
    entry (path, sha256, size; the weights' checksum)."""
    keys = {**fmt.FILE_KEYS, **(fmt.OPTIONAL_GRAPH_KEYS if fused else {})}
    keys.update(
        {
            k: v
            for k, v in fmt.OPTIONAL_FILE_KEYS.items()
            if k not in fmt.OPTIONAL_GRAPH_KEYS and (directory / v).is_file()
        }
    )
    files = {
        key: {
            "path": path,
            "sha256": fmt.sha256(directory / path),
            fmt.SIZE_FIELD: (directory / path).stat().st_size,
        }
        for key, path in keys.items()
    }
    if "weights" in files:  # the load's check (spec's weights.checksum): cheaper than sha256 on every CPU
        files["weights"][fmt.WEIGHTS_CHECKSUM] = fmt.file_crc32(directory / files["weights"]["path"])
    return keys, files


def _graph_entries(directory: Path, cfg, dtype: str, fused: bool, keys: dict[str, str]) -> dict:
    """bundle.json's graphs: each graph's signature, with the operator domains read from its file."""
    import onnx

    graphs = graph_signature(
        cfg.n_decoder_layers, cfg.n_heads, cfg.head_dim, dtype, cfg.tgt_vocab_size, fused=fused
    )
    for label, graph in graphs.items():  # what a host's runtime must be able to run, read from the files
        graph["domains"] = graph_domains(onnx.load(str(directory / keys[label]), load_external_data=False))
    return graphs


def _producer() -> dict:
    """bundle.json's producer: the versions that made the bundle."""
    return {
        "seq2onnx": _version("seq2onnx"),
        "torch": torch.__version__,
        "onnx": _version("onnx"),
        "onnxruntime": _version("onnxruntime-gpu") or _version("onnxruntime"),
        "opset": OPSET,
        "python": platform.python_version(),
    }


def validate(directory: Path) -> None:
    """The bundle reads, its graphs load on the CPU, and one short decode runs on each decoder.

    A fused decoder this onnxruntime cannot run is an error here (the exporter's onnxruntime is
    the one that built it), not the silent fallback a host gets."""
    from seq2onnx.runtime.session_tuning import SessionTuning
    from seq2onnx.runtime.translator import Translator

    bundle = fmt.read_bundle(directory)  # read once; each Translator loads from these bytes
    for variant_ in bundle.decoder_variants:
        # unpacked: a packed copy of every weight would be the export's peak (optimisation-notes row 44)
        translator = Translator(bundle, device="cpu", _tuning=SessionTuning(decoder=variant_, prepack=False))
        translator.translate_batch([[4, 5, 6]], beam_size=2, max_decoding_length=3)
        del translator  # one set of sessions at a time: a large model's sessions hold gigabytes
