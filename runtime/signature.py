"""Every input and output of a bundle's graphs, as bundle.json's `graphs` states them: name, element
type and shape with named axes. The names come from runtime/bundle.py (and so from spec/bundle.json)."""

from __future__ import annotations

from .bundle import (
    BEAM_WIDTH,
    CACHE_INDICES,
    CACHE_INDIRECTION,
    ROW_START,
    CROSS_ATTENTION,
    DECODER_LABELS,
    FUSED,
    LOG_PROBS,
    SRC_IDS,
    SRC_LENGTHS,
    SRC_MASK,
    STANDARD,
    STEP,
    TOKENS,
    TOP_K,
    TOPK_IDS,
    TOPK_LOG_PROBS,
    cross_names,
    past_names,
    present_names,
)


def fused_signature(n_layers: int, n_heads: int, head_dim: int, vocab: int) -> dict:
    """Inputs and outputs of the fused decoder step (fp32 only): name, element type, shape with named axes.

    The cache inputs and outputs are one [rows, heads, max_length, head_dim] buffer per layer and
    kind, bound as both past_* and present_* (docs/fused-decoder.md).

    Args:
        n_layers: decoder layers.
        n_heads: attention heads.
        head_dim: head size.
        vocab: target vocabulary size.

    Returns:
        {"inputs": [...], "outputs": [...]}, each entry {"name", "dtype", "shape"}.
    """
    cache = lambda name: {
        "name": name,
        "dtype": "float32",
        "shape": ["rows", n_heads, "max_length", head_dim],
    }
    cross = lambda name: {"name": name, "dtype": "float32", "shape": ["batch", n_heads, "src_len", head_dim]}
    return {
        "inputs": [
            {"name": TOKENS, "dtype": "int64", "shape": ["rows", 1]},
            {"name": STEP, "dtype": "int32", "shape": [1]},
            {"name": BEAM_WIDTH, "dtype": "int32", "shape": [1]},
            {"name": CACHE_INDIRECTION, "dtype": "int32", "shape": ["batch", "beam", "max_length"]},
            {"name": ROW_START, "dtype": "int32", "shape": ["rows"]},
        ]
        + [cache(n) for n in past_names(n_layers)]
        + [cross(n) for n in cross_names(n_layers)]
        + [
            {"name": SRC_MASK, "dtype": "bool", "shape": ["batch", "src_len"]},
            {"name": TOP_K, "dtype": "int64", "shape": [1]},
        ],
        "outputs": [{"name": LOG_PROBS, "dtype": "float32", "shape": ["rows", vocab]}]
        + [cache(n) for n in present_names(n_layers)]
        + [
            {"name": TOPK_LOG_PROBS, "dtype": "float32", "shape": ["rows", "k"]},
            {"name": TOPK_IDS, "dtype": "int64", "shape": ["rows", "k"]},
        ],
    }


def graph_signature(
    n_layers: int, n_heads: int, head_dim: int, dtype: str, vocab: int, *, fused: bool = False
) -> dict:
    """Every input and output of the graphs, with each decoder's variant: name, element type and shape (axes
    named).

    The operator domains of each graph are read from the files by the exporter, not stated here.

    Args:
        n_layers: decoder layers.
        n_heads: attention heads.
        head_dim: head size.
        dtype: the keys' and values' element type ("float32", "float16").
        vocab: target vocabulary size.
        fused: add decoder_fused (export writes it for fp32 bundles).

    Returns:
        bundle.json's `graphs`: {label: {"inputs", "outputs", "variant"}}.
    """
    kv = lambda name, rows, length: {"name": name, "dtype": dtype, "shape": [rows, n_heads, length, head_dim]}
    graphs = {
        "encoder": {
            "inputs": [
                {"name": SRC_IDS, "dtype": "int64", "shape": ["batch", "src_len"]},
                {"name": SRC_LENGTHS, "dtype": "int64", "shape": ["batch"]},
            ],
            "outputs": [{"name": SRC_MASK, "dtype": "bool", "shape": ["batch", "src_len"]}]
            + [kv(n, "batch", "src_len") for n in cross_names(n_layers)],
            "variant": STANDARD,
        },
        "decoder": {
            "inputs": [
                {"name": TOKENS, "dtype": "int64", "shape": ["rows", 1]},
                # 1, or rows: each row's own step in a serving batch (serve/batcher.py); bundles exported
                # before serve/ say [1]
                {"name": STEP, "dtype": "int64", "shape": ["step_rows"]},
                {"name": CACHE_INDICES, "dtype": "int64", "shape": ["rows"]},
            ]
            + [kv(n, "prev_rows", "past") for n in past_names(n_layers)]
            + [kv(n, "batch", "src_len") for n in cross_names(n_layers)]
            + [
                {"name": SRC_MASK, "dtype": "bool", "shape": ["batch", "src_len"]},
                {"name": TOP_K, "dtype": "int64", "shape": [1]},
            ],
            "outputs": [{"name": LOG_PROBS, "dtype": "float32", "shape": ["rows", vocab]}]
            + [kv(n, "rows", "past_plus_1") for n in present_names(n_layers)]
            + [{"name": CROSS_ATTENTION, "dtype": "float32", "shape": ["rows", "src_len"]}]
            + [
                {"name": TOPK_LOG_PROBS, "dtype": "float32", "shape": ["rows", "k"]},
                {"name": TOPK_IDS, "dtype": "int64", "shape": ["rows", "k"]},
            ],
            "variant": STANDARD,
        },
    }
    if fused:
        graphs[DECODER_LABELS[FUSED]] = {
            **fused_signature(n_layers, n_heads, head_dim, vocab),
            "variant": FUSED,
        }
    return graphs
