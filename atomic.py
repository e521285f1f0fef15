"""Outputs written whole: every file and directory this package writes goes through here.

A file is written to a temporary file beside it and renamed over it when complete (os.replace is
atomic within a directory), with the mode a plain open() would give it, or the mode of the file
it replaces: a reader sees the old file or the new one, never half of one, even after an error or
Ctrl-C. A directory is built in a temporary sibling, under a lock beside it, and swapped in by
`replace_dir`. This module imports nothing of the package, so every layer may use it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import stat
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator, Mapping


# Written into every directory `building` makes: `--force` replaces a directory only when it holds
# this file (or the caller recognises it otherwise), so that it never empties a folder of the user's.
MARKER = ".seq2onnx-output"


class OutputError(ValueError):
    """An output that cannot be written where asked: the message names the path and the fix."""


def _temp_beside(path: Path) -> tuple[int, Path]:
    """mkstemp beside path; an error names `path` (what the user asked for), not the temporary file."""
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    except OSError as e:
        raise OutputError(
            f"cannot write {path}: {e.strerror or e} (in {path.parent}); choose a writable directory"
        ) from None
    return fd, Path(name)


def _default_mode(path: Path, directory: bool = False) -> int:
    """The mode of the file being replaced, or what open() / mkdir() would give a new one."""
    if not directory and path.exists():
        return stat.S_IMODE(path.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


class AtomicFile:
    """A file written beside `path` and renamed over it by commit(); discard() leaves `path` as it was.

    Use as a context manager (commit on success, discard on an exception) or call commit/discard.

    Args:
        path: the file to write; its directory must exist.
        text: open the temporary file as UTF-8 text with "\\n" newlines instead of binary.

    Raises:
        OutputError: the directory cannot be written (the message names `path`).

    Attributes:
        file: the open temporary file to write to.
        temp: its path (".NAME.XXXX.partial" beside `path`).
    """

    def __init__(self, path: str | os.PathLike[str], *, text: bool = False):
        self.path = Path(path)
        self.mode = _default_mode(self.path)
        fd, self.temp = _temp_beside(self.path)
        self.file: IO = os.fdopen(fd, "w", encoding="utf-8", newline="\n") if text else os.fdopen(fd, "wb")

    def commit(self) -> None:
        """Closes the file and renames it over `path`, with `path`'s mode (mkstemp makes it 0600)."""
        self.file.close()
        os.chmod(self.temp, self.mode)
        os.replace(self.temp, self.path)

    def discard(self) -> None:
        """Closes and removes the temporary file."""
        self.file.close()
        self.temp.unlink(missing_ok=True)

    def __enter__(self) -> IO:
        return self.file

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()


def write_file(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Writes `data` (UTF-8 text or bytes) to `path` atomically.

    Args:
        path: the file; its directory must exist.
        data: the whole content.

    Returns:
        The path.
    """
    with AtomicFile(path, text=isinstance(data, str)) as f:
        f.write(data)
    return Path(path)


@contextmanager
def temp_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside `path` for a writer that takes a path (pyarrow's).

    The temporary file is renamed over `path`, with its mode, when the block ends without error and
    removed when it raises.

    Args:
        path: the file to write; its directory must exist.

    Yields:
        The temporary path (".NAME.XXXX.partial" beside `path`).

    Raises:
        OutputError: the directory cannot be written (the message names `path`).
    """
    path = Path(path)
    mode = _default_mode(path)
    fd, temp = _temp_beside(path)
    os.close(fd)
    try:
        yield temp
        os.chmod(temp, mode)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def temp_dir(parent: Path, prefix: str) -> Path:
    """Makes a new empty directory in `parent`, with a plain mkdir's mode (not mkdtemp's 0700).

    Args:
        parent: the directory to make it in.
        prefix: the start of its name (a random part follows).

    Returns:
        The new directory.
    """
    temp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(temp, _default_mode(temp, directory=True))
    return temp


def _exchange(a: Path, b: Path) -> bool:
    """Swaps two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where the system cannot."""
    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    # file system or kernel lacks it
    if ctypes.get_errno() in (errno.EINVAL, errno.ENOSYS, errno.EXDEV, errno.EPERM):
        return False
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(b))


