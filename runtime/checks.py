"""Load-time checks: what bundle.json states must be what the graphs and tokenizers state.

A bundle.json that disagrees with its own files translates garbage (a wrong end id), fluent
garbage (source and target tokenizers exchanged) or fails at the first step with a raw
onnxruntime error (a wrong head count). Each check here turns that into a BundleError at load
that names the field, both values and the fix.
"""

from __future__ import annotations

import hashlib

from .bundle import (
    DTYPES,
    LOG_PROBS,
    SRC_IDS,
    ROW_POSITION,
    STEP,
    TOP_K,
    Bundle,
    BundleError,
    past_key,
    past_names,
    past_value,
)
from .onnx_info import GraphInfo, GraphReadError, read_graph_info
from .spec import SPEC
from .vocab import all_pieces
from .weights import check_references

# onnxruntime's type strings for the element types bundle.json names
_ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(bool)": "bool",
}
_FIX = "re-export the bundle with `seq2onnx export` (its bundle.json does not describe these files)"


def _mismatch(bundle: Bundle, field: str, stated, found, where: str) -> BundleError:
    return BundleError(
        f"{bundle.path / 'bundle.json'}: {field}={stated!r}, but {where} has {found!r}; {_FIX}, "
        f"or set {field} to {found!r} if only bundle.json is wrong"
    )


def tokenizer_fingerprint(processor) -> dict:
    """Fingerprints a SentencePiece processor's vocabulary.

    What bundle.json's optional `tokenizers` field records per side, so that a tokenizer file
    exchanged for another with the same size is caught even when its sha256 in `files` was rewritten.

    Args:
        processor (sentencepiece.SentencePieceProcessor): the tokenizer.

    Returns:
        {"pieces": vocabulary size, "pieces_sha256": hash of the pieces in id order}.
    """
    pieces = "\n".join(all_pieces(processor))
    return {
        "pieces": processor.get_piece_size(),
        "pieces_sha256": hashlib.sha256(pieces.encode("utf-8")).hexdigest(),
    }


def check_tokenizers(bundle: Bundle, source, target, vocabulary=None) -> None:
    """Checks vocabulary sizes, special ids and (when recorded) fingerprints of both SentencePiece models.

    A side with a vocabulary map (an imported model: runtime/vocab.py) has its own ids: its size
    and special ids are the map's business (read_map checks its length and range) and are not
    compared with the SentencePiece model's.

    Args:
        bundle: the bundle read.
        source (sentencepiece.SentencePieceProcessor): its source tokenizer.
        target (sentencepiece.SentencePieceProcessor): its target tokenizer.
        vocabulary (runtime.vocab.Vocabulary | None): the bundle's maps.

    Raises:
        BundleError: naming the file, both values and the fix; two exchanged tokenizers are named as such.
    """
    fingerprints = bundle.meta.get("tokenizers")
    sides = (
        ("source", source, "src_vocab_size", "source_tokenizer"),
        ("target", target, "tgt_vocab_size", "target_tokenizer"),
    )
    have = {}
    if fingerprints:
        have["source"] = tokenizer_fingerprint(source)
        have["target"] = have["source"] if target is source else tokenizer_fingerprint(target)

    def wrong_vocabulary(side: str, key: str, is_other: bool = False, exchanged: bool = False) -> BundleError:
        other = "target" if side == "source" else "source"
        if exchanged:
            what = f"; it is the {other} tokenizer: the two .model files are exchanged"
        elif is_other:
            same = bundle.file(other + "_tokenizer").name
            what = f"; it is the {other} tokenizer (the same vocabulary as {same})"
        else:
            what = ""
        return BundleError(
            f"{bundle.file(key)}: its vocabulary is not the {side} vocabulary the model was exported with "
            f"(tokenizers.{side}.pieces_sha256 in bundle.json){what}; {_FIX}"
        )

    # A tokenizer that is the other side's first: named as such (exchanged when both are) rather
    # than as a size or id mismatch. Any other wrong file is named by its size or special ids where
    # those differ, as the more telling fact.
    if have:
        own = {side: have[side]["pieces_sha256"] for side in have}
        want = {side: fingerprints[side]["pieces_sha256"] for side in ("source", "target")}
        for side, _, _, key in sides:
            other = "target" if side == "source" else "source"
            if own[side] == want[other] != want[side]:
                raise wrong_vocabulary(side, key, is_other=True, exchanged=own[other] == want[side])
    mapped = {
        "source": vocabulary is not None and vocabulary.source_map is not None,
        "target": vocabulary is not None and vocabulary.target_map is not None,
    }
    for side, proc, size_key, key in sides:
        if not mapped[side]:
            _check_sentencepiece(bundle, proc, size_key, key)
        if have and have[side]["pieces_sha256"] != fingerprints[side]["pieces_sha256"]:
            raise wrong_vocabulary(side, key)


