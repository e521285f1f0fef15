"""The bundle: reading a bundle directory once, checked, and the format's names (from runtime/spec.py).

A bundle is a directory that a host in any language can drive from bundle.json alone:
encoder.onnx, decoder.onnx, the SentencePiece models and bundle.json (docs/bundle-format.md),
and optionally decoder_fused.onnx, the same step built from onnxruntime's `com.microsoft` contrib
kernels (docs/fused-decoder.md): a host that cannot run com.microsoft uses graphs.decoder.
Every graph input and output name comes from spec/bundle.json (runtime/spec.py reads it; this
module re-exports the names); bundle.json's fields are checked by runtime/meta.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from .meta import _short, validate_meta
from .weights import WeightsFile, file_crc32, read_weights  # noqa: F401 (file_crc32: the exporter's)

# re-exported: the format's names, as `from . import bundle as names` reads them
from .spec import (  # noqa: F401
    BEAM_WIDTH,
    BUNDLE_JSON,
    BundleError,
    CACHE_INDICES,
    CACHE_INDIRECTION,
    ROW_POSITION,
    ROW_START,
    CROSS_ATTENTION,
    DECODER_FILE,
    DECODER_LABELS,
    DTYPES,
    ENCODER_FILE,
    FILE_KEYS,
    FORMAT,
    FORMAT_VERSION,
    FUSED,
    FUSED_DECODER_FILE,
    LOG_PROBS,
    MAX_JSON_BYTES,
    MS_DOMAIN,
    OPTIONAL_FILE_KEYS,
    OPTIONAL_GRAPH_KEYS,
    SOURCE_VOCAB,
    TARGET_VOCAB,
    VOCAB_TEXTS,
    WEIGHTS_ALIGNMENT,
    WEIGHTS_CHECKSUM,
    WEIGHTS_FILE,
    SIZE_FIELD,
    SOURCE_SPM,
    SPEC,
    SPEC_PATH,
    SRC_IDS,
    SRC_LENGTHS,
    SRC_MASK,
    STANDARD,
    STEP,
    TARGET_SPM,
    TOKENS,
    TOPK_IDS,
    TOPK_LOG_PROBS,
    TOP_K,
    cross_names,
    key_cross,
    past_key,
    past_names,
    past_value,
    present_key,
    present_names,
    present_value,
    value_cross,
)


@dataclass(frozen=True)
class Bundle:
    """A bundle as read by read_bundle.

    Attributes:
        path: the bundle directory.
        meta: bundle.json as read and validated.
        data: each listed file's bytes (file key -> bytes; BUNDLE_JSON -> bundle.json's own), exactly
            the bytes whose sha256 was checked:
            sessions and tokenizers are made from these, never from a path read again later, so a
            bundle replaced on disk meanwhile cannot mix into this one. Empty once a Translator has
            loaded what it needs (Bundle.without_data).
    """

    path: Path
    meta: dict
    data: dict = field(default_factory=dict, compare=False, repr=False)

    def bytes(self, key: str) -> bytes:
        """Returns the bytes of file `key` as read and checked.

        Args:
            key: a file key of bundle.json's `files` ("encoder", "decoder", ...).

        Raises:
            BundleError: the bytes were not kept (a Bundle after without_data()).
        """
        if key not in self.data:
            raise BundleError(
                f"{self.file(key)}: its bytes were not kept with the bundle read from {self.path}; "
                "read the bundle again (read_bundle) to load it"
            )
        return self.data[key]

    def without_data(self) -> "Bundle":
        """Returns the same bundle without the files' bytes (once sessions hold what they need)."""
        return Bundle(self.path, self.meta)

    @property
    def model(self) -> dict:
        """bundle.json's `model`: the ModelConfig fields."""
        return self.meta["model"]

    @property
    def special_ids(self) -> dict:
        """bundle.json's `special_ids`: pad, unk, bos, eos, decoder_start."""
        return self.meta["special_ids"]

    @property
    def decoding(self) -> dict:
        """bundle.json's `decoding`: the default search options."""
        return self.meta["decoding"]

    @property
    def dtype(self) -> str:
        """bundle.json's `dtype`: the graphs' float type ("float32", "float16")."""
        return self.meta["dtype"]

    @property
    def max_positions(self) -> int:
        """The model's positions (model.max_positions), end token included."""
        return self.meta["model"]["max_positions"]

    def file(self, key: str) -> Path:
        """Returns the path of file `key` (for messages: sessions are made from Bundle.bytes).

        Args:
            key: a file key of bundle.json's `files`.
        """
        return self.path / self.meta["files"][key]["path"]

    @property
    def weights(self) -> WeightsFile | None:
        """The checked weights file every graph points into (runtime/weights.py), or None: a bundle whose
        graphs hold their own weights (before 0.4), or one whose files were let go (without_data)."""
        found = self.data.get("weights")
        return found if isinstance(found, WeightsFile) else None

    @property
    def decoder_variants(self) -> list[str]:
        """The decoder variants this bundle has: "standard" always, "fused" where it was exported."""
        return [v for v, label in DECODER_LABELS.items() if label in self.meta["files"]]


