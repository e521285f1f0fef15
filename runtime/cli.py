"""The `seq2onnx` command's entry point: its parser, its error handling, and the dispatch.

A runtime-only install (`pip install 'seq2onnx[cpu]'`: onnxruntime, numpy, sentencepiece) runs every
command here without importing torch, seq2onnx.model or seq2onnx.export. The training-side
commands (train, export, verify, evaluate, demo, bench) live in seq2onnx.export.cli; main()
dispatches to it by name, so that module is imported only when one of them is asked for. The
runtime's own command, translate, is seq2onnx.runtime.translate_cmd.
"""
from __future__ import annotations

import argparse
import sys

EXIT_USAGE, EXIT_FAIL = 2, 1

# Commands served by seq2onnx.export.cli, with their one-line help for `seq2onnx --help` (kept here
# so that listing them imports nothing of the training side).
TRAINING_COMMANDS = {
    "train": "train a Transformer on a parallel corpus (or the generated one)",
    "export": "turn a checkpoint into an ONNX bundle",
    "verify": "prove a bundle computes what its checkpoint computes",
    "evaluate": "BLEU on the checkpoint's test split (PyTorch and, with --bundle, onnxruntime)",
    "demo": "train, export, verify and translate on the generated corpus (~5 min on 2 cores)",
    "bench": "benchmark the PyTorch reference, the ONNX runtime and CTranslate2 on the same model",
}


class CommandError(Exception):
    """An error meant for the user: printed as one line, exit status 1."""


def needs_torch(command: str) -> None:
    """Raises CommandError naming the install command when torch is missing (or cannot load: a
    broken install is as missing as an absent one, and the command imports it next anyway)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise CommandError(
            f"`seq2onnx {command}` needs PyTorch, which this install lacks: pip install 'seq2onnx[train,cpu]' "
            "(or 'seq2onnx[train,gpu]' on a CUDA machine)"
        ) from None


# -- main ----------------------------------------------------------------------------------------

def _version() -> str:
    from seq2onnx import __version__

    return __version__


def add_debug(parser: argparse.ArgumentParser) -> None:
    """--debug before or after the subcommand (SUPPRESS keeps a subcommand from resetting it)."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the full traceback on errors")


def build_parser(training: bool = False) -> argparse.ArgumentParser:
    """The `seq2onnx` parser. With training=False the training-side commands are listed by name
    only (choosing one dispatches to seq2onnx.export.cli before this parser runs)."""
    parser = argparse.ArgumentParser(
        prog="seq2onnx",
        description="Train a Transformer in PyTorch, export it as two ONNX graphs, verify parity, translate without torch.",
        epilog="`seq2onnx COMMAND --help` explains a command. translate needs only the runtime "
               "(pip install 'seq2onnx[cpu]'); the others need the training extra (pip install 'seq2onnx[train,cpu]').",
    )
    parser.add_argument("--version", action="version", version=f"seq2onnx {_version()}")
    add_debug(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    if training:
        from seq2onnx.export.cli import add_commands

        add_commands(sub)
    else:
        for name, help in TRAINING_COMMANDS.items():
            sub.add_parser(name, help=help, add_help=False)
    from seq2onnx.runtime.dataset import add_translate_dataset
    from seq2onnx.runtime.translate_cmd import add_translate
    from seq2onnx.runtime.web import add_web

    add_translate(sub)
    add_translate_dataset(sub)
    add_web(sub)
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


def main(argv: list[str] | None = None) -> int:
    """The `seq2onnx` console command."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in TRAINING_COMMANDS:
        from seq2onnx.export import cli

        return cli.main(argv)
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy's: the commands raise
    # seq2onnx.runtime.cli.CommandError, which a second copy of this class would not catch.
    from seq2onnx.runtime.cli import main as _main

    sys.exit(_main())
