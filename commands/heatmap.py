"""Attention as data and as a picture: the records `seq2onnx translate --attention FILE` writes.

FILE gets one JSON object per input line (JSON lines):
    {"line": 0, "source_pieces": [...], "target_pieces": [...], "attention": [[...], ...]}
attention[j][i]: how much target piece j attended to source piece i (the last decoder layer's
cross-attention averaged over heads, each row summing to 1; the source's end token "</s>" is its
last piece). Beside it, FILE with the suffix .html: a self-contained page drawing the first
MAX_PICTURES records as heatmaps (no script, no network).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy only for the annotation: `seq2onnx translate`'s parser loads this module
    import numpy as np

MAX_PICTURES = 100  # a page of thousands of tables helps nobody; the JSON lines have them all
DIGITS = 4  # weights rounded in the JSON: 1e-4 is below what a heatmap shows, and keeps lines short


def picture_path(path: Path) -> Path:
    """Returns where the heatmap page of attention file `path` goes: the suffix replaced by .html.

    Args:
        path: the attention file (JSON lines); without a suffix, or with .html, ".html" is appended.
    """
    if path.suffix and path.suffix != ".html":
        return path.with_suffix(".html")
    return path.with_name(path.name + ".html")


def record(line: int, source_pieces: list[str], target_pieces: list[str], weights: np.ndarray) -> dict:
    """Builds one line's record (the module docstring's JSON object), weights rounded to DIGITS.

    Args:
        line: the input line's index.
        source_pieces: the source pieces, the end token last.
        target_pieces: the target pieces.
        weights: [target pieces, source pieces] attention.

    Returns:
        The record.

    Raises:
        ValueError: weights of another shape.
    """
    if weights.shape != (len(target_pieces), len(source_pieces)):
        raise ValueError(
            f"line {line}: attention of shape {weights.shape} for {len(target_pieces)} target "
            f"and {len(source_pieces)} source pieces"
        )
    return {
        "line": line,
        "source_pieces": source_pieces,
        "target_pieces": target_pieces,
        "attention": weights.astype("float64").round(DIGITS).tolist(),
    }


def json_line(rec: dict) -> str:
    """Returns a record as one line of JSON (UTF-8 text, not escaped), newline included.

    Args:
        rec: from record().
    """
    return json.dumps(rec, ensure_ascii=False) + "\n"


_STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:0 0 2em 0;font-size:13px}
td,th{border:1px solid #ddd;padding:2px 4px;text-align:center;min-width:1.6em}
th.src{writing-mode:vertical-rl;transform:rotate(180deg);font-weight:normal}
th.tgt{text-align:right;font-weight:normal}
h2{font-size:15px;font-weight:600;margin:1.2em 0 .4em}"""


def _cell(weight: float) -> str:
    # white (0) to deep blue (1); the number is in the title for a hover read-out
    shade = int(round(255 * (1.0 - weight)))
    ink = "#fff" if weight > 0.55 else "#222"
    return (
        f'<td style="background:rgb({shade},{shade},255);color:{ink}" title="{weight:.4f}">'
        f"{round(100 * weight)}</td>"
    )


def table(rec: dict) -> str:
    """Renders one record as an HTML table: target pieces down, source pieces across, weights in percent.

    Args:
        rec: from record().

    Returns:
        The table's HTML.
    """
    head = "".join(f'<th class="src">{html.escape(p)}</th>' for p in rec["source_pieces"])
    rows = "".join(
        f'<tr><th class="tgt">{html.escape(piece)}</th>{"".join(_cell(w) for w in weights)}</tr>'
        for piece, weights in zip(rec["target_pieces"], rec["attention"])
    )
    return f"<table><tr><th></th>{head}</tr>{rows}</table>"


def page(records: list[dict], total: int, data_name: str) -> str:
    """Renders the heatmap page of the first records.

    Args:
        records: the records to draw.
        total: how many records the JSON lines file holds.
        data_name: the JSON lines file's name, named on the page.

    Returns:
        A self-contained HTML page.
    """
    parts = [
        f"<!doctype html><meta charset=utf-8><title>seq2onnx attention</title><style>{_STYLE}</style>",
        "<h1 style='font-size:18px'>Cross-attention, last decoder layer, averaged over heads</h1>",
        "<p>Rows: target pieces; columns: source pieces (the end token last); cells: weight in "
        f"percent. {len(records)} of {total} lines drawn; all are in {html.escape(data_name)}.</p>",
    ]
    for rec in records:
        parts.append(f"<h2>line {rec['line']}</h2>{table(rec)}")
    return "\n".join(parts) + "\n"
