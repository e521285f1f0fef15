"""Whether the Node host (js/) can run here: one reason to skip, shared by the tests that start it."""

from __future__ import annotations

import shutil
from pathlib import Path

JS = Path(__file__).resolve().parents[1] / "js"
NODE = shutil.which("node")


def skip_reason(what: str) -> str:
    """Why tests of `what` cannot run here, with the fix; "" when node and js/node_modules are present."""
    if NODE is None:
        return f"node is not installed: install Node.js >= 18 (Debian: apt-get install nodejs npm) to test {what}"
    if not (JS / "node_modules" / "onnxruntime-node").is_dir():
        return f"js/node_modules is missing: run `npm ci --prefix js` to test {what}"
    return ""
