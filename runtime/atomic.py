"""Directories written whole: built in a temporary sibling, then renamed into place."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def replace_dir(temp: Path, out: Path) -> None:
    """Moves the finished directory `temp` to `out` (a sibling of it), replacing an existing `out`.

    The old `out` is first moved aside and deleted only once `temp` is in place; if that last rename
    fails, the old one is put back. So a reader sees the old directory or the new one, never a mix,
    and a failure leaves what was there.
    """
    if not out.exists():
        os.replace(temp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}-old-", dir=out.parent))
    os.replace(out, old / out.name)
    try:
        os.replace(temp, out)
    except OSError:
        os.replace(old / out.name, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
