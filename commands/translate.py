"""`seq2onnx translate`: a Unix filter over a bundle's Translator.

Reads lines as they arrive (stdin or -i FILE, the same code), translates what has arrived, writes in
input order and flushes; invalid UTF-8 and over-long lines cost only a warning on their own line.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

from seq2onnx import atomic
from seq2onnx.errors import CommandError
from seq2onnx.commands import translate_flags
from seq2onnx.commands.lines import LineReader
from seq2onnx.commands.translate_io import (
    READ_CHUNK,
    AtomicOutput,
    Progress,
    Warnings,
    count_lines,
    decode_line,
    stdin_read,
)
from seq2onnx.commands.heatmap import MAX_PICTURES, json_line, page, picture_path, record

# -- translate: input, output, messages ------------------------------------------------------------

# Lines taken at once (when that many are waiting) = SORT_WINDOW x --batch-size: translate_batch sorts
# them by length into batches of --batch-size, so batches of a file hold similar lengths (less padding:
# 2,000 lines of 2-25 words took 3.2 s instead of 3.6 s with windows of one batch, tests' tiny model).
# A stream's windows hold
# only what has arrived, so the window does not delay an answer to a line that came alone.
SORT_WINDOW = 8


def _source_ids(
    translator, text: str, line: int, strict: bool, warnings: Warnings, args_langs: dict
) -> list[int]:
    """Source ids of one line; an over-long line is truncated with a warning, or an error with strict."""
    ids, cut = translator.prepare_source(
        text,
        truncate=True,
        source_lang=args_langs.get("source_lang"),
        target_lang=args_langs.get("target_lang"),
    )
    if cut:
        # prepare_source tokenised only a prefix (a 55 MB line costs no more than a short one): the
        # count beyond the limit is unknown, and not worth a full tokenisation to report.
        limit = translator.max_positions
        if strict:
            raise CommandError(
                f"input line {line} has more than {limit} tokens; this model was exported for "
                f"at most {limit} positions (max_positions in bundle.json): shorten the line, "
                "or leave out --strict to have it truncated with a warning"
            )
        warnings.warn(
            "more tokens than the model's positions",
            f"line {line}: more tokens than the {limit} positions this model was exported for "
            f"(max_positions in bundle.json): translated its first {limit - 1} and the end token "
            "(--strict makes this an error)",
        )
    return ids


def _format(result, index: int, args) -> str:
    if args.num_hypotheses > 1:
        return "".join(
            f"{index} ||| {text} ||| {score:.4f}\n" for text, score in zip(result.hypotheses, result.scores)
        )
    if args.scores:
        return f"{result.scores[0]:.4f}\t{result.hypotheses[0]}\n"
    return result.hypotheses[0] + "\n"


# -- translate: the command ------------------------------------------------------------------------

TRANSLATE_DESCRIPTION = """\
Translate lines with a bundle made by `seq2onnx export` (no torch needed).
Reads --input (default stdin) and writes one line per input line, in input
order, to --output (default stdout).

A Unix filter: it translates the lines that have arrived (waiting ~50 ms for
more; at most 8 x --batch-size, sorted by length into batches of --batch-size),
writes and flushes their translations and reads on, so `tail -f LOG | seq2onnx translate B` and
co-processes get each answer soon after its line. A reader that leaves early
(`| head -1`) ends it quietly with status 0.

