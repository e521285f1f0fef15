"""`seq2onnx translate BUNDLE` (python -m seq2onnx.runtime.cli translate) against Translator.translate_batch."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from seq2onnx.runtime.translator import Translator
from tiny import scratch, tiny_bundle

try:  # the tiny model is built with torch: one thread is much faster on a small shared machine
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass

ROOT = Path(__file__).resolve().parents[1]
LINES = [
    "the cat dances in the box",
    "",
    "eleven young cows eat the brave book",
    "a small bird sleeps",
    "   ",
    "three old kings carry the red boxes",
    "the farmer liked 12 green cows",
    "漢字 ☃ 🙂",
]


def cli(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    env.pop("SEQ2ONNX_PROGRESS", None)
    return subprocess.run([sys.executable, "-m", "seq2onnx.runtime.cli", "translate", *args], input=input,
                          capture_output=True, text=True, encoding="utf-8", cwd=ROOT, env=env, timeout=120)


@pytest.fixture(scope="module")
def bundle() -> Path:
    return tiny_bundle()


@pytest.fixture(scope="module")
def translator(bundle) -> Translator:
    return Translator(bundle, device="cpu")


def _ok(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("\n")
    return proc.stdout.split("\n")[:-1]


def test_translate_stdin_one_line_per_input_line(bundle, translator):
    out = _ok(cli(str(bundle), "--device", "cpu", input="\n".join(LINES) + "\n"))
    assert len(out) == len(LINES)
    assert out == [r.hypotheses[0] for r in translator.translate_batch(LINES)]  # bundle defaults: beam 4
    assert out[1] == "" and out[4] == "" and out[0] and out[2]
    # no trailing newline on the last line: still read; order kept across --batch-size batches
    small = _ok(cli(str(bundle), "--batch-size", "2", input="\n".join(LINES)))
    assert small == out


def test_translate_beam_one(bundle, translator):
    out = _ok(cli(str(bundle), "--beam", "1", input="\n".join(LINES) + "\n"))
    assert out == [r.hypotheses[0] for r in translator.translate_batch(LINES, beam_size=1)]


def test_translate_scores(bundle, translator):
    out = _ok(cli(str(bundle), "--scores", "--beam", "2", "--length-penalty", "0.6", input="\n".join(LINES) + "\n"))
    want = translator.translate_batch(LINES, beam_size=2, length_penalty=0.6, return_scores=True)
    assert len(out) == len(LINES)
    for line, r in zip(out, want):
        score, text = line.split("\t")
        assert text == r.hypotheses[0]
        assert score == f"{r.scores[0]:.4f}"
        assert float(score) <= 0
    assert any(float(line.split("\t")[0]) < 0 for line in out)


def test_translate_n_best(bundle, translator):
    out = _ok(cli(str(bundle), "--n-best", "2", input="\n".join(LINES) + "\n"))
    want = translator.translate_batch(LINES, num_hypotheses=2, return_scores=True)
    assert len(out) == 2 * len(LINES)
    expected = [f"{i} ||| {text} ||| {score:.4f}" for i, r in enumerate(want) for text, score in zip(r.hypotheses, r.scores)]
    assert out == expected
    parts = out[0].split(" ||| ")
    assert len(parts) == 3 and parts[0] == "0" and float(parts[2]) < 0


def test_translate_files(bundle, translator):
    d = scratch("cli-files")
    (d / "in.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    proc = cli(str(bundle), "-i", str(d / "in.txt"), "-o", str(d / "out.txt"), "--beam", "2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    out = (d / "out.txt").read_text(encoding="utf-8").split("\n")
    assert out[-1] == "" and out[:-1] == [r.hypotheses[0] for r in translator.translate_batch(LINES, beam_size=2)]


def _one_error_line(proc: subprocess.CompletedProcess, *words: str) -> str:
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("seq2onnx translate: error:")
    for w in words:
        assert w in lines[0]
    assert proc.stdout == ""
    return lines[0]


def test_missing_input_file(bundle):
    missing = scratch("cli-missing") / "nope.txt"
    _one_error_line(cli(str(bundle), "-i", str(missing)), "nope.txt")


def test_bad_bundle_path():
    bad = scratch("cli-bad") / "no-bundle"
    _one_error_line(cli(str(bad), input="the cat\n"), "no-bundle")
    empty = scratch("cli-empty")  # a directory without bundle.json
    _one_error_line(cli(str(empty), input="the cat\n"), "bundle.json")


def test_help():
    proc = cli("--help")
    assert proc.returncode == 0
    assert "--beam" in proc.stdout and "--n-best" in proc.stdout and "--scores" in proc.stdout


def test_unicode_line_separators_do_not_split_lines(bundle):
    lines = ["the cat\x0cdances in the box", "a small\u2028bird sleeps", "the farmer liked 12 green cows"]
    out = _ok(cli(str(bundle), "--beam", "1", input="\n".join(lines) + "\n"))
    assert len(out) == len(lines)
