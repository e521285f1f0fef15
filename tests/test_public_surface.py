"""The public surface an app imports (issue 56): what `seq2onnx` and `seq2onnx.runtime` export is what
docs/python-api.md's table "The public surface" documents, and every name the table gives resolves."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import seq2onnx
import seq2onnx.runtime

DOC = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"


def _table_rows(text: str) -> list[str]:
    """The rows of the table under "## The public surface" (header and rule left out)."""
    section = text.split("## The public surface", 1)[1]
    rows = []
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| name") and not line.startswith("| ---"):
            rows.append(line)
        elif rows and not line.startswith("|"):
            break
    return rows


def _documented(rows: list[str]) -> tuple[list[str], set[str]]:
    """(the dotted names of the table's first column, every backticked name of the table's rows)."""
    dotted = []
    for row in rows:
        first = row.split("|")[1]
        names = re.findall(r"`([\w.]+)`", first)
        module = names[0].rpartition(".")[0]
        dotted += [names[0]] + [f"{module}.{n}" for n in names[1:]]  # `a.b.c`, `d`: d is in a.b too
    mentioned = {n.rpartition(".")[2] for row in rows for n in re.findall(r"`([\w.]+)`", row)}
    return dotted, mentioned


def _resolve(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_the_table_is_read():
    dotted, mentioned = _documented(_table_rows(DOC.read_text(encoding="utf-8")))
    assert "seq2onnx.Translator" in dotted and "seq2onnx.runtime.Bundle" in dotted
    assert len(dotted) >= 8 and "Option" in mentioned


def test_every_documented_name_resolves():
    dotted, _ = _documented(_table_rows(DOC.read_text(encoding="utf-8")))
    missing = []
    for name in dotted:
        try:
            _resolve(name)
        except (ImportError, AttributeError):
            missing.append(name)
    assert not missing, f"docs/python-api.md's public surface names what does not exist: {missing}"


def test_every_export_is_documented():
    _, mentioned = _documented(_table_rows(DOC.read_text(encoding="utf-8")))
    exported = {n for n in seq2onnx.__all__ if n != "__version__"} | set(seq2onnx.runtime.__all__)
    undocumented = sorted(exported - mentioned)
    assert not undocumented, (
        f"exported but not in docs/python-api.md's table 'The public surface': {undocumented}: "
        "document them there, or stop exporting them"
    )


def test_the_check_finds_an_undocumented_name():
    rows = ["| `seq2onnx.Translator` | a bundle loaded |", "| `seq2onnx.runtime.read_bundle`, `Bundle` | x |"]
    dotted, mentioned = _documented(rows)
    assert dotted == ["seq2onnx.Translator", "seq2onnx.runtime.read_bundle", "seq2onnx.runtime.Bundle"]
    assert {"Translator", "read_bundle", "Bundle"} == mentioned
    assert "SearchOptions" not in mentioned