Input is UTF-8 whatever the locale: invalid bytes are replaced by U+FFFD, with
a warning naming the line. Lines end at "\\n" only; a trailing "\\r" is dropped.
A line with more tokens than the model's positions is truncated, with a
warning naming the line (--strict: an error instead). Output is UTF-8."""


def add(sub) -> None:
    p = sub.add_parser(
        "translate",
        help="translate lines with a bundle (no torch needed)",
        description=TRANSLATE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "bundle", help="the bundle directory (bundle.json, encoder.onnx, decoder.onnx, tokenizers)"
    )
    p.add_argument("-i", "--input", help="file of source lines (default, or '-': stdin)")
    p.add_argument(
        "-o",
        "--output",
        help="file to write (default, or '-': stdout); written under a "
        "temporary name beside it and renamed when complete, so it is "
        "never left half-written",
    )
    p.add_argument("--force", action="store_true", help="let --output replace an existing file")
    translate_flags.add_option_flags(p, notes=_NOTES)
    p.add_argument("--scores", action="store_true", help="write 'SCORE<TAB>TEXT' (sum of log-probabilities)")
    _add_session_flags(p)
    _add_line_flags(p)
    p.set_defaults(func=run)


def _add_session_flags(p) -> None:
    """Where the graphs run: --device, --threads, --cache-dir."""
    p.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda"],
        help="auto: CUDA where onnxruntime can run it, else the CPU (default auto)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help=f"onnxruntime intra-op threads, at most this machine's {os.cpu_count()} cores "
        "(default 0: OMP_NUM_THREADS where set, else all cores)",
    )
    p.add_argument(
        "--cache-dir",
        default=None,
        metavar="DIR",
        help="on the CPU, keep onnxruntime's optimized graphs with their weights packed for "
        "this machine in DIR, so that later starts skip optimizing and packing (about 2.8x "
        "the bundle on disk; runtime/session_cache.py; default: none)",
    )


def _add_line_flags(p) -> None:
    """Each line's length (--truncate, --strict), its --attention, and --progress."""
    length = p.add_mutually_exclusive_group()
    length.add_argument(
        "--truncate",
        action="store_true",
        help="cut lines longer than the model's positions, with a warning naming the line (the default)",
    )
    length.add_argument(
        "--strict",
        action="store_true",
        help="a line longer than the model's positions is an error naming the line, not truncated",
    )
    p.add_argument(
        "--attention",
        metavar="FILE",
        help="also write each line's cross-attention (the best translation's target pieces x "
        "source pieces, last decoder layer averaged over heads) to FILE as JSON lines, and "
        f"heatmaps of the first {MAX_PICTURES} lines to FILE with the suffix .html; the "
        "translations are the same as without it",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar on stderr (default: on when stderr is a terminal and the input a "
        "file; --progress shows it anywhere, e.g. in a log, --no-progress never)",
    )


def _languages(args) -> dict:
    return {"source_lang": args.source_lang, "target_lang": args.target_lang}


_NOTES = {
    "num_hypotheses": "; written as 'LINE ||| TEXT ||| SCORE', LINE counted from 0",
    "max_batch_size": "; a stream's batches hold what has arrived",
    "target_prefix": "; here comma-separated ids (e.g. 5,17), forced in every line's translation",
}


def run(args) -> int:
    translate_flags.check_options(args)
    from_file = args.input not in (None, "-")
    to_file = args.output not in (None, "-")
    _refuse_outputs(args, from_file, to_file)  # before the model loads

    from seq2onnx.runtime.translator import Translator

    translator = Translator(
        args.bundle, device=args.device, intra_threads=args.threads, cache_dir=args.cache_dir
    )
    translate_flags.check_against_model(args, translator)
    show = args.progress if args.progress is not None else from_file and sys.stderr.isatty()
    progress = Progress(count_lines(Path(args.input)) if from_file and show else None, enabled=show)
    warnings = Warnings(progress)
    fd, read = _open_input(args.input if from_file else None)
    attention = AttentionSink(Path(args.attention), args.force, translator) if args.attention else None
    # last: nothing can fail before `try`
    sink = AtomicOutput(Path(args.output), args.force) if to_file else None
    if not sink:
        sys.stdout.flush()  # whatever the text layer holds goes first: translations go to its byte buffer
    out = sink.file if sink else getattr(sys.stdout, "buffer", None)
    done = False
    try:
        _translate_stream(
            translator,
            LineReader(read, max_queued=max(4096, 4 * args.max_batch_size)),
            args,
            out,
            warnings,
            progress,
            attention,
        )
        done = True
    except BrokenPipeError:
        if sink:
            raise
        # The reader of stdout left (`| head -1`): not an error. Python's docs' recipe: point stdout at
        # devnull, so that flushing it at exit raises nothing more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        done = True
    finally:
        progress.close()
        warnings.close()
        if fd is not None:
            os.close(fd)
        if sink and done:
            sink.commit()
        elif sink:
            sink.discard()
        if attention:
            attention.close(commit=done)
    return 0


def _refuse_outputs(args, from_file: bool, to_file: bool) -> None:
    """Refuses an --output or --attention file that overlaps an input or exists without --force."""
    inputs = {"the bundle": args.bundle, **({"--input": args.input} if from_file else {})}
    if to_file:
        atomic.refuse_overlap(args.output, inputs, CommandError)
        AtomicOutput.check(Path(args.output), args.force)
    if args.attention:
        for path in (Path(args.attention), picture_path(Path(args.attention))):
            atomic.refuse_overlap(path, inputs, CommandError)
            AtomicOutput.check(path, args.force, "--attention")


def _open_input(path: str | None):
    """(fd, read): the file's descriptor and a reader of its chunks, or (None, stdin's reader)."""
    if path is None:
        return None, stdin_read()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    return fd, functools.partial(os.read, fd, READ_CHUNK)


class AttentionSink:
    """--attention FILE: JSON lines as the translations are written, the heatmap page at the end;
    both atomic (AtomicOutput), both refused when they exist unless --force."""

    def __init__(self, path: Path, force: bool, translator):
        self.data = AtomicOutput(path, force, "--attention")
        self.picture = AtomicOutput(picture_path(path), force, "--attention")
        self.name, self.translator, self.drawn, self.total = path.name, translator, [], 0

    def write(self, first: int, sources: list[list[int]], results) -> None:
        """Appends the records of lines first, first + 1, ... (their source ids and TranslationResults) to
        FILE."""
        source_piece = self.translator.source_tokenizer.id_to_piece
        target_piece = self.translator.target_tokenizer.id_to_piece
        lines = []
        for k, (ids, result) in enumerate(zip(sources, results)):
            rec = record(
                first + k,
                [source_piece(i) for i in ids],
                [target_piece(t) for t in result.token_ids[0]],
                result.attention[0],
            )
            lines.append(json_line(rec))
            if len(self.drawn) < MAX_PICTURES:
                self.drawn.append(rec)
        self.total += len(lines)
        self.data.file.write("".join(lines).encode("utf-8"))
        self.data.file.flush()

    def close(self, commit: bool) -> None:
        """With commit, writes the page (the first MAX_PICTURES records) and renames both files into place;
        else discards both."""
        if commit:
            self.picture.file.write(page(self.drawn, self.total, self.name).encode("utf-8"))
            self.data.commit()
            self.picture.commit()
        else:
            self.data.discard()
            self.picture.discard()


def _translate_stream(
    translator,
    reader: LineReader,
    args,
    out,
    warnings: Warnings,
    progress: Progress,
    attention: AttentionSink | None = None,
) -> None:
    """Translates the reader's batches, writing and flushing each batch's lines in input order."""

    def write(text: str) -> None:
        if out is None:  # stdout replaced by a text stream (embedding, tests)
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            out.write(text.encode("utf-8"))
            out.flush()

    first = 0  # index of the batch's first line, counted from 0
    for batch in reader.batches(SORT_WINDOW * args.max_batch_size):
        ids, error = [], None
        for offset, raw in enumerate(batch):
            line = first + offset + 1
            try:
                text = decode_line(raw, line, warnings)
                ids.append(_source_ids(translator, text, line, args.strict, warnings, _languages(args)))
            except CommandError as e:  # the lines before it are still translated and written
                error = e
                break
        if ids:
            # the ids hold the source's language already
            options = translate_flags.search_options(args, len(ids)) | {"source_lang": None}
            results = translator.translate_batch(
                ids, return_scores=True, return_attention=attention is not None, **options
            )
            write("".join(_format(r, first + k, args) for k, r in enumerate(results)))
            if attention is not None:
                attention.write(first, ids, results)
            progress.update(len(results))
        if error is not None:
            raise error
        first += len(batch)