def _check_sentencepiece(bundle: Bundle, proc, size_key: str, key: str) -> None:
    """One SentencePiece model's vocabulary size and special ids against bundle.json's.

    Args:
        bundle: the bundle read.
        proc (sentencepiece.SentencePieceProcessor): the tokenizer.
        size_key: its vocabulary size's field in model (src_vocab_size or tgt_vocab_size).
        key: its file's key in files (source_tokenizer or target_tokenizer).

    Raises:
        BundleError: naming the field, both values and the file.
    """
    model, ids = bundle.model, bundle.special_ids
    where = f"{bundle.file(key).name} (get_piece_size())"
    if proc.get_piece_size() != model[size_key]:
        raise _mismatch(bundle, f"model.{size_key}", model[size_key], proc.get_piece_size(), where)
    for name, own in (
        ("pad", proc.pad_id()),
        ("unk", proc.unk_id()),
        ("bos", proc.bos_id()),
        ("eos", proc.eos_id()),
    ):
        if own != ids[name]:
            raise _mismatch(
                bundle, f"special_ids.{name}", ids[name], own, f"{bundle.file(key).name} ({name}_id())"
            )


def _shape_of(arg) -> list:
    return [d if isinstance(d, int) else str(d) for d in arg.shape]


def read_graphs(bundle: Bundle) -> dict[str, GraphInfo]:
    """Parses every graph bundle.json lists from the bytes read (whichever decoder will be driven).

    Args:
        bundle: the bundle read, with its files' bytes.

    Returns:
        File key -> the graph's constant shapes and nodes.

    Raises:
        BundleError: a graph file that is not a readable ONNX model (damaged or replaced), naming it, or one
            whose external data does not point into the bundle's weights file as the spec says.
    """
    check_scheme(bundle, _onnxruntime_version())
    graphs = {}
    for label in bundle.meta["graphs"]:
        try:
            graphs[label] = read_graph_info(bundle.bytes(label))
        except GraphReadError as e:
            raise BundleError(
                f"{bundle.file(label)}: not a readable ONNX graph ({e}); the file is damaged or was "
                f"replaced (files.{label}): re-export the bundle"
            ) from e
        check_references(bundle.file(label), graphs[label], bundle.weights)  # before onnxruntime follows them
    return graphs


def _onnxruntime_version() -> str:
    import onnxruntime  # here: the checks above run without it (tests of bundle.json alone)

    return onnxruntime.__version__


def _release(version: str) -> tuple[int, ...]:
    """(1, 32, 0) of "1.32.0", "1.32.0.dev20260101" or "1.32.0+cu12": the leading numbers."""
    numbers = []
    for part in version.split("+")[0].split("."):
        if not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers)


def check_scheme(bundle: Bundle, onnxruntime_version: str) -> None:
    """Refuses, by name, a quantization scheme this runtime does not know or its onnxruntime cannot run.

    spec/bundle.json's `quantization_schemes` lists each scheme's operators and the oldest onnxruntime it
    was run with; a bundle without `quantization_scheme` (fp32, float16, older int8) passes.

    Args:
        bundle: the bundle read.
        onnxruntime_version: this host's onnxruntime version ("1.32.0").

    Raises:
        BundleError: naming the scheme, what it needs, what this host has and the fix.
    """
    scheme = bundle.meta.get("quantization_scheme")
    if not scheme:
        return
    known = {k: v for k, v in SPEC["quantization_schemes"].items() if not k.startswith("$")}
    name = scheme.get("name") if isinstance(scheme, dict) else scheme
    where = bundle.path / "bundle.json"
    if name not in known:
        raise BundleError(
            f"{where}: quantization_scheme.name={name!r} is not a scheme this runtime runs "
            f"({', '.join(known)}); "
            "upgrade seq2onnx, or re-export the bundle with `seq2onnx export --quantize int8`"
        )
    need = known[name]["onnxruntime"]
    if _release(onnxruntime_version) < _release(need):
        operators = ", ".join(known[name]["operators"]) or "its int8 operators"
        raise BundleError(
            f"{where}: quantization scheme {name!r} ({operators}) needs onnxruntime >= {need}, and this host "
            f"has onnxruntime {onnxruntime_version}; upgrade onnxruntime, or re-export the bundle with "
            "`seq2onnx export --quantize int8`"
        )


