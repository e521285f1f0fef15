"""Greedy, beam and sampling search in numpy, batched over sentences, over a step callable.

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


def _top_candidates(total: np.ndarray, n: int) -> np.ndarray:
    """Per row, the flat indices of the n largest values, ordered by (value desc, index asc)."""
    if n < total.shape[1]:
        part = np.argpartition(-total, n - 1, axis=1)[:, :n]
        chosen = np.take_along_axis(total, part, axis=1)
        threshold = chosen.min(axis=1, keepdims=True)
        # A tie at the threshold may have taken a higher index over a lower one: redo those rows
        # with a full stable sort (rare: exact float ties or -inf from a forbidden end token).
        tied = (total == threshold).sum(axis=1) != (chosen == threshold).sum(axis=1)
        for row in np.flatnonzero(tied):
            part[row] = np.argsort(-total[row], kind="stable")[:n]
    else:
        part = np.broadcast_to(np.arange(total.shape[1]), total.shape).copy()
    values = np.take_along_axis(total, part, axis=1)
    order = np.lexsort((part, -values), axis=1)
    return np.take_along_axis(part, order, axis=1)


def beam_search(step: Step, batch: int, **options) -> list[SearchResult]:
    """Beam search: run(beam_program(batch, **options), step); the step must give at least 2K candidates per
    row."""
    return run(beam_program(batch, **options), step)


def beam_program(
    batch: int,
    *,
    beam_size: int,
    start_id: int,
    eos_id: int,
    max_lengths: np.ndarray,
    min_length: int = 0,
    length_penalty: float = 1.0,
    num_hypotheses: int = 1,
    convention: str = "fairseq",
) -> Program:
    """Beam search as a program over `batch` sentences at once; each sentence finishes on its own.

    Args:
        batch: the number of sentences.
        beam_size: K.
        start_id, eos_id: the first decoder input and the end token.
        max_lengths: per sentence, the tokens it may generate (end token included).
        min_length: the end token is forbidden before this many tokens.
        length_penalty: alpha of the ranking score / len^alpha.
        num_hypotheses: the n-best per sentence, 1..K.
        convention: "fairseq" (a finishing candidate takes a free place among the K, docs/decoding.md) or
            one of generate()'s (the K best by normalised score of those finished so far and this step's,
            which may displace one finished earlier), which stop a sentence as its early_stopping does
            (EARLY_STOPPING): "transformers" (True) once K have finished; "transformers_heuristic" (False) and
            "transformers_never" ("never") once the best live beam's score / len^alpha is no better than the
            worst finished one's, len being the tokens generated so far, or for "never" with alpha > 0 the
            sentence's max length (_check_early_stop_heuristic); bundle.json's decoding.beam_convention.

    Returns:
        (as the program's result) One SearchResult per sentence, best first.

    Raises:
        ValueError: impossible settings (at the first request), or a vocabulary or step with fewer than 2K
            candidates.
    """
    max_lengths = np.asarray(max_lengths, dtype=np.int64)
    _check(beam_size, max_lengths, min_length)
    if convention not in BEAM_CONVENTIONS:
        raise ValueError(f"convention={convention!r}; choose one of {', '.join(BEAM_CONVENTIONS)}")
    if not 1 <= num_hypotheses <= beam_size:
        raise ValueError(f"num_hypotheses={num_hypotheses} must lie in [1, beam_size={beam_size}]")
    beams = _Beams(batch, beam_size, start_id, eos_id, max_lengths, min_length, length_penalty, convention)
    while beams.alive.size:
        out = yield beams.tokens, beams.cache_indices, beams.t, beams.keep
        beams.advance(out)
    return beams.results(num_hypotheses)


_NEVER = np.iinfo(np.int64).max  # the least max length of no sentence


class _Beams:
    """beam_program's state between two steps, and its step: the sentences still decoding (`alive`), their
    live beams' scores and tokens, the finished hypotheses of every sentence, the next request."""

    def __init__(self, batch, k, start_id, eos_id, max_lengths, min_length, length_penalty, convention):
        self.k, self.eos_id, self.max_lengths, self.min_length = k, eos_id, max_lengths, min_length
        self.length_penalty = length_penalty
        self.best_finished, self.early_stopping = convention != "fairseq", EARLY_STOPPING[convention]
        longest = int(max_lengths.max(initial=0))
        self.fin_tokens = np.zeros((batch, k, longest), dtype=np.int64)
        self.fin_lengths = np.zeros((batch, k), dtype=np.int64)
        self.fin_scores = np.full((batch, k), -np.inf)
        self.n_finished = np.zeros(batch, dtype=np.int64)
        self.alive = np.arange(batch)  # sentence ids still decoding
        self.beams = 1  # live beams per sentence: one on the first step
        self.scores = np.zeros((batch, 1))  # (B, beams) cumulative log-probabilities
        self.history = np.zeros((batch, 1, 0), dtype=np.int64)  # (B, beams, t) tokens so far
        self.tokens = np.full((batch, 1), start_id, dtype=np.int64)
        self.cache_indices = np.arange(batch, dtype=np.int64)
        self.keep = None
        self.t = 0
        self.in_top_k = np.arange(2 * k)[None, :] < k
        # for gathers along axis 1: x[rows, idx] is take_along_axis, cheaper
        self.rows = np.arange(batch)[:, None]
        self._offsets: tuple | None = None  # (beams, vocab, beam x vocab offsets of a TopK's flat indices)
        self._reach = max_lengths  # the max lengths of the sentences in `alive`
        # the least of them: before it, no sentence is at its last step
        self._soonest = int(max_lengths.min(initial=_NEVER))
        self._finished_any = False  # a hypothesis has finished: full sentences must be looked for

    def advance(self, out: np.ndarray | TopK) -> None:
        """Takes a step's output: finishes candidates that end, continues the K best that do not, drops the
        sentences that are done, and sets the next request."""
        b = self.alive.size
        if self.rows.shape[0] != b:  # sentences left: a new index only then
            self.rows = self.rows[:b]
        cand, cand_scores, vocab = self._candidates(out, b)
        cand_beam, cand_token = np.divmod(cand, vocab)
        # (b,) sentences at their last step; None before the first can be
        last = self._reach == self.t + 1 if self.t + 1 >= self._soonest else None
        is_eos = cand_token == self.eos_id
        k = self.k
        eos_in_top = is_eos[:, :k].any()
        if eos_in_top or last is not None:
            self._finish(
                cand_beam, cand_token, cand_scores, is_eos if last is None else is_eos | last[:, None]
            )
        # 2. continue: the first K candidates that do not end
        if eos_in_top:
            cont = ~is_eos
            pick = cont & (np.cumsum(cont, axis=1) <= k)
            # at least K non-end candidates exist: each beam contributes at most one end token
            next_beam = cand_beam[pick].reshape(b, k)
            next_token = cand_token[pick].reshape(b, k)
            next_scores = cand_scores[pick].reshape(b, k)
        else:  # no end token among the first K: they are the K picked
            next_beam, next_token, next_scores = cand_beam[:, :k], cand_token[:, :k], cand_scores[:, :k]
        self.t += 1
        self._next(None if last is None else ~last, next_beam, next_token, next_scores)

    def _candidates(self, out: np.ndarray | TopK, b: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Each sentence's 2K best candidates, best first (ties: lower flat index beam x V + token): their
        flat indices, their scores, and V."""
        k, beams = self.k, self.beams
        vocab = out.vocab if isinstance(out, TopK) else out.shape[1]
        if vocab < 2 * k:
            raise ValueError(
                f"beam_size={k} needs a vocabulary of at least {2 * k} tokens, this one has {vocab}"
            )
        if not isinstance(out, TopK):
            log_probs = out.astype(np.float64)
            if self.t < self.min_length:
                log_probs[:, self.eos_id] = -np.inf
            total = (self.scores[:, :, None] + log_probs.reshape(b, beams, vocab)).reshape(b, beams * vocab)
            cand = _top_candidates(total, 2 * k)  # (b, 2K) flat indices, best first
            return cand, total[self.rows, cand], vocab
        values = out.values.astype(np.float64)
        if self.t < self.min_length:
            values = np.where(out.ids == self.eos_id, -np.inf, values)
        kk = values.shape[1]
        if kk < 2 * k:
            raise ValueError(f"the step returned {kk} candidates per row; beam_size={k} needs {2 * k}")
        if self._offsets is None or self._offsets[:2] != (beams, vocab):
            self._offsets = (beams, vocab, np.arange(beams)[None, :, None] * vocab)
        total = (self.scores[:, :, None] + values.reshape(b, beams, kk)).reshape(b, beams * kk)
        flat = (self._offsets[2] + out.ids.reshape(b, beams, kk)).reshape(b, beams * kk)
        order = np.lexsort((flat, -total), axis=1)[:, : 2 * k]
        return flat[self.rows, order], total[self.rows, order], vocab

    def _finish(self, cand_beam, cand_token, cand_scores, ends) -> None:
        """1. finish: top-K candidates that end (`ends`: the end token, or any at the sentence's last step),
        while room remains; a candidate at -inf (forced or forbidden tokens) never finishes."""
        k, t, alive, n_finished = self.k, self.t, self.alive, self.n_finished
        finishing = self.in_top_k & ends & (cand_scores > -np.inf)
        accepted = finishing & (np.cumsum(finishing, axis=1) + n_finished[alive, None] <= k)
        if (
            self.best_finished
        ):  # rows with more finishing than free places, or full ones still live: the best K
            accepted |= finishing
        for row, rank in zip(*np.nonzero(accepted)):
            sent, slot = alive[row], n_finished[alive[row]]
            if slot == k:  # transformers: this step's candidates are best first, so the worst finished may go
                norm = (
                    self.fin_scores[sent] / self.fin_lengths[sent].astype(np.float64) ** self.length_penalty
                )
                slot = int(np.argmin(norm))
                if not cand_scores[row, rank] / float(t + 1) ** self.length_penalty > norm[slot]:
                    continue
                n_finished[sent] -= 1
            self.fin_tokens[sent, slot, :t] = self.history[row, cand_beam[row, rank]]
            self.fin_tokens[sent, slot, t] = cand_token[row, rank]
            self.fin_lengths[sent, slot] = t + 1
            self.fin_scores[sent, slot] = cand_scores[row, rank]
            n_finished[sent] += 1
            self._finished_any = True

    def _next(self, still, next_beam, next_token, next_scores) -> None:
        """3. drop sentences that are done (`still`: not at their last step, or None: all), and set the next
        request."""
        if self._finished_any:
            full = self.n_finished[self.alive] == self.k
            if still is None:
                still = np.ones(full.size, dtype=bool)
            if self.early_stopping is True:
                still &= ~full
            elif full.any():
                still = self._early_stop(still, full, next_scores)
        rows = self.rows
        origin = rows * self.beams + next_beam  # (b, K) rows of this step the new beams continue
        history = np.concatenate([self.history[rows, next_beam], next_token[:, :, None]], axis=2)
        if still is None or still.all():
            self.keep = None
        else:
            self.keep = keep = np.flatnonzero(still)
            self.alive, origin, history = self.alive[keep], origin[keep], history[keep]
            next_token, next_scores = next_token[keep], next_scores[keep]
            self._reach = self._reach[keep]
            self._soonest = int(self._reach.min(initial=_NEVER))
        self.history = history
        self.beams = self.k
        self.scores = next_scores
        self.tokens = next_token.reshape(-1, 1)
        self.cache_indices = origin.reshape(-1)

    def _early_stop(self, still, full, next_scores):
        """generate()'s _check_early_stop_heuristic: can the best live beam still beat the worst finished?"""
        alpha, t = self.length_penalty, self.t
        done = np.flatnonzero(full & still)
        sents = self.alive[done]
        worst = (self.fin_scores[sents] / self.fin_lengths[sents].astype(np.float64) ** alpha).min(axis=1)
        if self.early_stopping == "never" and alpha > 0:
            reach = self.max_lengths[sents]
        else:
            reach = np.full(done.size, t)
        still[done] = next_scores[done, 0] / reach.astype(np.float64) ** alpha > worst
        return still

    def results(self, num_hypotheses: int) -> list[SearchResult]:
        """Each sentence's n-best by score / len^alpha, best first."""
        results = []
        for sent in range(self.n_finished.size):
            n = self.n_finished[sent]
            norm = (
                self.fin_scores[sent, :n]
                / self.fin_lengths[sent, :n].astype(np.float64) ** self.length_penalty
            )
            order = np.argsort(-norm, kind="stable")[:num_hypotheses]
            results.append(
                SearchResult(
                    [self.fin_tokens[sent, i, : self.fin_lengths[sent, i]].tolist() for i in order],
                    [float(self.fin_scores[sent, i]) for i in order],
                )
            )
        return results


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
