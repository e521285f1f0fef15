"""The tensor tier of `seq2onnx verify MODEL_DIR BUNDLE`: encoder K/V and teacher-forced log-probabilities
of one decoder graph against transformers' model in float64 (seq2onnx.export.hf.verify runs the tiers)."""

from __future__ import annotations

import numpy as np
import torch

from seq2onnx.export.parity_report import Check

from .reference import log_probs


def _cross_projections(hf) -> list[tuple]:
    """Each decoder layer's cross-attention key and value projections: BART-style layers, or T5's blocks."""
    decoder = hf.get_decoder()
    if hasattr(decoder, "block"):  # T5, mT5: block.N.layer[1] is the cross-attention
        return [(b.layer[1].EncDecAttention.k, b.layer[1].EncDecAttention.v) for b in decoder.block]
    return [(layer.encoder_attn.k_proj, layer.encoder_attn.v_proj) for layer in decoder.layers]


def tensor_checks(
    translator, hf, rows, sources, targets, start, suppression, atol, variant, say
) -> list[Check]:
    """Encoder K/V and teacher-forced log-probabilities of one decoder against transformers in float64."""
    if not rows:
        return []
    say(f"tensors: {len(rows)} sentences, {variant} decoder, against transformers in float64")
    worst_kv = worst_lp = 0.0
    scale_kv = 1.0
    n_layers = translator.n_layers
    projections = _cross_projections(hf)
    for row, src, target in zip(rows, sources, targets):
        src_mask, cross = translator.graphs.encode(*translator.sources.pad([src]))
        with torch.no_grad():
            memory = hf.get_encoder()(**row).last_hidden_state  # (1, S, D)
        heads, dh = translator.n_heads, translator.head_dim
        for i in range(n_layers):
            k_proj, v_proj = projections[i]
            for proj, got in ((k_proj, cross[2 * i]), (v_proj, cross[2 * i + 1])):
                with torch.no_grad():
                    ref = proj(memory).reshape(1, -1, heads, dh).transpose(1, 2).numpy()
                worst_kv = max(worst_kv, float(np.abs(got.numpy().astype(np.float64) - ref).max()))
                scale_kv = max(scale_kv, float(np.abs(ref).max()))
        decoder_input = [start] + target
        ref = log_probs(hf, row, decoder_input, *suppression)
        step = translator.graphs.step(
            (src_mask, cross), rows=1, top_k=None, max_length=len(decoder_input) + 1
        )
        for t, token in enumerate(decoder_input):
            lp = np.asarray(step(np.array([[token]], dtype=np.int64), np.zeros(1, dtype=np.int64), t, None))[
                0
            ]
            finite = np.isfinite(ref[t])
            if not np.array_equal(finite, np.isfinite(lp)):
                worst_lp = float("inf")
                continue
            worst_lp = max(worst_lp, float(np.abs(lp[finite].astype(np.float64) - ref[t][finite]).max()))
        translator.graphs.recycle(step)
    kv_bound = atol * scale_kv
    return [
        Check(
            "tensor",
            "encoder K/V (cross-attention inputs)",
            worst_kv,
            kv_bound,
            worst_kv <= kv_bound,
            f"x max|K/V| = {scale_kv:.2f}",
            variant,
        ),
        Check(
            "tensor",
            "decoder log_probs (teacher-forced)",
            worst_lp,
            atol,
            worst_lp <= atol,
            f"{sum(len(t) + 1 for t in targets)} steps",
            variant,
        ),
    ]