def check_graphs(bundle: Bundle, sessions: dict, graphs: dict[str, GraphInfo]) -> None:
    """Checks the loaded graphs against bundle.json.

    Every loaded graph's inputs and outputs are bundle.json's (names, element types, fixed sizes),
    and the model's sizes are the graphs': layers (cache inputs), heads and head size (their fixed
    dims), dtype, target vocabulary (log_probs), source vocabulary (the encoder's embedding) and
    max_positions (each decoder's positional table).

    Args:
        bundle: the bundle read.
        sessions: file key ("encoder", "decoder", "decoder_fused") -> its onnxruntime session, for every
            graph loaded (the encoder and both decoders where the fused one runs here).
        graphs: read_graphs(bundle).

    Raises:
        BundleError: naming the field, the value stated, the value found and the fix.
    """
    for label, session in sessions.items():
        _check_signature(bundle, label, session)
    for label in sessions:
        if label != "encoder":
            _check_decoder(bundle, label, sessions[label])
            _check_tables(bundle, graphs, label)


def _check_signature(bundle: Bundle, label: str, session) -> None:
    not_loaded = isinstance(session, GraphInfo)  # checked from its file: loaded (and checked again) later
    spec = bundle.meta["graphs"][label]
    path = bundle.file(label)
    have = ({i.name: i for i in session.get_inputs()}, {o.name: o for o in session.get_outputs()})
    want = ({i["name"]: i for i in spec["inputs"]}, {o["name"]: o for o in spec["outputs"]})
    if set(have[0]) != set(want[0]) or set(have[1]) != set(want[1]):
        raise BundleError(
            f"{path}: its inputs/outputs {(sorted(have[0]), sorted(have[1]))} differ from bundle.json's "
            f"{(sorted(want[0]), sorted(want[1]))}; {_FIX}"
        )
    for side, kind in ((0, "inputs"), (1, "outputs")):
        for name, item in want[side].items():
            arg = have[side][name]
            dtype = _ORT_TYPES.get(arg.type, arg.type)
            if dtype != item["dtype"]:
                raise _mismatch(
                    bundle, f"graphs.{label}.{kind}[{name}].dtype", item["dtype"], dtype, f"{path.name}"
                )
            shape = _shape_of(arg)
            fixed = [(i, d) for i, d in enumerate(item["shape"]) if isinstance(d, int)]
            if not_loaded and side == 1:  # a file may name an output's size that onnxruntime infers at load
                fixed = [(i, d) for i, d in fixed if i >= len(shape) or isinstance(shape[i], int)]
            if len(shape) != len(item["shape"]) or any(shape[i] != d for i, d in fixed):
                raise _mismatch(
                    bundle, f"graphs.{label}.{kind}[{name}].shape", item["shape"], shape, path.name
                )


