"""Two exports to one output directory at once: exactly one succeeds, the other says why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiny import scratch, tiny_run

from seq2onnx.runtime import bundle as fmt

REPO = Path(__file__).resolve().parents[1]

# A worker imports torch once, then runs one export per line of stdin ("CKPT OUT force|new") and
# answers with one JSON line. Two workers given the same line within microseconds of each other
# export at the same time: an export takes seconds, far longer than the gap.
WORKER = """
import json, sys
from seq2onnx.export.bundle import ExportError, export_bundle
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    ckpt, out, mode = line.split()
    try:
        export_bundle(ckpt, out, force=mode == "force")
        print(json.dumps({"ok": True}), flush=True)
    except ExportError as e:
        print(json.dumps({"ok": False, "error": str(e)}), flush=True)
"""


def _workers(n: int) -> list[subprocess.Popen]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=_env(),
        )
        for _ in range(n)
    ]
    for p in procs:
        line = p.stdout.readline()
        assert line and json.loads(line) == {"ready": True}, p.stderr.read()
    return procs


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _round(procs: list[subprocess.Popen], ckpt: Path, out: Path, force: bool) -> list[dict]:
    command = f"{ckpt} {out} {'force' if force else 'new'}\n"
    for p in procs:  # both lines go out before either export can have finished
        p.stdin.write(command)
        p.stdin.flush()
    answers = []
    for p in procs:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        answers.append(json.loads(line))
    return answers


def _leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name != name)


@pytest.mark.slow
def test_concurrent_exports_one_succeeds_the_other_fails_clearly():
    ckpt = (tiny_run() / "last").resolve()
    procs = _workers(2)
    try:
        for round_ in range(3):  # a fresh output directory: without --force
            parent = scratch(f"lock-new-{round_}")
            out = parent / "bundle"
            answers = _round(procs, ckpt, out, force=False)
            assert sorted(a["ok"] for a in answers) == [False, True], answers
            [error] = [a["error"] for a in answers if not a["ok"]]
            assert "another export is writing" in error and str(out) in error, error
            fmt.read_bundle(out)  # the winner's bundle is whole: hashes match, graphs listed
            assert _leftovers(parent, "bundle") == [], "lock or temporary files left behind"
        parent = scratch("lock-force")
        out = parent / "bundle"
        assert [a["ok"] for a in _round(procs[:1], ckpt, out, force=False)] == [True]
        for _ in range(2):  # --force replaces, but still not two at once
            (out / "marker").write_text("old")
            answers = _round(procs, ckpt, out, force=True)
            assert sorted(a["ok"] for a in answers) == [False, True], answers
            [error] = [a["error"] for a in answers if not a["ok"]]
            assert "another export is writing" in error and "wait for it to finish" in error, error
            assert not (out / "marker").exists()  # replaced once, by the winner
            fmt.read_bundle(out)
            assert _leftovers(parent, "bundle") == []
        # one after the other, --force replaces and a plain export refuses
        assert [a["ok"] for a in _round(procs[:1], ckpt, out, force=True)] == [True]
        [refused] = _round(procs[:1], ckpt, out, force=False)
        assert not refused["ok"] and "already exists" in refused["error"] and "--force" in refused["error"]
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=60)


@pytest.mark.slow
def test_two_cli_exports_started_together():
    """The user's case: two `seq2onnx export` commands into one directory; one prints success."""
    ckpt = tiny_run()
    out = scratch("lock-cli") / "bundle"
    cmd = [sys.executable, "-m", "seq2onnx.commands", "export", str(ckpt), str(out)]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=_env())
        for _ in range(2)
    ]
    results = [(p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for p in procs]
    assert sorted(rc for rc, _, _ in results) == [0, 1], results
    [(_, _, err)] = [r for r in results if r[0] == 1]
    [(_, ok, _)] = [r for r in results if r[0] == 0]
    assert "bundle written to" in ok
    lines = [line for line in err.splitlines() if line.strip()]
    # started together they overlap, unless one process started far slower than the other
    assert len(lines) == 1 and lines[0].startswith("seq2onnx export: error:"), err
    assert "another export is writing" in lines[0] or "already exists" in lines[0], err
    fmt.read_bundle(out)
