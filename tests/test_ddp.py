"""Training on 2 processes with DistributedDataParallel (gloo on the CPU), launched by torchrun:
the same losses as one process, checkpoints that resume with another number of processes, and a
killed rank that ends the run with a clear error and a loadable checkpoint."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import free_port
from tiny import scratch
from seq2onnx.model import checkpoint
from seq2onnx.model.distributed import Group, without_option
from seq2onnx.model.train import TrainOptions, train

# A tiny model, dropout 0 so that the runs are deterministic; eval_every 1 puts every step's loss
# and gradient norm in the history.
OPTIONS = dict(
    generated_pairs=600,
    valid_size=20,
    test_size=20,
    vocab_size=80,
    max_len=40,
    d_model=32,
    n_heads=4,
    layers=1,
    d_ff=64,
    dropout=0.0,
    max_tokens=600,
    warmup=20,
    lr=2.0,
    eval_every=1,
    bleu_sentences=2,
    seed=3,
    device="cpu",
    progress=False,
)
# The same options as `seq2onnx train` flags.
FLAGS = [
    "--pairs",
    "600",
    "--valid-size",
    "20",
    "--test-size",
    "20",
    "--vocab-size",
    "80",
    "--max-len",
    "40",
    "--d-model",
    "32",
    "--heads",
    "4",
    "--layers",
    "1",
    "--d-ff",
    "64",
    "--dropout",
    "0",
    "--max-tokens",
    "600",
    "--warmup",
    "20",
    "--lr",
    "2",
    "--eval-every",
    "1",
    "--bleu-sentences",
    "2",
    "--seed",
    "3",
    "--device",
    "cpu",
]
# Per-step differences between 1 and 2 processes come from summing in another order (about 1e-6
# here over 20 steps); a wrong share of the batch or a wrong normalisation moves the loss by 1e-2.
TOL = 1e-4
# TMPDIR in the run's own folder (removed when the run ends): torchrun's agent leaves its torchelastic_*
# folder behind when a rank is killed or fails, as tests here make them
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch("ddp-tmp"))}


def _torchrun(out: Path, max_steps: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "seq2onnx.commands",
        "train",
        str(out),
        *FLAGS,
        "--max-steps",
        str(max_steps),
        *extra,
    ]


def _launch(out: Path, max_steps: int, *extra: str) -> list[str]:
    """The same run through model.distributed.launch (what `seq2onnx train --nproc 2` calls)."""
    code = "import sys; from seq2onnx.model.distributed import launch; sys.exit(launch(2, sys.argv[1:]))"
    return [sys.executable, "-c", code, "train", str(out), *FLAGS, "--max-steps", str(max_steps), *extra]


def _run(command: list[str]) -> subprocess.CompletedProcess:
    """A 2-process run that must finish: exit 0, and nothing aborted at exit.

    The abort at exit ("terminate called without an active exception", about 1 run in 30 on busy cores)
    came when DistributedDataParallel still held the process group at shutdown; every run here checks for
    it. The suite's other worker keeps the cores busy: the runs no longer spin two processes of their own,
    which cost the parallel suite about a core for the file's length.
    """
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "terminate called" not in done.stderr and "Fatal Python error" not in done.stderr, done.stderr[
        -3000:
    ]
    return done


def _state(run: Path) -> dict:
    return json.loads((run / "last" / checkpoint.STATE).read_text())


def _assert_same_history(got: list[dict], want: list[dict]) -> None:
    assert [h["step"] for h in got] == [h["step"] for h in want]
    for key in ("train_loss", "grad_norm", "valid_loss"):
        diff = max(abs(g[key] - w[key]) for g, w in zip(got, want))
        assert diff < TOL, (
            f"{key} differs by up to {diff:.2e} (tolerance {TOL:.0e}): "
            f"{[g[key] for g in got]} vs {[w[key] for w in want]}"
        )


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    """The reference: 20 steps in this process, without torchrun."""
    return train(TrainOptions(out=str(tmp_path_factory.mktemp("one") / "run"), max_steps=20, **OPTIONS))


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> tuple[Path, str]:
    """10 steps on 2 processes under torchrun: the run directory (tests copy it before resuming) and its
    stdout. One 2-process run serves both the comparison and the resume in one process."""
    run = tmp_path_factory.mktemp("two") / "run"
    return run, _run(_torchrun(run, 10)).stdout


@pytest.mark.slow
def test_two_processes_match_one_process(two_processes, tmp_path):
    run, stdout = two_processes
    assert "x 2 processes" in stdout  # it did train on two ranks
    assert stdout.count("training ") == 1  # rank 0 alone reports
    one = train(TrainOptions(out=str(tmp_path / "one"), max_steps=10, **OPTIONS))
    two, ref = _state(run), _state(one)
    assert two["step"] == ref["step"] == 10
    assert (two["epoch"], two["batch_in_epoch"]) == (ref["epoch"], ref["batch_in_epoch"])
    _assert_same_history(two["history"], ref["history"])
    # The keys' biases are left out: softmax ignores a shift shared by all keys, so their gradient is
    # rounding noise, which Adam (eps 1e-9) turns into full-size steps in either run; they do not
    # change the output, as the equal validation losses show. The other weights agree closely.
    a, _, _ = checkpoint.load(run)
    b, _, _ = checkpoint.load(one)
    worst = max(
        (a.state_dict()[k] - v).abs().max().item()
        for k, v in b.state_dict().items()
        if not k.endswith("w_k.bias")
    )
    assert worst < 1e-3, f"weights differ by up to {worst:.2e}"
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # no probe or temporary leftovers


@pytest.mark.slow
def test_two_process_checkpoint_resumes_in_one_process(two_processes, tmp_path, one_process):
    run = tmp_path / "run"
    shutil.copytree(two_processes[0], run, symlinks=True)  # "last" is a link
    train(TrainOptions(out=str(run), max_steps=20, resume=True, **OPTIONS))
    state = _state(run)
    assert state["step"] == 20
    _assert_same_history(state["history"], _state(one_process)["history"])


@pytest.mark.slow
def test_one_process_checkpoint_resumes_in_two_processes(tmp_path, one_process):
    """Through model.distributed.launch, what `seq2onnx train --nproc 2` calls."""
    run = tmp_path / "run"
    train(TrainOptions(out=str(run), max_steps=10, **OPTIONS))
    done = _run(_launch(run, 20, "--resume"))
    assert "training " not in done.stdout  # a resumed run does not announce a new one
    state = _state(run)
    assert state["step"] == 20
    _assert_same_history(state["history"], _state(one_process)["history"])


def _workers(agent: int) -> dict[int, int]:
    """{rank: pid} of the worker processes torchrun's agent (pid `agent`) started."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        rank = [v for v in environ if v.startswith(b"RANK=")]
        if ppid == agent and rank:
            found[int(rank[0][5:])] = int(entry.name)
    return found


