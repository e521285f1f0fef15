"""The `seq2onnx` command's parser and error handling, and the runtime's commands on it.

A runtime-only install (`pip install 'seq2onnx[cpu]'`: onnxruntime, numpy, sentencepiece) runs the
runtime's commands (translate, translate-dataset, web, verify-host) without torch, seq2onnx.model or
seq2onnx.export; this module imports none of them. The console entry point is seq2onnx.cli, which
dispatches the training-side commands (train, export, verify, evaluate, demo, bench) by name to
seq2onnx.export.cli, and that module builds this parser with its own commands added.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

EXIT_USAGE, EXIT_FAIL = 2, 1

# Commands served by seq2onnx.export.cli, with their one-line help for `seq2onnx --help` (kept here
# so that listing them imports nothing of the training side).
TRAINING_COMMANDS = {
    "train": "train a Transformer on a parallel corpus (or the generated one)",
    "export": "turn a checkpoint into an ONNX bundle (or a CTranslate2 model)",
    "verify": "prove a bundle or CTranslate2 model computes what its checkpoint computes",
    "evaluate": "BLEU on the checkpoint's test split (PyTorch and, with --bundle, onnxruntime)",
    "demo": "train, export, verify and translate on the generated corpus (~5 min on 2 cores)",
    "bench": "benchmark the PyTorch reference, the ONNX runtime and CTranslate2 on the same model",
}


class CommandError(Exception):
    """An error meant for the user: printed as one line, exit status 1."""


def _version() -> str:
    from seq2onnx import __version__

    return __version__


def add_debug(parser: argparse.ArgumentParser) -> None:
    """--debug before or after the subcommand (SUPPRESS keeps a subcommand from resetting it)."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the full traceback on errors")


def build_parser(add_training: Callable[[Any], None] | None = None) -> argparse.ArgumentParser:
    """The `seq2onnx` parser. add_training(subparsers) adds the training-side commands (given by
    seq2onnx.export.cli); without it they are listed by name only, since seq2onnx.cli dispatches
    them before this parser runs."""
    parser = argparse.ArgumentParser(
        prog="seq2onnx",
        description="Train a Transformer in PyTorch, export it as two ONNX graphs, verify parity, translate without torch.",
        epilog="`seq2onnx COMMAND --help` explains a command. translate, translate-dataset, web and verify-host need "
               "only the runtime (pip install 'seq2onnx[cpu]'; verify-host also Node.js and npm ci --prefix js); the "
               "others need the training extra (pip install 'seq2onnx[train,cpu]').",
    )
    parser.add_argument("--version", action="version", version=f"seq2onnx {_version()}")
    add_debug(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    if add_training is not None:
        add_training(sub)
    else:
        for name, help in TRAINING_COMMANDS.items():
            sub.add_parser(name, help=help, add_help=False)
    from seq2onnx.runtime.dataset import add_translate_dataset
    from seq2onnx.runtime.host_parity import add_verify_host
    from seq2onnx.runtime.translate_cmd import add_translate
    from seq2onnx.runtime.web import add_web

    add_translate(sub)
    add_translate_dataset(sub)
    add_web(sub)
    add_verify_host(sub)
    for action in sub.choices.values():
        if action.add_help:
            add_debug(action)
    return parser


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parses argv and runs the chosen command: errors become one line on stderr and status 1
    (the traceback with --debug), Ctrl-C status 130."""
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    debug = getattr(args, "debug", False)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one line for the user; the traceback with --debug
        if debug:
            raise
        from seq2onnx.runtime.bundle import BundleError

        known = (CommandError, BundleError, ImportError, ValueError, TypeError, FileNotFoundError, PermissionError,
                 RuntimeError, OSError)
        kind = "" if isinstance(e, known) else f"unexpected {type(e).__name__} (rerun with --debug for the traceback): "
        print(f"seq2onnx {args.command}: error: {kind}{e}", file=sys.stderr)
        return EXIT_FAIL
