"""Run the benchmark without installing the `seq2onnx` command: the same as `seq2onnx bench`.

    python benchmarks/run.py CHECKPOINT [--bundle-dir DIR] [--sentences N] [--threads N] [--json FILE] [--quick]

See benchmarks/README.md for what is measured and how to read it; the implementation lives in
export/benchcli.py (engines, child processes, report) and export/ct2convert.py (CTranslate2 conversion).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from export.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