def sha256(path: Path) -> str:
    """Returns the hex sha256 of a file, read in 1 MiB blocks.

    Args:
        path: the file.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


_READ_ATTEMPTS = 8  # a bundle replaced while it is read (`seq2onnx export --force`) is read again


def read_bundle(path: str | Path, *, check_hashes: bool = True, defer_weights_hash: bool = False) -> Bundle:
    """Reads and validates a bundle directory, keeping each file's bytes (Bundle.data).

    Every file is read once, through one handle on the directory: the hashes are checked on the
    bytes that sessions are then made from. A bundle replaced meanwhile by an export with --force
    (a rename of the whole directory) is detected and read again, so the result is one bundle,
    never parts of two.

    Args:
        path: the bundle directory.
        check_hashes: check every file's sha256 against bundle.json.
        defer_weights_hash: hash the weights file in a thread while the caller goes on (makes its
            sessions): the caller must call `bundle.weights.verify()` before using anything made from it
            (Translator does); other files are checked here as always.

    Returns:
        The bundle, with its files' bytes.

    Raises:
        BundleError: naming the file and the problem: missing files, a file that is not a regular
            file, invalid or over-large JSON, another format or version, a field of the wrong type or
            range, file names that leave the bundle, hashes that do not match.
    """
    path = Path(path)
    for attempt in range(_READ_ATTEMPTS):
        if not path.is_dir():
            if attempt + 1 < _READ_ATTEMPTS and os.path.lexists(path.parent):
                time.sleep(0.01 * (attempt + 1))  # a moment between two renames of an export elsewhere
                continue
            raise BundleError(
                f"{path}: not a bundle directory (make one with `seq2onnx export CHECKPOINT {path}`)"
            )
        try:
            directory = _Directory(path)
        except FileNotFoundError:  # renamed away since the check above
            continue
        with directory:
            try:
                return _read(path, directory, check_hashes, defer_weights_hash)
            except (BundleError, OSError) as e:
                if not directory.replaced():
                    raise
                if attempt + 1 == _READ_ATTEMPTS:
                    raise BundleError(
                        f"{path}: replaced by another export {_READ_ATTEMPTS} times while being read "
                        f"(last: {e}); try again once the export is done"
                    ) from e
                # the directory was swapped for a new export while being read: read the new one
    raise BundleError(
        f"{path}: replaced by another export {_READ_ATTEMPTS} times while being read; try again"
    )


class _Directory:
    """The bundle directory held open: files are opened relative to it (where the OS can), so that all
    of them come from the directory that was opened even if another is renamed into its place."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = (
            os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            if os.open in os.supports_dir_fd
            else None
        )
        # the inode of what was opened (the path may already lead to another directory)
        self.inode = os.fstat(self.fd).st_ino if self.fd is not None else os.stat(path).st_ino

    def __enter__(self) -> "_Directory":
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def replaced(self) -> bool:
        try:
            return os.stat(self.path).st_ino != self.inode
        except OSError:
            return True

    def open(self, relative: str, limit: int | None = None, size: int | None = None):
        """Opens a regular file for reading; refuses anything else (a FIFO, a device, /dev/zero), and a file
        of another size than `size` (bundle.json's files.<key>.size, where it has one), before reading.
        """
        where = self.path / relative
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
        try:
            fd = os.open(relative if self.fd is not None else where, flags, dir_fd=self.fd)
        except FileNotFoundError:
            raise BundleError(f"{where}: missing from the bundle") from None
        # before a file object: Python refuses a directory with a bare "[Errno 21] ... : 7"
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "a device, pipe or socket"
            raise BundleError(
                f"{where}: not a regular file ({kind}); a bundle holds files: re-export it with "
                "`seq2onnx export`"
            )
        if size is not None and info.st_size != size:
            os.close(fd)
            raise BundleError(
                f"{where}: {info.st_size} bytes, bundle.json records {size} ({SIZE_FIELD}); the file is "
                "damaged or was replaced: re-export the bundle"
            )
        f = os.fdopen(fd, "rb")
        if limit is not None and info.st_size > limit:
            f.close()
            raise BundleError(
                f"{where}: {info.st_size} bytes, more than the {limit} a bundle description can be; "
                "this is not a bundle.json made by `seq2onnx export`"
            )
        return f

    def read(self, relative: str, limit: int | None = None, size: int | None = None) -> bytes:
        """A regular file's bytes (Directory.open's checks)."""
        with self.open(relative, limit, size) as f:
            return f.read()


