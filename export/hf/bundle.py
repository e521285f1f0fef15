"""`seq2onnx export MODEL_DIR OUT`: a Hugging Face Marian, M2M100/NLLB or mBART-50 directory -> a bundle.

The same graphs as our own exports (one encoder, one decoder step, the fused decoder where the CPU
runs it, int8 included), plus the vocabulary maps and the tokens section that let every host
tokenize to the model's ids (export/hf/tokens.py), and decoding defaults from generation_config.json.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from seq2onnx import atomic
from seq2onnx.export.bundle import (
    ExportError,
    _is_bundle,
    check_options,
    validate,
    write_graphs_owned,
    write_meta,
)
from seq2onnx.runtime import bundle as fmt

from .family import Family
from .read import HFImportError, import_hf, read_config
from .tokens import TokenFiles, load_tokenizer, token_files


def decoding_defaults(generation: dict, config: dict, max_positions: int) -> dict:
    """The decoding defaults every family shares (Family.decoding_defaults; a family may override them).

    Raises:
        HFImportError: as Family.decoding_defaults.
    """
    return Family().decoding_defaults(generation, config, max_positions)


def export_hf_bundle(
    model_dir: str | Path,
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
    """Exports a Hugging Face model directory into the bundle `out` (options as export_bundle's).

    Args:
        model_dir: a directory as save_pretrained writes it (config.json, weights, generation_config.json,
            tokenizer files) of a model_type that a family of export/hf/family_*.py reads.
        out: the bundle directory to write (atomically, validated before it is moved into place).
        dtype, quantize, force, decoder, table_bits, block_size, activations: as
            seq2onnx.export.bundle.export_bundle.

    Returns:
        The bundle directory.

    Raises:
        HFImportError: an unsupported or damaged model directory (one line: the file, the value, the fix);
            nothing is written.
        ExportError: bad options or output (as export_bundle).
    """
    fused = check_options(dtype, quantize, decoder, table_bits, block_size, activations)
    model_dir, out = Path(model_dir), Path(out)
    config = read_config(model_dir)  # before anything is written: an unsupported directory writes nothing
    tokenizer = load_tokenizer(model_dir)
    imported = import_hf(model_dir)
    model, cfg, kind, family = imported.model, imported.model.cfg, imported.kind, imported.family
    files = _token_files(model_dir, imported, tokenizer)
    if files.unk_id != cfg.unk_id:
        model.cfg = cfg = type(cfg)(**{**cfg.to_dict(), "unk_id": files.unk_id})
    decoding = family.decoding_defaults(imported.generation, config, cfg.max_positions)
    owner = [model]
    del imported, model  # write_graphs_owned lets it go once its graphs are staged
    with atomic.building(
        out, force, "bundle", error=ExportError, inputs={"the model directory": model_dir}, ours=_is_bundle
    ) as tmp:
        scheme = write_graphs_owned(owner, tmp, dtype, quantize, fused, table_bits, block_size, activations)
        _write_tokens(tmp, files)
        write_meta(
            tmp,
            cfg,
            source=model_dir.name,
            dtype=dtype,
            quantize=quantize,
            fused=fused,
            scheme=scheme,
            decoding=decoding,
            extra={"tokens": files.tokens, "imported_from": _origin(kind, config)},
        )
        validate(tmp)
    return out


def _token_files(model_dir: Path, imported, tokenizer) -> TokenFiles:
    """The vocabulary files and tokens section of the imported model (export/hf/tokens.py)."""
    cfg = imported.model.cfg
    return token_files(
        model_dir,
        imported.family,
        tokenizer,
        src_vocab=cfg.src_vocab_size,
        tgt_vocab=cfg.tgt_vocab_size,
        generation=imported.generation,
    )


def _write_tokens(tmp: Path, files: TokenFiles) -> None:
    """Writes the SentencePiece models, the vocabulary maps and the vocabulary texts into the bundle."""
    shutil.copyfile(files.source_spm, tmp / fmt.SOURCE_SPM)
    shutil.copyfile(files.target_spm, tmp / fmt.TARGET_SPM)
    (tmp / fmt.SOURCE_VOCAB).write_bytes(files.source_map.astype("<i4").tobytes())
    (tmp / fmt.TARGET_VOCAB).write_bytes(files.target_map.astype("<i4").tobytes())
    if files.texts:
        (tmp / fmt.VOCAB_TEXTS).write_text(
            json.dumps(files.texts, ensure_ascii=False, sort_keys=True), encoding="utf-8"
        )


def _origin(kind: str, config: dict) -> dict:
    """bundle.json's imported_from: the model type, architectures and the transformers settings read."""
    return {
        "model_type": kind,
        "architectures": config.get("architectures"),
        "transformers_config": {
            k: config.get(k)
            for k in ("activation_function", "scale_embedding", "max_position_embeddings", "d_model")
        },
    }


__all__ = ["HFImportError", "export_hf_bundle", "decoding_defaults"]
