"""A run's corpus split into train, validation and test, the same way by training, verify and evaluate."""

from __future__ import annotations

from pathlib import Path

from .corpus import generate_pairs
from .data import Split, read_pairs, split_pairs
from .options import TrainError, TrainOptions


def _read_tsv(path: str, flag: str, opts: TrainOptions, verbose: bool = True) -> list[tuple[str, str]]:
    if not Path(path).is_file():
        raise TrainError(f"{flag} {path}: no such file; give a tab-separated corpus")
    pairs, skipped = read_pairs(
        path, src_col=opts.src_col, tgt_col=opts.tgt_col, skip_bad=opts.skip_bad_lines
    )
    if skipped and verbose:
        print(f"skipped {skipped} malformed lines of {path} (--skip-bad-lines)")
    return pairs


def load_split(opts: TrainOptions, *, valid: bool = True, verbose: bool = True) -> Split:
    """Splits the corpus (a TSV file or the generated one) deterministically by opts.seed.

    With opts.valid_data the validation set is that file (read with the same column options)
    and `data` gives only train and test; training pairs whose source is in the validation file
    are dropped, so that validation never scores memorised sentences.

    Args:
        opts: the run's options (data, valid_data, columns, sizes, seed).
        valid: False skips reading the validation file (the test split does not depend on it)
            and leaves `valid` empty.
        verbose: False keeps its notes (lines skipped, pairs dropped) off stdout: for ranks other than 0.

    Returns:
        The train, validation and test pairs.

    Raises:
        TrainError: a missing file, or every training source is also in the validation file.
        DataError: a malformed file.
    """
    if opts.data is None:
        pairs = generate_pairs(opts.generated_pairs, seed=opts.seed)
    else:
        pairs = _read_tsv(opts.data, "--data", opts, verbose)
    if opts.valid_data is None:
        return split_pairs(pairs, valid_size=opts.valid_size, test_size=opts.test_size, seed=opts.seed)
    split = split_pairs(pairs, valid_size=0, test_size=opts.test_size, seed=opts.seed)
    if not valid:
        return split
    valid_pairs = _read_tsv(opts.valid_data, "--valid-data", opts, verbose)
    sources = {s for s, _ in valid_pairs}
    train = [pair for pair in split.train if pair[0] not in sources]
    if not train:
        raise TrainError(
            f"every training source of {opts.data or 'the generated corpus'} is also in "
            f"--valid-data {opts.valid_data}; give a validation file distinct from the training "
            "data"
        )
    if len(train) < len(split.train) and verbose:
        print(
            f"dropped {len(split.train) - len(train)} training pairs whose source is in --valid-data "
            f"{opts.valid_data}"
        )
    return Split(train=train, valid=valid_pairs, test=split.test)
