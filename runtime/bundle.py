"""The bundle format, owned here: graph names, bundle.json, and its validation.

A bundle is a directory that a host in any language can drive from bundle.json alone:
encoder.onnx, decoder.onnx, the SentencePiece models and bundle.json (docs/bundle-format.md),
and optionally decoder_fused.onnx, the same step built from onnxruntime's `com.microsoft` contrib
kernels (docs/fused-decoder.md): a host that cannot run com.microsoft uses graphs.decoder.
Every graph input and output name is defined in this module and nowhere else.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

# The spec every host reads (spec/bundle.json, shipped inside the package): names and limits come
# from it and from nowhere else, so that a change there changes the Python and JavaScript hosts alike.
SPEC_PATH = Path(__file__).resolve().parents[1] / "spec" / "bundle.json"
SPEC = json.loads(SPEC_PATH.read_text(encoding="utf-8"))

FORMAT = SPEC["format"]
FORMAT_VERSION = SPEC["format_version"]
BUNDLE_JSON = SPEC["bundle_json"]
MAX_JSON_BYTES = SPEC["max_json_bytes"]  # a real bundle.json is ~10 kB: anything near this is not one
DTYPES = tuple(SPEC["dtypes"])  # the key/value element types a host can feed
FILE_KEYS = dict(SPEC["files"]["required"])
# Files a bundle may have: an fp32 export writes the fused decoder unless told `--decoder standard`.
OPTIONAL_FILE_KEYS = dict(SPEC["files"]["optional"])
ENCODER_FILE, DECODER_FILE = FILE_KEYS["encoder"], FILE_KEYS["decoder"]
SOURCE_SPM, TARGET_SPM = FILE_KEYS["source_tokenizer"], FILE_KEYS["target_tokenizer"]
FUSED_DECODER_FILE = OPTIONAL_FILE_KEYS["decoder_fused"]
# The decoder graphs by variant (bundle.json's graphs.<label>.variant), and the operator domain
# of onnxruntime's contrib kernels that only the fused one uses.
STANDARD, FUSED = "standard", "fused"
DECODER_LABELS = {variant: SPEC["decoders"][variant] for variant in (STANDARD, FUSED)}
MS_DOMAIN = SPEC["contrib_domain"]

_NAMES = SPEC["names"]
# Encoder graph: source ids and lengths -> the source mask and every layer's cross keys/values.
SRC_IDS, SRC_LENGTHS, SRC_MASK = _NAMES["src_ids"], _NAMES["src_lengths"], _NAMES["src_mask"]
# Decoder step graph.
TOKENS, STEP, CACHE_INDICES, LOG_PROBS = _NAMES["tokens"], _NAMES["step"], _NAMES["cache_indices"], _NAMES["log_probs"]
# The k best log-probabilities of each row, best first (ties: lower token id first), so that a
# search can download [rows, k] instead of [rows, vocab]. `top_k` is an input: 1 <= k <= vocab.
TOP_K, TOPK_LOG_PROBS, TOPK_IDS = _NAMES["top_k"], _NAMES["topk_log_probs"], _NAMES["topk_ids"]
# Standard decoder only: the last layer's cross-attention weights averaged over heads [rows,
# src_len] (CTranslate2's return_attention convention), for showing what each target piece
# attended to. Bundles exported before 0.3 lack it; the search never binds it.
CROSS_ATTENTION = _NAMES["cross_attention"]
# Fused decoder only: the beams per sentence W and, replacing cache_indices, the table
# [batch, W, max_length] naming for each beam and position the beam whose cache row holds it.
BEAM_WIDTH, CACHE_INDIRECTION = _NAMES["beam_width"], _NAMES["cache_indirection"]


def _layer_name(kind: str, i: int) -> str:
    return SPEC["layer_names"][kind].replace("{i}", str(i))


def key_cross(i: int) -> str:
    return _layer_name("key_cross", i)


def value_cross(i: int) -> str:
    return _layer_name("value_cross", i)


def past_key(i: int) -> str:
    return _layer_name("past_key", i)


def past_value(i: int) -> str:
    return _layer_name("past_value", i)


def present_key(i: int) -> str:
    return _layer_name("present_key", i)


def present_value(i: int) -> str:
    return _layer_name("present_value", i)


def cross_names(n_layers: int) -> list[str]:
    return [n for i in range(n_layers) for n in (key_cross(i), value_cross(i))]


def past_names(n_layers: int) -> list[str]:
    return [n for i in range(n_layers) for n in (past_key(i), past_value(i))]


def present_names(n_layers: int) -> list[str]:
    return [n for i in range(n_layers) for n in (present_key(i), present_value(i))]


def fused_signature(n_layers: int, n_heads: int, head_dim: int, vocab: int) -> dict:
    """Inputs and outputs of the fused decoder step (fp32 only): name, element type, shape with named axes.

    The cache inputs and outputs are one [rows, heads, max_length, head_dim] buffer per layer and
    kind, bound as both past_* and present_* (docs/fused-decoder.md)."""
    cache = lambda name: {"name": name, "dtype": "float32", "shape": ["rows", n_heads, "max_length", head_dim]}
    cross = lambda name: {"name": name, "dtype": "float32", "shape": ["batch", n_heads, "src_len", head_dim]}
    return {
        "inputs": [
            {"name": TOKENS, "dtype": "int64", "shape": ["rows", 1]},
            {"name": STEP, "dtype": "int32", "shape": [1]},
            {"name": BEAM_WIDTH, "dtype": "int32", "shape": [1]},
            {"name": CACHE_INDIRECTION, "dtype": "int32", "shape": ["batch", "beam", "max_length"]},
        ]
        + [cache(n) for n in past_names(n_layers)]
        + [cross(n) for n in cross_names(n_layers)]
        + [{"name": SRC_MASK, "dtype": "bool", "shape": ["batch", "src_len"]},
           {"name": TOP_K, "dtype": "int64", "shape": [1]}],
        "outputs": [{"name": LOG_PROBS, "dtype": "float32", "shape": ["rows", vocab]}]
        + [cache(n) for n in present_names(n_layers)]
        + [{"name": TOPK_LOG_PROBS, "dtype": "float32", "shape": ["rows", "k"]},
           {"name": TOPK_IDS, "dtype": "int64", "shape": ["rows", "k"]}],
    }


def graph_signature(n_layers: int, n_heads: int, head_dim: int, dtype: str, vocab: int, *, fused: bool = False) -> dict:
    """Every input and output of the graphs, with each decoder's variant: name, element type and
    shape (axes named). `fused` adds decoder_fused (export writes it for fp32 bundles). The
    operator domains of each graph are read from the files by the exporter, not stated here."""
    kv = lambda name, rows, length: {"name": name, "dtype": dtype, "shape": [rows, n_heads, length, head_dim]}
    graphs = {
        "encoder": {
            "inputs": [
                {"name": SRC_IDS, "dtype": "int64", "shape": ["batch", "src_len"]},
                {"name": SRC_LENGTHS, "dtype": "int64", "shape": ["batch"]},
            ],
            "outputs": [{"name": SRC_MASK, "dtype": "bool", "shape": ["batch", "src_len"]}]
            + [kv(n, "batch", "src_len") for n in cross_names(n_layers)],
            "variant": STANDARD,
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
            + [{"name": CROSS_ATTENTION, "dtype": "float32", "shape": ["rows", "src_len"]}]
            + [{"name": TOPK_LOG_PROBS, "dtype": "float32", "shape": ["rows", "k"]},
               {"name": TOPK_IDS, "dtype": "int64", "shape": ["rows", "k"]}],
            "variant": STANDARD,
        },
    }
    if fused:
        graphs[DECODER_LABELS[FUSED]] = {**fused_signature(n_layers, n_heads, head_dim, vocab), "variant": FUSED}
    return graphs


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

    @property
    def max_positions(self) -> int:
        return self.meta["model"]["max_positions"]

    def file(self, key: str) -> Path:
        return self.path / self.meta["files"][key]["path"]

    @property
    def decoder_variants(self) -> list[str]:
        """The decoder variants this bundle has: "standard" always, "fused" where it was exported."""
        return [v for v, label in DECODER_LABELS.items() if label in self.meta["files"]]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


_MISSING = object()  # a field that is absent, shown as `missing`


def _short(value) -> str:
    """A value for a message as JSON (as every host writes it), cut to 60 characters."""
    if value is _MISSING:
        return "missing"
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Schema:
    """Type and range checks of bundle.json's fields; each failure is one line naming the field."""

    def __init__(self, where: Path):
        self.where = where

    def fail(self, field: str, value, want: str):
        raise BundleError(f"{self.where}: {field} is {_short(value)}, {want}; re-export the bundle with "
                          "`seq2onnx export` (or correct the field)")

    def obj(self, parent: dict, key: str, field: str) -> dict:
        if key not in parent:
            raise BundleError(f"{self.where}: missing the field {field!r}; re-export the bundle with `seq2onnx export`")
        value = parent[key]
        if not isinstance(value, dict):
            self.fail(field, value, "expected an object")
        return value

    def integer(self, parent: dict, key: str, field: str, low: int = 0, required: bool = True) -> int | None:
        if key not in parent and not required:
            return None
        value = parent.get(key)
        if key not in parent or not isinstance(value, int) or isinstance(value, bool) or value < low:
            self.fail(field, value if key in parent else _MISSING, f"expected an integer >= {low}")
        return value

    def real(self, parent: dict, key: str, field: str, low: float | None = None) -> float:
        value = parent.get(key)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if key not in parent or not ok or (low is not None and value < low):
            self.fail(field, value if key in parent else _MISSING,
                      "expected a finite number" + (f" >= {low}" if low is not None else ""))
        return float(value)

    def text(self, parent: dict, key: str, field: str, choices: tuple | None = None) -> str:
        value = parent.get(key)
        if key not in parent or not isinstance(value, str) or (choices and value not in choices):
            self.fail(field, value if key in parent else _MISSING,
                      f"expected one of {', '.join(choices)}" if choices else "expected a string")
        return value


