"""Reference decoding in PyTorch: the oracle the ONNX runtime must match token for token.

The convention is docs/decoding.md's (fairseq's and CTranslate2's): a hypothesis' score is
the sum of its tokens' log-probabilities, end token included; n-best are ranked by
score / len^alpha with len counting the end token; each step looks at the 2K best continuations
of all live beams; an end token finishes a hypothesis only within the top K; a sentence is done
when K hypotheses have finished or the maximum length is reached, where every top-K candidate is
recorded as finished. Ties are broken towards the lower flat index (beam x V + token), so that
another implementation with a stable sort finds the same hypotheses.

Search is written over a step callable, so that it can be tested with a hand-made fake step:
    step(tokens (R, 1) int64, cache_indices (R,) int64, t: int, state) -> (log_probs (R, V), state)
where row r continues row cache_indices[r] of the previous step and t is the step's position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from .transformer import Transformer

Step = Callable[[Tensor, Tensor, int, Any], tuple[Tensor, Any]]


@dataclass(frozen=True)
class Hypothesis:
    """One finished translation of a search.

    Attributes:
        tokens: generated ids, the end token included when it was produced.
        score: sum of the tokens' log-probabilities.
    """

    tokens: list[int]  # generated ids, the end token included when it was produced
    score: float  # sum of the tokens' log-probabilities

    def normalized(self, length_penalty: float) -> float:
        """The score that ranks the n-best: score / len(tokens)^length_penalty (the raw score when empty).

        Args:
            length_penalty: alpha; 0 ranks by the raw score.

        Returns:
            The normalized score.
        """
        return self.score / (len(self.tokens) ** length_penalty) if self.tokens else self.score


def _check(beam_size: int, max_length: int, min_length: int) -> None:
    if beam_size < 1:
        raise ValueError(f"beam_size={beam_size}; it must be at least 1 (1 is greedy search)")
    if max_length < 1:
        raise ValueError(f"max_length={max_length}; it must be at least 1")
    if not 0 <= min_length < max_length:
        raise ValueError(f"min_length={min_length} must lie in [0, max_length={max_length})")


def beam_search(
    step: Step,
    state: Any,
    *,
    beam_size: int,
    start_id: int,
    eos_id: int,
    max_length: int,
    min_length: int = 0,
    length_penalty: float = 1.0,
    num_hypotheses: int = 1,
) -> list[Hypothesis]:
    """Beam search for ONE sentence, by the module's convention.

    Args:
        step: the step callable (see the module docstring).
        state: its initial state (the empty cache).
        beam_size: K, the beams kept.
        start_id: the first decoder input.
        eos_id: the end token.
        max_length: counts generated tokens including the end token.
        min_length: the end token is forbidden while fewer than min_length tokens have been generated.
        length_penalty: alpha of the ranking score / len^alpha.
        num_hypotheses: the n-best returned, 1..beam_size.

    Returns:
        Its n-best, best first.

    Raises:
        ValueError: impossible settings.
    """
    _check(beam_size, max_length, min_length)
    if not 1 <= num_hypotheses <= beam_size:
        raise ValueError(f"num_hypotheses={num_hypotheses} must lie in [1, beam_size={beam_size}]")
    k = beam_size
    live: list[tuple[list[int], float]] = [([], 0.0)]  # on the first step only one beam is live
    finished: list[Hypothesis] = []
    tokens = torch.tensor([[start_id]])
    cache_indices = torch.tensor([0])
    for t in range(max_length):
        log_probs, state = step(tokens, cache_indices, t, state)
        # the search's bookkeeping is on the host; the step owns the device
        log_probs = log_probs.double().cpu()
        if t < min_length:
            log_probs[:, eos_id] = float("-inf")
        last_step = t == max_length - 1
        next_live = _expand(live, log_probs, k, eos_id, last_step, finished)
        if len(finished) >= k or last_step:
            break
        live = [(toks, s) for toks, s, _ in next_live]
        tokens = torch.tensor([[toks[-1]] for toks, _, _ in next_live])
        cache_indices = torch.tensor([beam for _, _, beam in next_live])
    ranked = sorted(finished, key=lambda h: h.normalized(length_penalty), reverse=True)
    return ranked[:num_hypotheses]


def _expand(
    live: list[tuple[list[int], float]],
    log_probs: Tensor,
    k: int,
    eos_id: int,
    last_step: bool,
    finished: list[Hypothesis],
) -> list[tuple[list[int], float, int]]:
    """One step of beam search over the 2K best continuations of the live beams (ties to the lower
    flat index): a top-K candidate that ends (or any top-K one at the last step) is appended to
    `finished` while it holds fewer than K; the first K that do not end are returned as
    (tokens, score, the beam they continue)."""
    vocab = log_probs.shape[1]
    scores = torch.tensor([s for _, s in live], dtype=torch.float64)
    total = (scores[:, None] + log_probs).reshape(-1)
    order = torch.sort(total, descending=True, stable=True).indices[: 2 * k].tolist()
    next_live: list[tuple[list[int], float, int]] = []
    for rank, flat in enumerate(order):
        beam, token = divmod(flat, vocab)
        hyp = (live[beam][0] + [token], total[flat].item())
        if rank < k and (token == eos_id or last_step):
            if len(finished) < k:
                finished.append(Hypothesis(*hyp))
        elif token != eos_id and len(next_live) < k:
            next_live.append((*hyp, beam))
    return next_live


def greedy_search(
    step: Step,
    state: Any,
    *,
    rows: int,
    start_id: int,
    eos_id: int,
    max_length: int | list[int],
    min_length: int = 0,
) -> list[Hypothesis]:
    """Greedy search for a batch of `rows` sentences at once (argmax, first index on ties).

    Args:
        step: the step callable (see the module docstring).
        state: its initial state (the empty cache).
        rows: the number of sentences.
        start_id: the first decoder input.
        eos_id: the end token.
        max_length: generated tokens, end token included; may be given per row: a row stops
            there, as if decoded alone.
        min_length: the end token is forbidden before this many tokens.

    Returns:
        One hypothesis per row, in row order.

    Raises:
        ValueError: impossible settings.
    """
    limits = max_length if isinstance(max_length, list) else [max_length] * rows
    for n in limits:
        _check(1, n, min_length)
    tokens = torch.full((rows, 1), start_id, dtype=torch.long)
    cache_indices = torch.arange(rows)
    out: list[list[int]] = [[] for _ in range(rows)]
    scores = [0.0] * rows
    done = [False] * rows
    for t in range(max(limits)):
        log_probs, state = step(tokens, cache_indices, t, state)
        # the search's bookkeeping is on the host; the step owns the device
        log_probs = log_probs.double().cpu()
        if t < min_length:
            log_probs[:, eos_id] = float("-inf")
        best = log_probs.argmax(dim=-1)
        for r in range(rows):
            if not done[r]:
                token = int(best[r])
                out[r].append(token)
                scores[r] += float(log_probs[r, token])
                done[r] = token == eos_id or len(out[r]) == limits[r]
        if all(done):
            break
        tokens = best[:, None]
    return [Hypothesis(toks, s) for toks, s in zip(out, scores)]


def model_step(model: Transformer, src: Tensor, src_mask: Tensor) -> tuple[Step, Any]:
    """Wraps the Transformer's decode_step as a search step, with the source encoded once.

    Args:
        model: the model.
        src: (B, S) source ids.
        src_mask: (B, S), True for real tokens.

    Returns:
        (step, state): the step callable and the empty cache for B rows.
    """
    cross = model.cross_kv(model.encode(src, src_mask))

    def step(tokens: Tensor, cache_indices: Tensor, t: int, past: Any) -> tuple[Tensor, Any]:
        position = torch.tensor([t], device=src.device)
        return model.decode_step(
            tokens.to(src.device), position, cache_indices.to(src.device), past, cross, src_mask
        )

    return step, model.empty_cache(src.shape[0], src.device)


@torch.no_grad()
def translate_ids(
    model: Transformer,
    sources: list[list[int]],
    *,
    beam_size: int = 4,
    max_length: int | None = None,
    min_length: int = 0,
    length_penalty: float = 1.0,
    num_hypotheses: int = 1,
    max_length_a: float = 1.5,
    max_length_b: int = 10,
    batch_size: int = 64,
) -> list[list[Hypothesis]]:
    """Reference decoding of source id lists: one sentence at a time for beam search, batched for greedy.

    Args:
        model: the model (put in eval mode).
        sources: source ids, end token included.
        beam_size: 1 with num_hypotheses 1 is greedy search.
        max_length: generated tokens at most; defaults to max_length_a * len(src) + max_length_b.
            Either way capped by the model's positions.
        min_length: the end token is forbidden before this many tokens.
        length_penalty: alpha of the n-best ranking.
        num_hypotheses: the n-best per sentence.
        max_length_a, max_length_b: the default limit's slope and offset.
        batch_size: sentences per greedy batch.

    Returns:
        Per source, its hypotheses, best first.

    Raises:
        ValueError: impossible settings.
    """
    cfg = model.cfg
    model.eval()
    device = next(model.parameters()).device
    if max_length is not None:
        limits = [min(max_length, cfg.max_positions)] * len(sources)
    else:
        limits = [min(int(max_length_a * len(s)) + max_length_b, cfg.max_positions) for s in sources]
    if beam_size == 1 and num_hypotheses == 1:
        return _translate_greedy(model, sources, limits, min_length, batch_size, device)
    results = []
    for s, n in zip(sources, limits):
        src = torch.tensor([s], device=device)
        step, state = model_step(model, src, torch.ones_like(src, dtype=torch.bool))
        results.append(
            beam_search(
                step,
                state,
                beam_size=beam_size,
                start_id=cfg.decoder_start_id,
                eos_id=cfg.eos_id,
                max_length=n,
                min_length=min_length,
                length_penalty=length_penalty,
                num_hypotheses=num_hypotheses,
            )
        )
    return results


def _translate_greedy(
    model: Transformer,
    sources: list[list[int]],
    limits: list[int],
    min_length: int,
    batch_size: int,
    device: torch.device,
) -> list[list[Hypothesis]]:
    """Greedy search over batches of `batch_size` sentences, each cut at its own limit.

    Greedy decisions do not look ahead, so sentences of similar length share a batch and each one's
    output is cut at its own limit afterwards.
    """
    cfg = model.cfg
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    by_index: dict[int, Hypothesis] = {}
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        width = max(len(sources[i]) for i in chunk)
        src = torch.full((len(chunk), width), cfg.pad_id, dtype=torch.long, device=device)
        for row, i in enumerate(chunk):
            src[row, : len(sources[i])] = torch.tensor(sources[i])
        step, state = model_step(model, src, src != cfg.pad_id)
        hyps = greedy_search(
            step,
            state,
            rows=len(chunk),
            start_id=cfg.decoder_start_id,
            eos_id=cfg.eos_id,
            min_length=min_length,
            max_length=[limits[i] for i in chunk],
        )
        by_index.update(zip(chunk, hyps))
    return [[by_index[i]] for i in range(len(sources))]
