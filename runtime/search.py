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
from typing import Callable, Iterator, NamedTuple

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


def candidates_needed(beam_size: int, min_length: int) -> int:
    """Returns how many candidates per row a step must return for a search to be exact: 2K, +1 if min_length > 0.

    Args:
        beam_size, min_length: the search's K (1 for greedy) and minimum length (the end token forbidden before it).
    """
    return 2 * beam_size + (1 if min_length > 0 else 0)


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
    step: Step, batch: int, *, start_id: int, eos_id: int, max_lengths: np.ndarray, min_length: int = 0,
) -> list[SearchResult]:
    """Greedy search: argmax at each step (first index on ties).

    Args:
        step: the step callable (see the module docstring).
        batch: the number of sentences.
        start_id, eos_id: the first decoder input and the end token.
        max_lengths: per sentence, the tokens it may generate (end token included), then it stops.
        min_length: the end token is forbidden before this many tokens.

    Returns:
        One SearchResult per sentence, with one hypothesis.

    Raises:
        ValueError: impossible lengths.
    """
    max_lengths = np.asarray(max_lengths, dtype=np.int64)
    _check(1, max_lengths, min_length)
    if batch == 1:
        return [_greedy_one(step, start_id=start_id, eos_id=eos_id, max_length=int(max_lengths[0]),
                            min_length=min_length)]
    out = np.zeros((batch, int(max_lengths.max(initial=0))), dtype=np.int64)
    lengths = np.zeros(batch, dtype=np.int64)
    scores = np.zeros(batch, dtype=np.float64)
    alive = np.arange(batch)  # sentences still decoding, in row order
    tokens = np.full((batch, 1), start_id, dtype=np.int64)
    cache_indices = np.arange(batch, dtype=np.int64)
    keep = None
    t = 0
    while alive.size:
        best, best_lp = _argmax(step(tokens, cache_indices, t, keep), eos_id, forbid_eos=t < min_length)
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


def _greedy_one(step: Step, *, start_id: int, eos_id: int, max_length: int, min_length: int) -> SearchResult:
    """greedy_search for one sentence with Python scalars: the same tokens and float64 score."""
    out: list[int] = []
    score = 0.0  # summed in order, as the batched loop's float64 scores
    for token, log_prob in _greedy_tokens(step, start_id=start_id, eos_id=eos_id, max_length=max_length,
                                          min_length=min_length):
        out.append(token)
        score += log_prob
    return SearchResult([out], [score])


def _greedy_tokens(
    step: Step, *, start_id: int, eos_id: int, max_length: int, min_length: int,
) -> Iterator[tuple[int, float]]:
    """One sentence's greedy tokens and their log-probabilities, lazily (the end token last, if chosen).

    Python scalars instead of the batched loop's ~25 numpy calls per step: between two decoder steps
    every numpy call runs on caches the step has just flushed (~2-3 us each at one row,
    docs/optimisation-notes.md row 16)."""
    tokens = np.full((1, 1), start_id, dtype=np.int64)
    cache_indices = np.zeros(1, dtype=np.int64)
    for t in range(max_length):
        found = step(tokens, cache_indices, t, None)
        if isinstance(found, TopK) and t >= min_length:
            token, log_prob = int(found.ids[0, 0]), float(found.values[0, 0])  # sorted: column 0 is the argmax
        else:
            best, best_lp = _argmax(found, eos_id, forbid_eos=t < min_length)
            token, log_prob = int(best[0]), float(best_lp[0])
        yield token, log_prob
        if token == eos_id:
            return
        tokens = np.array([[token]], dtype=np.int64)  # new each step: a step may keep what it was given


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


