"""The benchmark as a script (the package must be installed): the same as `seq2onnx bench`.

    python scripts/run.py CHECKPOINT [--bundle-dir DIR] [--sentences N] [--threads N] [--json FILE]
        [--quick]

See scripts/README.md for what is measured and how to read it; the implementation lives in
commands/bench.py (the subcommand), bench/run.py (sentences, bundles, one child process per
engine), bench/engines.py (the child: one engine timed), bench/machine.py (the machine),
bench/rows.py (tokens/s, percentiles, ratios), bench/report.py (the printed report) and
export/ctranslate2/convert.py (CTranslate2 conversion).
"""
from __future__ import annotations

import sys

from seq2onnx.commands.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
