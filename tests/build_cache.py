"""One build per test run of each expensive fixture (tiny trained runs, bundles, Hugging Face models),
shared by every pytest-xdist worker of the run.

Each worker is its own process, so a per-process cache (functools.lru_cache) would train and export the
same tiny models once per worker. Here the first worker to ask builds aside and renames into place under
a lock; the others wait on the lock and reuse the result. The root is keyed by xdist's run id, so two runs
never share (or delete) each other's builds; the controller (or a run without xdist) removes it at exit.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")


def _make_root() -> Path:
    if _RUN is None:  # one process: its own directory, removed when it exits
        root = Path(tempfile.mkdtemp(prefix="seq2onnx-tests-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        return root
    root = Path(tempfile.gettempdir()) / f"seq2onnx-tests-{_RUN}"
    root.mkdir(exist_ok=True)
    return root


ROOT = _make_root()


def shared_root_of_run(run_id: str) -> Path:
    """The directory the workers of xdist run `run_id` share (for the controller to remove at the end)."""
    return Path(tempfile.gettempdir()) / f"seq2onnx-tests-{run_id}"


def build_once(name: str, build: Callable[[Path], object]) -> Path:
    """ROOT/name, built by `build(path)` (which creates `path`) once per test run, whichever worker asks first.

    A build that fails leaves nothing under `name`: the next caller tries again (and fails alike).
    """
    final = ROOT / name
    if final.is_dir():
        return final
    with open(ROOT / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if final.is_dir():
            return final
        aside = Path(tempfile.mkdtemp(prefix=f"{name}.partial-", dir=ROOT))
        try:
            build(aside / name)
            (aside / name).rename(final)
        finally:
            shutil.rmtree(aside, ignore_errors=True)
    return final


@contextmanager
def exclusive(name: str) -> Iterator[None]:
    """Holds ROOT/name.lock for the block: the workers of one run take turns at what must not overlap (two local
    Ray instances started together on this machine: Ray Serve's proxy then died at start, 1 run in 3 with 3
    workers)."""
    with open(ROOT / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        yield
