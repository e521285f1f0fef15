"""Reading real parallel corpora (tab-separated), splitting without leakage, token batches.

Only the stdlib: this module is shared by training and tooling that must not need torch.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

_BOM = b"\xef\xbb\xbf"
_SKIP_HINT = "pass skip_bad=True (--skip-bad-lines) to skip such lines"


class DataError(ValueError):
    """A corpus that cannot be used as given; the message names the file, line and fix."""


def read_pairs(
    path: str | os.PathLike[str], *, src_col: int = 0, tgt_col: int = 1, skip_bad: bool = False
) -> tuple[list[tuple[str, str]], int]:
    """Reads (source, target) pairs from a tab-separated UTF-8 file.

    Args:
        path: the file; a leading byte-order mark and \\r\\n line endings are handled.
        src_col, tgt_col: 0-based columns of source and target; other columns are ignored
            (e.g. src_col=1, tgt_col=0 for Tatoeba's English<TAB>other<TAB>attribution).
        skip_bad: skip and count malformed lines instead of raising.

    Returns:
        (pairs, skipped): fields stripped of surrounding whitespace, blank lines ignored and not counted.

    Raises:
        DataError: a missing file, bad column arguments, a malformed or non-UTF-8 line (unless
            skip_bad), or a file without any pair.
    """
    if src_col < 0 or tgt_col < 0 or src_col == tgt_col:
        raise DataError(
            f"src_col={src_col}, tgt_col={tgt_col}: columns must be two different indices >= 0; "
            "choose e.g. src_col=0, tgt_col=1"
        )
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file; check the corpus path") from None
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    pairs: list[tuple[str, str]] = []
    skipped = 0
    # Split bytes, not text, so that invalid UTF-8 is reported at its own line number.
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        pair, problem = _parse_line(raw, src_col, tgt_col)
        if pair is not None:
            pairs.append(pair)
        if problem is not None:
            if not skip_bad:
                raise DataError(f"{path}:{lineno}: {problem} {_SKIP_HINT}")
            skipped += 1
    if not pairs:
        detail = f" ({skipped} malformed lines skipped)" if skipped else ""
        raise DataError(f"{path}: no sentence pairs found{detail}; give a file with source<TAB>target lines")
    return pairs, skipped


def _parse_line(raw: bytes, src_col: int, tgt_col: int) -> tuple[tuple[str, str] | None, str | None]:
    """One line of a corpus: (the pair, None), or (None, what is wrong with it); (None, None) for a
    blank line (a trailing newline included), which carries nothing."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"invalid UTF-8 at byte {e.start} of the line; re-encode the file as UTF-8 or"
    if not line.strip():
        return None, None
    need = max(src_col, tgt_col) + 1
    fields = line.rstrip("\r").split("\t")
    if len(fields) < need:
        return None, (
            f"expected at least {need} tab-separated columns "
            f"(src_col={src_col}, tgt_col={tgt_col}), found {len(fields)}; fix the line or"
        )
    src, tgt = fields[src_col].strip(), fields[tgt_col].strip()
    if not src or not tgt:
        side = "source" if not src else "target"
        col = src_col if not src else tgt_col
        return None, f"empty {side} field (column {col}); fix the line or"
    return (src, tgt), None


@dataclass(frozen=True)
class Split:
    """Train, validation and test pairs; no source sentence occurs in two of them.

    Attributes:
        train: the training pairs.
        valid: the validation pairs.
        test: the test pairs.
    """

    train: list[tuple[str, str]]
    valid: list[tuple[str, str]]
    test: list[tuple[str, str]]


def split_pairs(pairs: list[tuple[str, str]], *, valid_size: int, test_size: int, seed: int = 0) -> Split:
    """Splits pairs into train/valid/test, keeping all translations of one source together.

    Sizes are in pairs; since a source's group is never cut, valid and test may exceed their
    size by less than one group. The result is the same for the same (pairs, sizes, seed).

    Args:
        pairs: (source, target) pairs.
        valid_size: validation pairs wanted.
        test_size: test pairs wanted.
        seed: seed of the shuffle of source groups.

    Returns:
        The split; training gets every group not drawn for test or validation.

    Raises:
        DataError: a negative size or fewer distinct sources than valid_size+test_size+1.
    """
    if valid_size < 0 or test_size < 0:
        raise DataError(f"valid_size={valid_size}, test_size={test_size}: sizes must be >= 0")
    # Tatoeba has many sources with several translations: split by source, or the model is
    # tested on sentences it was trained on.
    groups: dict[str, list[tuple[str, str]]] = {}
    for pair in pairs:
        groups.setdefault(pair[0], []).append(pair)
    need = valid_size + test_size + 1
    if len(groups) < need:
        raise DataError(
            f"{len(groups)} distinct source sentences ({len(pairs)} pairs) cannot fill "
            f"test_size={test_size} + valid_size={valid_size} + at least 1 for training (need {need}); "
            "lower the sizes or give more data"
        )
    order = list(groups.values())  # first-occurrence order, so the shuffle is reproducible
    random.Random(seed).shuffle(order)
    test: list[tuple[str, str]] = []
    valid: list[tuple[str, str]] = []
    i = 0
    for target, size in ((test, test_size), (valid, valid_size)):
        while len(target) < size:
            target.extend(order[i])
            i += 1
    train = [pair for group in order[i:] for pair in group]
    return Split(train=train, valid=valid, test=test)


def filter_by_length(
    examples: list[tuple[list[int], list[int]]], *, max_len: int, min_len: int = 1
) -> tuple[list[int], int]:
    """Finds the examples whose source and target lengths both lie in [min_len, max_len].

    Args:
        examples: (source ids, target ids) pairs.
        max_len: the longest length kept.
        min_len: the shortest length kept.

    Returns:
        (kept indices in order, number dropped).

    Raises:
        ValueError: min_len < 0 or max_len < min_len.
    """
    if min_len < 0 or max_len < min_len:
        raise ValueError(f"min_len={min_len}, max_len={max_len}: need 0 <= min_len <= max_len")
    kept = [
        i
        for i, (src, tgt) in enumerate(examples)
        if min_len <= len(src) <= max_len and min_len <= len(tgt) <= max_len
    ]
    return kept, len(examples) - len(kept)


def token_batches(
    lengths: list[tuple[int, int]], *, max_tokens: int, shuffle: bool, seed: int = 0
) -> list[list[int]]:
    """Groups example indices into batches of at most max_tokens padded tokens per side.

    Examples are sorted by length so that a batch pads little, and a batch holds
    batch_size * longest <= max_tokens; an example longer than max_tokens gets a batch of its own
    rather than being dropped.

    Args:
        lengths: lengths[i] is (source length, target length) of example i.
        max_tokens: the padded tokens a batch may hold per side.
        shuffle: shuffle the order of the batches (not their content) with seed.
        seed: the shuffle's seed.

    Returns:
        The batches, each a list of example indices.

    Raises:
        ValueError: max_tokens < 1.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be >= 1; a few thousand is typical")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i][0], lengths[i][1], i))
    batches: list[list[int]] = []
    batch: list[int] = []
    width = 0
    for i in order:
        # max(1, ...) so that empty examples still count against the budget.
        new_width = max(width, lengths[i][0], lengths[i][1], 1)
        if batch and (len(batch) + 1) * new_width > max_tokens:
            batches.append(batch)
            batch, new_width = [], max(lengths[i][0], lengths[i][1], 1)
        batch.append(i)
        width = new_width
    if batch:
        batches.append(batch)
    if shuffle:
        random.Random(seed).shuffle(batches)
    return batches
