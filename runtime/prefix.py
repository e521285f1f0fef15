"""Forced tokens as a step wrapper: a target prefix (transformers' forced_bos_token_id, CTranslate2's
target_prefix) and a forced end token at the last allowed step (transformers' forced_eos_token_id).

At step t < len(prefix) of a row's sentence the step's log-probabilities become 0 for the prefix's
token t and -inf for every other token, before any search sees them (docs/decoding.md). The
searches stay as they are: greedy takes the forced token, beam search keeps one finite beam (the
others carry -inf until the prefix ends, and a -inf candidate never finishes), sampling draws it
with probability 1. Each forced token adds 0 to the score and counts in the length.

The forced end token (a bundle whose decoding says forced_eos) is the same rule at one step: at
t = max_length - 1 of a sentence that is still decoding, the end token at 0 and -inf elsewhere, so a
sentence that reaches its maximum length ends with </s> as generate() ends it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .search import Step, TopK


class _Forced:
    """The step of `force_prefix`; `inner` is the wrapped step (its buffers are recycled by the caller)."""

    def __init__(self, step: Step, table: np.ndarray):
        self.inner, self.table = step, table  # table: (B, longest) prefix ids, -1 past a prefix's end
        self.alive = np.arange(table.shape[0])  # the sentence of each row group, followed through `keep`

    def __call__(self, tokens: np.ndarray, cache_indices: np.ndarray, t: int, keep):
        if keep is not None:
            self.alive = self.alive[keep]
        out = self.inner(tokens, cache_indices, t, keep)
        if t >= self.table.shape[1]:
            return out
        per = tokens.shape[0] // self.alive.size  # rows per sentence (beams are contiguous)
        want = np.repeat(self.table[self.alive, t], per)
        hit = np.flatnonzero(want >= 0)
        if not hit.size:
            return out
        if not isinstance(out, TopK):
            out = np.array(out, copy=True)
            out[hit] = -np.inf
            out[hit, want[hit]] = 0.0
            return out
        values, ids = out.values.copy(), out.ids.copy()
        for r in hit:  # column 0 the forced token at 0; the others keep their ids (distinct) at -inf
            rest = ids[r][ids[r] != want[r]][: ids.shape[1] - 1]
            ids[r, 0], ids[r, 1:] = want[r], rest
            values[r, 0], values[r, 1:] = 0.0, -np.inf
        return TopK(values, ids, out.vocab)


def force_prefix(
    step: Step,
    prefixes: Sequence[Sequence[int]],
    *,
    end_id: int | None = None,
    max_lengths: Sequence[int] | None = None,
) -> Step:
    """Wraps a step so that each sentence's first tokens are its prefix (and, with end_id, its last the end
    token).

    Args:
        step: the search's step (runtime/search.py), its rows grouped by sentence.
        prefixes: one list of target ids per sentence of the search, in its order ([] for none).
        end_id: the end token to force at each sentence's last allowed step (forced_eos), or None.
        max_lengths: with end_id, each sentence's maximum length, as the search is given them.

    Returns:
        `step` itself when nothing is forced, else the forcing step (its `inner` is `step`).
    """
    longest = max((len(p) for p in prefixes), default=0)
    lengths = np.asarray(max_lengths if end_id is not None else [], dtype=np.int64)
    if end_id is not None and lengths.shape != (len(prefixes),):
        raise ValueError(f"{lengths.size} max lengths for {len(prefixes)} sentences; give one per sentence")
    width = max(longest, int(lengths.max(initial=0)))
    if not width:
        return step
    table = np.full((len(prefixes), width), -1, dtype=np.int64)
    for i, prefix in enumerate(prefixes):
        table[i, : len(prefix)] = prefix
    # after the prefix: at a 1-token limit transformers' forced EOS wins over forced BOS too
    if end_id is not None:
        table[np.arange(len(prefixes)), np.maximum(lengths, 1) - 1] = end_id
    return _Forced(step, table)
