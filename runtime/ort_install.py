"""Imports onnxruntime after checking that exactly one onnxruntime distribution is installed.

Every flavour (onnxruntime, onnxruntime-gpu, onnxruntime-directml, onnxruntime-openvino, ...)
installs the same import package, `onnxruntime/`, into the same directory. Two of them
overwrite each other's files: the import may work and then miss the CUDA provider, or load a
mix of two versions. pip cannot see the clash, so the runtime names it before importing.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib import metadata

_PREFIXES = ("onnxruntime", "ort_nightly", "ort-nightly")  # metadata directories' names, lower case
CPU_FIX = "pip install 'seq2onnx[cpu]' (or 'seq2onnx[gpu]' on a CUDA machine)"


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _ships_onnxruntime(dist: metadata.Distribution) -> bool:
    """Whether the distribution installs the top-level package `onnxruntime`."""
    top = dist.read_text("top_level.txt")
    if top is not None:
        return "onnxruntime" in top.split()
    return any(str(f).replace("\\", "/").startswith("onnxruntime/") for f in dist.files or ())


def _candidate_paths() -> list[str]:
    """The metadata directories on sys.path named onnxruntime* or ort-nightly* (.dist-info, .egg-info).

    A scan of sys.path's directories by name: reading every distribution's metadata
    (metadata.distributions()) took ~30 ms of each process's start in an environment of ~200 packages.
    """
    found = []
    for entry in sys.path:
        try:
            names = sorted(e.name for e in os.scandir(entry or "."))
        except OSError:  # a missing directory, a zip file
            continue
        for name in names:
            low = name.lower()
            if low.startswith(_PREFIXES) and low.endswith((".dist-info", ".egg-info")):
                found.append(os.path.join(entry or ".", name))
    return found


def _candidates() -> list[metadata.Distribution]:
    """The installed distributions whose metadata directory is named onnxruntime* or ort-nightly*."""
    from importlib import metadata  # ~25 ms of imports (email, zipfile): only where a clash is possible

    return [metadata.Distribution.at(path) for path in _candidate_paths()]


def onnxruntime_distributions() -> list[str]:
    """Lists the installed distributions that provide `import onnxruntime`.

    Only distributions named onnxruntime* or ort-nightly* are opened (a cheap filter on names);
    of those, the ones that ship the package count (not onnxruntime-genai or -extensions).

    Returns:
        "name version" of each, sorted by name.
    """
    found = {}
    for dist in _candidates():
        name = _normal(dist.metadata["Name"] or "")
        if name.startswith(("onnxruntime", "ort-nightly")) and name not in found and _ships_onnxruntime(dist):
            found[name] = dist.version
    return [f"{name} {version}" for name, version in sorted(found.items())]


def check_install(dists: list[str]) -> None:
    """Refuses an install with more than one onnxruntime flavour.

    Args:
        dists: what onnxruntime_distributions() returned.

    Raises:
        ImportError: more than one is installed (the fix in the message).
    """
    if len(dists) > 1:
        names = [d.split()[0] for d in dists]
        gpu = any("gpu" in n for n in names)
        raise ImportError(
            f"{' and '.join(dists)} are {'both' if len(dists) == 2 else 'all'} installed and share one "
            "directory (onnxruntime/), so each "
            f"overwrote the other's files; keep exactly one: pip uninstall -y {' '.join(names)} && "
            + ("pip install 'seq2onnx[gpu]' (or [cpu])" if gpu else "pip install 'seq2onnx[cpu]' (or [gpu])")
        )


def import_onnxruntime():
    """Returns the onnxruntime module, after check_install.

    Raises:
        ImportError: naming the problem and the fix: several flavours installed, none installed, or
            one that cannot be imported.
    """
    if len(_candidate_paths()) <= 1:  # no two flavours can clash: metadata is read only if the import fails
        try:
            return importlib.import_module("onnxruntime")
        except ImportError:
            pass  # the checks below name the problem
    dists = onnxruntime_distributions()
    check_install(dists)
    try:
        return importlib.import_module("onnxruntime")
    except ImportError as e:
        if not dists:
            raise ImportError(f"onnxruntime is not installed: {CPU_FIX}") from e
        name = dists[0].split()[0]
        raise ImportError(
            f"{dists[0]} is installed but cannot be imported ({e}); reinstall it: "
            f"pip install --force-reinstall {name}"
        ) from e
