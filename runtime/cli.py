"""The `seq2onnx` command's entry point, and the runtime's own commands (translate).

A runtime-only install (`pip install 'seq2onnx[cpu]'`: onnxruntime, numpy, sentencepiece) runs every
command here without importing torch, seq2onnx.model or seq2onnx.export. The training-side
commands (train, export, verify, evaluate, demo, bench) live in seq2onnx.export.cli; main()
dispatches to it by name, so that module is imported only when one of them is asked for.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

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
    """Raises CommandError naming the install command when torch is missing."""
    if importlib.util.find_spec("torch") is None:
        raise CommandError(
            f"`seq2onnx {command}` needs PyTorch, which this install lacks: pip install 'seq2onnx[train,cpu]' "
            "(or 'seq2onnx[train,gpu]' on a CUDA machine)"
        )


# -- translate -----------------------------------------------------------------------------------

class Progress:
    """A one-line progress bar on stderr (tqdm is not a runtime dependency)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.t0, self.enabled = total, 0, time.time(), enabled and total > 0

    def update(self, n: int) -> None:
        self.done += n
        if self.enabled:
            elapsed = time.time() - self.t0
            rate = self.done / elapsed if elapsed > 0 else 0.0
            left = (self.total - self.done) / rate if rate else 0.0
            width = 30
            filled = int(width * self.done / self.total)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} lines "
                             f"{rate:.1f}/s, {left:.0f} s left ")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def add_translate(sub) -> None:
    p = sub.add_parser("translate", help="translate lines with a bundle (no torch needed)",
                       description="Read lines from --input (default stdin), write translations in input order "
                       "to --output (default stdout). Batched internally by length.")
    p.add_argument("bundle")
    p.add_argument("-i", "--input", help="file of source lines (default: stdin)")
    p.add_argument("-o", "--output", help="file to write (default: stdout)")
    p.add_argument("--beam", type=int, default=None, help="beam size; 1 is greedy (default: the bundle's, 4)")
    p.add_argument("--n-best", type=int, default=1, help="hypotheses per line, written as 'LINE ||| TEXT ||| SCORE'")
    p.add_argument("--scores", action="store_true", help="write 'SCORE<TAB>TEXT' (sum of log-probabilities)")
    p.add_argument("--length-penalty", type=float, default=None)
    p.add_argument("--max-length", type=int, default=None, help="maximum target tokens (default: relative to the source)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0: all cores)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--truncate", action="store_true", help="cut sources longer than the model's positions")
    p.set_defaults(func=cmd_translate)


def cmd_translate(args) -> int:
    from seq2onnx.runtime.translator import Translator

    translator = Translator(args.bundle, device=args.device, intra_threads=args.threads)
    if args.input:
        path = Path(args.input)
        if not path.is_file():
            raise CommandError(f"--input {path}: no such file")
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            text = f.read()
    else:
        text = sys.stdin.read()
    # Lines end at "\n" only: str.splitlines would also split at form feeds, U+2028 and other
    # separators inside a line, and every later translation would land on the wrong line.
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    progress = Progress(len(lines), enabled=bool(args.input) and sys.stderr.isatty() or bool(os.environ.get("SEQ2ONNX_PROGRESS")))
    try:
        chunk = 256
        for start in range(0, len(lines), chunk):
            results = translator.translate_batch(
                lines[start : start + chunk], beam_size=args.beam, num_hypotheses=args.n_best,
                length_penalty=args.length_penalty, max_decoding_length=args.max_length, return_scores=True,
                truncate=args.truncate, max_batch_size=args.batch_size)
            for offset, r in enumerate(results):
                if args.n_best > 1:
                    for text, score in zip(r.hypotheses, r.scores):
                        out.write(f"{start + offset} ||| {text} ||| {score:.4f}\n")
                elif args.scores:
                    out.write(f"{r.scores[0]:.4f}\t{r.hypotheses[0]}\n")
                else:
                    out.write(r.hypotheses[0] + "\n")
            progress.update(len(results))
    finally:
        progress.close()
        if args.output:
            out.close()
    return 0


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
    add_translate(sub)
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

        known = (CommandError, BundleError, ValueError, TypeError, FileNotFoundError, PermissionError, RuntimeError, OSError)
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
    sys.exit(main())
