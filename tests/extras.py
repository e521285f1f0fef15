"""The optional packages a test module needs, imported or refused with the fix: core tests never skip.

Each comes with an extra that `[dev]` includes, so CI always has it; a checkout without it gets a
collection error naming the extra instead of a silently skipped module.
"""

from __future__ import annotations

import importlib


def require(module: str, extra: str):
    """Imports `module`, or raises ImportError naming the extra that installs it.

    Args:
        module: the import name (e.g. "fastapi").
        extra: seq2onnx's extra that installs it (e.g. "serve").
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{module} cannot be imported ({e}): it comes with seq2onnx's [{extra}] extra, which "
            "[dev] includes: pip install -e '.[dev]'"
        ) from e
