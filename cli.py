"""The `seq2onnx` console command: dispatches by command name.

The training-side commands (train, export, verify, evaluate, demo, bench) go to seq2onnx.export.cli,
which imports torch when they run; every other command is the runtime's (seq2onnx.runtime.cli), so
a runtime-only install never imports seq2onnx.export or seq2onnx.model. This module sits above both
(it is the package root's), which is why the dispatch lives here and not in runtime/.
"""
from __future__ import annotations

import sys

from seq2onnx.runtime.cli import TRAINING_COMMANDS, build_parser, run_command


def main(argv: list[str] | None = None) -> int:
    """The `seq2onnx` console command."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in TRAINING_COMMANDS:
        from seq2onnx.export import cli

        return cli.main(argv)
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
