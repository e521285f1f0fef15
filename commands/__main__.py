"""`python -m seq2onnx.commands ...` is the `seq2onnx` command (torchrun's workers start it so)."""

import sys

from seq2onnx.commands.main import main

sys.exit(main())
