"""The bundle format, owned here: graph names, bundle.json, and its validation.

A bundle is a directory that a host in any language can drive from bundle.json alone:
encoder.onnx, decoder.onnx, the SentencePiece models and bundle.json (docs/bundle-format.md).
Every graph input and output name is defined in this module and nowhere else.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

FORMAT = "seq2onnx-bundle"
FORMAT_VERSION = 1
BUNDLE_JSON = "bundle.json"
ENCODER_FILE, DECODER_FILE = "encoder.onnx", "decoder.onnx"
SOURCE_SPM, TARGET_SPM = "source.spm.model", "target.spm.model"
FILE_KEYS = {"encoder": ENCODER_FILE, "decoder": DECODER_FILE,
             "source_tokenizer": SOURCE_SPM, "target_tokenizer": TARGET_SPM}

# Encoder graph: source ids and lengths -> the source mask and every layer's cross keys/values.
SRC_IDS, SRC_LENGTHS, SRC_MASK = "src_ids", "src_lengths", "src_mask"
# Decoder step graph.
TOKENS, STEP, CACHE_INDICES, LOG_PROBS = "tokens", "step", "cache_indices", "log_probs"
# The k best log-probabilities of each row, best first (ties: lower token id first), so that a
# search can download [rows, k] instead of [rows, vocab]. `top_k` is an input: 1 <= k <= vocab.
TOP_K, TOPK_LOG_PROBS, TOPK_IDS = "top_k", "topk_log_probs", "topk_ids"


def key_cross(i: int) -> str:
    return f"key_cross_{i}"


def value_cross(i: int) -> str:
    return f"value_cross_{i}"


def past_key(i: int) -> str:
    return f"past_key_self_{i}"


def past_value(i: int) -> str:
    return f"past_value_self_{i}"


def present_key(i: int) -> str:
    return f"present_key_self_{i}"


def present_value(i: int) -> str:
    return f"present_value_self_{i}"


def cross_names(n_layers: int) -> list[str]:
    return [n for i in range(n_layers) for n in (key_cross(i), value_cross(i))]


def past_names(n_layers: int) -> list[str]:
    return [n for i in range(n_layers) for n in (past_key(i), past_value(i))]


def present_names(n_layers: int) -> list[str]:
    return [n for i in range(n_layers) for n in (present_key(i), present_value(i))]


def graph_signature(n_layers: int, n_heads: int, head_dim: int, dtype: str, vocab: int) -> dict:
    """Every input and output of both graphs: name, element type and shape (axes named)."""
    kv = lambda name, rows, length: {"name": name, "dtype": dtype, "shape": [rows, n_heads, length, head_dim]}
    return {
        "encoder": {
            "inputs": [
                {"name": SRC_IDS, "dtype": "int64", "shape": ["batch", "src_len"]},
                {"name": SRC_LENGTHS, "dtype": "int64", "shape": ["batch"]},
            ],
            "outputs": [{"name": SRC_MASK, "dtype": "bool", "shape": ["batch", "src_len"]}]
            + [kv(n, "batch", "src_len") for n in cross_names(n_layers)],
        },
        "decoder": {
            "inputs": [
                {"name": TOKENS, "dtype": "int64", "shape": ["rows", 1]},
                {"name": STEP, "dtype": "int64", "shape": [1]},
                {"name": CACHE_INDICES, "dtype": "int64", "shape": ["rows"]},
            ]
            + [kv(n, "prev_rows", "past") for n in past_names(n_layers)]
            + [kv(n, "batch", "src_len") for n in cross_names(n_layers)]
            + [{"name": SRC_MASK, "dtype": "bool", "shape": ["batch", "src_len"]},
               {"name": TOP_K, "dtype": "int64", "shape": [1]}],
            "outputs": [{"name": LOG_PROBS, "dtype": "float32", "shape": ["rows", vocab]}]
            + [kv(n, "rows", "past_plus_1") for n in present_names(n_layers)]
            + [{"name": TOPK_LOG_PROBS, "dtype": "float32", "shape": ["rows", "k"]},
               {"name": TOPK_IDS, "dtype": "int64", "shape": ["rows", "k"]}],
        },
    }


class BundleError(ValueError):
    """A bundle that is missing, damaged or of another format: the message names the file."""


@dataclass(frozen=True)
class Bundle:
    path: Path
    meta: dict  # bundle.json as read

    @property
    def model(self) -> dict:
        return self.meta["model"]

    @property
    def special_ids(self) -> dict:
        return self.meta["special_ids"]

    @property
    def decoding(self) -> dict:
        return self.meta["decoding"]

    @property
    def dtype(self) -> str:
        return self.meta["dtype"]

    def file(self, key: str) -> Path:
        return self.path / self.meta["files"][key]["path"]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_bundle(path: str | Path, *, check_hashes: bool = True) -> Bundle:
    """Reads and validates a bundle directory before anything is loaded from it.

    Raises BundleError naming the file and the problem: missing files, invalid JSON, another
    format or version, file names that leave the bundle, hashes that do not match.
    """
    path = Path(path)
    if not path.is_dir():
        raise BundleError(f"{path}: not a bundle directory (make one with `seq2onnx export CHECKPOINT {path}`)")
    meta_path = path / BUNDLE_JSON
    if not meta_path.is_file():
        raise BundleError(f"{meta_path}: missing; {path} is not a seq2onnx bundle")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise BundleError(f"{meta_path}: invalid JSON ({e}); re-export the bundle") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise BundleError(f"{meta_path}: not a {FORMAT} description (format={meta.get('format') if isinstance(meta, dict) else None!r})")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise BundleError(
            f"{meta_path}: format_version {version!r}, this runtime reads version {FORMAT_VERSION}; "
            "re-export the bundle with this seq2onnx or install the matching runtime"
        )
    for key in ("model", "special_ids", "decoding", "files", "graphs", "dtype"):
        if key not in meta:
            raise BundleError(f"{meta_path}: missing the field {key!r}; re-export the bundle")
    root = path.resolve()
    for key in FILE_KEYS:
        entry = meta["files"].get(key)
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise BundleError(f"{meta_path}: files.{key} is missing or has no path")
        target = (path / entry["path"]).resolve()
        if root not in target.parents:
            raise BundleError(f"{meta_path}: files.{key}.path {entry['path']!r} points outside the bundle; refusing it")
        if not target.is_file():
            raise BundleError(f"{target}: missing from the bundle (files.{key} in {BUNDLE_JSON})")
        if check_hashes and sha256(target) != entry.get("sha256"):
            raise BundleError(
                f"{target}: sha256 differs from bundle.json (files.{key}); the file is damaged or was "
                "replaced: re-export the bundle"
            )
    return Bundle(path=path, meta=meta)
