"""Interrupted training: SIGKILL inside checkpoint writes and at random moments; resume every time."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


from seq2onnx.model import checkpoint

TRAIN = """
import sys
from seq2onnx.model.train import TrainOptions, train
train(TrainOptions(out=sys.argv[1], generated_pairs=600, valid_size=20, test_size=20, vocab_size=60, max_len=30,
                   d_model=16, n_heads=2, layers=1, d_ff=32, dropout=0.0, max_tokens=400, warmup=20,
                   max_steps=int(sys.argv[2]), eval_every=2, bleu_sentences=2, seed=5, device="cpu",
                   progress=False, resume=sys.argv[3] == "resume"))
"""


# Each checkpoint write pauses this long with its temporary directory complete but not yet renamed
# (model/checkpoint.py's test hook), so a kill can be aimed inside a write and seen to land there.
WRITE_PAUSE_S = 1.0


def _start(out: Path, max_steps: int, resume: bool, pause: bool = False) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pause:
        env[checkpoint._WRITE_PAUSE_ENV] = str(WRITE_PAUSE_S)
    return subprocess.Popen(
        [sys.executable, "-c", TRAIN, str(out), str(max_steps), "resume" if resume else "new"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )


def _step_of(out: Path) -> int:
    return json.loads((out / "last" / checkpoint.STATE).read_text())["step"]


def _assert_consistent(out: Path) -> None:
    """`last` (and `best`) load; every step-* directory is complete; nothing half-written is visible."""
    model, tok, path = checkpoint.load(out / "last")
    assert path.name.startswith("step-")
    if (out / "best").exists():
        checkpoint.load(out / "best")
    for child in out.iterdir():
        if child.name.startswith("step-"):
            missing = [f for f in checkpoint.REQUIRED + (checkpoint.STATE,) if not (child / f).is_file()]
            assert not missing, f"{child} is half-written: missing {missing}"


def _writes_in_progress(out: Path) -> list[Path]:
    """Temporary checkpoint directories holding a complete checkpoint that is not renamed into place yet."""
    return [
        d
        for d in out.glob(".tmp-*")
        if not d.name.startswith(".tmp-del-") and (d / checkpoint.STATE).is_file()
    ]


@pytest.mark.slow
def test_sigkill_inside_writes_and_at_random_moments_then_resume(tmp_path):
    out = tmp_path / "run"
    rng = random.Random(1234)
    proc = _start(out, 10_000, resume=False, pause=True)
    deadline = time.time() + 120
    while not (out / "last").exists():  # the first kill comes once a checkpoint exists
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.time() < deadline, "training wrote no checkpoint in 120 s"
        time.sleep(0.05)
    steps_seen, inside_writes = [], 0
    for round_ in range(6):
        leftovers: list[Path] = []
        if round_ % 2 == 0:  # aimed: kill while a write's temporary directory exists
            deadline = time.time() + 120
            while not (writing := _writes_in_progress(out)):
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.time() < deadline, "no checkpoint write seen in 120 s"
                time.sleep(0.01)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            # The write was cut: its temporary directory is still there, never renamed.
            leftovers = [d for d in writing if d.is_dir()]
            assert leftovers, f"the kill missed the write of {writing}"
            inside_writes += 1
        else:  # anywhere: a step, an evaluation, a write, a link swap
            time.sleep(rng.uniform(0.05, 1.5))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        _assert_consistent(out)
        steps_seen.append(_step_of(out))
        proc = _start(out, 10_000, resume=True, pause=True)
        # wait for the resumed run to get past its last checkpoint before the next kill
        start_step = steps_seen[-1]
        deadline = time.time() + 120
        while _safe_step(out) <= start_step:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.time() < deadline, "resumed training made no progress in 120 s"
            time.sleep(0.05)
        # resuming removed what the killed write left, and the new checkpoint loads
        assert not [d for d in leftovers if d.exists()], leftovers
        _assert_consistent(out)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _assert_consistent(out)
    assert inside_writes == 3
    assert steps_seen == sorted(steps_seen) and _step_of(out) > steps_seen[0], steps_seen


def _safe_step(out: Path) -> int:
    try:
        return _step_of(out)
    except (FileNotFoundError, json.JSONDecodeError):  # link swapped between the two reads
        return -1


@pytest.mark.slow
def test_resume_continues_to_max_steps(tmp_path):
    out = tmp_path / "run"
    first = _start(out, 4, resume=False)
    assert first.wait(timeout=120) == 0, first.stderr.read().decode()
    assert _step_of(out) == 4
    second = _start(out, 8, resume=True)
    assert second.wait(timeout=120) == 0, second.stderr.read().decode()
    assert _step_of(out) == 8
    history = json.loads((out / "last" / checkpoint.STATE).read_text())["history"]
    assert [h["step"] for h in history] == [2, 4, 6, 8]
