"""The Transformer's building blocks without parameters of their own: positions, masks, wide LayerNorm,
dropout."""

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
        return F.layer_norm(wide(x), self.normalized_shape, wide(self.weight), wide(self.bias), self.eps).to(
            x.dtype
        )


class RMSNorm(nn.Module):
    """T5's norm: x / sqrt(mean(x^2) + eps) * weight, no mean subtracted and no bias, in at least fp32.

    Args:
        d: the normalized width.
        eps: added to the mean square.
    """

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """Normalizes the last dimension of x in at least fp32 (transformers' T5LayerNorm's order of
        operations); returns it in x's dtype."""
        h = wide(x)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (wide(self.weight) * h).to(x.dtype)


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU's tanh approximation, written as transformers' NewGELUActivation ("gelu_new") computes it."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def relative_bucket(relative: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """T5's bucket of each relative position (key position - query position), as Mesh TensorFlow and
    transformers' T5Attention._relative_position_bucket compute it: exact buckets for small distances,
    logarithmic ones up to max_distance, one bucket for everything beyond.

    Args:
        relative: int64 relative positions, any shape.
        bidirectional: the encoder's (half the buckets for keys after the query); False: the decoder's
            (keys after the query never occur).
        num_buckets: the buckets.
        max_distance: the distance from which all positions share a bucket.

    Returns:
        The buckets, int64, relative's shape.
    """
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).to(torch.long) * num_buckets
        relative = torch.abs(relative)
    else:
        relative = -torch.min(relative, torch.zeros_like(relative))
    max_exact = num_buckets // 2
    is_small = relative < max_exact
    logarithmic = torch.log(relative.float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (logarithmic * (num_buckets - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, relative, large)


def bucket_table(bidirectional: bool, num_buckets: int, max_distance: int, n_positions: int) -> Tensor:
    """The bucket of every relative position from -(n_positions - 1) to n_positions - 1 (index
    r + n_positions - 1): what a stack of at most n_positions positions looks up, so that the graphs need
    no logarithm (whose last bit could differ between torch and onnxruntime at a bucket's edge).
    """
    relative = torch.arange(1 - n_positions, n_positions, dtype=torch.long)
    return relative_bucket(relative, bidirectional, num_buckets, max_distance)


class Dropout(nn.Module):
    """Dropout (the paper's P_drop) whose masks cost about a third of torch's on the CPU.

    torch's CPU dropout draws one sample per element from its generator, about 10 ns each, single-threaded:
    on the demo's training batches it cost more than every linear layer's forward (docs/optimisation-notes.md,
    row 79). Here one 64-bit draw from the same generator (so seeds and saved RNG states still replay a
    run) gives four elements 16 random bits each: P_drop is rounded to a multiple of 1/65536 (0.1 becomes
    0.100006), and the kept values are scaled by the exact inverse of the rounded keep rate, so that the
    expectation is x. Elsewhere than the CPU, torch's own kernel is fast and is used.

    Args:
        p: the probability of zeroing an element, in [0, 1).
    """

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout {p} is outside [0, 1); 0.1 is the paper's")
        self.p = p
        self._dropped = round(p * 65536)  # of the 65536 values of 16 bits, those that drop an element

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self._dropped == 0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        n = x.numel()
        bits = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64)
        # an int16 is uniform over [-32768, 32767]: kept when it is not among the lowest _dropped values
        kept = bits.view(torch.int16)[:n].view(x.shape) >= self._dropped - 32768
        return x * (kept * (65536 / (65536 - self._dropped))).to(x.dtype)

    def extra_repr(self) -> str:
        return f"p={self.p}"