def replace_dir(temp: Path, out: Path) -> None:
    """Moves the finished directory `temp` to `out` (a sibling of it), replacing an existing `out`.

    Where the system can (Linux), the two are exchanged in one step, so `out` never ceases to exist;
    elsewhere the old `out` is first moved aside and put back if the last rename fails. Either way
    a reader sees the old directory or the new one, never a mix, and a failure leaves what was there.

    Args:
        temp: the finished directory.
        out: where it goes; an existing directory there is replaced.

    Raises:
        OSError: a rename fails (the old `out` is left in place).
    """
    if not out.exists():
        os.replace(temp, out)
        return
    if _exchange(temp, out):
        shutil.rmtree(temp, ignore_errors=True)  # `temp` now holds the old directory
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}-old-", dir=out.parent))
    os.replace(out, old / out.name)
    try:
        os.replace(temp, out)
    except OSError:
        os.replace(old / out.name, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def refuse_overlap(
    out: str | os.PathLike[str],
    inputs: Mapping[str, str | os.PathLike[str]],
    error: type[Exception] = OutputError,
) -> None:
    """Refuses an output that is, contains or is inside one of the inputs (links followed).

    Args:
        out: the file or directory to write.
        inputs: what the command reads, by what it is called in a message ("the checkpoint", ...).
        error: the exception type to raise.

    Raises:
        error: naming the output, the input and the fix.
    """
    where = Path(out).resolve()
    for name, path in inputs.items():
        for source in {Path(os.path.abspath(path)), Path(path).resolve()}:  # a link (run/last) and its target
            if where == source or source in where.parents or where in source.parents:
                raise error(
                    f"the output {out} overlaps {name} {path} (it is, holds or lies inside it): "
                    "writing there would destroy what is being read; choose an output outside it"
                )


def check_replaceable(
    out: Path, ours: Callable[[Path], bool] | None, what: str, error: type[Exception] = OutputError
) -> None:
    """With --force, `out` may be replaced only if it is empty or something this package wrote.

    Args:
        out: an existing output path.
        ours: tells whether a directory without the MARKER file was written by this package (a
            bundle exported before the marker existed, a run ...); None: the marker alone.
        what: what is written, for messages.
        error: the exception type to raise.

    Raises:
        error: `out` is a file, or a non-empty directory that `ours` does not recognise.
    """
    if not out.is_dir() or out.is_symlink():
        raise error(
            f"{out} exists and is not a directory; refusing to replace it with a {what}: "
            "choose another output or remove it yourself"
        )
    if any(out.iterdir()) and not ((out / MARKER).is_file() or (ours is not None and ours(out))):
        raise error(
            f"{out} is a non-empty directory that seq2onnx did not write (not a {what}); --force replaces "
            "only what seq2onnx wrote: choose another output or empty it yourself"
        )


def _check_existing(
    out: Path,
    force: bool,
    what: str,
    error: type[Exception],
    ours: Callable[[Path], bool] | None,
    why: str,
) -> None:
    """Refuse an existing `out` without force, or one force may not replace (`why` adds to the message)."""
    if out.exists() and not force:
        raise error(f"{out} already exists{why}; pass --force to replace it")
    if out.exists():
        check_replaceable(out, ours, what, error)


@contextmanager
def building(
    out: str | os.PathLike[str],
    force: bool,
    what: str = "output",
    error: type[Exception] = OutputError,
    *,
    inputs: Mapping[str, str | os.PathLike[str]] | None = None,
    ours: Callable[[Path], bool] | None = None,
) -> Iterator[Path]:
    """A temporary sibling directory of `out` to write `what` into, under out's lock.

    Renamed onto `out` (replace_dir) when the block ends without error, removed when it raises.
    Refuses an existing `out` without force, checked again under the lock: another writer may
    have finished meanwhile. Of two writers to one place started together exactly one succeeds.

    Args:
        out: the directory to write.
        force: replace an existing `out` (only an empty one or one that `ours` recognises).
        what: what is written, for messages ("bundle", "site", ...).
        error: the exception type to raise (the caller's own, e.g. ExportError).
        inputs: what the command reads; an output that is, holds or lies inside one is refused.
        ours: recognises a directory this package wrote (check_replaceable).

    Yields:
        The temporary directory.

    Raises:
        error: `out` overlaps an input, exists without force, is not ours to replace, another writer
            holds its lock, or it cannot be written.
    """
    out = Path(out)
    refuse_overlap(out, inputs or {}, error)
    _check_existing(out, force, what, error, ours, "")
    parent = out.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise error(f"cannot write the {what} at {out}: {e.strerror}; choose a writable directory") from e
    with OutputLock(out, what, error):
        _check_existing(out, force, what, error, ours, f" (written by another {what} meanwhile)")
        try:
            tmp = temp_dir(parent, f".{out.name}.tmp-")
        except OSError as e:
            raise error(f"cannot write the {what} at {out}: {e.strerror}; choose a writable directory") from e
        try:
            yield tmp
            (tmp / MARKER).write_text(
                f"written by seq2onnx: a {what}; `--force` may replace this directory\n"
            )
            replace_dir(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


class OutputLock:
    """An exclusive lock on one output path, held while it is written: `.NAME.lock` beside it.

    Without it two writers to one place both report success and the later rename silently
    replaces the earlier output. flock (not O_EXCL) so that a killed writer leaves no stale lock:
    the kernel drops the lock with the process. The file is removed on release; a waiter that
    opened the removed file sees a different inode from the path's and reports the lock as taken.
    Use as a context manager: entering takes the lock, leaving releases it.

    Args:
        out: the output path.
        what: what is written, for messages.
        error: the exception type to raise.

    Raises:
        error: on entering, when the lock file cannot be made or another writer holds the lock.
    """

    def __init__(self, out: Path, what: str = "output", error: type[Exception] = OutputError):
        self.out, self.what, self.error = out, what, error
        self.path = out.resolve().parent / f".{out.name}.lock"
        self.fd: int | None = None

    def __enter__(self) -> "OutputLock":
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise self.error(
                f"cannot write the {self.what} at {self.out}: {e.strerror} ({self.path}); "
                "choose a writable directory"
            ) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.ENOENT):
                os.close(fd)
                raise
            same = False
        if not same:
            os.close(fd)
            raise self.error(
                f"another export is writing {self.out} right now (it holds {self.path}); "
                "wait for it to finish, or export to another directory"
            )
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)  # while still locked, so no waiter can take the removed file
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None
