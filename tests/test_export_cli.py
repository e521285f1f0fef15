"""The `seq2onnx` command's help: every command is listed with its one-line help and has its own --help."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from seq2onnx.commands.main import COMMANDS, build_parser

REPO = Path(__file__).resolve().parents[1]


def _help(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "250"}  # one line per command in the listing
    return subprocess.run(
        [sys.executable, "-m", "seq2onnx.commands", *args, "--help"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_top_level_help_lists_every_command_with_its_one_line_help():
    r = _help()
    assert r.returncode == 0, r.stderr
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    helps = {c.dest: c.help for c in subparsers._choices_actions}
    assert sorted(helps) == sorted(COMMANDS)
    listing = " ".join(r.stdout.split())  # a long name puts its help on the next line
    for name, text in helps.items():
        assert text and f" {name} {' '.join(text.split())} " in listing, (name, r.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_has_its_own_help(name):
    r = _help(name)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: seq2onnx {name} "), r.stdout


def test_help_imports_neither_torch_nor_onnxruntime():
    """`seq2onnx --help` builds every command's parser; none may import the heavy libraries to do so."""
    code = (
        "import sys; from seq2onnx.commands.main import build_parser; build_parser().format_help(); "
        "print(sorted(m for m in ('torch', 'onnxruntime', 'ray', 'seq2onnx.model', 'seq2onnx.export') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
