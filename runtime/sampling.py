"""Random sampling in numpy as a search program (runtime/search.py's convention and protocol).

Each sentence's draws come from a counter-based generator keyed by (seed, the sentence's key) and the
step, so that a sentence's sample does not depend on the other sentences of its batch.
"""

from __future__ import annotations

import numpy as np

from .search import Program, SearchResult, Step, _check, greedy_program, run


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


def sample(step: Step, batch: int, **options) -> list[SearchResult]:
    """Random sampling: run(sample_program(batch, **options), step); the step must return full
    log-probabilities.
    """
    return run(sample_program(batch, **options), step)


def _probabilities(log_probs: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The distribution to sample from: softmax(log_probs / temperature), cut to top_k and top_p.

    Args:
        log_probs: (R, V) the step's log-probabilities, float64.
        temperature: > 0.
        top_k: keep exactly this many tokens per row, ties to the lower id (0: all).
        top_p: keep the smallest set of tokens whose probability reaches it (1: all).

    Returns:
        (R, V) probabilities, each row summing to 1.
    """
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
    return probs


def sample_program(
    batch: int,
    *,
    start_id: int,
    eos_id: int,
    max_lengths: np.ndarray,
    min_length: int = 0,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    row_keys: "list[list[int]] | None" = None,
) -> Program:
    """Random sampling as a program: from softmax(log_probs / temperature), restricted to top_k and top_p.

    Each sentence's draws depend only on (seed, *row_keys[sentence]) and the step, so that its
    sample does not depend on the other sentences of the batch: the translator keys a sentence by
    its source ids and hypothesis index.

    Args:
        batch: the number of sentences; the step must return full log-probabilities (not TopK).
        start_id, eos_id: the first decoder input and the end token.
        max_lengths: per sentence, the tokens it may generate (end token included).
        min_length: the end token is forbidden before this many tokens.
        temperature, top_k, top_p: sample from softmax(log_probs / temperature) (temperature > 0), among the
            top_k tokens (0: all) and the smallest set whose probability reaches top_p.
        seed: None draws a fresh seed.
        row_keys: one key per sentence (default key: the sentence's index).

    Returns:
        (as the program's result) One SearchResult per sentence; scores are the model's log-probabilities of
        the sampled tokens.

    Raises:
        ValueError: a setting out of range, or not one row key per sentence.
    """
    _check_sampling(temperature, top_k, top_p)
    _check(1, np.asarray(max_lengths, dtype=np.int64), min_length)
    keys = [[r] for r in range(batch)] if row_keys is None else row_keys
    if len(keys) != batch:
        raise ValueError(f"row_keys has {len(keys)} keys for {batch} sentences; give one per sentence")
    sampled = _Sampler(batch, _streams(seed, keys), eos_id, min_length, temperature, top_k, top_p)
    # Greedy search takes the argmax of each step's output: it is sent a one-hot of the sampled choice.
    program = greedy_program(batch, start_id=start_id, eos_id=eos_id, max_lengths=max_lengths, min_length=0)
    request = next(program)
    while True:
        out = yield request
        try:
            request = program.send(sampled(out, request[2], request[3]))
        except StopIteration as done:
            return done.value


def _check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    if temperature <= 0:
        raise ValueError(f"temperature={temperature}; it must be > 0 (use beam_size=1 for greedy)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must lie in (0, 1]")
    if top_k < 0:
        raise ValueError(f"top_k={top_k} must be >= 0 (0 keeps every token)")


def _streams(seed: int | None, keys: list[list[int]]) -> np.ndarray:
    """One 64-bit stream key per sentence, made once per batch; each step's draws are then one
    vectorised hash of (key, step) rather than a generator call per row. A None seed draws a fresh one."""
    if seed is None:
        seed = int(np.random.SeedSequence().entropy)
    return np.array(
        [
            np.random.SeedSequence([seed, *(int(k) for k in key)]).generate_state(1, np.uint64)[0]
            for key in keys
        ],
        dtype=np.uint64,
    )


class _Sampler:
    """Turns a step's log-probabilities into a one-hot of each row's sampled token, scored by the model
    (greedy search, which takes the argmax, then keeps the sample)."""

    def __init__(self, batch, stream, eos_id, min_length, temperature, top_k, top_p):
        self.alive = np.arange(batch)  # sentence of each row, followed through `keep` as rows end
        self.stream, self.eos_id, self.min_length = stream, eos_id, min_length
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p

    def __call__(self, out: np.ndarray, t: int, keep) -> np.ndarray:
        if keep is not None:
            self.alive = self.alive[keep]
        log_probs = out.astype(np.float64)
        if t < self.min_length:
            log_probs[:, self.eos_id] = -np.inf
        probs = _probabilities(log_probs, self.temperature, self.top_k, self.top_p)
        draws = _uniform(self.stream[self.alive], t)[:, None]  # (R, 1): each row's own stream at step t
        choice = (probs.cumsum(axis=1) > draws).argmax(axis=1)
        out = np.full_like(log_probs, -np.inf)
        rows = np.arange(log_probs.shape[0])
        out[rows, choice] = log_probs[rows, choice]
        return out
