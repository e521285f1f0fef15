"""A bundle's weights file: every graph's large initializers, each stored once (spec/bundle.json's `weights`).

The exporter (export/weights.py) moves the graphs' large initializers into one file, `files.weights`,
as ONNX external data. Here the runtime

- makes the file its own before anything uses it: a private copy that no other process can name (an
  unlinked file in the temporary directory, O_TMPFILE on Linux; a reflink where the file system has them,
  else copy_file_range). onnxruntime memory-maps that copy and frees what it has packed into its own layout
  (docs/optimisation-notes.md row 29), so a weight still costs one copy in memory, and rewriting or
  truncating the bundle's `weights.bin` under a running server changes nothing it runs: no mix of two models,
  no SIGBUS (a mapping of a file truncated under it faults). The cost is the copy's time (page cache to page
  cache) and its disk space while the process lives;
- checks the copy: its size against files.weights.size before a byte is read (bundles exported before that
  field have none), its sha256 against files.weights.sha256 at every load (hashed in a thread while the
  sessions are made, `defer`). The CRC-32 that exports also write (spec's weights.checksum) is no longer
  enough alone: an edit can fix up a CRC-32, not a sha256;
- checks every graph's references before onnxruntime follows them (the name of the file, whole
  numbers inside it, aligned, the length of the tensor), so a damaged or crafted graph is refused by
  name rather than read from the wrong bytes or from outside the bundle;
- points onnxruntime at the copy: a private directory, made for the session's creation and removed after
  it, whose one entry is a link to `/proc/self/fd/N` of the copy held open (or `/dev/fd/N`); where the OS
  has neither, onnxruntime gets the copy's bytes (WeightsFile.open_session).

A bundle without `files.weights` (before 0.4) keeps its weights inside each graph file, as before.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import mmap
import os
import shutil
import tempfile
import threading
import weakref
import zlib
from pathlib import Path

from .onnx_info import GraphInfo
from .spec import (
    ELEMENT_BYTES,
    SIZE_FIELD,
    WEIGHTS_ALIGNMENT,
    WEIGHTS_CHECKSUM,
    WEIGHTS_CHECKSUM_DIGITS,
    BundleError,
)

# onnxruntime's session option: where the external data of a model loaded from bytes lies.
FOLDER_OPTION = "session.model_external_initializers_file_folder_path"
# Where the private copies are made (default: the temporary directory, tempfile.gettempdir()).
COPY_DIR_VARIABLE = "SEQ2ONNX_WEIGHTS_DIR"
FICLONE = 0x40049409  # Linux ioctl: share the blocks copy-on-write (btrfs, XFS), a copy in no time


class WeightsFile:
    """The weights file of a bundle read: copied privately, checked, held open, and handed to onnxruntime.

    Attributes:
        path: the bundle's file (for messages).
        name: its name in the bundle (files.weights.path), the location every reference must give.
        size: its size in bytes as copied.
        sha256: bundle.json's sha256 of the file, once the copy was checked against it; None where it was not
            checked.
        checked_by: "sha256" where the copy is held to bundle.json's sha256, else None.
    """

    def __init__(self, path: Path, name: str, size: int, file_fd: int, sha256: str | None = None,
                 where: str | None = None):
        self.path, self.name, self.size, self.sha256 = path, name, size, sha256
        self._where = where  # the copy's directory where it can be named again (O_TMPFILE), else None
        self.checked_by = "sha256" if sha256 is not None else None
        self._file_fd = file_fd  # the private copy: held while a session may still be made
        weakref.finalize(self, os.close, file_fd)

    def _start_hash(self, expected: str) -> None:
        """Hashes the copy in a thread (os.pread: the descriptor's offset is not moved)."""
        fd, outcome = os.dup(self._file_fd), {}

        def run():
            try:
                outcome["same"] = _checksum(fd, "sha256") == expected
            except OSError as e:
                outcome["error"] = e
            finally:
                os.close(fd)

        self._hashing = threading.Thread(target=run, name="seq2onnx-weights-sha256", daemon=True)
        self._outcome = outcome
        self._hashing.start()

    def verify(self) -> None:
        """Waits for a deferred hash (read_weights' `defer`); nothing to do where it was checked already.

        Raises:
            BundleError: the file's sha256 differs from bundle.json's, or it could not be read.
        """
        hashing = getattr(self, "_hashing", None)
        if hashing is None:
            return
        hashing.join()
        outcome = self._outcome
        if "error" in outcome:
            raise BundleError(
                f"{self.path}: cannot be read ({outcome['error']}) (files.weights in bundle.json)"
            )
        if not outcome.get("same"):
            raise BundleError(f"{self.path}: {_differs('sha256')} (files.weights in bundle.json)")
        self._hashing = None

    def _link(self) -> tuple[str, int | None] | None:
        """A fresh private directory whose entry `name` is the copy held open (a hard link: onnxruntime
        refuses a symbolic one to an unlinked file), and a descriptor to close once the session is made (or
        None); None where the OS cannot name an unlinked file again.

        The kernel lets an unnamed file (O_TMPFILE) be linked only until its first link is gone: a session
        made later (the standard decoder, loaded when first needed) links a fresh private copy of the copy,
        so that onnxruntime still maps a file rather than holding the bytes twice."""
        if self._where is None or not os.path.isdir("/proc/self/fd"):
            return None
        folder = tempfile.mkdtemp(prefix="seq2onnx-weights-", dir=self._where)  # 0700: only this user enters
        link = os.path.join(folder, self.name)
        fresh = None
        try:
            os.makedirs(os.path.dirname(link), exist_ok=True)  # a nested files.weights.path
            try:
                _link_open_file(self._file_fd, link)
            except FileNotFoundError:  # linked once already, and that link is gone
                fresh, where = _private_copy(self._file_fd, self.size, self.path)
                if where is None:
                    raise
                _link_open_file(fresh, link)
        except (OSError, BundleError):
            if fresh is not None:
                os.close(fresh)
            shutil.rmtree(folder, ignore_errors=True)
            return None
        return folder, fresh

    def open_session(self, create):
        """Makes a session whose external data onnxruntime reads from the private copy.

        onnxruntime maps the copy itself (on the CPU; what it packs into its own layout is the only copy it
        keeps) through a link made for this call and removed after it: the mapping outlives the link. Where
        the OS cannot name an open file, it is given the copy's bytes instead (a weight then costs a copy more
        while that session lives).

        Args:
            create: create(configure) makes the session, calling configure(session_options) first.

        Returns:
            What create returned.
        """
        linked = self._link()
        if linked is not None:
            folder, fresh = linked
            try:
                return create(lambda options: options.add_session_config_entry(FOLDER_OPTION, folder))
            finally:
                shutil.rmtree(folder, ignore_errors=True)
                if fresh is not None:
                    os.close(fresh)  # the session's mapping keeps what it reads
        with mmap.mmap(self._file_fd, 0, access=mmap.ACCESS_READ) as held:
            data = memoryview(held)
            try:
                return create(
                    lambda options: options.add_external_initializers_from_files_in_memory(
                        [self.name], [data], [len(data)]
                    )
                )
            finally:
                data.release()

    def copy_to(self, dest: Path) -> None:
        """Copies the file as checked into `dest` (`seq2onnx web`'s site), hashing the copy again.

        Raises:
            BundleError: the file changed since it was checked (naming it and the fix).
        """
        h = hashlib.sha256()
        with open(dest, "wb") as out:
            offset = 0
            while block := os.pread(self._file_fd, 8 << 20, offset):
                h.update(block)
                out.write(block)
                offset += len(block)
        if self.sha256 is not None and h.hexdigest() != self.sha256:
            raise BundleError(
                f"{self.path}: changed since it was read (sha256 differs from bundle.json); re-export "
                "the bundle, or wait for the export that is writing it"
            )


@contextlib.contextmanager
def verified(weights: WeightsFile | None):
    """Runs the block, then waits for a deferred hash of `weights` (WeightsFile.verify); where the block
    fails, a file that differs is the error raised instead (a damaged file named as such, not as whatever
    it broke). None: nothing to wait for.

    Raises:
        BundleError: the weights file's checksum differs from bundle.json's.
    """
    try:
        yield
    except BaseException:
        if weights is not None:
            weights.verify()
        raise
    if weights is not None:
        weights.verify()


def read_weights(
    path: Path, name: str, entry: dict | None, opener, dir_fd: int | None = None, *, defer: bool = False
) -> WeightsFile:
    """Makes a private copy of a weights file (a regular file of files.weights.size bytes where bundle.json
    records one) and checks the copy's sha256 against bundle.json's.

    With `defer`, the hash is computed in a thread while the caller makes its sessions (onnxruntime's
    session creation lets go of the GIL, so it costs the load no more than the sessions' own time where a
    core is free); WeightsFile.verify() waits for it and refuses a file that differs.

    Args:
        path: the file's path (for messages).
        name: files.weights.path.
        entry: bundle.json's files.weights (its sha256, and its size where the export wrote one); without
            a sha256 (or None) the copy is not hashed.
        opener: opens the file relative to the directory held open (runtime/bundle.py's _Directory), with
            opener(name, size=N) refusing a file of another size before reading it.
        dir_fd: unused (the copy is private; kept for callers of the earlier signature).
        defer: hash in a thread; the caller calls verify() before using what it made from the file.

    Returns:
        The checked file.

    Raises:
        BundleError: missing, not a regular file, of another size than bundle.json's, not copied (its
            directory full or not writable: the message names it), or a sha256 that differs (naming the
            file and the fix).
    """
    expected = None if entry is None else entry.get("sha256")
    with opener(name, size=None if entry is None else entry.get(SIZE_FIELD)) as f:
        size = os.fstat(f.fileno()).st_size
        held, where = _private_copy(f.fileno(), size, path)
    try:
        if expected is not None and not defer and _checksum(held, "sha256") != expected:
            raise BundleError(f"{path}: {_differs('sha256')}")
    except BaseException:
        os.close(held)
        raise
    weights = WeightsFile(path, name, size, held, expected, where)
    if expected is not None and defer:
        weights._start_hash(expected)
    return weights


def _private_copy(source: int, size: int, path: Path) -> tuple[int, str | None]:
    """A descriptor of an unlinked file of this process holding the `size` bytes of `source`, and its
    directory where the file may be linked there again (O_TMPFILE without O_EXCL), else None.

    Raises:
        BundleError: the copy could not be made (naming the directory and the variable that moves it), or
            the file changed size while it was copied.
    """
    where = os.environ.get(COPY_DIR_VARIABLE) or tempfile.gettempdir()
    try:
        free = shutil.disk_usage(where).free
        if free < size:  # before writing: an 8 GB file is refused at once, not after filling the disk
            raise OSError(errno.ENOSPC, f"{size} bytes to copy, {free} free")
        fd, linkable = _unnamed(where)
        try:
            copied = _copy(source, fd, size)
        except BaseException:
            os.close(fd)
            raise
    except OSError as e:
        raise BundleError(
            f"{path}: cannot make the private copy a server runs ({e.strerror or e}) in {where}; free space "
            f"there or point {COPY_DIR_VARIABLE} at a directory with {size} bytes free"
        ) from None
    if copied != size or os.fstat(source).st_size != size:
        os.close(fd)
        raise BundleError(f"{path}: changed size while it was read; re-export the bundle, or wait for the "
                          "export that is writing it")
    return fd, where if linkable else None


def _unnamed(where: str) -> tuple[int, bool]:
    """A new file in `where` that has no name (O_TMPFILE, on Linux: nothing is left behind whatever kills the
    process), and whether it can be given one later; elsewhere a temporary file unlinked at once."""
    if hasattr(os, "O_TMPFILE"):
        with contextlib.suppress(OSError):  # a file system without O_TMPFILE: the portable way below
            return os.open(where, os.O_TMPFILE | os.O_RDWR, 0o600), True
    with tempfile.TemporaryFile(dir=where) as out:
        return os.dup(out.fileno()), False


def _link_open_file(fd: int, link: str) -> None:
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


def _copy(source: int, dest: int, size: int) -> int:
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


def _differs(kind: str) -> str:
    return (
        f"{kind} differs from bundle.json (files.weights); the file is damaged or was replaced: "
        "re-export the bundle"
    )


def _checksum(fd: int, kind: str) -> str:
    """The checksum of an open file as bundle.json writes it ("crc32": 8 lowercase hex digits, zlib's CRC-32;
    "sha256": its hex digest), read with os.preadv (the descriptor's offset stays) into one reused 1 MiB
    buffer: a fresh block per read was fresh pages for the kernel to fault in, 8% of the hash's time (0.173
    against 0.160 s for OPUS-MT's 297 MB)."""
    h, crc, offset = hashlib.sha256() if kind == "sha256" else None, 0, 0
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)
    while n := os.preadv(fd, [buffer], offset):
        if h is None:
            crc = zlib.crc32(view[:n], crc)
        else:
            h.update(view[:n])
        offset += n
    return h.hexdigest() if h is not None else f"{crc:0{WEIGHTS_CHECKSUM_DIGITS}x}"


