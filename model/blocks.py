"""The Transformer's building blocks: multi-head scaled dot-product attention, the position-wise feed-forward
network, Add & Norm, and the encoder and decoder layers (model/transformer.py assembles them).

Shape legend: B batch (sentences), R decoder rows (B x live beams), H heads, S source length,
T target length, P past (cached) length, D d_model, Dh head size, V vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .layers import Dropout, LayerNorm, RMSNorm, gelu_tanh, wide

KV = tuple[Tensor, Tensor]


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention, written out with MatMul and Softmax.

    Args:
        cfg: the model's shape (d_model, n_heads, dropout).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        inner, bias = cfg.inner_dim, cfg.linear_bias  # inner: d_model but in T5 (d_kv)
        self.w_q = nn.Linear(cfg.d_model, inner, bias=bias)
        self.w_k = nn.Linear(cfg.d_model, inner, bias=bias)
        self.w_v = nn.Linear(cfg.d_model, inner, bias=bias)
        self.w_o = nn.Linear(inner, cfg.d_model, bias=bias)
        self.dropout = Dropout(cfg.dropout)
        self.scaled = cfg.attention_scale  # T5 adds its relative bias to unscaled scores

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, H, T, Dh)."""
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def project_kv(self, x: Tensor) -> KV:
        """Keys and values of x (B, S, D): 2 x (B, H, S, Dh)."""
        return self.split_heads(self.w_k(x)), self.split_heads(self.w_v(x))  # 2 x (B, H, S, Dh)

    def attention_weights(self, q: Tensor, k: Tensor, bias: Tensor | None) -> Tensor:
        """Returns softmax(Q K^T / sqrt(d_k) + bias) per head, in fp32: (B, H, T, S); T5: no sqrt(d_k).

        Args:
            q: (B, H, T, Dh) queries.
            k: (B, H, S, Dh) keys.
            bias: additive mask broadcast to (B, H, T, S), or None.
        """
        # 1. scores: (B, H, T, Dh) @ (B, H, Dh, S) -> (B, H, T, S)
        scores = torch.matmul(q, k.transpose(-2, -1))
        if self.scaled:
            scores = scores / math.sqrt(self.head_dim)
        # 2. masks: padding (B, 1, 1, S) and/or causal (T, S) broadcast over heads (T5: plus its relative
        # position bias, (1 or B, H, T, S))
        if bias is not None:
            scores = scores + bias
        # 3. softmax in fp32: fp16 exponentials overflow
        return F.softmax(wide(scores), dim=-1)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
        """Returns softmax(Q K^T / sqrt(d_k) + bias) V per head (dropout on the weights): (B, H, T, Dh).

        Args:
            q: (B, H, T, Dh) queries.
            k, v: (B, H, S, Dh) keys and values.
            bias: additive mask, or None.
        """
        weights = self.dropout(self.attention_weights(q, k, bias).to(v.dtype))
        # 4. weighted values: (B, H, T, S) @ (B, H, S, Dh) -> (B, H, T, Dh)
        return torch.matmul(weights, v)

    def forward(self, x: Tensor, kv: KV, bias: Tensor | None) -> Tensor:
        """Returns the attention from x to kv, heads merged and projected: (B, T, D).

        Args:
            x: (B, T, D) queries.
            kv: 2 x (B, H, S, Dh) keys and values (project_kv).
            bias: additive mask, or None.
        """
        context = self.attention(self.split_heads(self.w_q(x)), kv[0], kv[1], bias)  # (B, H, T, Dh)
        b, _, t, _ = context.shape  # heads merged: (B, T, H * Dh)
        return self.w_o(context.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))

    # -- one decoding step: rows (R, D), one new position each -------------------------------
    # The same arithmetic as above on 2-D rows. In the exported step this matters: reshapes to
    # constant shapes need no Shape/Gather/Concat nodes, (R, H, 1, Dh) needs no Transpose, and
    # 2-D Linear layers become single Gemm nodes. At batch 1 a step's cost is mostly per-node
    # dispatch (docs/optimisation-notes.md, row 6).

    def rows_to_heads(self, x: Tensor) -> Tensor:
        """(R, D) -> (R, H, 1, Dh)."""
        return x.reshape(-1, self.n_heads, 1, self.head_dim)  # (R, D) -> (R, H, 1, Dh)

    def step_self(self, x: Tensor, past: KV, bias: Tensor | None = None) -> tuple[Tensor, KV]:
        """Self-attention of one new position per row over the cache and itself.

        Args:
            x: (R, D) the new positions.
            past: 2 x (R, H, P, Dh) the cached keys and values.
            bias: (R or 1, 1, 1, P+1) which slots are the row's own (layers.own_past_bias), or None: all.

        Returns:
            (R, D) and the cache 2 x (R, H, P+1, Dh).
        """
        k = torch.cat([past[0], self.rows_to_heads(self.w_k(x))], dim=2)
        v = torch.cat([past[1], self.rows_to_heads(self.w_v(x))], dim=2)
        # the newest position attends to every cached position of its own (all of them, but in a serving
        # batch)
        context = self.attention(self.rows_to_heads(self.w_q(x)), k, v, bias)  # (R, H, 1, Dh)
        return self.w_o(context.reshape(-1, self.n_heads * self.head_dim)), (k, v)

    def step_cross(self, x: Tensor, kv: KV, bias: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention of one new position per row over its sentence's source.

        A sentence's R/B rows (its live beams) share its keys and values: they query them as
        (B, H, R/B, Dh) instead of copying the cross cache per beam.

        Args:
            x: (R, D) grouped by sentence.
            kv: 2 x (B, H, S, Dh) the source's keys and values.
            bias: (B, 1, 1, S) padding bias.

        Returns:
            (R, D), and the attention weights averaged over heads (R, S) in fp32.
        """
        # (B, H, R/B, Dh)
        q = self.w_q(x).reshape(kv[0].shape[0], -1, self.n_heads, self.head_dim).transpose(1, 2)
        weights = self.attention_weights(q, kv[0], bias)  # (B, H, R/B, S)
        # (B, R/B, H, Dh)
        context = torch.matmul(self.dropout(weights.to(kv[1].dtype)), kv[1]).transpose(1, 2)
        averaged = weights.mean(dim=1).reshape(-1, weights.shape[-1])  # (R, S)
        return self.w_o(context.reshape(-1, self.n_heads * self.head_dim)), averaged


class FeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2 (act = max(0, .) in the paper), applied at each position alike.

    Args:
        cfg: the model's shape (d_model, d_ff, dropout).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.linear_bias)
        # gated (T5 v1.1, mT5): the linear half, multiplied into the activated one (transformers' wi_1)
        self.w_3 = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.linear_bias) if cfg.gated else None
        self.w_2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.linear_bias)
        self.dropout = Dropout(cfg.dropout)
        # exact gelu (erf), as transformers' "gelu"; swish = SiLU; gelu_tanh as transformers' "gelu_new"
        functions = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu, "gelu_tanh": gelu_tanh}
        self.activation = functions[cfg.activation]

    def forward(self, x: Tensor) -> Tensor:
        """(..., D) -> (..., D), dropout after the activation (after the gate's product when gated)."""
        h = self.activation(self.w_1(x))
        if self.w_3 is not None:
            h = h * self.w_3(x)
        return self.w_2(self.dropout(h))


def make_norm(cfg: ModelConfig) -> nn.Module:
    """The model's norm over d_model: LayerNorm, or T5's RMS norm (cfg.norm)."""
    if cfg.norm == "rms":
        return RMSNorm(cfg.d_model, cfg.layer_norm_eps)
    return LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)


class Sublayer(nn.Module):
    """Residual Add & Norm around one sublayer: post-LN norm(x + f(x)) or pre-LN x + f(norm(x)).

    Args:
        cfg: the model's shape (d_model, layer_norm_eps, dropout, pre_norm).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = make_norm(cfg)
        self.dropout = Dropout(cfg.dropout)
        self.pre_norm = cfg.pre_norm

    def forward(self, x: Tensor, f) -> Tensor:
        """Applies f (Callable[[Tensor], Tensor], the sublayer) with the residual, dropout on f's output."""
        if self.pre_norm:
            return x + self.dropout(f(self.norm(x)))
        return self.norm(x + self.dropout(f(x)))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each in a Sublayer.

    Args:
        cfg: the model's shape.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg)
        self.feed_forward = FeedForward(cfg)
        self.sub_attn, self.sub_ff = Sublayer(cfg), Sublayer(cfg)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        """x (B, S, D) with padding bias (B, 1, 1, S) -> (B, S, D)."""
        x = self.sub_attn(x, lambda y: self.self_attn(y, self.self_attn.project_kv(y), bias))
        return self.sub_ff(x, self.feed_forward)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention, then feed-forward, each in a Sublayer.

    Args:
        cfg: the model's shape.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg)
        self.cross_attn = MultiHeadAttention(cfg)
        self.feed_forward = FeedForward(cfg)
        self.sub_self, self.sub_cross, self.sub_ff = Sublayer(cfg), Sublayer(cfg), Sublayer(cfg)

    def forward(self, x: Tensor, self_bias: Tensor, cross: KV, cross_bias: Tensor) -> Tensor:
        """Returns the layer's output (B, T, D), teacher-forced: all target positions at once under the
        causal mask.

        Args:
            x: (B, T, D).
            self_bias: (T, T) causal bias.
            cross: 2 x (B, H, S, Dh) the source's keys and values.
            cross_bias: (B, 1, 1, S) padding bias.
        """
        x = self.sub_self(x, lambda y: self.self_attn(y, self.self_attn.project_kv(y), self_bias))
        x = self.sub_cross(x, lambda y: self.cross_attn(y, cross, cross_bias))
        return self.sub_ff(x, self.feed_forward)

    def step(
        self, x: Tensor, past: KV, cross: KV, cross_bias: Tensor, self_bias: Tensor | None = None
    ) -> tuple[Tensor, KV, Tensor]:
        """One new position per row.

        Args:
            x: (R, D).
            past: 2 x (R, H, P, Dh), already reordered to the rows.
            cross: 2 x (B, H, S, Dh) the source's keys and values.
            cross_bias: (B, 1, 1, S) padding bias.
            self_bias: (R or 1, 1, 1, P+1) the rows' own cached slots (layers.own_past_bias), or None: all.

        Returns:
            x, the layer's new cache and its cross-attention averaged over heads (R, S).
        """
        present: list[KV] = []
        attention: list[Tensor] = []

        def self_attention(y: Tensor) -> Tensor:
            out, kv = self.self_attn.step_self(y, past, self_bias)
            present.append(kv)
            return out

        def cross_attention(y: Tensor) -> Tensor:
            out, weights = self.cross_attn.step_cross(y, cross, cross_bias)
            attention.append(weights)
            return out

        x = self.sub_self(x, self_attention)
        x = self.sub_cross(x, cross_attention)
        return self.sub_ff(x, self.feed_forward), present[0], attention[0]
