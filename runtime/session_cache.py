"""A cache of onnxruntime's optimized graphs, their weights pre-packed, so that later loads skip both.

Making a CPU session spends most of a load optimizing the graph and packing every weight into the
layout of this machine's matrix kernels (0.23 s of the OPUS-MT-size load's 0.44 s; docs/optimisation-notes.md
row 42). onnxruntime can save the optimized graph with its packed weights beside it (session options
`optimized_model_filepath` and `session.save_external_prepacked_constant_initializers`); a session made
from that file maps the packed weights instead of computing them.

What is saved belongs to this machine and this onnxruntime: the packed layout depends on the CPU's
instruction set, the graph on onnxruntime's optimizers and on the session entries that steer them. The
cache's key covers the graph's bytes, the weights file's checked sha256, onnxruntime's version, the
optimisation level, those entries and the CPU's model and flags, so a change of any makes a new entry
rather than reusing a stale one. Entries are written into a temporary directory and renamed into place
whole; a damaged entry that onnxruntime refuses is made again.

The cache costs disk: each graph's weights twice (as stored and packed), about 2.8x the bundle at
OPUS-MT size. It is off unless a directory is given (Translator's `cache_dir`, `--cache-dir`); entries
are never removed here (delete the directory to reclaim the space), only what an interrupted build left.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import shutil
import tempfile
import time
from pathlib import Path

# bumped when what an entry holds or how it is keyed changes
CACHE_FORMAT = 1
_MODEL, _DATA = "model.onnx", "model.data"
# an entry being made (build's staging directory); one older than STALE_S was left by a process that died
_STAGING = re.compile(r"\.[0-9a-f]{32}-[A-Za-z0-9_]+")
STALE_S = 3600


@functools.cache  # read once per process, not once per graph
def cpu_identity() -> str:
    """The CPU's model and instruction-set flags (Linux's /proc/cpuinfo), or the platform's words."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n\n")[0].splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    keep = ("model name", "flags", "Features", "CPU implementer", "CPU part")
    return "\n".join(line for line in lines if line.split(":")[0].strip() in keep)


def entry_key(graph: bytes, weights_sha256: str | None, ort_version: str, level: str, entries: dict) -> str:
    """The cache key of one graph's session.

    Args:
        graph: the graph file's bytes as checked.
        weights_sha256: the weights file's sha256 as checked (None: a bundle without a weights file).
        ort_version: onnxruntime's version.
        level: the optimisation level asked for.
        entries: the session's config entries (they steer optimizers: the int8 rewrite's precision).

    Returns:
        A hex digest naming the entry's directory.
    """
    h = hashlib.sha256()
    fields = {
        "format": CACHE_FORMAT,
        "graph": hashlib.sha256(graph).hexdigest(),
        "weights": weights_sha256,
        "onnxruntime": ort_version,
        "level": level,
        "entries": sorted(entries.items()),
        "cpu": cpu_identity(),
    }
    h.update(json.dumps(fields, sort_keys=True).encode())
    return h.hexdigest()[:32]


class SessionCache:
    """One directory of cached sessions' graphs (see the module's docstring).

    Args:
        root: the cache directory (made where missing).

    Raises:
        ValueError: root exists and is not a directory, or cannot be made (naming it and the fix).
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise ValueError(f"cache_dir={str(root)!r} is not a directory; give a directory")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(
                f"cache_dir={str(root)!r} cannot be used ({e.strerror or e}); give a writable directory"
            ) from None

    def drop_stale(self) -> None:
        """Removes staging directories an interrupted build left (older than STALE_S); nothing else."""
        for path in self.root.iterdir():
            try:
                if _STAGING.fullmatch(path.name) and time.time() - path.stat().st_mtime > STALE_S:
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:
                pass  # another process removed or renamed it meanwhile

    def model(self, key: str) -> Path | None:
        """The cached graph of `key`, or None where there is none yet."""
        path = self.root / key / _MODEL
        return path if path.is_file() and (self.root / key / _DATA).is_file() else None

    def build(self, key: str, make, before_saving=None) -> object:
        """Makes a session with make(save_options), saving its optimized graph as the entry `key`.

        Args:
            key: entry_key's digest.
            make: make(configure) makes the session, calling configure(session_options) before; configure
                sets the options that save the optimized graph and its packed weights.
            before_saving: called before the entry is put in place (the weights file's deferred hash
                check, which raises where the file is damaged: then no entry is saved).

        Returns:
            The session make returned; the entry is in place unless another process put one there first
            (then that one stays) or the disk refused it (then the session is returned all the same).
        """
        self.drop_stale()
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=self.root))
        try:

            def configure(options):
                options.optimized_model_filepath = str(staging / _MODEL)
                options.add_session_config_entry(
                    "session.optimized_model_external_initializers_file_name", _DATA
                )
                options.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")

            session = make(configure)
            if before_saving is not None:
                before_saving()
            if (staging / _MODEL).is_file() and (staging / _DATA).is_file():
                try:
                    os.rename(staging, self.root / key)  # whole, or not at all
                except OSError:
                    pass  # another process made it first, or a stale one is there: drop ours
            return session
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def discard(self, key: str) -> None:
        """Removes entry `key` (one onnxruntime refused), so that the next load makes it again."""
        shutil.rmtree(self.root / key, ignore_errors=True)
