"""One build per test run of each expensive fixture (tiny trained runs, bundles, Hugging Face models),
shared by every pytest-xdist worker of the run, and the trained ones kept between runs on this machine.

Each worker is its own process, so a per-process cache (functools.lru_cache) would train and export the
same tiny models once per worker. Here the first worker to ask builds aside and renames into place under
a lock; the others wait on the lock and reuse the result. The root is keyed by xdist's run id, so two runs
never share (or delete) each other's builds; the controller (or a run without xdist) removes it at exit.

Training is deterministic here (one thread, fixed seeds: the same bytes each time), and the trained fixtures
are most of the suite's fixture time (about 20 s of CPU each). A build given `keep_by` (the source files that
decide its output) is also kept in the machine's cache, keyed by its name, the bytes of those files and the
versions of the libraries it runs, and the next run copies it from there instead of training again. A change
to any of those files or versions builds it afresh. SEQ2ONNX_TEST_CACHE names the cache folder (default
~/.cache/seq2onnx-tests, or under XDG_CACHE_HOME); SEQ2ONNX_TEST_CACHE=off builds everything in every run,
as CI does (.ci/run), so that the builders themselves stay tested.
"""

from __future__ import annotations

import atexit
import fcntl
import glob
import hashlib
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable, Iterator

_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")
# What a kept build's bytes depend on besides its own sources.
_LIBRARIES = ("numpy", "safetensors", "sentencepiece", "tokenizers", "torch", "transformers")


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


def build_once(name: str, build: Callable[[Path], object], keep_by: Iterable[Path] = ()) -> Path:
    """ROOT/name, built by `build(path)` (which creates `path`) once per test run, whichever worker asks first.

    With `keep_by` (the source files that decide what `build` writes), the build is also kept in the
    machine's cache (the module's docstring) and copied from there while those files are unchanged.

    A build that fails leaves nothing under `name`: the next caller tries again (and fails alike).
    """
    final = ROOT / name
    if final.is_dir():
        return final
    with open(ROOT / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if final.is_dir():
            return final
        kept = _kept_path(name, keep_by)
        aside = Path(tempfile.mkdtemp(prefix=f"{name}.partial-", dir=ROOT))
        try:
            if not (kept is not None and _copied(kept, aside / name)):
                build(aside / name)
                if kept is not None:
                    _keep(aside / name, kept)
            (aside / name).rename(final)
        finally:
            shutil.rmtree(aside, ignore_errors=True)
    return final


def _cache_dir() -> Path | None:
    chosen = os.environ.get("SEQ2ONNX_TEST_CACHE")
    if chosen is not None:
        return None if chosen.lower() in ("", "0", "off", "no", "false") else Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "seq2onnx-tests"


def _kept_path(name: str, keep_by: Iterable[Path]) -> Path | None:
    """Where the machine's cache keeps `name` as built from these sources and libraries; None: not kept."""
    sources, cache = sorted(Path(p).resolve() for p in keep_by), _cache_dir()
    if not sources or cache is None:
        return None
    digest = hashlib.sha256(f"{name}\0{sys.version}\0".encode())
    for library in _LIBRARIES:
        try:
            digest.update(f"{library}={metadata.version(library)}\0".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{library}=absent\0".encode())
    for source in sources:
        digest.update(f"{source.name}\0".encode() + source.read_bytes() + b"\0")
    return cache / f"{name}-{digest.hexdigest()[:20]}"


def _copied(kept: Path, out: Path) -> bool:
    """Copies a kept build to `out`; False (and nothing at `out`) when there is none or it went meanwhile."""
    try:
        shutil.copytree(kept, out, symlinks=True)
        return True
    except OSError:  # absent, or removed by a run of other sources while copied
        shutil.rmtree(out, ignore_errors=True)
        return False


def _keep(built: Path, kept: Path) -> None:
    """Copies a fresh build into the machine's cache, replacing that name's builds from other sources;
    a cache that cannot be written costs only the next run's build."""
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{kept.name}.partial-", dir=kept.parent))
        try:
            shutil.copytree(built, partial / "b", symlinks=True)
            os.rename(partial / "b", kept)  # whole or absent; a concurrent run's copy may have won
        except OSError:
            pass
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        stem = kept.name[: -len(kept.name.rsplit("-", 1)[1])]
        for older in kept.parent.glob(f"{glob.escape(stem)}*"):
            if older != kept and older.is_dir() and len(older.name) == len(kept.name):
                shutil.rmtree(older, ignore_errors=True)
    except OSError:
        pass


@contextmanager
def exclusive(name: str) -> Iterator[None]:
    """Holds ROOT/name.lock for the block: the workers of one run take turns at what must not overlap (two local
    Ray instances started together on this machine: Ray Serve's proxy then died at start, 1 run in 3 with 3
    workers)."""
    with open(ROOT / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        yield
