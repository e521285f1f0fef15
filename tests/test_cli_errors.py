"""Every command error exits non-zero with one line naming the problem and the fix; no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tiny import scratch, tiny_bundle, tiny_run


def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "seq2onnx.commands", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _cases():
    d = scratch("cli")
    existing = d / "existing"
    existing.mkdir()
    (existing / "file").write_text("x")
    ckpt = str(tiny_run() / "last")
    bundle = str(tiny_bundle())
    return [
        ("train", [str(d / "t1"), "--data", str(d / "missing.tsv")], "no such file"),
        ("train", [str(existing)], "--force"),
        ("train", [str(d / "t2"), "--resume"], "no checkpoint"),
        ("export", [str(d / "nope"), str(d / "b1")], "no such checkpoint"),
        ("export", [str(existing), str(d / "b2")], "not a complete checkpoint"),
        ("export", [ckpt, str(existing)], "--force"),
        ("verify", [ckpt, str(d / "nobundle")], "not a bundle directory"),
        ("translate", [str(d / "nobundle")], "not a bundle directory"),
        ("translate", [bundle, "-i", str(d / "missing.txt")], "no such file"),
        ("translate", [bundle, "--threads", "100000"], "give 1 to"),
        ("translate", [bundle, "-o", str(existing / "file")], "--force"),
        ("demo", ["--out", str(existing)], "--force"),
        ("serve", [bundle, "--lanes", "0"], "--lanes 0: give an int >= 1"),
    ]


@pytest.fixture(scope="module")
def cases():
    return _cases()


@pytest.mark.slow
def test_each_command_error_is_one_line_without_traceback(cases, capsys):
    # In this process (main() is what the console script and `python -m` call; test_debug_* start the
    # real command): thirteen interpreters that import torch would cost a minute on two cores.
    from seq2onnx.commands.main import main

    seen = set()
    for command, args, needle in cases:
        code = main([command, *args])
        stderr = capsys.readouterr().err
        lines = stderr.strip().splitlines()
        where = f"seq2onnx {command} {' '.join(args)}: {stderr!r}"
        assert code == 1, where
        assert len(lines) == 1 and lines[0].startswith(f"seq2onnx {command}: error:"), where
        assert needle in lines[0], where
        assert "Traceback" not in stderr, where
        seen.add(command)
    assert seen == {"train", "export", "verify", "translate", "demo", "serve"}


@pytest.mark.slow
def test_debug_shows_the_traceback(tmp_path):
    result = run("--debug", "translate", str(tmp_path / "nobundle"))
    assert result.returncode != 0 and "Traceback" in result.stderr


@pytest.mark.slow
def test_debug_after_the_subcommand(tmp_path):
    result = run("translate", str(tmp_path / "nobundle"), "--debug")
    assert result.returncode != 0 and "Traceback" in result.stderr and "nobundle" in result.stderr
    plain = run("translate", str(tmp_path / "nobundle"))
    assert plain.returncode == 1 and "Traceback" not in plain.stderr


@pytest.mark.slow
def test_threads_above_the_cores_is_an_error_naming_the_limit():
    cores = os.cpu_count()
    for value in (100000, -1, cores + 1):
        result = run("translate", str(tiny_bundle()), "--threads", str(value))
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert (
            f"--threads {value}: this machine has {cores} cores; give 1 to {cores}, or 0 to use them all"
            in result.stderr
        )


@pytest.mark.slow
def test_usage_errors_exit_2():
    assert run("translate").returncode == 2  # missing BUNDLE: argparse's usage message
    assert run().returncode == 2  # no command: help, exit 2


@pytest.mark.slow
def test_help_explains_every_command():
    for command in ("train", "export", "verify", "evaluate", "translate", "demo"):
        result = run(command, "--help")
        assert result.returncode == 0 and "usage: seq2onnx " + command in result.stdout
    assert "--force" in run("export", "--help").stdout
