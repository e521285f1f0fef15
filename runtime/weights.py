"""A bundle's weights file: every graph's large initializers, each stored once (spec/bundle.json's `weights`).

The exporter (export/weights.py) moves the graphs' large initializers into one file, `files.weights`,
as ONNX external data. Here the runtime

- makes the file its own before anything uses it: a private copy that no other process can name (an unlinked
  file in the temporary directory, O_TMPFILE on Linux; a reflink where the file system has them, else
  copy_file_range: runtime/private_copy.py). onnxruntime memory-maps that copy and frees what it has packed
  into its own layout (docs/optimisation-notes.md row 29), so a weight still costs one copy in memory, and
  rewriting or truncating the bundle's `weights.bin` under a running server changes nothing it runs: no mix of
  two models, no SIGBUS (a mapping of a file truncated under it faults). The cost is the copy's time (page
  cache to page cache) and its disk space while the process lives;
- checks the copy: its size against files.weights.size before a byte is read (bundles exported before that
  field have none), its sha256 against files.weights.sha256 at every load (a Translator copies and then hashes
  in a thread while it reads the other files and makes its tokenizers and sessions, `defer`). The CRC-32 that
  exports also write (spec's weights.checksum) is no longer enough alone: an edit can fix up a CRC-32, not a
  sha256;
- checks every graph's references before onnxruntime follows them (the name of the file, whole numbers inside
  it, aligned, the length of the tensor), so a damaged or crafted graph is refused by name rather than read
  from the wrong bytes or from outside the bundle;
- points onnxruntime at the copy: a private directory, made for the session's creation and removed after it,
  whose one entry is a link to `/proc/self/fd/N` of the copy held open (or `/dev/fd/N`); where the OS has
  neither, onnxruntime gets the copy's bytes (WeightsFile.open_session).

A bundle without `files.weights` (before 0.4) keeps its weights inside each graph file, as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import shutil
import sys
import tempfile
import threading
import weakref
import zlib
from pathlib import Path

from .onnx_info import GraphInfo
from .private_copy import COPY_DIR_VARIABLE, fill, link_open_file, private_copy, target  # noqa: F401
from .spec import (
    ELEMENT_BYTES,
    SIZE_FIELD,
    WEIGHTS_ALIGNMENT,
    WEIGHTS_CHECKSUM,
    WEIGHTS_CHECKSUM_DIGITS,
    BundleError,
)

MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux's value; Python 3.11 does not name it
# onnxruntime's session option: where the external data of a model loaded from bytes lies.
FOLDER_OPTION = "session.model_external_initializers_file_folder_path"


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

    def __init__(
        self,
        path: Path,
        name: str,
        size: int,
        file_fd: int,
        sha256: str | None = None,
        where: str | None = None,
    ):
        self.path, self.name, self.size, self.sha256 = path, name, size, sha256
        self._where = where  # the copy's directory where it can be named again (O_TMPFILE), else None
        self.checked_by = "sha256" if sha256 is not None else None
        self._file_fd = file_fd  # the private copy: held while a session may still be made
        self._kept: list | None = None  # in kept_linked(): [its link, None until the first session]
        self._kept_lock = threading.Lock()
        self.flips = None  # what flip() changed in the copy (runtime/exact_int8.py), once it has
        self._flip_lock = threading.Lock()  # a flip, and each read of the file as checked
        weakref.finalize(self, os.close, file_fd)

    def _start_copy(self, source: int, expected: str | None) -> None:
        """Fills the copy from `source` (a descriptor this thread closes), then hashes it, in a thread
        (read_weights' `defer`; explicit offsets throughout: no descriptor offset is shared)."""
        fd, outcome, copied = os.dup(self._file_fd), {}, threading.Event()

        def run():
            try:
                fill(source, fd, self.size, self.path)
            except BaseException as e:  # noqa: BLE001 (raised again by the thread that waits for it)
                outcome["copy_error"] = e
            finally:
                os.close(source)
                copied.set()
            try:
                if "copy_error" not in outcome and expected is not None:
                    outcome["same"] = _checksum(fd, "sha256", self._read_as_checked) == expected
            except OSError as e:
                outcome["error"] = e
            finally:
                os.close(fd)

        self._hashing = threading.Thread(target=run, name="seq2onnx-weights-copy-sha256", daemon=True)
        self._outcome, self._copied, self._expected = outcome, copied, expected
        self._hashing.start()

    def _wait_copy(self) -> None:
        """Waits until the copy is whole (read_weights' `defer`).

        Raises:
            BundleError: the copy could not be made, or the file changed size while it was copied.
        """
        copied = getattr(self, "_copied", None)
        if copied is not None:
            copied.wait()
            if "copy_error" in self._outcome:
                raise self._outcome["copy_error"]

    def flip(self, flips) -> None:
        """Flips the top bit of the bytes of `flips.ranges` in the copy, once (runtime/exact_int8.py): the
        sessions made after it read those int8 weights as uint8, their graphs typed so by flips.graph.

        Raises:
            BundleError: the copy could not be mapped to be rewritten.
        """
        self._wait_copy()
        with self._flip_lock:
            if self.flips is not None:
                return
            try:  # in place, through a mapping: no copy of the bytes in this process
                with mmap.mmap(self._file_fd, self.size) as mapped:
                    if sys.platform == "linux":  # its pages made writable at once (Linux 5.14): 70 -> 24 ms
                        with contextlib.suppress(OSError):  # an older kernel: page by page, as they fault
                            mapped.madvise(MADV_POPULATE_WRITE)
                    flips.apply(memoryview(mapped))
            except (OSError, ValueError) as e:  # nothing was written: a mapping that fails fails before
                raise BundleError(
                    f"{self.path}: its private copy could not be rewritten ({e.strerror or e}); free "
                    f"space in its directory, or point {COPY_DIR_VARIABLE} at one with room"
                ) from e
            self.flips = flips

    def _read_as_checked(self, fd: int, buffer: bytearray, offset: int) -> int:
        """Reads the copy into `buffer` from `offset` as it was checked: what a flip changed, changed back."""
        with self._flip_lock:
            n = os.preadv(fd, [buffer], offset)
            if self.flips is not None:
                self.flips.apply(memoryview(buffer)[:n], offset)
        return n

    def verify(self) -> None:
        """Waits for a deferred copy and hash (read_weights' `defer`); nothing to do where it was checked
        already.

        Raises:
            BundleError: the copy could not be made, the file's sha256 differs from bundle.json's, or it could
                not be read.
        """
        hashing = getattr(self, "_hashing", None)
        if hashing is None:
            return
        hashing.join()
        self._wait_copy()
        outcome = self._outcome
        if self._expected is None:
            self._hashing = None
            return
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
                link_open_file(self._file_fd, link)
            except FileNotFoundError:  # linked once already, and that link is gone
                fresh, where = private_copy(self._file_fd, self.size, self.path)
                if where is None:
                    raise
                link_open_file(fresh, link)
        except (OSError, BundleError):
            if fresh is not None:
                os.close(fresh)
            shutil.rmtree(folder, ignore_errors=True)
            return None
        return folder, fresh

    @contextlib.contextmanager
    def kept_linked(self):
        """Keeps the copy's name from the first session made in the block to its end: every session of one
        load maps the same link. (Each session linking its own would cost the second one a whole copy of the
        file, since an unnamed file can be named only until its first name is gone: 8.8 s of NLLB-600M's
        load.)"""
        self._kept = [None]
        try:
            yield
        finally:
            kept, self._kept = self._kept[0], None
            _unlink(kept)

    def _linked(self) -> tuple[tuple[str, int | None] | None, bool]:
        """(the link for a session, whether the caller removes it after the session is made)."""
        kept = self._kept
        if kept is None:
            return self._link(), True
        with self._kept_lock:  # a small bundle's encoder is made beside its decoder (runtime/sessions.py)
            if kept[0] is None:
                kept[0] = self._link()
            return kept[0], False

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
        self._wait_copy()
        linked, own = self._linked()
        if linked is not None:
            folder = linked[0]
            try:
                return create(lambda options: options.add_session_config_entry(FOLDER_OPTION, folder))
            finally:
                if own:
                    _unlink(linked)  # the session's mapping keeps what it reads
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
        self._wait_copy()
        h, buffer, offset = hashlib.sha256(), bytearray(8 << 20), 0
        with open(dest, "wb") as out:
            while n := self._read_as_checked(self._file_fd, buffer, offset):
                block = memoryview(buffer)[:n]
                h.update(block)
                out.write(block)
                offset += n
        if self.sha256 is not None and h.hexdigest() != self.sha256:
            raise BundleError(
                f"{self.path}: changed since it was read (sha256 differs from bundle.json); re-export "
                "the bundle, or wait for the export that is writing it"
            )


def _unlink(linked: tuple[str, int | None] | None) -> None:
    """Removes a link WeightsFile._link made, and closes its fresh copy's descriptor (if any)."""
    if linked is not None:
        folder, fresh = linked
        shutil.rmtree(folder, ignore_errors=True)
        if fresh is not None:
            os.close(fresh)


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

    With `defer`, the copy is made and then hashed in a thread while the caller reads the bundle's other
    files, makes its tokenizers, then its sessions (copy_file_range, hashlib and onnxruntime let go of the
    GIL); WeightsFile.open_session waits for the copy, verify() for the hash and refuses a file that differs.

    Args:
        path: the file's path (for messages).
        name: files.weights.path.
        entry: bundle.json's files.weights (its sha256, and its size where the export wrote one); without
            a sha256 (or None) the copy is not hashed.
        opener: opens the file relative to the directory held open (runtime/bundle.py's _Directory), with
            opener(name, size=N) refusing a file of another size before reading it.
        dir_fd: unused (kept for callers of the earlier signature).
        defer: copy and hash in a thread; the caller calls verify() before using what it made from the file.

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
        if defer:
            held, where = target(size, path)  # no room: refused now, before a byte is copied
            source = os.dup(f.fileno())
        else:
            held, where = private_copy(f.fileno(), size, path)
    try:
        if expected is not None and not defer and _checksum(held, "sha256") != expected:
            raise BundleError(f"{path}: {_differs('sha256')}")
    except BaseException:
        os.close(held)
        raise
    weights = WeightsFile(path, name, size, held, expected, where)
    if defer:
        weights._start_copy(source, expected)
    return weights


def _differs(kind: str) -> str:
    return (
        f"{kind} differs from bundle.json (files.weights); the file is damaged or was replaced: "
        "re-export the bundle"
    )


def _checksum(fd: int, kind: str, read=None) -> str:
    """The checksum of an open file as bundle.json writes it ("crc32": 8 lowercase hex digits, zlib's CRC-32;
    "sha256": its hex digest), read with os.preadv (the descriptor's offset stays) into one reused 1 MiB
    buffer: a fresh block per read was fresh pages for the kernel to fault in, 8% of the hash's time (0.173
    against 0.160 s for OPUS-MT's 297 MB). read(fd, buffer, offset) -> bytes read, where given, reads instead
    (WeightsFile._read_as_checked)."""
    h, crc, offset = hashlib.sha256() if kind == "sha256" else None, 0, 0
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)
    while n := (read(fd, buffer, offset) if read else os.preadv(fd, [buffer], offset)):
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
