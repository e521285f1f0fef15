"""`python -m seq2onnx.bench.engines JOB.json OUT.json`: the child process (timing.main)."""

import sys

from seq2onnx.bench.engines.timing import main

sys.exit(main(sys.argv[1:]))