def _check_field(v: _Schema, meta: dict, spec: dict) -> None:
    """One row of the spec's `fields` table: the field's type, range or choices."""
    *parents, key = spec["field"].split(".")
    parent = meta
    for i, name in enumerate(parents):
        parent = v.obj(parent, name, ".".join(parents[: i + 1]))
    if key not in parent and not spec.get("required", True):
        return
    if spec.get("nullable") and parent.get(key) is None and key in parent:
        return
    kind = spec["type"]
    if kind == "integer":
        v.integer(parent, key, spec["field"], low=spec.get("min", 0))
    elif kind == "number":
        v.real(parent, key, spec["field"], low=spec.get("min"))
    elif kind == "string":
        choices = spec.get("choices")
        v.text(parent, key, spec["field"], tuple(SPEC[choices]) if isinstance(choices, str) else choices)
    else:  # a spec this runtime does not understand: refuse loudly rather than skip a check
        raise RuntimeError(f"{SPEC_PATH}: fields[{spec['field']}] has type {kind!r}; this runtime knows integer, number, string")


def validate_meta(meta: dict, where: Path) -> None:
    """Every field the runtime reads has its type and range, and the fields stated twice agree.

    The per-field checks are the spec's `fields` table (spec/bundle.json); the checks that
    relate fields to each other follow it.

    Args:
        meta: bundle.json as parsed.
        where: bundle.json's path, for messages.

    Raises:
        BundleError: naming the field, its value, what was expected and the fix.
    """
    v = _Schema(where)
    for spec in SPEC["fields"]:
        _check_field(v, meta, spec)
    model = meta["model"]
    sizes = {k: model[k] for k in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "n_decoder_layers",
                                   "max_positions")}
    if sizes["d_model"] % sizes["n_heads"]:
        v.fail("model.d_model", sizes["d_model"], f"expected a multiple of model.n_heads={sizes['n_heads']}")
    if meta["max_positions"] != sizes["max_positions"]:
        v.fail("max_positions", meta["max_positions"],
               f"expected model.max_positions={sizes['max_positions']} (the same value twice)")
    special = meta["special_ids"]
    for key in ("pad", "unk", "bos", "eos", "decoder_start"):
        value = special[key]
        vocab = sizes["tgt_vocab_size"] if key == "decoder_start" else min(sizes["src_vocab_size"], sizes["tgt_vocab_size"])
        if value >= vocab:
            v.fail(f"special_ids.{key}", value, f"expected an id inside the vocabulary [0, {vocab})")
        model_key = "decoder_start_id" if key == "decoder_start" else f"{key}_id"
        if model_key in model and model[model_key] != value:
            v.fail(f"special_ids.{key}", value, f"expected model.{model_key}={_short(model[model_key])} (the same id twice)")
    files = v.obj(meta, "files", "files")
    for key in [*FILE_KEYS, *(k for k in OPTIONAL_FILE_KEYS if k in files)]:
        entry = v.obj(files, key, f"files.{key}")
        v.text(entry, "path", f"files.{key}.path")
        v.text(entry, "sha256", f"files.{key}.sha256")
    graphs = v.obj(meta, "graphs", "graphs")
    labels = ["encoder", "decoder"]
    for key in OPTIONAL_FILE_KEYS:  # an optional graph is described exactly when its file is listed
        if (key in files) != (key in graphs):
            v.fail(f"graphs.{key}" if key in files else f"files.{key}", _MISSING,
                   f"expected because {'files' if key in files else 'graphs'}.{key} is present")
        if key in files:
            labels.append(key)
    for label in labels:
        graph = v.obj(graphs, label, f"graphs.{label}")
        if "variant" in graph:  # optional: bundles exported before the fused decoder lack it
            want = FUSED if label == DECODER_LABELS[FUSED] else STANDARD
            v.text(graph, "variant", f"graphs.{label}.variant", (want,))
        domains = graph.get("domains")
        if "domains" in graph and (not isinstance(domains, list) or not all(isinstance(d, str) for d in domains)):
            v.fail(f"graphs.{label}.domains", domains, "expected a list of operator domains (strings)")
        for side in ("inputs", "outputs"):
            items = graph.get(side)
            if not isinstance(items, list) or not items:
                v.fail(f"graphs.{label}.{side}", items if side in graph else _MISSING, "expected a non-empty list")
            for i, item in enumerate(items):
                field = f"graphs.{label}.{side}[{i}]"
                if not isinstance(item, dict):
                    v.fail(field, item, "expected an object")
                v.text(item, "name", f"{field}.name")
                v.text(item, "dtype", f"{field}.dtype")
                shape = item.get("shape")
                if not isinstance(shape, list) or not all(
                        isinstance(d, str) or (isinstance(d, int) and not isinstance(d, bool) and d >= 0) for d in shape):
                    v.fail(f"{field}.shape", shape, "expected a list of sizes (integers) and axis names (strings)")
    tokenizers = meta.get("tokenizers")
    if tokenizers is not None:  # optional: vocabulary fingerprints (runtime.checks.tokenizer_fingerprint)
        tokenizers = v.obj(meta, "tokenizers", "tokenizers")
        for side in ("source", "target"):
            entry = v.obj(tokenizers, side, f"tokenizers.{side}")
            v.integer(entry, "pieces", f"tokenizers.{side}.pieces", low=1)
            v.text(entry, "pieces_sha256", f"tokenizers.{side}.pieces_sha256")


