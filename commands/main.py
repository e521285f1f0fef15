"""The `seq2onnx` console command: one parser, one subcommand per module of this package.

Every command module (train.py, export.py, ..., verify_host.py) has `add(subparsers)`, which
registers its parser, and a `run(args)` that the parser calls. A module imports nothing heavy at
its top (torch, onnxruntime, Ray are imported when its command runs), so `seq2onnx --help` and the
runtime's commands work on a runtime-only install (`pip install 'seq2onnx[cpu]'`) without torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from seq2onnx.errors import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_USAGE, CommandError

# Command name -> module in seq2onnx.commands, in the order `seq2onnx --help` lists them.
COMMANDS = {
    "train": "train",
    "export": "export",
    "verify": "verify",
    "evaluate": "evaluate",
    "demo": "demo",
    "bench": "bench",
    "translate": "translate",
    "translate-dataset": "translate_dataset",
    "web": "web",
    "serve": "serve",
    "verify-host": "verify_host",
}
# The commands that need the training extra (torch); the others need only the runtime.
TRAINING_COMMANDS = ("train", "export", "verify", "evaluate", "demo", "bench")


def _version() -> str:
    from seq2onnx import __version__

    return __version__


def add_debug(parser: argparse.ArgumentParser) -> None:
    """Adds --debug, before or after the subcommand (SUPPRESS keeps a subcommand from resetting it).

    Args:
        parser: the main parser or a subcommand's.
    """
    parser.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback on errors"
    )


def build_parser() -> argparse.ArgumentParser:
    """Builds the `seq2onnx` parser with every command registered.

    Returns:
        The parser; each subcommand sets `func` (its module's run) as its default.
    """
    parser = argparse.ArgumentParser(
        prog="seq2onnx",
        description="Train a Transformer in PyTorch, export it as two ONNX graphs, verify parity, translate "
        "without torch.",
        epilog="`seq2onnx COMMAND --help` explains a command. translate, translate-dataset, web and "
        "verify-host need only the runtime (pip install 'seq2onnx[cpu]'; verify-host also Node.js and "
        f"npm ci --prefix js); the others ({', '.join(TRAINING_COMMANDS)}) need the training extra "
        "(pip install 'seq2onnx[train,cpu]').",
    )
    parser.add_argument("--version", action="version", version=f"seq2onnx {_version()}")
    add_debug(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        importlib.import_module(f"seq2onnx.commands.{module}").add(sub)
    for action in sub.choices.values():
        add_debug(action)
    return parser


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parses argv and runs the chosen command.

    Errors become one line on stderr and EXIT_FAIL (the traceback with --debug), Ctrl-C
    EXIT_INTERRUPTED, no command the help and EXIT_USAGE.

    Args:
        parser: from build_parser().
        argv: the arguments after the program name.

    Returns:
        The command's exit status.
    """
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    debug = getattr(args, "debug", False)
    if args.command not in TRAINING_COMMANDS:
        # numpy's OpenBLAS starts a thread per core when numpy loads, each spinning ~0.1 s of CPU before it
        # sleeps (docs/optimisation-notes.md row 83). The runtime's commands never call numpy's BLAS (their
        # products are onnxruntime's), so they load it with one thread, unless the user chose a number.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # one line for the user; the traceback with --debug
        if debug:
            raise
        from seq2onnx.runtime.bundle import BundleError

        known = (
            CommandError,
            BundleError,
            ImportError,
            ValueError,
            TypeError,
            FileNotFoundError,
            PermissionError,
            RuntimeError,
            OSError,
        )
        kind = (
            ""
            if isinstance(e, known)
            else f"unexpected {type(e).__name__} (rerun with --debug for the traceback): "
        )
        print(f"seq2onnx {args.command}: error: {kind}{e}", file=sys.stderr)
        return EXIT_FAIL


def main(argv: list[str] | None = None) -> int:
    """Runs the `seq2onnx` console command.

    Args:
        argv: the arguments after the program name (default sys.argv[1:]).

    Returns:
        The exit status.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    parser.set_defaults(argv=argv)  # train --nproc hands the command line to torchrun's workers
    return run_command(parser, argv)
