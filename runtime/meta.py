"""bundle.json's fields checked: the spec's `fields` table, then the checks that relate fields."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from .spec import (
    DECODER_LABELS,
    FILE_KEYS,
    FUSED,
    MAX_PATH_CHARS,
    OPTIONAL_FILE_KEYS,
    OPTIONAL_GRAPH_KEYS,
    SPEC,
    SHA256_DIGITS,
    SIZE_FIELD,
    SPEC_PATH,
    STANDARD,
    WEIGHTS_CHECKSUM,
    WEIGHTS_CHECKSUM_DIGITS,
    BundleError,
)


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
        raise BundleError(
            f"{self.where}: {field} is {_short(value)}, {want}; re-export the bundle with "
            "`seq2onnx export` (or correct the field)"
        )

    def obj(self, parent: dict, key: str, field: str) -> dict:
        if key not in parent:
            raise BundleError(
                f"{self.where}: missing the field {field!r}; re-export the bundle with `seq2onnx export`"
            )
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
            self.fail(
                field,
                value if key in parent else _MISSING,
                "expected a finite number" + (f" >= {low}" if low is not None else ""),
            )
        return float(value)

    def text(self, parent: dict, key: str, field: str, choices: tuple | None = None) -> str:
        value = parent.get(key)
        if key not in parent or not isinstance(value, str) or (choices and value not in choices):
            self.fail(
                field,
                value if key in parent else _MISSING,
                f"expected one of {', '.join(choices)}" if choices else "expected a string",
            )
        return value


def _check_field(v: _Schema, meta: dict, spec: dict) -> None:
    """One row of the spec's `fields` table: the field's type, range or choices.

    Args:
        v: the checker, which names bundle.json in its messages.
        meta: bundle.json as parsed.
        spec: the row: `field` (a dotted path), `type`, and optionally `required`, `nullable`,
            `min` and `choices`.

    Raises:
        BundleError: the field fails the row.
        RuntimeError: the row's type is not one this runtime knows.
    """
    *parents, key = spec["field"].split(".")
    parent = meta
    for i, name in enumerate(parents):
        if name not in parent and not spec.get("required", True):
            return  # an optional field of an absent optional section (tokens.*)
        parent = v.obj(parent, name, ".".join(parents[: i + 1]))
    if key not in parent and not spec.get("required", True):
        return
    if spec.get("nullable") and parent.get(key) is None and key in parent:
        return
    _check_value(v, parent, key, spec)


def _check_value(v: _Schema, parent: dict, key: str, spec: dict) -> None:
    """The value at `parent[key]` against the row's type (and its range or choices).

    Args:
        v: the checker.
        parent: the object that holds the field.
        key: the field's last name.
        spec: the row of the spec's `fields` table.

    Raises:
        BundleError: the value fails the row.
        RuntimeError: the row's type is not one this runtime knows.
    """
    kind, field = spec["type"], spec["field"]
    value = parent.get(key)
    if kind == "integer":
        v.integer(parent, key, field, low=spec.get("min", 0))
    elif kind == "number":
        v.real(parent, key, field, low=spec.get("min"))
    elif kind == "string":
        choices = spec.get("choices")
        v.text(parent, key, field, tuple(SPEC[choices]) if isinstance(choices, str) else choices)
    elif kind == "boolean":
        if not isinstance(value, bool):
            v.fail(field, parent.get(key, _MISSING), "expected true or false")
    elif kind == "ids":
        if not isinstance(value, list) or not all(_nonnegative(x) for x in value):
            v.fail(field, value, "expected a list of token ids (integers >= 0)")
    elif kind == "id_map":
        if not isinstance(value, dict) or not all(_nonnegative(x) for x in value.values()):
            v.fail(field, value, "expected an object of language codes to token ids (integers >= 0)")
    else:  # a spec this runtime does not understand: refuse loudly rather than skip a check
        raise RuntimeError(
            f"{SPEC_PATH}: fields[{field}] has type {kind!r}; this runtime knows integer, number, "
            "string, boolean, ids, id_map"
        )


def _nonnegative(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _check_tokens(v: _Schema, meta: dict, sizes: dict) -> None:
    """tokens.* ids inside the vocabularies they index (their types are the fields table's)."""
    tokens = meta.get("tokens")
    if tokens is None:
        return
    src, tgt = sizes["src_vocab_size"], sizes["tgt_vocab_size"]
    limits = (
        ("source_prefix", src, "the source vocabulary"),
        ("source_suffix", src, "the source vocabulary"),
        ("target_prefix", tgt, "the target vocabulary"),
    )
    for key, limit, what in limits:
        if key in tokens and any(x >= limit for x in tokens[key]):
            v.fail(f"tokens.{key}", tokens[key], f"expected ids inside {what} [0, {limit})")
    languages = tokens.get("languages", {})
    if any(x >= min(src, tgt) for x in languages.values()):
        v.fail("tokens.languages", languages, f"expected ids inside both vocabularies [0, {min(src, tgt)})")


def validate_meta(meta: dict, where: Path) -> None:
    """Checks that every field the runtime reads has its type and range, and the fields stated twice agree.

    The per-field checks are the spec's `fields` table (spec/bundle.json); the checks that
    relate fields to each other follow it.

    Args:
        meta: bundle.json as parsed.
        where: bundle.json's path, for messages.

    Raises:
        BundleError: naming the field, its value, what was expected and the fix.
        RuntimeError: the spec's table has a field type this runtime does not know.
    """
    v = _Schema(where)
    for spec in SPEC["fields"]:
        _check_field(v, meta, spec)
    model = meta["model"]
    sizes = {
        k: model[k]
        for k in (
            "src_vocab_size",
            "tgt_vocab_size",
            "d_model",
            "n_heads",
            "n_decoder_layers",
            "max_positions",
        )
    }
    if sizes["d_model"] % sizes["n_heads"] and not model.get("d_kv"):  # d_kv: T5's head size of its own
        v.fail("model.d_model", sizes["d_model"], f"expected a multiple of model.n_heads={sizes['n_heads']}")
    if meta["max_positions"] != sizes["max_positions"]:
        v.fail(
            "max_positions",
            meta["max_positions"],
            f"expected model.max_positions={sizes['max_positions']} (the same value twice)",
        )
    _check_tokens(v, meta, sizes)
    _check_special_ids(v, meta, sizes)
    files = _check_files(v, meta)
    _check_graphs(v, meta, files)
    _check_tokenizers(v, meta)


def _check_special_ids(v: _Schema, meta: dict, sizes: dict) -> None:
    """special_ids.* inside the vocabularies, and equal to model.*_id where both are stated.

    Args:
        v: the checker.
        meta: bundle.json as parsed (its fields' types already checked).
        sizes: model.src_vocab_size and model.tgt_vocab_size, among others.

    Raises:
        BundleError: an id outside its vocabulary, or stated twice with two values.
    """
    model, special = meta["model"], meta["special_ids"]
    for key in ("pad", "unk", "bos", "eos", "decoder_start"):
        value = special[key]
        vocab = (
            sizes["tgt_vocab_size"]
            if key == "decoder_start"
            else min(sizes["src_vocab_size"], sizes["tgt_vocab_size"])
        )
        if value >= vocab:
            v.fail(f"special_ids.{key}", value, f"expected an id inside the vocabulary [0, {vocab})")
        model_key = "decoder_start_id" if key == "decoder_start" else f"{key}_id"
        if model_key in model and model[model_key] != value:
            v.fail(
                f"special_ids.{key}",
                value,
                f"expected model.{model_key}={_short(model[model_key])} (the same id twice)",
            )


def _check_files(v: _Schema, meta: dict) -> dict:
    """files.*: each required file, and each optional one listed, has a path and a sha256.

    Args:
        v: the checker.
        meta: bundle.json as parsed.

    Returns:
        The `files` object.

    Raises:
        BundleError: a file entry missing or malformed.
    """
    files = v.obj(meta, "files", "files")
    for key in [*FILE_KEYS, *(k for k in OPTIONAL_FILE_KEYS if k in files)]:
        entry = v.obj(files, key, f"files.{key}")
        _check_entry(v, entry, key)
    weights = files.get("weights")
    if isinstance(weights, dict) and WEIGHTS_CHECKSUM in weights:  # optional: bundles before it have none
        value = weights[WEIGHTS_CHECKSUM]
        if not (isinstance(value, str) and re.fullmatch(f"[0-9a-f]{{{WEIGHTS_CHECKSUM_DIGITS}}}", value)):
            v.fail(
                f"files.weights.{WEIGHTS_CHECKSUM}",
                value,
                f"expected {WEIGHTS_CHECKSUM_DIGITS} lowercase hex digits (the file's CRC-32)",
            )
    return files


def _check_entry(v: _Schema, entry: dict, key: str) -> None:
    """One files.<key>: a path short enough to name a file (checked before any path operation: a 400 KB path
    cost seconds of CPU in pathlib), without NUL; a sha256 of the spec's width; a size (optional) >= 0."""
    path = v.text(entry, "path", f"files.{key}.path")
    if len(path) > MAX_PATH_CHARS or "\0" in path:
        want = (
            f"expected a path of at most {MAX_PATH_CHARS} characters"
            if "\0" not in path
            else "expected a path without a NUL character"
        )
        v.fail(f"files.{key}.path", path, want)
    digest = v.text(entry, "sha256", f"files.{key}.sha256")
    if not re.fullmatch(f"[0-9a-f]{{{SHA256_DIGITS}}}", digest):
        v.fail(f"files.{key}.sha256", digest, f"expected {SHA256_DIGITS} lowercase hex digits")
    v.integer(entry, SIZE_FIELD, f"files.{key}.{SIZE_FIELD}", low=0, required=False)


def _check_graphs(v: _Schema, meta: dict, files: dict) -> None:
    """graphs.*: the encoder, the decoder and each optional graph whose file is listed.

    Args:
        v: the checker.
        meta: bundle.json as parsed.
        files: its `files` object (already checked).

    Raises:
        BundleError: a graph missing, described without its file, or malformed.
    """
    graphs = v.obj(meta, "graphs", "graphs")
    labels = ["encoder", "decoder"]
    for key in OPTIONAL_GRAPH_KEYS:  # an optional graph is described exactly when its file is listed
        if (key in files) != (key in graphs):
            v.fail(
                f"graphs.{key}" if key in files else f"files.{key}",
                _MISSING,
                f"expected because {'files' if key in files else 'graphs'}.{key} is present",
            )
        if key in files:
            labels.append(key)
    for label in labels:
        _check_graph(v, v.obj(graphs, label, f"graphs.{label}"), label)


def _check_graph(v: _Schema, graph: dict, label: str) -> None:
    """One graph's description: its variant, operator domains, inputs and outputs.

    Args:
        v: the checker.
        graph: graphs.<label> as parsed.
        label: the graph's key in `graphs` (encoder, decoder, ...).

    Raises:
        BundleError: naming the first malformed field.
    """
    if "variant" in graph:  # optional: bundles exported before the fused decoder lack it
        want = FUSED if label == DECODER_LABELS[FUSED] else STANDARD
        v.text(graph, "variant", f"graphs.{label}.variant", (want,))
    domains = graph.get("domains")
    if "domains" in graph and (not isinstance(domains, list) or not all(isinstance(d, str) for d in domains)):
        v.fail(f"graphs.{label}.domains", domains, "expected a list of operator domains (strings)")
    for side in ("inputs", "outputs"):
        items = graph.get(side)
        if not isinstance(items, list) or not items:
            v.fail(
                f"graphs.{label}.{side}",
                items if side in graph else _MISSING,
                "expected a non-empty list",
            )
        for i, item in enumerate(items):
            _check_value_info(v, item, f"graphs.{label}.{side}[{i}]")


def _check_value_info(v: _Schema, item, field: str) -> None:
    """One graph input or output: an object with a name, a dtype and a shape.

    Args:
        v: the checker.
        item: the entry as parsed.
        field: its path, for messages (graphs.decoder.inputs[3]).

    Raises:
        BundleError: the entry is malformed.
    """
    if not isinstance(item, dict):
        v.fail(field, item, "expected an object")
    v.text(item, "name", f"{field}.name")
    v.text(item, "dtype", f"{field}.dtype")
    shape = item.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, str) or (isinstance(d, int) and not isinstance(d, bool) and d >= 0) for d in shape
    ):
        v.fail(
            f"{field}.shape",
            shape,
            "expected a list of sizes (integers) and axis names (strings)",
        )


def _check_tokenizers(v: _Schema, meta: dict) -> None:
    """tokenizers.* (optional: vocabulary fingerprints, runtime.checks.tokenizer_fingerprint).

    Args:
        v: the checker.
        meta: bundle.json as parsed.

    Raises:
        BundleError: the section is present but malformed.
    """
    if meta.get("tokenizers") is None:
        return
    tokenizers = v.obj(meta, "tokenizers", "tokenizers")
    for side in ("source", "target"):
        entry = v.obj(tokenizers, side, f"tokenizers.{side}")
        v.integer(entry, "pieces", f"tokenizers.{side}.pieces", low=1)
        v.text(entry, "pieces_sha256", f"tokenizers.{side}.pieces_sha256")