def read_bundle(path: str | Path, *, check_hashes: bool = True) -> Bundle:
    """Reads and validates a bundle directory before anything is loaded from it.

    Raises BundleError naming the file and the problem: missing files, invalid or over-large
    JSON, another format or version, a field of the wrong type or range, file names that leave
    the bundle, hashes that do not match.
    """
    path = Path(path)
    if not path.is_dir():
        raise BundleError(f"{path}: not a bundle directory (make one with `seq2onnx export CHECKPOINT {path}`)")
    meta_path = path / BUNDLE_JSON
    if not meta_path.is_file():
        raise BundleError(f"{meta_path}: missing; {path} is not a seq2onnx bundle")
    size = meta_path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise BundleError(f"{meta_path}: {size} bytes, more than the {MAX_JSON_BYTES} a bundle description can be; "
                          "this is not a bundle.json made by `seq2onnx export`")
    try:
        with open(meta_path, "rb") as f:
            meta = json.loads(f.read(MAX_JSON_BYTES + 1).decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise BundleError(f"{meta_path}: invalid JSON ({e}); re-export the bundle") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise BundleError(f"{meta_path}: not a {FORMAT} description "
                          f"(format={_short(meta.get('format')) if isinstance(meta, dict) else None})")
    version = meta.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version != FORMAT_VERSION:
        raise BundleError(
            f"{meta_path}: format_version {_short(version)}, this runtime reads version {FORMAT_VERSION} (an integer); "
            "re-export the bundle with this seq2onnx or install the matching runtime"
        )
    validate_meta(meta, meta_path)
    root = path.resolve()
    for key in [*FILE_KEYS, *(k for k in OPTIONAL_FILE_KEYS if k in meta["files"])]:
        entry = meta["files"][key]
        target = (path / entry["path"]).resolve()
        if root not in target.parents:
            raise BundleError(f"{meta_path}: files.{key}.path {entry['path']!r} points outside the bundle; refusing it")
        if not target.is_file():
            raise BundleError(f"{target}: missing from the bundle (files.{key} in {BUNDLE_JSON})")
        if check_hashes and sha256(target) != entry["sha256"]:
            raise BundleError(
                f"{target}: sha256 differs from bundle.json (files.{key}); the file is damaged or was "
                "replaced: re-export the bundle"
            )
    return Bundle(path=path, meta=meta)