def beam_search(
    step: Step,
    batch: int,
    *,
    beam_size: int,
    start_id: int,
    eos_id: int,
    max_lengths: np.ndarray,
    min_length: int = 0,
    length_penalty: float = 1.0,
    num_hypotheses: int = 1,
) -> list[SearchResult]:
    """Beam search over `batch` sentences at once; each sentence finishes on its own.

    Args:
        step: the step callable; it must give at least 2K candidates per row.
        batch: the number of sentences.
        beam_size: K.
        start_id, eos_id: the first decoder input and the end token.
        max_lengths: per sentence, the tokens it may generate (end token included).
        min_length: the end token is forbidden before this many tokens.
        length_penalty: alpha of the ranking score / len^alpha.
        num_hypotheses: the n-best per sentence, 1..K.

    Returns:
        One SearchResult per sentence, best first.

    Raises:
        ValueError: impossible settings, or a vocabulary or step with fewer than 2K candidates.
    """
    max_lengths = np.asarray(max_lengths, dtype=np.int64)
    _check(beam_size, max_lengths, min_length)
    k = beam_size
    if not 1 <= num_hypotheses <= k:
        raise ValueError(f"num_hypotheses={num_hypotheses} must lie in [1, beam_size={k}]")
    longest = int(max_lengths.max(initial=0))
    fin_tokens = np.zeros((batch, k, longest), dtype=np.int64)
    fin_lengths = np.zeros((batch, k), dtype=np.int64)
    fin_scores = np.full((batch, k), -np.inf)
    n_finished = np.zeros(batch, dtype=np.int64)

    alive = np.arange(batch)  # sentence ids still decoding
    beams = 1  # live beams per sentence: one on the first step
    scores = np.zeros((batch, 1))  # (B, beams) cumulative log-probabilities
    history = np.zeros((batch, 1, 0), dtype=np.int64)  # (B, beams, t) tokens so far
    tokens = np.full((batch, 1), start_id, dtype=np.int64)
    cache_indices = np.arange(batch, dtype=np.int64)
    keep = None
    t = 0
    in_top_k = np.arange(2 * k)[None, :] < k
    rows = np.arange(batch)[:, None]  # for gathers along axis 1: x[rows, idx] is take_along_axis, cheaper
    while alive.size:
        b = alive.size
        if rows.shape[0] != b:  # sentences left: a new index only then
            rows = rows[:b]
        out = step(tokens, cache_indices, t, keep)
        vocab = out.vocab if isinstance(out, TopK) else out.shape[1]
        if vocab < 2 * k:
            raise ValueError(f"beam_size={k} needs a vocabulary of at least {2 * k} tokens, this one has {vocab}")
        if isinstance(out, TopK):
            values = out.values.astype(np.float64)
            if t < min_length:
                values = np.where(out.ids == eos_id, -np.inf, values)
            kk = values.shape[1]
            if kk < 2 * k:
                raise ValueError(f"the step returned {kk} candidates per row; beam_size={k} needs {2 * k}")
            total = (scores[:, :, None] + values.reshape(b, beams, kk)).reshape(b, beams * kk)
            flat = (np.arange(beams)[None, :, None] * vocab + out.ids.reshape(b, beams, kk)).reshape(b, beams * kk)
            order = np.lexsort((flat, -total), axis=1)[:, : 2 * k]
            cand = flat[rows, order]
            cand_scores = total[rows, order]
        else:
            log_probs = out.astype(np.float64)
            if t < min_length:
                log_probs[:, eos_id] = -np.inf
            total = (scores[:, :, None] + log_probs.reshape(b, beams, vocab)).reshape(b, beams * vocab)
            cand = _top_candidates(total, 2 * k)  # (b, 2K) flat indices, best first
            cand_scores = total[rows, cand]
        cand_beam, cand_token = np.divmod(cand, vocab)
        last = (max_lengths[alive] == t + 1)[:, None]  # (b, 1)
        is_eos = cand_token == eos_id

        # 1. finish: top-K candidates that end (all top-K at the last step), while room remains; a
        #    candidate at -inf (forced or forbidden tokens) never finishes
        finishing = in_top_k & (is_eos | last) & (cand_scores > -np.inf)
        accepted = finishing & (np.cumsum(finishing, axis=1) + n_finished[alive, None] <= k)
        for row, rank in zip(*np.nonzero(accepted)):
            sent, slot = alive[row], n_finished[alive[row]]
            fin_tokens[sent, slot, :t] = history[row, cand_beam[row, rank]]
            fin_tokens[sent, slot, t] = cand_token[row, rank]
            fin_lengths[sent, slot] = t + 1
            fin_scores[sent, slot] = cand_scores[row, rank]
            n_finished[sent] += 1

        # 2. continue: the first K candidates that do not end
        cont = ~is_eos
        pick = cont & (np.cumsum(cont, axis=1) <= k)
        # at least K non-end candidates exist: each beam contributes at most one end token
        next_beam = cand_beam[pick].reshape(b, k)
        next_token = cand_token[pick].reshape(b, k)
        next_scores = cand_scores[pick].reshape(b, k)

        # 3. drop sentences that are done
        t += 1
        still = (n_finished[alive] < k) & ~last[:, 0]
        origin = rows * beams + next_beam  # (b, K) rows of this step the new beams continue
        history = np.concatenate([history[rows, next_beam], next_token[:, :, None]], axis=2)
        if still.all():
            keep = None
        else:
            keep = np.flatnonzero(still)
            alive, origin, history = alive[keep], origin[keep], history[keep]
            next_token, next_scores = next_token[keep], next_scores[keep]
        beams = k
        scores = next_scores
        tokens = next_token.reshape(-1, 1)
        cache_indices = origin.reshape(-1)

    results = []
    for sent in range(batch):
        n = n_finished[sent]
        norm = fin_scores[sent, :n] / fin_lengths[sent, :n].astype(np.float64) ** length_penalty
        order = np.argsort(-norm, kind="stable")[:num_hypotheses]
        results.append(SearchResult(
            [fin_tokens[sent, i, : fin_lengths[sent, i]].tolist() for i in order],
            [float(fin_scores[sent, i]) for i in order],
        ))
    return results


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _uniform(keys: np.ndarray, t: int) -> np.ndarray:
    """One draw in [0, 1) per key at step t: SplitMix64 of key + (t + 1) x the golden gamma (a
    counter-based generator: a row's draw depends on its key and the step alone). Array
    arithmetic on uint64 wraps, as the hash means it to."""
    z = keys + np.full(keys.shape, t + 1, dtype=np.uint64) * _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def sample(
    step: Step, batch: int, *, start_id: int, eos_id: int, max_lengths: np.ndarray, min_length: int = 0,
    temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
    row_keys: "list[list[int]] | None" = None,
) -> list[SearchResult]:
    """Random sampling from softmax(log_probs / temperature), restricted to top_k and top_p.

    Each sentence's draws depend only on (seed, *row_keys[sentence]) and the step, so that its
    sample does not depend on the other sentences of the batch: the translator keys a sentence by
    its source ids and hypothesis index.

    Args:
        step: the step callable; it must return full log-probabilities (not TopK).
        batch: the number of sentences.
        start_id, eos_id: the first decoder input and the end token.
        max_lengths: per sentence, the tokens it may generate (end token included).
        min_length: the end token is forbidden before this many tokens.
        temperature, top_k, top_p: sample from softmax(log_probs / temperature) (temperature > 0), among the
            top_k tokens (0: all) and the smallest set whose probability reaches top_p.
        seed: None draws a fresh seed.
        row_keys: one key per sentence (default key: the sentence's index).

    Returns:
        One SearchResult per sentence; scores are the model's log-probabilities of the sampled tokens.

    Raises:
        ValueError: a setting out of range, or not one row key per sentence.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature}; it must be > 0 (use beam_size=1 for greedy)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must lie in (0, 1]")
    if top_k < 0:
        raise ValueError(f"top_k={top_k} must be >= 0 (0 keeps every token)")
    _check(1, np.asarray(max_lengths, dtype=np.int64), min_length)
    keys = [[r] for r in range(batch)] if row_keys is None else row_keys
    if len(keys) != batch:
        raise ValueError(f"row_keys has {len(keys)} keys for {batch} sentences; give one per sentence")
    if seed is None:
        seed = int(np.random.SeedSequence().entropy)
    # One 64-bit stream key per sentence, made once per batch; each step's draws are then one
    # vectorised hash of (key, step) rather than a generator call per row.
    stream = np.array([np.random.SeedSequence([seed, *(int(k) for k in key)]).generate_state(1, np.uint64)[0]
                       for key in keys], dtype=np.uint64)
    alive = np.arange(batch)  # sentence of each row, followed through `keep` as greedy_search drops them

    def sampled_step(tokens, cache_indices, t, keep):
        nonlocal alive
        if keep is not None:
            alive = alive[keep]
        log_probs = step(tokens, cache_indices, t, keep).astype(np.float64)
        if t < min_length:
            log_probs[:, eos_id] = -np.inf
        logits = log_probs / temperature
        if 0 < top_k < logits.shape[1]:
            # keep exactly top_k tokens per row, ties to the lower id (as greedy does)
            order = np.argsort(-logits, axis=1, kind="stable")
            outside = np.zeros_like(logits, dtype=bool)
            np.put_along_axis(outside, order[:, top_k:], True, axis=1)
            logits = np.where(outside, -np.inf, logits)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        if top_p < 1:
            order = np.argsort(-probs, axis=1, kind="stable")
            sorted_p = np.take_along_axis(probs, order, axis=1)
            outside = np.cumsum(sorted_p, axis=1) - sorted_p >= top_p  # mass before it already enough
            mask = np.zeros_like(probs, dtype=bool)
            np.put_along_axis(mask, order, outside, axis=1)
            probs = np.where(mask, 0.0, probs)
            probs /= probs.sum(axis=1, keepdims=True)
        draws = _uniform(stream[alive], t)[:, None]  # (R, 1): each row's own stream at step t
        choice = (probs.cumsum(axis=1) > draws).argmax(axis=1)
        # Greedy search below takes the argmax: hand it a one-hot of the choice, scored by the model.
        out = np.full_like(log_probs, -np.inf)
        rows = np.arange(log_probs.shape[0])
        out[rows, choice] = log_probs[rows, choice]
        return out

    return greedy_search(sampled_step, batch, start_id=start_id, eos_id=eos_id, max_lengths=max_lengths,
                         min_length=0)


def stream_greedy(
    step: Step, *, start_id: int, eos_id: int, max_length: int, min_length: int = 0,
) -> Iterator[int]:
    """Greedy decoding of one sentence, yielding each token as soon as it is chosen.

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
    for token, _ in _greedy_tokens(step, start_id=start_id, eos_id=eos_id, max_length=max_length,
                                   min_length=min_length):
        if token == eos_id:
            return
        yield token
