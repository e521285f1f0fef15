"""Where PyTorch and CTranslate2 part on a sentence: both hypotheses scored by both engines.

Every difference is shown with both hypotheses scored by both engines under teacher forcing
(PyTorch's forward, CTranslate2's score_batch: one scale for both), the gap of their normalised
scores and the log-probabilities of the two tokens where they first part. Engines that disagree
on the same tokens compute differently (weights, tokenizer, source); engines that agree, with a
deciding gap of float noise (<= TIE), met a near-tie; engines that agree with a wide gap searched
differently (options, convention).
"""

from __future__ import annotations

import torch

# nats: a gap at most this is float noise (a near-tie), and so is a difference between the engines'
# log-probabilities of the same token (measured: at most 5.3e-6 on the tests' tiny model)
TIE = 1e-3


@torch.no_grad()
def token_log_probs(model, src: list[int], tokens: list[int]) -> list[float]:
    """Scores tokens under the PyTorch model by teacher forcing: log p(tokens[t] | source, tokens[:t]).

    In fp32 as decode_step computes them, summed by the caller in float64 as the search does.

    Args:
        model (Transformer): the model.
        src: the source ids.
        tokens: the hypothesis' ids.

    Returns:
        One log-probability per token; [] for no tokens.
    """
    if not tokens:
        return []
    cfg = model.cfg
    src_t = torch.tensor([src])
    tgt_in = torch.tensor([[cfg.decoder_start_id] + tokens[:-1]])
    logits = model(src_t, src_t != cfg.pad_id, tgt_in)[0]  # (T, V)
    log_probs = torch.log_softmax(logits.float(), dim=-1).double()
    return log_probs[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()


def ct2_token_log_probs(
    translator, pieces: list[str], tokens: list[int], id_to_piece, eos_id: int, max_positions: int
) -> list[float] | None:
    """Scores tokens under CTranslate2 (Translator.score_batch, which appends the end token itself).

    Args:
        translator (ctranslate2.Translator): the model.
        pieces: the source pieces.
        tokens: the hypothesis' ids, the end token included when produced.
        id_to_piece (Callable[[int], str]): the target vocabulary.
        eos_id: the end token's id.
        max_positions: the model's positions.

    Returns:
        The same log-probabilities as token_log_probs; None for a hypothesis cut at the last
        position, which it cannot score.
    """
    ends = bool(tokens) and tokens[-1] == eos_id
    body = tokens[:-1] if ends else tokens
    if len(body) + 1 > max_positions:
        return None
    result = translator.score_batch([pieces], [[id_to_piece(t) for t in body]], max_input_length=0)[0]
    return list(result.log_probs)[: len(tokens)]


def describe_difference(
    model,
    tok,
    translator,
    search: str,
    index: int,
    source: str,
    src: list[int],
    pieces: list[str],
    want: list[int],
    got: list[int],
    length_penalty: float,
) -> dict:
    """Describes one sentence where the searches part: both hypotheses scored by both engines (teacher
    forcing).

    So a near-tie can be told from engines that compute differently or search differently.

    Args:
        model (Transformer): the PyTorch model.
        tok (Tokenizer): its tokenizer.
        translator (ctranslate2.Translator): the CTranslate2 model.
        search: "greedy" or "beam K".
        index: the sentence's index.
        source: its text.
        src: its ids (PyTorch's side).
        pieces: its pieces (CTranslate2's side).
        want: PyTorch's hypothesis.
        got: CTranslate2's hypothesis.
        length_penalty: alpha of the normalised scores.

    Returns:
        Both sides' scores, the first differing token, the gap, the engines' disagreement and the kind.
    """
    torch_side, ct2_side = (
        _scored(model, tok, translator, src, pieces, tokens, length_penalty) for tokens in (want, got)
    )
    disagreement = _disagreement(torch_side, ct2_side)
    first_difference = _first_difference(tok, want, got, torch_side, ct2_side)
    gap = torch_side["torch_normalized"] - ct2_side["torch_normalized"]
    kind = _kind(search, disagreement, gap, first_difference)
    return {
        "search": search,
        "index": index,
        "source": source,
        "torch": torch_side,
        "ct2": ct2_side,
        "first_difference": first_difference,
        "gap": gap,
        "engine_disagreement": disagreement,
        "near_tie": kind == "near-tie",
        "kind": kind,
    }


def _scored(model, tok, translator, src, pieces, tokens: list[int], length_penalty: float) -> dict:
    """One hypothesis scored by both engines: log-probabilities, sums and normalised sums."""
    cfg = model.cfg
    by_torch = token_log_probs(model, src, tokens)
    by_ct2 = ct2_token_log_probs(
        translator, pieces, tokens, tok.target.id_to_piece, cfg.eos_id, cfg.max_positions
    )
    norm = max(len(tokens), 1) ** length_penalty
    return {
        "tokens": tokens,
        "text": tok.decode_target(tokens),
        "length": len(tokens),
        "torch_log_probs": by_torch,
        "ct2_log_probs": by_ct2,
        "torch_score": float(sum(by_torch)),
        "torch_normalized": float(sum(by_torch)) / norm,
        "ct2_score": None if by_ct2 is None else float(sum(by_ct2)),
        "ct2_normalized": None if by_ct2 is None else float(sum(by_ct2)) / norm,
    }


def _disagreement(torch_side: dict, ct2_side: dict) -> float:
    """How far the engines' own log-probabilities of the same tokens lie apart: float noise, or not."""
    pairs = [
        (x, y)
        for h in (torch_side, ct2_side)
        if h["ct2_log_probs"] is not None
        for x, y in zip(h["torch_log_probs"], h["ct2_log_probs"])
    ]
    return max((abs(x - y) for x, y in pairs), default=0.0)


def _first_difference(tok, want: list[int], got: list[int], torch_side: dict, ct2_side: dict) -> dict | None:
    """The first token where the hypotheses part, and each engine's log-probability gap of the two
    tokens there (the same prefix before it: both tokens from one distribution per engine)."""
    first = next((t for t, (x, y) in enumerate(zip(want, got)) if x != y), None)
    if first is None:
        return None
    lp = lambda h, engine: None if h[f"{engine}_log_probs"] is None else h[f"{engine}_log_probs"][first]
    first_difference = {
        "position": first,
        "torch_piece": tok.target.id_to_piece(want[first]),
        "ct2_piece": tok.target.id_to_piece(got[first]),
        "torch_gap": lp(torch_side, "torch") - lp(ct2_side, "torch"),
    }
    if lp(torch_side, "ct2") is not None and lp(ct2_side, "ct2") is not None:
        first_difference["ct2_gap"] = lp(torch_side, "ct2") - lp(ct2_side, "ct2")
    return first_difference


def _kind(search: str, disagreement: float, gap: float, first_difference: dict | None) -> str:
    """Why the searches part: the engines compute differently, a near-tie, or they search differently."""
    # Greedy parts where the two argmaxes part, so the gap of those two tokens decides; beam search
    # ranks finished hypotheses by their normalised scores, so the gap of those decides.
    decisive = (
        gap if search != "greedy" else None if first_difference is None else first_difference["torch_gap"]
    )
    if disagreement > TIE:
        return f"the engines' log-probabilities differ by up to {disagreement:.1e}: they compute differently"
    if decisive is not None and abs(decisive) <= TIE:
        return "near-tie"
    return "NOT a near-tie; same log-probabilities, so the searches differ: options or convention" + (
        "" if search == "greedy" else ", or a tie among pruned candidates"
    )
