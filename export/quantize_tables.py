"""The int8 embedding tables of an int8 bundle (export/quantize.py): each table quantized per row, symmetric,
as CTranslate2 quantizes its embeddings, and each lookup rewritten as a lookup of the codes and their row
scales, the codes dequantized around a zero point (0) as the products read them."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from .graph_layers import attrs, id_tables


# rows of an embedding table quantized at once (each row on its own: any block gives the same codes)
TABLE_ROWS = 8192


def quantize_table(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Quantizes an embedding table per row, symmetric, as CTranslate2 quantizes its embeddings.

    Args:
        table: E (V, D) fp32.

    Returns:
        (codes (V, D) int8 in [-127, 127], scale (V, 1) fp32): E ~ codes x scale, row by row.
    """
    codes, scale = np.empty(table.shape, np.int8), np.empty((len(table), 1), np.float32)
    for start in range(0, len(table), TABLE_ROWS):  # a block at a time: NLLB's table is 1-2 GB of fp32
        rows = slice(start, start + TABLE_ROWS)
        block = (np.abs(table[rows]).max(axis=1, keepdims=True) / 127).astype(np.float32)
        block[block == 0] = 1.0  # an all-zero row: codes 0
        scale[rows] = block
        codes[rows] = np.clip(np.round(table[rows] / block), -127, 127)
    return codes, scale


def quantize_tables(
    graph: onnx.GraphProto, inits: dict[str, np.ndarray], const
) -> dict[str, tuple[str, str]]:
    """Rewrites each embedding lookup as a lookup of int8 codes and their row scales (quantize_table).

    Returns:
        Table initializer -> (its codes, its scales (V, 1), the scales' values): a tied output projection
        multiplies by the same codes (transposed) rather than by codes of its own.
    """
    tables: dict[str, tuple[str, str, np.ndarray]] = {}
    rewritten: dict[int, list[onnx.NodeProto]] = {}
    for node in id_tables(graph, inits):
        name = node.input[0]
        if name not in tables:
            codes, scale = quantize_table(inits[name])
            tables[name] = (const(f"{name}/rowq8/codes", codes), const(f"{name}/rowq8/scale", scale), scale)
        codes, scale, _ = tables[name]
        tag, kept = node.name or node.output[0], attrs(node)
        t = f"{tag}/lookup8"
        # the codes read around a zero point of their own (0), not cast as they are: a runtime that reads the
        # table as uint8 (runtime/exact_int8.py) moves the zero point with it, and the lookup is unchanged
        one, zero = const(f"{name}/rowq8/one", np.float32(1.0)), const(f"{name}/rowq8/zero", np.int8(0))
        rewritten[id(node)] = [
            helper.make_node(node.op_type, [codes, node.input[1]], [f"{t}/codes"], name=f"{t}/codes", **kept),
            helper.make_node(node.op_type, [scale, node.input[1]], [f"{t}/scale"], name=f"{t}/scale", **kept),
            helper.make_node(
                "DequantizeLinear", [f"{t}/codes", one, zero], [f"{t}/float"], name=f"{t}/dequantize"
            ),
            helper.make_node("Mul", [f"{t}/float", f"{t}/scale"], [node.output[0]], name=f"{t}/mul"),
        ]
    nodes = [n for node in graph.node for n in rewritten.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    return tables
