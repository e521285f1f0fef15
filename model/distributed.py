"""Training across processes with DistributedDataParallel, launched by torchrun.

Each process runs the ordinary training entry. Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT in the environment) `start` joins the process group: `nccl` on CUDA
devices, `gloo` on the CPU. Outside torchrun it returns a single-process Group whose collectives
do nothing, so training code is written once.

Data: every rank builds the same length-sorted, shuffled token batches from the same seed, and
each global batch is cut into world_size contiguous parts, one per rank (`Group.shard`). A step
therefore sees the same examples whatever the number of processes, `--max-tokens` is the global
batch, and a position in the data (epoch, batch in the epoch) means the same thing for any N: a
run resumes with a different number of processes and continues the same trajectory.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from seq2onnx import atomic

T = TypeVar("T")

# Set by torchrun (and by any launcher that follows its conventions) in every worker.
ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

# How long a collective may wait for the slowest rank. Rank 0 validates and writes checkpoints
# while the others wait in the next collective, so this must cover a validation with BLEU decodes
# plus a checkpoint write of a large model; a killed rank is noticed at once regardless (torchrun
# tears the group down), so only a hung rank waits this long.
TIMEOUT = timedelta(minutes=30)


class DistributedError(RuntimeError):
    """A multi-process run that cannot start or cannot go on; the message names the rank and the fix."""


def in_torchrun() -> bool:
    """Tells whether this process was started by torchrun.

    Returns:
        True when all of ENV are set.
    """
    return all(name in os.environ for name in ENV)


def is_main() -> bool:
    """Tells whether this process prints summaries.

    Returns:
        True outside torchrun and in rank 0 (RANK unset or "0").
    """
    return os.environ.get("RANK", "0") == "0"


@dataclass
class Group:
    """This process's place in the run; a single-process run is rank 0 of 1 with `active` False.

    Attributes:
        rank: this process's rank.
        world_size: the number of processes.
        local_rank: its rank on this node.
        device: the device it trains on.
        active: a process group was initialised (and must be destroyed).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    active: bool = False  # a process group was initialised (and must be destroyed)

    @property
    def is_main(self) -> bool:
        """True in rank 0: the rank that validates, logs and writes checkpoints."""
        return self.rank == 0

    def shard(self, batch: list[int]) -> list[int]:
        """Cuts this rank's contiguous part out of a global batch.

        The parts of all ranks, in rank order, are the batch.

        Args:
            batch: the global batch's example indices.

        Returns:
            This rank's part; empty when the batch has fewer examples than ranks.
        """
        q, r = divmod(len(batch), self.world_size)
        start = self.rank * q + min(self.rank, r)
        return batch[start : start + q + (self.rank < r)]

    def agree(self, fn: Callable[[], T]) -> T:
        """Runs fn on every rank; if it raised on any rank, raises on all of them.

        Without this, a rank that fails while the others go on leaves them waiting in the next
        collective until TIMEOUT.

        Args:
            fn: the work to run (a check, a read).

        Returns:
            What fn returned on this rank.

        Raises:
            Exception: a failing rank raises its own exception.
            DistributedError: on the other ranks, quoting the first failing rank's message.
        """
        if not self.active:
            return fn()
        error: BaseException | None = None
        result = None
        try:
            result = fn()
        except Exception as e:  # gathered, then raised on every rank below
            error = e
        errors: list[Any] = [None] * self.world_size
        dist.all_gather_object(errors, None if error is None else f"{type(error).__name__}: {error}")
        if error is not None:
            raise error
        failed = [(rank, message) for rank, message in enumerate(errors) if message is not None]
        if failed:
            rank, message = failed[0]
            raise DistributedError(f"rank {rank} failed, so rank {self.rank} stops too: {message}")
        return result  # type: ignore[return-value]

    def broadcast(self, obj: T) -> T:
        """Sends rank 0's obj to every rank.

        Args:
            obj: a picklable object (train state, a tokenizer's models); ignored on ranks other than 0.

        Returns:
            Rank 0's obj (obj itself in a single process).
        """
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sums a tensor element-wise over ranks, in place.

        Args:
            tensor: on this rank's device.

        Returns:
            The same tensor, now holding the sum.
        """
        if self.active:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def close(self, clean: bool = True) -> None:
        """Leaves the process group, in order, on every rank (a no-op for a single process).

        First the objects that still hold the group go: DistributedDataParallel's reducer sits in
        reference cycles, so without a collection here it (and with it gloo's worker threads) is
        freed at some later moment, possibly while the interpreter shuts down, where a native
        thread still joinable aborts the process ("terminate called without an active
        exception") after a run that trained and saved. Then, after a clean run, a barrier: no
        rank tears its connections down while another still uses them. After an error there is no
        barrier (a peer may be gone and would never arrive). Then the group is destroyed.

        Args:
            clean: the run ended without an error on this rank.
        """
        if self.active and dist.is_initialized():
            gc.collect()
            if clean:
                dist.barrier()
            dist.destroy_process_group()
            gc.collect()
        self.active = False


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise DistributedError(
            f"{name}={value!r} is not an integer; start the run with torchrun, which sets it"
        ) from None


def start(device: torch.device) -> Group:
    """Joins torchrun's process group, or returns a single-process Group outside torchrun.

    Args:
        device: the device the options chose (pick_device): on CUDA each rank takes cuda:LOCAL_RANK
            and the backend is nccl; otherwise gloo.

    Returns:
        This process's Group.

    Raises:
        DistributedError: this node has fewer CUDA devices than processes, an environment
            variable is not an integer, or the group cannot be formed.
    """
    if not in_torchrun():
        return Group(device=device)
    rank, world_size, local_rank = _env_int("RANK"), _env_int("WORLD_SIZE"), _env_int("LOCAL_RANK")
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise DistributedError(
                f"rank {rank} has LOCAL_RANK {local_rank}, but this node has {count} CUDA device(s); "
                f"start at most {count} processes per node (--nproc-per-node {count}) or train with --device "
                "cpu"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    try:
        dist.init_process_group(
            backend,
            rank=rank,
            world_size=world_size,
            timeout=TIMEOUT,
            device_id=device if device.type == "cuda" else None,
        )
    except Exception as e:  # the store or backend raise several types for the same problem
        raise DistributedError(
            f"rank {rank} of {world_size} could not join the {backend} process group at "
            f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}: {e}; check that every node reaches "
            "that address and that all ranks were started"
        ) from e
    return Group(rank=rank, world_size=world_size, local_rank=local_rank, device=device, active=True)


def describe_failure(group: Group, error: BaseException, step: int) -> DistributedError:
    """Builds the error a rank raises when a collective fails mid-run: a peer died or hung.

    Args:
        group: this process's group.
        error: the collective's error (its first line is quoted).
        step: the last step trained.

    Returns:
        A DistributedError that tells how to resume.
    """
    return DistributedError(
        f"rank {group.rank} of {group.world_size} lost the process group at step {step}: another rank "
        "stopped, was killed or timed out (torchrun's summary names it). The last checkpoint is intact: "
        "continue with --resume (any number of processes). Cause: "
        f"{str(error).splitlines()[0] if str(error) else type(error).__name__}"
    )


def is_collective_failure(error: BaseException) -> bool:
    """Tells the errors gloo and nccl raise when a peer disappears or a collective times out.

    Args:
        error: an exception raised during training.

    Returns:
        True for such an error.
    """
    if isinstance(error, dist.DistError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        s in text
        for s in ("Connection closed by peer", "Connection reset by peer", "Timed out", "NCCL", "Gloo")
    )


# -- launching ---------------------------------------------------------------------------------


def recorded(fn: Callable[..., T]) -> Callable[..., T]:
    """fn, whose exception is written to the file torchrun reads (TORCHELASTIC_ERROR_FILE) before it goes on.

    What torch's `record` does, with the file written aside and renamed. torch's opens the file, then writes
    the JSON; torchrun's agent, which SIGTERMs the other ranks as soon as one fails, can stop this rank
    between the two, then fail itself on the empty file (a JSONDecodeError in torchrun instead of its summary;
    seen in a full test run, tests/test_ddp.py's killed rank). Renamed into place, the file is whole or
    absent.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            path = os.environ.get("TORCHELASTIC_ERROR_FILE")
            if path:  # torch's layout (ProcessFailure reads message, extraInfo.py_callstack and timestamp)
                info = {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))}
                message = {"message": {"message": f"{type(e).__name__}: {e}", "extraInfo": info}}
                atomic.write_file(path, json.dumps(message))
            raise

    return wrapper


def without_option(argv: list[str], flag: str) -> list[str]:
    """Removes `flag VALUE` and `flag=VALUE` from a command line.

    Args:
        argv: the command line.
        flag: the option to drop (e.g. --nproc, which the workers must not see).

    Returns:
        A new list without it.
    """
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out


def launch(nproc: int, argv: list[str]) -> int:
    """Runs `torchrun --standalone --nproc-per-node nproc -m seq2onnx.commands *argv` in this process.

    It goes through torch.distributed.run; --standalone picks a free port on this machine. On
    failure torchrun's summary (which rank failed first, its exit code or signal, its error) goes
    to stderr.

    Args:
        nproc: the number of processes.
        argv: the `seq2onnx` command line without --nproc, e.g. ["train", "OUT", "--max-steps", "100"].

    Returns:
        0 when every rank succeeded, 1 otherwise.

    Raises:
        DistributedError: nproc < 1, or called inside a torchrun worker.
    """
    if nproc < 1:
        raise DistributedError(
            f"--nproc {nproc}: need at least 1 process; use the number of GPUs (or CPU workers)"
        )
    if in_torchrun():
        raise DistributedError(
            "--nproc was given inside a torchrun worker (RANK is set); "
            "either launch with torchrun or with --nproc, not both"
        )
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(["--standalone", "--nproc-per-node", str(nproc), "-m", "seq2onnx.commands", *argv])
    try:
        run(args)
    except ChildFailedError as e:
        print(e.format_msg(), file=sys.stderr)
        return 1
    return 0
