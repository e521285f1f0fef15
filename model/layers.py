"""The Transformer's building blocks without parameters of their own: positions, masks, wide LayerNorm."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def sinusoid_table(n_positions: int, d_model: int) -> Tensor:
    """Returns the (n_positions, d_model) fp32 position table, computed in fp64.

    PE[pos, 2k] = sin(pos * w_k), PE[pos, 2k+1] = cos(pos * w_k), w_k = 1/10000^(2k/d).

    Args:
        n_positions: rows (positions).
        d_model: columns.
    """
    position = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)
    omega = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * omega)
    table[:, 1::2] = torch.cos(position * omega[: d_model // 2])
    return table.float()


def padding_bias(mask: Tensor) -> Tensor:
    """Returns the (B, 1, 1, S) additive attention bias, 0 or -inf, of a padding mask.

    Args:
        mask: (B, S) bool, True for real tokens.
    """
    zero = torch.zeros((), device=mask.device)
    return torch.where(mask, zero, float("-inf"))[:, None, None, :]


def own_past_bias(step: Tensor, past_len: int) -> Tensor:
    """Returns the (R or 1, 1, 1, P+1) additive bias, 0 or -inf, of one decoding step's self-attention.

    Row r holds step[r] positions of its own at the END of the P cached slots, then the new one (slot
    P). In a batch decoded together every row has step = P, so every slot is its own (the bias is 0).
    A serving batch mixes sentences at different steps (serve/batcher.py): a row that joined it later
    has fewer positions, and the slots before its own are another sentence's history or padding.

    Args:
        step: (R,) or (1,) each row's position (its count of cached positions).
        past_len: P, the cache's length.
    """
    slots = torch.arange(past_len + 1, device=step.device)  # (P+1,)
    own = slots[None, :] >= (past_len - step)[:, None]  # (R, P+1)
    zero = torch.zeros((), device=step.device)
    return torch.where(own, zero, float("-inf"))[:, None, None, :]


def causal_bias(t: int, device: torch.device) -> Tensor:
    """Returns the (T, T) additive causal bias, 0 or -inf: position i attends to positions <= i only.

    Args:
        t: the target length T.
        device: where the tensor goes.
    """
    return torch.full((t, t), float("-inf"), device=device).triu(1)


def wide(x: Tensor) -> Tensor:
    """Returns x in at least fp32 (fp16 and bf16 become fp32): fp16 overflows in LayerNorm, softmax and
    large sums.

    Args:
        x: any tensor; fp32 and fp64 are returned as they are.
    """
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class LayerNorm(nn.LayerNorm):
    """LayerNorm computed in at least fp32 whatever the weights' dtype (fp16 graphs cannot overflow)."""

    def forward(self, x: Tensor) -> Tensor:
        """Normalizes the last dimension of x in at least fp32; returns it in x's dtype."""
        return F.layer_norm(
            wide(x), self.normalized_shape, wide(self.weight), wide(self.bias), self.eps
        ).to(x.dtype)
