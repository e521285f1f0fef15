"""The machine a `seq2onnx bench` run measured: CPU, cores, memory, load, library versions.

Printed above the table and kept in the JSON report, because tokens/s mean little without them.
psutil (the `[bench]` extra) is imported by the functions, so that `seq2onnx --help` does not need it.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata


def _version(*dists: str) -> str | None:
    """The installed version of the first of these distributions that is installed."""
    for d in dists:
        try:
            return metadata.version(d)
        except metadata.PackageNotFoundError:
            continue
    return None


def _cpu_name() -> str:
    # psutil has no CPU model name; on Linux platform.processor() is usually empty, /proc/cpuinfo has it.
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """Returns the cores this process may run on (its CPU affinity; all logical cores where there is none)."""
    import psutil

    try:
        return len(psutil.Process().cpu_affinity())
    except (AttributeError, psutil.Error):  # macOS has no CPU affinity
        return os.cpu_count() or 1


def describe_machine(threads: int) -> dict:
    """Describes the machine, the thread count every engine gets, and the libraries' versions.

    Args:
        threads: the thread count every engine gets.

    Returns:
        CPU, cores, memory, load at start, OS, Python and versions, as the JSON report keeps them.
    """
    import psutil

    try:
        load = [round(x, 2) for x in psutil.getloadavg()]
    except (AttributeError, OSError):
        load = None
    return {
        "cpu": _cpu_name(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "threads": threads,
        "load_average_at_start": load,
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            "torch": _version("torch"),
            "onnxruntime": _version("onnxruntime-gpu", "onnxruntime"),
            "ctranslate2": _version("ctranslate2"),
            "numpy": _version("numpy"),
            "seq2onnx": _version("seq2onnx"),
        },
    }
