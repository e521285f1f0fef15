"""The training-side commands' help: each one-line help is written once, in TRAINING_COMMANDS."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from seq2onnx.runtime import cli as runtime_cli
from seq2onnx.runtime.cli import TRAINING_COMMANDS, build_parser

REPO = Path(__file__).resolve().parents[1]


def _help(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "250"}  # one line per command in the listing
    return subprocess.run([sys.executable, "-m", "seq2onnx.cli", *args, "--help"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_top_level_help_lists_every_command_with_its_one_line_help():
    r = _help()
    assert r.returncode == 0, r.stderr
    for name, text in TRAINING_COMMANDS.items():
        assert any(line.split() == [name, *text.split()] for line in r.stdout.splitlines()), (name, r.stdout)


@pytest.mark.parametrize("name", list(TRAINING_COMMANDS))
def test_each_command_has_its_own_help(name):
    r = _help(name)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: seq2onnx {name} "), r.stdout


def test_training_parser_takes_its_help_lines_from_training_commands(monkeypatch):
    """Changing the one source changes both listings: nothing in export/cli.py repeats the text."""
    changed = {name: f"help line {i} for {name}" for i, name in enumerate(TRAINING_COMMANDS)}
    monkeypatch.setattr(runtime_cli, "TRAINING_COMMANDS", changed)
    from seq2onnx.export import cli as export_cli

    monkeypatch.setattr(export_cli, "TRAINING_COMMANDS", changed)
    for training in (False, True):
        listing = build_parser(add_training=export_cli.add_commands if training else None).format_help()
        flat = " ".join(listing.split())
        for name, text in changed.items():
            assert f"{name} {text}" in flat, (training, listing)
