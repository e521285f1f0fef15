"""Search in numpy, batched over sentences, over a step callable: greedy here, beam in runtime/beam.py,
sampling in runtime/sampling.py.

The convention is docs/decoding.md's, the same as model/search.py (the PyTorch oracle that
this code is tested against token for token): scores are sums of log-probabilities, end token
included; n-best ranked by score / len^alpha; 2K candidates per sentence; an end token finishes
only within the top K; at a sentence's last allowed step every top-K candidate finishes; ties go
to the lower flat index (beam x V + token).

    step(tokens (R, 1) int64, cache_indices (R,) int64, t, keep) -> log_probs (R, V) or TopK

A step may return every row's full log-probabilities, or only its k best (TopK, from the
decoder graph's TopK node): the search needs at most 2K candidates per row (2K + 1 while the
end token is forbidden, one of them possibly the end token), so both give the same hypotheses.
Rows are grouped by sentence, beams contiguous. Row r continues row cache_indices[r] of the
previous step. `keep` is None, or the indices (into the previous step's sentences) of the
sentences still decoding: finished sentences are dropped so that they cost no more compute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generator, Iterator, NamedTuple

import numpy as np


class TopK(NamedTuple):
    """The k best log-probabilities of each row, best first (ties: lower id first), and their ids.

    Attributes:
        values, ids: (R, k) log-probabilities and their int64 token ids.
        vocab: V, for the flat index beam x V + token that breaks ties.
    """

    values: np.ndarray  # (R, k)
    ids: np.ndarray  # (R, k) int64
    vocab: int  # V, for the flat index beam x V + token that breaks ties


Step = Callable[[np.ndarray, np.ndarray, int, "np.ndarray | None"], "np.ndarray | TopK"]
# A search program: a generator that yields each step's request (tokens, cache_indices, t, keep), is sent
# the step's output, and returns its results. run(program, step) drives one; serve/batcher.py drives many
# at once, one decoder run for all of their requests.
Program = Generator[tuple, "np.ndarray | TopK", object]
BEAM_CONVENTIONS = (
    "fairseq",
    "transformers",
    "transformers_heuristic",
    "transformers_never",
)  # spec/bundle.json's
# beam_conventions (docs/decoding.md); each transformers one is generate()'s with this early_stopping:
EARLY_STOPPING = {
    "fairseq": True,
    "transformers": True,
    "transformers_heuristic": False,
    "transformers_never": "never",
}


def run(program: Program, step: Step):
    """Drives a search program with a step callable and returns its result.

    Args:
        program: a search program (greedy_program, beam_program, ...), not started.
        step: the step callable that answers its requests.
    """
    try:
        request = next(program)
        while True:
            request = program.send(step(*request))
    except StopIteration as done:
        return done.value


def candidates_needed(beam_size: int, min_length: int, greedy: bool = False) -> int:
    """Returns how many candidates per row a search's step must return for it to be exact: 2K for a beam
    search (K = 1 included), 1 for greedy search (it reads its best alone), +1 if min_length > 0 (the best
    may be the forbidden end token).

    Why greedy asks for 1, not 2K = 2: the graph's TopK is a pass over each row's vocabulary, and
    greedy reads one column of it (docs/optimisation-notes.md row 50).

    Args:
        beam_size, min_length: the search's K and minimum length (the end token forbidden before it).
        greedy: the search is greedy search (beam_size 1).
    """
    return (1 if greedy else 2 * beam_size) + (1 if min_length > 0 else 0)


@dataclass
class SearchResult:
    """One sentence's n-best, best first.

    Attributes:
        hypotheses: token ids, end token included when produced.
        scores: their sums of log-probabilities.
    """

    hypotheses: list[list[int]] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)


def _check(beam_size: int, max_lengths: np.ndarray, min_length: int) -> None:
    if beam_size < 1:
        raise ValueError(f"beam_size={beam_size}; it must be at least 1 (1 is greedy search)")
    if max_lengths.size and max_lengths.min() < 1:
        raise ValueError(f"max_decoding_length={int(max_lengths.min())}; it must be at least 1")
    if min_length < 0 or (max_lengths.size and min_length >= max_lengths.min()):
        raise ValueError(
            f"min_decoding_length={min_length} must lie in [0, max_decoding_length="
            f"{int(max_lengths.min()) if max_lengths.size else '?'})"
        )


def greedy_search(
    step: Step,
    batch: int,
    *,
    start_id: int,
    eos_id: int,
    max_lengths: np.ndarray,
    min_length: int = 0,
) -> list[SearchResult]:
    """Greedy search: run(greedy_program(...), step); its arguments and results are greedy_program's."""
    return run(
        greedy_program(
            batch, start_id=start_id, eos_id=eos_id, max_lengths=max_lengths, min_length=min_length
        ),
        step,
    )