def _read(path: Path, directory: _Directory, check_hashes: bool, defer_weights_hash: bool = False) -> Bundle:
    meta_path = path / BUNDLE_JSON
    try:
        raw = directory.read(BUNDLE_JSON, limit=MAX_JSON_BYTES)
    except BundleError as e:
        if "missing from the bundle" in str(e):
            raise BundleError(f"{meta_path}: missing; {path} is not a seq2onnx bundle") from None
        raise
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise BundleError(f"{meta_path}: invalid JSON ({e}); re-export the bundle") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise BundleError(
            f"{meta_path}: not a {FORMAT} description "
            f"(format={_short(meta.get('format')) if isinstance(meta, dict) else None})"
        )
    version = meta.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version != FORMAT_VERSION:
        raise BundleError(
            f"{meta_path}: format_version {_short(version)}, this runtime reads version {FORMAT_VERSION} (an "
            "integer); "
            "re-export the bundle with this seq2onnx or install the matching runtime"
        )
    validate_meta(meta, meta_path)
    root = path.resolve()
    data = {BUNDLE_JSON: raw}
    for key in [*FILE_KEYS, *(k for k in OPTIONAL_FILE_KEYS if k in meta["files"])]:
        entry = meta["files"][key]
        target = (path / entry["path"]).resolve()
        if root not in target.parents:
            raise BundleError(
                f"{meta_path}: files.{key}.path {entry['path']!r} points outside the bundle; refusing it"
            )
        if key == "weights":  # checked as a stream: onnxruntime reads it itself (runtime/weights.py)
            try:
                data[key] = read_weights(
                    path / entry["path"],
                    entry["path"],
                    entry if check_hashes else {k: v for k, v in entry.items() if k == SIZE_FIELD},
                    directory.open,
                    directory.fd,
                    defer=defer_weights_hash,
                )
            except BundleError as e:
                raise BundleError(f"{e} (files.{key} in {BUNDLE_JSON})") from None
            continue
        try:
            data[key] = directory.read(entry["path"], size=entry.get(SIZE_FIELD))
        except BundleError as e:
            raise BundleError(f"{e} (files.{key} in {BUNDLE_JSON})") from None
        if check_hashes and hashlib.sha256(data[key]).hexdigest() != entry["sha256"]:
            raise BundleError(
                f"{path / entry['path']}: sha256 differs from bundle.json (files.{key}); the file is damaged "
                "or was "
                "replaced: re-export the bundle"
            )
    return Bundle(path=path, meta=meta, data=data)
