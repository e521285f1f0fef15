"""A bundle's weights file: every graph's large initializers, each stored once (spec/bundle.json's `weights`).

The exporter (export/weights.py) moves the graphs' large initializers into one file, `files.weights`,
as ONNX external data. Here the runtime

- checks the file like every other (a regular file, its checksum), reading it as a stream rather than
  keeping a copy: onnxruntime reads it itself, memory-mapped on the CPU, and frees what it has packed
  into its own layout (docs/optimisation-notes.md row 29), so a weight costs one copy in memory. The
  checksum is files.weights' CRC-32 where bundle.json has one (spec's weights.checksum: 1.7 GB/s on one
  core where sha256 runs at 0.3 GB/s on x86 CPUs without SHA instructions, the largest part of a load
  there), else its sha256 (bundles exported before the CRC-32 was written);
- checks every graph's references before onnxruntime follows them (the name of the file, whole
  numbers inside it, aligned, the length of the tensor), so a damaged or crafted graph is refused by
  name rather than read from the wrong bytes or from outside the bundle;
- points onnxruntime at the directory that was read: `/proc/self/fd/N` of a descriptor held open on
  it where the OS has one, so that a bundle replaced on disk (`seq2onnx export --force` renames a new
  directory into place) cannot mix its weights into the graphs read from the old one; where that
  directory no longer holds the file checked (replaced, deleted), onnxruntime gets the bytes of the
  file held open instead (WeightsFile.open_session).

A bundle without `files.weights` (before 0.4) keeps its weights inside each graph file, as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import threading
import weakref
import zlib
from pathlib import Path

from .onnx_info import GraphInfo
from .spec import ELEMENT_BYTES, WEIGHTS_ALIGNMENT, WEIGHTS_CHECKSUM, WEIGHTS_CHECKSUM_DIGITS, BundleError

# onnxruntime's session option: where the external data of a model loaded from bytes lies.
FOLDER_OPTION = "session.model_external_initializers_file_folder_path"


class WeightsFile:
    """The weights file of a bundle read: checked, held open, and handed to onnxruntime.

    Attributes:
        path: the file's path (for messages).
        name: its name in the bundle (files.weights.path), the location every reference must give.
        size: its size in bytes as checked.
        sha256: bundle.json's sha256 of the file, once the file was checked against bundle.json (by that
            hash or by its CRC-32: `checked_by`); None where it was not checked.
        checked_by: the checksum the file is held to ("crc32" or "sha256"), or None.
    """

    def __init__(
        self, path: Path, name: str, size: int, dir_fd: int | None, file_fd: int, sha256: str | None = None,
        checked_by: str = "sha256",
    ):
        self.path, self.name, self.size, self.sha256 = path, name, size, sha256
        self.checked_by = checked_by if sha256 is not None else None
        self._dir_fd, self._file_fd = dir_fd, file_fd
        # held while a session may still be made (a standard decoder loaded late)
        for fd in (dir_fd, file_fd):
            if fd is not None:
                weakref.finalize(self, os.close, fd)

    def _start_hash(self, expected: str) -> None:
        """Checksums the file held open in a thread (os.pread: the descriptor's offset is not moved)."""
        fd, outcome, kind = os.dup(self._file_fd), {}, self.checked_by

        def run():
            try:
                outcome["same"] = _checksum(fd, kind) == expected
            except OSError as e:
                outcome["error"] = e
            finally:
                os.close(fd)

        self._hashing = threading.Thread(target=run, name=f"seq2onnx-weights-{kind}", daemon=True)
        self._outcome = outcome
        self._hashing.start()

    def verify(self) -> None:
        """Waits for a deferred hash (read_weights' `defer`); nothing to do where it was checked already.

        Raises:
            BundleError: the file's checksum differs from bundle.json's, or it could not be read.
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
            raise BundleError(f"{self.path}: {_differs(self.checked_by)} (files.weights in bundle.json)")
        self._hashing = None

    def folder(self) -> str:
        """The directory onnxruntime reads the file from: the one that was checked, where the OS allows."""
        proc = f"/proc/self/fd/{self._dir_fd}" if self._dir_fd is not None else None
        if proc and os.path.isdir(proc):
            return proc
        return str(self.path.parent)

    def _intact(self) -> bool:
        """Whether the file under folder() is still the very file checked (not replaced, not deleted)."""
        try:
            on_disk = os.stat(os.path.join(self.folder(), self.name))
        except OSError:
            return False
        held = os.fstat(self._file_fd)
        return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)

    def open_session(self, create):
        """Makes a session whose external data onnxruntime reads from this file, as checked.

        onnxruntime reads the file itself (memory-mapped on the CPU; what it packs into its own layout
        is the only copy it keeps). Where the bundle directory has been replaced or deleted since it was
        read (a session made late), it is given the bytes of the file held open instead: a weight then
        costs a copy more while that session lives, and never comes from another bundle.

        Args:
            create: create(configure) makes the session, calling configure(session_options) first.

        Returns:
            What create returned.
        """
        if self._intact():
            try:
                session = create(
                    lambda options: options.add_session_config_entry(FOLDER_OPTION, self.folder())
                )
            except Exception:  # onnxruntime's own types
                if self._intact():
                    raise  # a failure of the graph itself, not of a directory replaced while it read
            else:
                if self._intact():  # nothing was swapped in while onnxruntime read it
                    return session
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
    path: Path, name: str, entry: dict | None, opener, dir_fd: int | None, *, defer: bool = False
) -> WeightsFile:
    """Checks a weights file as a stream: a regular file whose checksum is bundle.json's (its CRC-32 where
    files.weights has one, else its sha256).

    With `defer`, the checksum is computed in a thread while the caller makes its sessions (onnxruntime's
    session creation lets go of the GIL, so it costs the load no more than the sessions' own time where a
    core is free); WeightsFile.verify() waits for it and refuses a file that differs.

    Args:
        path: the file's path (for messages).
        name: files.weights.path.
        entry: bundle.json's files.weights (its sha256, and its crc32 where the export wrote one), or None
            not to check the file.
        defer: checksum in a thread; the caller calls verify() before using what it made from the file.
        opener: opens the file relative to the directory held open (runtime/bundle.py's _Directory).
        dir_fd: the directory's descriptor (duplicated here and kept), or None where the OS has none.

    Returns:
        The checked file.

    Raises:
        BundleError: missing, not a regular file, or a checksum that differs (naming the file and the fix).
    """
    kind, expected = _expected(entry)
    with opener(name) as f:
        size = os.fstat(f.fileno()).st_size
        if expected is not None and not defer and _checksum(f.fileno(), kind) != expected:
            raise BundleError(f"{path}: {_differs(kind)}")
        held = os.dup(f.fileno())
    weights = WeightsFile(
        path, name, size, os.dup(dir_fd) if dir_fd is not None else None, held,
        None if entry is None else entry["sha256"], kind,
    )
    if expected is not None and defer:
        weights._start_hash(expected)
    return weights


def _expected(entry: dict | None) -> tuple[str, str | None]:
    """(the checksum to compute, its expected hex digest) for files.weights; (..., None): not checked."""
    if entry is None:
        return "sha256", None
    if WEIGHTS_CHECKSUM in entry:
        return WEIGHTS_CHECKSUM, entry[WEIGHTS_CHECKSUM]
    return "sha256", entry["sha256"]


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