def greedy_program(
    batch: int,
    *,
    start_id: int,
    eos_id: int,
    max_lengths: np.ndarray,
    min_length: int = 0,
) -> Program:
    """Greedy search as a program: argmax at each step (first index on ties).

    Args:
        batch: the number of sentences.
        start_id, eos_id: the first decoder input and the end token.
        max_lengths: per sentence, the tokens it may generate (end token included), then it stops.
        min_length: the end token is forbidden before this many tokens.

    Returns:
        (as the program's result) One SearchResult per sentence, with one hypothesis.

    Raises:
        ValueError: impossible lengths (at the first request).
    """
    max_lengths = np.asarray(max_lengths, dtype=np.int64)
    _check(1, max_lengths, min_length)
    if batch == 1:
        return [
            (
                yield from greedy_one_program(
                    start_id=start_id, eos_id=eos_id, max_length=int(max_lengths[0]), min_length=min_length
                )
            )
        ]
    out = np.zeros((batch, int(max_lengths.max(initial=0))), dtype=np.int64)
    lengths = np.zeros(batch, dtype=np.int64)
    scores = np.zeros(batch, dtype=np.float64)
    alive = np.arange(batch)  # sentences still decoding, in row order
    tokens = np.full((batch, 1), start_id, dtype=np.int64)
    cache_indices = np.arange(batch, dtype=np.int64)
    keep = None
    t = 0
    while alive.size:
        best, best_lp = _argmax((yield tokens, cache_indices, t, keep), eos_id, forbid_eos=t < min_length)
        out[alive, t] = best
        scores[alive] += best_lp
        lengths[alive] = t + 1
        t += 1
        still = (best != eos_id) & (max_lengths[alive] > t)
        if still.all():
            if keep is not None:
                keep = None
                cache_indices = np.arange(alive.size, dtype=np.int64)
        else:
            keep = np.flatnonzero(still)
            cache_indices = keep
            alive = alive[keep]
        tokens = best[still][:, None] if keep is not None else best[:, None]
    return [SearchResult([out[b, : lengths[b]].tolist()], [float(scores[b])]) for b in range(batch)]


def greedy_one_program(
    *,
    start_id: int,
    eos_id: int,
    max_length: int,
    min_length: int,
    on_token: Callable[[int], None] | None = None,
) -> Program:
    """greedy_program for one sentence with Python scalars: the same tokens and float64 score.

    Python scalars instead of the batched loop's ~25 numpy calls per step: between two decoder steps
    every numpy call runs on caches the step has just flushed (~2-3 us each at one row,
    docs/optimisation-notes.md row 16).

    Args:
        start_id, eos_id, max_length, min_length: as greedy_program's, for one sentence.
        on_token: called with each token as soon as it is chosen (the end token too), for streaming.

    Returns:
        (as the program's result) The sentence's SearchResult.
    """
    out: list[int] = []
    score = 0.0  # summed in order, as the batched loop's float64 scores
    tokens = np.full((1, 1), start_id, dtype=np.int64)
    cache_indices = np.zeros(1, dtype=np.int64)
    for t in range(max_length):
        found = yield tokens, cache_indices, t, None
        if isinstance(found, TopK) and t >= min_length:
            token, log_prob = (
                int(found.ids[0, 0]),
                float(found.values[0, 0]),
            )  # sorted: column 0 is the argmax
        else:
            best, best_lp = _argmax(found, eos_id, forbid_eos=t < min_length)
            token, log_prob = int(best[0]), float(best_lp[0])
        out.append(token)
        score += log_prob
        if on_token is not None:
            on_token(token)
        if token == eos_id:
            break
        tokens = np.array([[token]], dtype=np.int64)  # new each step: a step may keep what it was given
    return SearchResult([out], [score])


def _argmax(out: "np.ndarray | TopK", eos_id: int, forbid_eos: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each row's best token (first index on ties) and its log-probability as float64."""
    if isinstance(out, TopK) and not forbid_eos:
        # Sorted best first, ties lower id first: column 0 is the argmax with the first index on ties.
        return out.ids[:, 0].astype(np.int64), out.values[:, 0].astype(np.float64)
    rows = np.arange(out.values.shape[0] if isinstance(out, TopK) else out.shape[0])
    if isinstance(out, TopK):
        values = out.values.astype(np.float64)
        if forbid_eos:
            values = np.where(out.ids == eos_id, -np.inf, values)
        j = values.argmax(axis=1)  # sorted best first: the first that is not a forbidden end token
        return out.ids[rows, j].astype(np.int64), values[rows, j]
    log_probs = out
    if forbid_eos:
        log_probs = log_probs.copy()
        log_probs[:, eos_id] = -np.inf
    best = log_probs.argmax(axis=1)
    return best, log_probs[rows, best].astype(np.float64)


def stream_greedy(
    step: Step,
    *,
    start_id: int,
    eos_id: int,
    max_length: int,
    min_length: int = 0,
) -> Iterator[int]:
    """Greedy decoding of one sentence, yielding each token as soon as it is chosen (before the next step
    runs).

    Args:
        step: the step callable, for one row.
        start_id, eos_id: the first decoder input and the end token.
        max_length: tokens it may generate (end token included).
        min_length: the end token is forbidden before this many tokens.

    Yields:
        Token ids, the end token excluded.

    Raises:
        ValueError: impossible lengths.
    """
    _check(1, np.array([max_length]), min_length)
    chosen: list[int] = []
    program = greedy_one_program(
        start_id=start_id, eos_id=eos_id, max_length=max_length, min_length=min_length, on_token=chosen.append
    )
    request = next(program)
    while True:
        try:
            request = program.send(step(*request))
        except StopIteration:
            request = None
        for token in chosen:
            if token != eos_id:
                yield token
        chosen.clear()
        if request is None:
            return
