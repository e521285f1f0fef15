"""The result type of Translator.translate_batch: one source's n-best, with scores and attention when asked
for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TranslationResult:
    """One source's n-best, best first; scores and attention are None unless asked for (return_scores,
    return_attention).

    Attributes:
        hypotheses, token_ids: detokenised texts, and their target ids (end token excluded).
        scores, attention: sums of log-probabilities (end token included); per hypothesis the array of the
        comment below.
    """

    hypotheses: list[str]
    token_ids: list[list[int]]
    scores: list[float] | None = None
    # with return_attention: per hypothesis a float32 [len(token_ids[i]), source pieces + end
    # token] array, the last layer's cross-attention averaged over heads (runtime/attention.py)
    attention: list[np.ndarray] | None = None

    def __repr__(self) -> str:
        scores = "" if self.scores is None else f", scores={[round(s, 4) for s in self.scores]}"
        return f"TranslationResult(hypotheses={self.hypotheses!r}{scores})"
