"""Cross-attention of found hypotheses: which source pieces each target piece attended to.

The search itself never asks the decoder for attention: it runs as it would without it (the
fused decoder has no attention output, and carrying [rows, src_len] per step through beam
reordering would cost every translation). Once the hypotheses are known, one forced pass of the
standard decoder feeds each hypothesis's own tokens (teacher forcing, one step per target piece,
all hypotheses of a batch as rows) and keeps the graph's `cross_attention` output: the last
layer's weights averaged over heads, CTranslate2's return_attention convention. The search's
results and scores are therefore exactly those without attention.

Row j of a hypothesis's matrix is the step that chose its piece j (the query fed piece j-1, or
the start token); column i is source piece i, the source's end token last. The end token of the
hypothesis has no row (its pieces are what is shown).
"""

from __future__ import annotations

import numpy as np

from . import bundle as names


class NoAttentionOutput(ValueError):
    """The bundle's standard decoder has no cross_attention output (exported before 0.3)."""


def check_attention_output(decoder, bundle_path) -> None:
    """Refuses a standard decoder without the cross_attention output.

    Args:
        decoder (onnxruntime.InferenceSession): the standard decoder's session.
        bundle_path (str | Path): the bundle, for the message.

    Raises:
        NoAttentionOutput: exported before 0.3; the message says to export again.
    """
    if names.CROSS_ATTENTION not in {o.name for o in decoder.get_outputs()}:
        raise NoAttentionOutput(
            f"{bundle_path}: its decoder.onnx has no {names.CROSS_ATTENTION!r} output (exported by seq2onnx "
            "before "
            "0.3), so attention cannot be returned: export the checkpoint again with `seq2onnx export`"
        )


def forced_attention(
    graph,
    *,
    src_mask,
    cross: list,
    rows_per_source: int,
    hypotheses: list[list[int]],
    source_lengths: list[int],
    start_id: int,
    eos_id: int,
) -> list[np.ndarray]:
    """Computes each hypothesis's attention by one forced pass of the standard decoder.

    Args:
        graph: the standard decoder's StandardGraph (runtime/standard_graph.py).
        src_mask (onnxruntime.OrtValue): the encoder's mask output for B sources.
        cross: the encoder's key and value outputs (OrtValues), per layer.
        rows_per_source: hypotheses per source.
        hypotheses: B x rows_per_source token lists (end token excluded), grouped by source as
            the decoder's rows are.
        source_lengths: B lengths (end token included).
        start_id: the decoder's start token.
        eos_id: the end token (fed by rows that have ended).

    Returns:
        Each hypothesis's [len(hypothesis), source length] attention, float32.
    """
    rows = len(hypotheses)
    steps = max((len(h) for h in hypotheses), default=0)
    if steps == 0:
        return [np.zeros((0, source_lengths[r // rows_per_source]), np.float32) for r in range(rows)]
    tokens = _forced_tokens(hypotheses, steps, start_id, eos_id)
    weights = _forced_steps(graph, tokens, cross, src_mask)
    stacked = np.stack(weights, axis=1)  # (rows, steps, S_padded)
    return [
        np.ascontiguousarray(stacked[r, : len(h), : source_lengths[r // rows_per_source]], dtype=np.float32)
        for r, h in enumerate(hypotheses)
    ]


def _forced_tokens(hypotheses: list[list[int]], steps: int, start_id: int, eos_id: int) -> np.ndarray:
    """tokens[r, t]: what row r feeds at step t: the start token, then its own pieces; rows that
    have ended feed the end token, whose attention is computed and dropped."""
    tokens = np.full((len(hypotheses), steps), eos_id, dtype=np.int64)
    tokens[:, 0] = start_id
    for r, h in enumerate(hypotheses):
        tokens[r, 1 : len(h)] = h[:-1]
    return tokens


def _forced_steps(graph, tokens: np.ndarray, cross: list, src_mask) -> list[np.ndarray]:
    """Runs the decoder on `tokens` one step at a time, every row continuing itself; each step's
    cross-attention (rows, S_padded)."""
    rows, steps = tokens.shape
    past = graph.empty_past(rows)
    keep = np.arange(rows, dtype=np.int64)  # every row continues itself
    weights = []
    for t in range(steps):
        past, got = graph.run(
            tokens=np.ascontiguousarray(tokens[:, t : t + 1]),
            steps=np.array([t], dtype=np.int64),
            cache_indices=keep,
            top_k=1,
            past=past,
            cross=cross,
            src_mask=src_mask,
            outputs={names.CROSS_ATTENTION: "cpu"},
        )
        weights.append(got[names.CROSS_ATTENTION])  # (rows, S_padded)
    return weights