@pytest.mark.slow
def test_killing_one_rank_ends_the_run_with_a_clear_error(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(
        _torchrun(run, 100_000, "--eval-every", "5"),
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        while not (run / "last").exists() or len(workers := _workers(proc.pid)) < 2:
            assert proc.poll() is None, proc.stderr.read()[-4000:]
            assert time.time() < deadline, "the 2-process run wrote no checkpoint in 120 s"
            time.sleep(0.1)
        os.kill(workers[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # the run outlived the test: end it, and its workers
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    # torchrun's summary names rank 1, killed by SIGKILL. Which failure it calls the root cause is a race:
    # rank 0's error file can carry an earlier time than the agent's sighting of the kill.
    assert re.search(r"rank +: 1 \(local_rank: 1\)\s+exitcode +: -9 .*SIGKILL", err), err[-3000:]
    # The last checkpoint loads and a single process continues from it.
    step = _state(run)["step"]
    assert step >= 5 and step % 5 == 0
    checkpoint.load(run / "last")
    train(TrainOptions(out=str(run), max_steps=step + 2, resume=True, **OPTIONS))
    assert _state(run)["step"] == step + 2


@pytest.mark.slow
def test_failure_on_rank_0_at_start_stops_every_rank(tmp_path):
    """An occupied OUT is refused by rank 0; rank 1 stops too, at once, instead of waiting for it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("keep me\n")
    started = time.time()
    done = subprocess.run(_launch(run, 5), env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "already holds a run; pass --resume to continue it or --force" in done.stderr
    assert "rank 0 failed, so rank 1 stops too" in done.stderr
    assert time.time() - started < 120
    assert (run / "notes.txt").read_text() == "keep me\n"


# -- the pieces ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 2, 5, 8])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_shards_partition_each_batch_in_order(size, world_size):
    batch = list(range(100, 100 + size))
    parts = [Group(rank=r, world_size=world_size).shard(batch) for r in range(world_size)]
    assert [i for part in parts for i in part] == batch
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_without_option_drops_the_flag_and_its_value():
    argv = ["train", "OUT", "--nproc", "2", "--max-steps", "5", "--nproc=3", "--resume"]
    assert without_option(argv, "--nproc") == ["train", "OUT", "--max-steps", "5", "--resume"]


def test_launch_refuses_a_bad_process_count():
    from seq2onnx.model.distributed import DistributedError, launch

    with pytest.raises(DistributedError, match=r"--nproc 0: need at least 1 process"):
        launch(0, ["train", "OUT"])


def test_single_process_group_does_nothing():
    group = Group()
    assert group.broadcast({"a": 1}) == {"a": 1}
    t = torch.tensor([2.0])
    assert group.all_reduce_sum(t).item() == 2.0
    with pytest.raises(ValueError, match="boom"):
        group.agree(lambda: (_ for _ in ()).throw(ValueError("boom")))


def test_a_rank_s_exception_reaches_torchrun_s_error_file_whole(tmp_path, monkeypatch):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from seq2onnx.model import distributed

    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    def fails():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        distributed.recorded(fails)()
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(path))
    assert failure.message["message"] == "ValueError: boom" and failure.timestamp > 0  # torch's layout
    assert 'raise ValueError("boom")' in failure.message["extraInfo"]["py_callstack"]
    # Stopped while the JSON is made (torchrun's SIGTERM), the file is absent, never empty: torchrun's agent
    # fails on an empty one.
    path.unlink()
    monkeypatch.setattr(distributed.json, "dumps", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        distributed.recorded(fails)()
    assert not path.exists()
