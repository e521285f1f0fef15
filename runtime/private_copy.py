"""The private copy of a weights file that runtime/weights.py hands to onnxruntime: an unnamed file in the
temporary directory (O_TMPFILE on Linux: nothing is left behind whatever kills the process), filled by a
reflink where the file system has them, else copy_file_range, else reads and writes."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path

from .spec import BundleError

# Where the private copies are made (default: the temporary directory, tempfile.gettempdir()).
COPY_DIR_VARIABLE = "SEQ2ONNX_WEIGHTS_DIR"
FICLONE = 0x40049409  # Linux ioctl: share the blocks copy-on-write (btrfs, XFS), a copy in no time


def private_copy(source: int, size: int, path: Path) -> tuple[int, str | None]:
    """A descriptor of an unlinked file of this process holding the `size` bytes of `source`, and its
    directory where the file may be linked there again (O_TMPFILE without O_EXCL), else None.

    Raises:
        BundleError: the copy could not be made (naming the directory and the variable that moves it), or
            the file changed size while it was copied.
    """
    fd, where = target(size, path)
    try:
        fill(source, fd, size, path)
    except BaseException:
        os.close(fd)
        raise
    return fd, where


def copy_error(path: Path, where: str, size: int, e: OSError) -> BundleError:
    """The refusal of a copy that could not be made, naming the directory and the variable that moves it."""
    return BundleError(
        f"{path}: cannot make the private copy a server runs ({e.strerror or e}) in {where}; free space "
        f"there or point {COPY_DIR_VARIABLE} at a directory with {size} bytes free"
    )


def target(size: int, path: Path) -> tuple[int, str | None]:
    """An empty unnamed file for the private copy (private_copy), once `size` bytes are free where it goes.

    Raises:
        BundleError: no room, or the file could not be made (naming the directory and the variable).
    """
    where = os.environ.get(COPY_DIR_VARIABLE) or tempfile.gettempdir()
    try:
        free = shutil.disk_usage(where).free
        if free < size:  # before writing: an 8 GB file is refused at once, not after filling the disk
            raise OSError(errno.ENOSPC, f"{size} bytes to copy, {free} free")
        fd, linkable = unnamed(where)
    except OSError as e:
        raise copy_error(path, where, size, e) from None
    return fd, where if linkable else None


def fill(source: int, fd: int, size: int, path: Path) -> None:
    """Copies the `size` bytes of `source` into the empty file `fd`.

    Raises:
        BundleError: the copy failed (a full disk), or the file changed size while it was copied.
    """
    try:
        copied = copy_bytes(source, fd, size)
    except OSError as e:
        raise copy_error(path, os.environ.get(COPY_DIR_VARIABLE) or tempfile.gettempdir(), size, e) from None
    if copied != size or os.fstat(source).st_size != size:
        raise BundleError(
            f"{path}: changed size while it was read; re-export the bundle, or wait for the "
            "export that is writing it"
        )


def unnamed(where: str) -> tuple[int, bool]:
    """A new file in `where` that has no name (O_TMPFILE, on Linux: nothing is left behind whatever kills the
    process), and whether it can be given one later; elsewhere a temporary file unlinked at once."""
    if hasattr(os, "O_TMPFILE"):
        with contextlib.suppress(OSError):  # a file system without O_TMPFILE: the portable way below
            return os.open(where, os.O_TMPFILE | os.O_RDWR, 0o600), True
    with tempfile.TemporaryFile(dir=where) as out:
        return os.dup(out.fileno()), False


def link_open_file(fd: int, link: str) -> None:
    """Gives the unnamed file `fd` the name `link`: linkat(2) with AT_SYMLINK_FOLLOW on /proc/self/fd/N, which
    os.link does not call (it links the magic link itself, across devices).

    Raises:
        OSError: the kernel refused (the error it gave).
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, at_symlink_follow = -100, 0x400
    source = f"/proc/self/fd/{fd}".encode()
    if libc.linkat(at_fdcwd, source, at_fdcwd, os.fsencode(link), at_symlink_follow) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), link)


def copy_bytes(source: int, dest: int, size: int) -> int:
    """Copies `size` bytes from the start of `source` into `dest`: a reflink, else copy_file_range, else reads
    and writes. Returns the bytes copied (fewer where the source was truncated meanwhile)."""
    with contextlib.suppress(OSError, ImportError):
        import fcntl

        fcntl.ioctl(dest, FICLONE, source)
        return os.fstat(dest).st_size
    copied = 0
    while copied < size:
        try:
            n = os.copy_file_range(source, dest, size - copied, copied, copied)
        except (AttributeError, OSError):  # not Linux, or across file systems where the kernel refuses
            block = os.pread(source, min(8 << 20, size - copied), copied)
            n = os.pwrite(dest, block, copied) if block else 0
        if n == 0:
            break
        copied += n
    return copied