def file_crc32(path: Path) -> str:
    """A file's CRC-32 as files.weights.crc32 holds it (the exporter's side of the load's check)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return _checksum(fd, WEIGHTS_CHECKSUM)
    finally:
        os.close(fd)


def check_references(graph_path: Path, info: GraphInfo, weights: WeightsFile | None) -> None:
    """Checks every external reference of one graph against the bundle's weights file.

    Args:
        graph_path: the graph file (for messages).
        info: the graph as read (runtime/onnx_info.py).
        weights: the bundle's weights file, or None where bundle.json lists none.

    Raises:
        BundleError: a reference without a weights file, to another file, or outside the file, unaligned,
            or of a length that is not its tensor's (naming the initializer and the fix).
    """
    fix = "re-export the bundle with `seq2onnx export`"
    for t in info.external:
        where = f"{graph_path}: initializer {t.name!r}"
        if weights is None:
            raise BundleError(
                f"{where} is external data ({t.entries.get('location')!r}) but bundle.json lists no "
                f"files.weights; {fix}"
            )
        if t.entries.get("location") != weights.name:
            raise BundleError(
                f"{where} points at {t.entries.get('location')!r}; a bundle's graphs may only point at "
                f"its weights file {weights.name!r}; {fix}"
            )
        try:
            offset, length = int(t.entries.get("offset", "0")), int(t.entries["length"])
        except (KeyError, ValueError):
            raise BundleError(
                f"{where}: offset/length {t.entries.get('offset')!r}/{t.entries.get('length')!r} are "
                f"not whole numbers; {fix}"
            ) from None
        width = ELEMENT_BYTES.get(t.data_type)
        count = 1
        for d in t.dims:
            count *= d
        if width is None or length != count * width:
            raise BundleError(
                f"{where}: {length} bytes for a tensor of shape {list(t.dims)} and ONNX type "
                f"{t.data_type}; {fix}"
            )
        if offset < 0 or offset % WEIGHTS_ALIGNMENT or offset + length > weights.size:
            raise BundleError(
                f"{where}: bytes {offset}..{offset + length} of {weights.path.name} "
                f"({weights.size} bytes, alignment {WEIGHTS_ALIGNMENT}); the file is truncated or "
                f"the graph damaged: {fix}"
            )
