"""The benchmark as a script (the package must be installed): the same as `seq2onnx bench`.

    python benchmarks/run.py CHECKPOINT [--bundle-dir DIR] [--sentences N] [--threads N] [--json FILE] [--quick]

See benchmarks/README.md for what is measured and how to read it; the implementation lives in
export/benchcli.py (the subcommand), export/bench_run.py (sentences, bundles, one child process per
engine), export/bench_engines.py (the child: one engine timed), export/bench_machine.py (the machine),
export/bench_rows.py (tokens/s, percentiles, ratios), export/bench_format.py (the printed report) and
export/ct2convert.py (CTranslate2 conversion).
"""
from __future__ import annotations

import sys

from seq2onnx.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