def _check_decoder(bundle: Bundle, dec_label: str, decoder) -> None:
    """The model's sizes against one decoder graph's cache inputs and log_probs."""
    model = bundle.model
    dec_file = bundle.file(dec_label)
    dec_inputs = {i.name: i for i in decoder.get_inputs()}
    n_layers = model["n_decoder_layers"]
    prefixes = (past_key(0).removesuffix("0"), past_value(0).removesuffix("0"))  # the spec's per-layer names
    cache_inputs = sum(1 for n in dec_inputs if n.startswith(prefixes))
    if cache_inputs != 2 * n_layers or not all(n in dec_inputs for n in past_names(n_layers)):
        raise _mismatch(
            bundle,
            "model.n_decoder_layers",
            n_layers,
            cache_inputs // 2,
            f"{dec_file.name} (its {prefixes[0]}*/{prefixes[1]}* inputs, layers)",
        )
    cache = _shape_of(dec_inputs[past_key(0)])
    where = f"{dec_file.name} (input {past_key(0)} of shape {cache})"
    head_dim = model.get("d_kv") or model["d_model"] // model["n_heads"]  # d_kv: T5's head size of its own
    if len(cache) != 4 or cache[1] != model["n_heads"]:
        raise _mismatch(
            bundle, "model.n_heads", model["n_heads"], cache[1] if len(cache) == 4 else cache, where
        )
    if cache[3] != head_dim:
        raise _mismatch(
            bundle,
            "model.d_model",
            model["d_model"],
            cache[3] * model["n_heads"],
            where + f": head size {cache[3]} x {model['n_heads']} heads",
        )
    cache_type = _ORT_TYPES.get(dec_inputs[past_key(0)].type, dec_inputs[past_key(0)].type)
    if cache_type not in DTYPES or cache_type != bundle.dtype:
        raise _mismatch(bundle, "dtype", bundle.dtype, cache_type, where)
    log_probs = _shape_of({o.name: o for o in decoder.get_outputs()}[LOG_PROBS])
    if log_probs[-1] != model["tgt_vocab_size"] and not (
        isinstance(decoder, GraphInfo) and isinstance(log_probs[-1], str)
    ):
        raise _mismatch(
            bundle,
            "model.tgt_vocab_size",
            model["tgt_vocab_size"],
            log_probs[-1],
            f"{dec_file.name} (output {LOG_PROBS} of shape {log_probs})",
        )
    if TOP_K not in dec_inputs:
        raise BundleError(f"{dec_file}: no {TOP_K} input; {_FIX}")


def _packed_tables(scheme) -> tuple[str, int] | None:
    """(lookup operator, bits) of a scheme whose tables' codes are packed (export/quantize_nbits.py): the
    lookup bundle.json names, where it is one of the spec's operators for that scheme; else None."""
    tables = scheme.get("tables") if isinstance(scheme, dict) else None
    known = SPEC["quantization_schemes"].get(scheme.get("name")) if isinstance(scheme, dict) else None
    if not isinstance(tables, dict) or not isinstance(known, dict):
        return None
    if tables.get("lookup") not in known["operators"]:
        return None
    bits = tables.get("bits")
    sound = isinstance(bits, int) and not isinstance(bits, bool) and bits > 0
    return (tables["lookup"], bits) if sound else None


def _check_tables(bundle: Bundle, graphs: dict[str, GraphInfo], dec_label: str) -> None:
    """The source embedding's rows and the positional table's rows, read from the graph files."""
    model = bundle.model
    packed = _packed_tables(bundle.meta.get("quantization_scheme"))
    tables = [
        (bundle.file("encoder").name, graphs["encoder"], SRC_IDS, "model.src_vocab_size", "source embedding"),
        (bundle.file(dec_label).name, graphs[dec_label], STEP, "model.max_positions", "positional table"),
    ][: 1 if model.get("relative_buckets") else 2]  # T5 has no positional table (a relative bias instead)
    for name, info, indices, field, what in tables:
        # the fused decoder's table is looked up at each row's own position (older fused graphs: at step)
        found = [shape for idx, shape in info.gather_tables(packed) if idx in (indices, ROW_POSITION)]
        # an int8 table is looked up twice, its codes and its row scales (rows, 1) (export/quantize.py)
        if len(found) > 1:
            found = [shape for shape in found if list(shape[1:]) != [1]]
        if len(found) != 1 or len(found[0]) != 2:
            raise BundleError(f"{bundle.path / name}: no {what} (a Gather of {indices}) found; {_FIX}")
        rows, width = found[0]
        stated = model[field.split(".")[1]]
        if rows != stated:
            raise _mismatch(bundle, field, stated, rows, f"{name} ({what} of shape [{rows}, {width}])")
        if width != model["d_model"]:
            raise _mismatch(
                bundle,
                "model.d_model",
                model["d_model"],
                width,
                f"{name} ({what} of shape [{rows}, {width}])",
            )
