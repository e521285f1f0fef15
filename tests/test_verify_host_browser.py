"""`seq2onnx verify-host --host browser`: the page of `seq2onnx web` in headless Chromium against the
Python runtime on the same bundle, as a command.

It passes on the tiny bundle with every row counted. A missing Chromium (and a --chromium that is not
one, and --max-length, which the page has no field for) is refused before any work with a message that
names what to install or pass; those tests need neither Chromium nor node and always run. The run in
the browser needs Debian's `chromium`, Node.js and `npm ci --prefix js`; without them it skips with
one line, as tests/test_web.py's browser tests do. The source-pieces row fails, and shows both sides,
when the page's pieces differ (no browser needed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from seq2onnx.commands.browser_host import browser_skip_reason
from seq2onnx.commands.verify_host import verify_host as verify_host_function
from seq2onnx.errors import CommandError
from seq2onnx.model.corpus import generate_pairs

ROOT = Path(__file__).resolve().parents[1]
N_SENTENCES = 6  # the page's parity on more sentences is tests/test_web.py's; here, the command
_BROWSER_SKIP = browser_skip_reason()


@pytest.mark.slow
@pytest.mark.skipif(bool(_BROWSER_SKIP), reason=_BROWSER_SKIP)
def test_browser_host_passes_on_the_tiny_bundle_with_every_row_counted(bundle, tmp_path):
    sentences = tmp_path / "sentences.txt"  # seed 11: not the training corpus (tests/tiny.py: seed 3)
    sentences.write_text("".join(s + "\n" for s, _ in generate_pairs(N_SENTENCES, seed=11)), encoding="utf-8")
    report_path = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "seq2onnx.commands", "verify-host", str(bundle), "--host", "browser"]
        + ["--sentences-file", str(sentences), "--json", str(report_path)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("PASSED") and "the browser host (" in proc.stdout
    report = json.loads(report_path.read_text(encoding="utf-8"))
    checks = {c["name"]: c["value"] for c in report["checks"]}
    n = N_SENTENCES
    assert checks == {
        "source tokenizer pieces identical": f"{n}/{n}",
        "greedy token ids identical": f"{n}/{n}",
        "greedy translations identical": f"{n}/{n}",
        "beam 4 (n-best 4) token ids identical": f"{n}/{n}",
        "beam 4 (n-best 4) translations identical": f"{4 * n}/{4 * n}",
        "greedy max |score diff|": checks["greedy max |score diff|"],
        "beam 4 (n-best 4) max |score diff|": checks["beam 4 (n-best 4) max |score diff|"],
    }
    assert all(c["passed"] for c in report["checks"]) and report["differences"] == []
    assert report["host"] == "browser" and report["sentences"] == n and report["decoder"] == "standard"
    assert report["onnxruntime_web"] and report["chromium_version"]
    assert report["speed"]["beam 4"]["host_s"] > 0 and report["speed"]["beam 4"]["host_tokens"] > n


def test_missing_chromium_names_what_to_install_and_the_option(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no chromium (nor node) on PATH
    with pytest.raises(CommandError) as refused:
        verify_host_function("nowhere", ["the cat"], host="browser")
    message = str(refused.value)
    assert "chromium is not installed" in message and "apt-get install chromium" in message
    assert "--chromium PATH" in message
    with pytest.raises(CommandError, match="--chromium .*no-such-chromium: not an executable file"):
        verify_host_function(
            "nowhere", ["the cat"], host="browser", chromium=str(tmp_path / "no-such-chromium")
        )


def test_max_length_is_refused_for_the_page_that_has_no_such_field():
    with pytest.raises(CommandError, match="--max-length 8: the page has no length field"):
        verify_host_function("nowhere", ["the cat"], host="browser", max_length=8)


class _Pieces:
    """A tokenizer stand-in: each word is a piece ("▁" + word)."""

    def encode(self, text, out_type=str):
        assert out_type is str
        return ["▁" + w for w in text.split()]


def test_a_piece_the_page_shows_differently_fails_its_row_and_is_shown():
    from seq2onnx.commands.host_report import compare_pieces

    differences: list[dict] = []
    texts = ["the cat", "a dog"]
    page = [["▁the", "▁cat", "</s>"], ["▁a", "▁do", "g", "</s>"]]  # the second split otherwise
    row = compare_pieces("source tokenizer", texts, _Pieces(), page, differences)
    assert row["value"] == "1/2" and not row["passed"]
    assert differences == [
        {
            "check": "source tokenizer",
            "sentence": 1,
            "source": "a dog",
            "python": {"pieces": ["▁a", "▁dog", "</s>"]},
            "browser": {"pieces": ["▁a", "▁do", "g", "</s>"]},
        }
    ]
