"""The sentences `seq2onnx verify-host` translates on both hosts: a file's lines (or a TSV column), spread
over the file, or synthetic sentences made of the bundle's own pieces."""

from __future__ import annotations

import random
from pathlib import Path

from seq2onnx import errors

DEFAULT_SENTENCES = 200


def _lines(path: Path) -> list[str]:
    """A file's lines split at "\\n" only (as `seq2onnx translate` splits them), a final "\\r" and a
    leading byte order mark removed."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise errors.CommandError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise errors.CommandError(
            f"{path}: line {line} is not UTF-8 ({e.reason}); give a UTF-8 file"
        ) from None
    lines = text.removeprefix("\ufeff").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _spread(items: list[str], count: int) -> list[str]:
    """`count` items evenly spaced over the list (all of them when it is shorter): a file sorted
    by length (Tatoeba's is) is sampled across its lengths, not at its short end."""
    if len(items) <= count:
        return items
    return [items[i * len(items) // count] for i in range(count)]


def _synthetic(bundle_dir: Path, count: int, seed: int = 0) -> list[str]:
    """Texts made of random pieces of the bundle's source vocabulary (control, unknown, unused and
    byte pieces left out), 1 to 24 pieces each: off the training distribution, where near-ties
    between hypotheses are common, and available for any bundle."""
    import sentencepiece as spm

    from seq2onnx.runtime.bundle import read_bundle

    bundle = read_bundle(bundle_dir, check_hashes=False)  # Translator checks the hashes
    sp = spm.SentencePieceProcessor(model_file=str(bundle.file("source_tokenizer")))
    pieces = [
        i
        for i in range(sp.get_piece_size())
        if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i) or sp.is_byte(i))
    ]
    rng = random.Random(seed)
    longest = max(1, min(24, bundle.max_positions - 1))
    return [sp.decode([rng.choice(pieces) for _ in range(rng.randint(1, longest))]) for _ in range(count)]


def read_sentences(
    *,
    bundle_dir: str | Path,
    data: str | None = None,
    src_col: int = 0,
    sentences_file: str | None = None,
    synthetic: bool = False,
    count: int = DEFAULT_SENTENCES,
) -> tuple[list[str], str]:
    """Returns the sentences to compare and a description of where they come from, read from exactly
    one source.

    Args:
        bundle_dir: the bundle (its vocabulary, for synthetic sentences).
        data, src_col: a tab-separated file, and its column to read.
        sentences_file: a file of sentences, one per line.
        synthetic: made from the bundle's vocabulary.
        count: blank lines and empty sentences are left out; of the rest, `count` evenly spaced ones are kept.

    Raises:
        CommandError: none or several sources are given, the file lacks the column, or a bad count or
            no sentence.
    """
    sources = (("--data", data), ("--sentences-file", sentences_file), ("--synthetic", synthetic))
    given = [name for name, on in sources if on]
    if not given:
        raise errors.CommandError(
            "give the sentences to compare: --sentences-file FILE (one per line), "
            "--data TSV --src-col N (a column of a tab-separated file) or --synthetic "
            "(random pieces of the bundle's source vocabulary)"
        )
    if len(given) > 1:
        raise errors.CommandError(f"{' and '.join(given)}: give one source of sentences")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise errors.CommandError(f"--sentences {count}: give an integer >= 1")
    if synthetic:
        described = f"{count} synthetic texts from the bundle's source vocabulary (seed 0)"
        return _synthetic(Path(bundle_dir), count), described
    path = Path(data or sentences_file)
    lines = _lines(path)
    if data:
        texts = _column(path, lines, src_col)
        what = f"column {src_col} of {path.name}"
    else:
        texts, what = lines, path.name
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise errors.CommandError(f"{path}: no non-empty sentences")
    kept = _spread(texts, count)
    spread = f" (evenly spaced over its {len(texts)} non-empty ones)" if len(kept) < len(texts) else ""
    return kept, f"{len(kept)} sentences from {what}{spread}"


def _column(path: Path, lines: list[str], src_col: int) -> list[str]:
    """Column `src_col` of the tab-separated `lines` (of `path`), blank lines left out."""
    if src_col < 0:
        raise errors.CommandError(f"--src-col {src_col}: give a column number >= 0")
    texts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():  # blank lines (a file ending in two newlines) hold no sentence
            continue
        columns = line.split("\t")
        if src_col >= len(columns):
            raise errors.CommandError(
                f"{path}: line {n} has {len(columns)} tab-separated columns; "
                f"--src-col {src_col} needs at least {src_col + 1}"
            )
        texts.append(columns[src_col])
    return texts


# -- the comparison --------------------------------------------------------------------------------
