"""Block-wise weight codes in the layout of onnxruntime's MatMulNBits and GatherBlockQuantized (4 or 8 bits).

Both com.microsoft operators read the same packing: a weight matrix held as N rows of K values (a linear
layer's W transposed, or an embedding table E (V, D) as it is), each row cut into blocks of `block` values
along K, each block with its own fp32 scale and, optionally, its own zero point:

    w ~ (code - zero point) x scale            code in [0, 2^bits - 1]

For 4 bits two codes share a byte, the first in the low nibble; the zero points (when stored) are packed the
same way, per row. Without zero points both operators take 2^(bits - 1) (8 or 128): the symmetric scheme,
whose scale maps the block's value of largest magnitude onto -2^(bits - 1), so that it and 0 are exact
(onnxruntime's own quantizer does the same). With zero points the block's [min, max] (0 included) spans every
code. The bytes of a table quantized along D are exactly the bytes of its tied output projection's
MatMulNBits B (N = V, K = D): export/weights.py stores equal bytes once, so the two share the file.
"""

from __future__ import annotations

import numpy as np

ROWS_AT_ONCE = 8192  # rows quantized at once: NLLB's table is 1-2 GB of fp32


def blocks_of(k: int, block: int) -> int:
    """How many blocks of `block` values a row of `k` values has (the last padded with zeros)."""
    return -(-k // block)


def _codes(rows: np.ndarray, bits: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes (R, nb, block) uint8, scales (R, nb) and zero points (R, nb) of blocks (R, nb, block)."""
    top = 2**bits - 1
    if symmetric:
        half = 2 ** (bits - 1)
        at = np.abs(rows).argmax(axis=2)[..., None]
        signed = np.take_along_axis(rows, at, axis=2)[..., 0]  # the block's value of largest magnitude
        scale = (signed / -half).astype(np.float32)
        zero = np.full(scale.shape, half, np.float32)
    else:
        low, high = np.minimum(rows.min(axis=2), 0), np.maximum(rows.max(axis=2), 0)
        scale = ((high - low) / top).astype(np.float32)
        zero = np.clip(np.round(-low / np.where(scale == 0, 1, scale)), 0, top)
    scale[scale == 0] = 1.0  # an all-zero block: every code is its zero point
    codes = np.clip(np.round(rows / scale[..., None]) + zero[..., None], 0, top)
    return codes.astype(np.uint8), scale, zero.astype(np.uint8)


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Two 4-bit codes per byte along the last axis, the first in the low nibble. An odd count (zero points
    of an odd number of blocks) is padded with 8, the unused nibble onnxruntime's quantizer writes."""
    if bits == 8:
        return codes
    if codes.shape[-1] % 2:
        codes = np.concatenate([codes, np.full(codes.shape[:-1] + (1,), 8, np.uint8)], axis=-1)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def quantize_rows(
    w: np.ndarray, bits: int, block: int, symmetric: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Quantizes N rows of K values block-wise along K, in MatMulNBits' layout.

    Args:
        w: (N, K) fp32: a linear layer's W (K, N) transposed, or an embedding table (V, D).
        bits: 4 or 8.
        block: values per block along K (a power of 2, at least 16).
        symmetric: no zero points (both operators then take 2^(bits - 1)); else one per block.

    Returns:
        (codes (N, nb, block x bits / 8) uint8, scales (N, nb) fp32, zero points or None): zero points are
        (N, nb) uint8 for 8 bits, (N, ceil(nb / 2)) packed for 4.
    """
    if bits not in (4, 8) or block < 16 or block & (block - 1):
        raise ValueError(f"bits={bits}, block={block}: bits must be 4 or 8 and block a power of 2 >= 16")
    n, k = w.shape
    nb = blocks_of(k, block)
    codes = np.empty((n, nb, block * bits // 8), np.uint8)
    scales = np.empty((n, nb), np.float32)
    zeros = np.empty((n, nb), np.uint8)
    for start in range(0, n, ROWS_AT_ONCE):
        part = np.asarray(w[start : start + ROWS_AT_ONCE], np.float32)
        if k % block:
            part = np.pad(part, ((0, 0), (0, nb * block - k)))
        c, s, z = _codes(part.reshape(len(part), nb, block), bits, symmetric)
        codes[start : start + len(part)] = _pack(c, bits)
        scales[start : start + len(part)], zeros[start : start + len(part)] = s, z
    return codes, scales, None if symmetric else _pack(zeros, bits)


def dequantize_rows(
    codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None, bits: int, k: int
) -> np.ndarray:
    """The (N, K) fp32 values quantize_rows' codes stand for (for tests and error measurements)."""
    n, nb, _ = codes.shape
    if bits == 4:
        codes = np.stack([codes & 15, codes >> 4], axis=-1).reshape(n, nb, -1)
    if zeros is None:
        zero = np.full((n, nb), 2 ** (bits - 1), np.float32)
    else:
        zero = np.stack([zeros & 15, zeros >> 4], axis=-1).reshape(n, -1)[:, :nb] if bits == 4 else zeros
    values = (codes.astype(np.float32) - zero[..., None].astype(np.float32)) * scales[..., None]
    return values.reshape(n, -1)[:, :k]
