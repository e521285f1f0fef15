"""The decoder graphs' last nodes: each row's k best log-probabilities and their ids, sorted best first,
ties to the lower id (the search's own rule, docs/decoding.md).

onnxruntime's CPU TopK keeps a heap per row and compares every entry with it, one at a time: over an
OPUS-MT vocabulary (58,101) it is 1.9 ms at 32 rows and k = 1, 9-24 ms at 128 rows and k = 8, several
times the LogSoftmax before it (docs/optimisation-notes.md row 50). Where the vocabulary V splits into G
blocks of B consecutive ids, the graph takes the top k in two stages instead:

    block maxima   m = ReduceMax(log_probs viewed as [R, G, B], last axis)     one vectorised pass, [R, G]
    best blocks    the top min(k, G) of m, then those block numbers ascending   [R, kg]
    candidates     the chosen blocks' entries, in id order                      [R, kg * B]
    result         TopK(candidates, k); id = block * B + offset

Exact, ties included: every one of the k best entries lies in one of the k best blocks (a block ranked
above the block of an entry e holds an entry ranked above e: a larger value, or the same value at a
lower id, since blocks are ordered by their maxima and then by number like the ids inside them), and the
candidates stay in id order, so TopK's own tie rule (lower position first) is the lower id.
tests/test_top_k.py holds it to plain TopK on ties, -inf and every k.

Small vocabularies keep plain TopK: below MIN_VOCAB its heap is cheap and the dozen extra nodes cost more
at one row than they save.
"""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, helper, numpy_helper

MIN_VOCAB = 8192  # below it, plain TopK (per-node overhead outweighs the pass it saves at one row)
BLOCKS = (32, 1024)  # the block sizes B considered (divisors of V)


def block_size(vocab: int) -> int | None:
    """The block size B for a vocabulary: the divisor of V in BLOCKS closest to sqrt(V) (the block maxima
    and one block's entries per candidate both small), or None for plain TopK.

    Args:
        vocab: V, the target vocabulary's size.
    """
    if vocab < MIN_VOCAB:
        return None
    divisors = [b for b in range(BLOCKS[0], BLOCKS[1] + 1) if vocab % b == 0 and vocab // b >= 2]
    return min(divisors, key=lambda b: abs(b - vocab**0.5)) if divisors else None


def top_k_nodes(log_probs: str, k: str, values: str, ids: str, vocab: int, prefix: str = "top_k") -> list:
    """The nodes that write `values` [R, k] (float) and `ids` [R, k] (int64) from `log_probs` [R, V] and the
    1-D int64 `k`: plain TopK, or the two stages above where block_size(vocab) finds a block size.

    Args:
        log_probs, k: the input names.
        values, ids: the output names.
        vocab: V.
        prefix: the nodes' (and their constants') name prefix.

    Returns:
        The onnx.NodeProto list; constants are Constant nodes, so no initializer is added to the graph.
    """
    b = block_size(vocab)
    if b is None:
        return [
            helper.make_node("TopK", [log_probs, k], [values, ids], name=prefix, axis=-1, largest=1, sorted=1)
        ]
    g = vocab // b

    def name(x: str) -> str:
        return x if x in (log_probs, k, values, ids) else f"{prefix}/{x}"

    def node(op: str, inputs: list[str], outputs: list[str], **attrs) -> NodeProto:
        outs = [name(x) for x in outputs]
        return helper.make_node(op, [name(x) for x in inputs], outs, name=outs[0], **attrs)

    def const(x: str, value) -> NodeProto:
        return node("Constant", [], [x], value=numpy_helper.from_array(np.asarray(value, np.int64), name(x)))

    return [
        const("blocks_shape", [0, g, b]),
        const("blocks", [g]),
        const("axis_2", [2]),
        const("rows_shape", [0, -1]),
        const("block_size", b),
        node("Reshape", [log_probs, "blocks_shape"], ["by_block"]),  # [R, G, B], a view
        node("ReduceMax", ["by_block"], ["block_max"], axes=[-1], keepdims=0),  # [R, G]
        node("Min", [k, "blocks"], ["kg"]),
        node("TopK", ["block_max", "kg"], ["best_max", "best_blocks"], axis=-1, largest=1, sorted=1),
        # the chosen block numbers ascending, so that the candidates are in id order
        node("TopK", ["best_blocks", "kg"], ["chosen", "chosen_order"], axis=-1, largest=0, sorted=1),
        node("Unsqueeze", ["chosen", "axis_2"], ["chosen_3d"]),  # [R, kg, 1]
        node("GatherND", ["by_block", "chosen_3d"], ["candidates_3d"], batch_dims=1),  # [R, kg, B]
        node("Reshape", ["candidates_3d", "rows_shape"], ["candidates"]),  # [R, kg * B]
        node("TopK", ["candidates", k], [values, "position"], axis=-1, largest=1, sorted=1),
        node("Div", ["position", "block_size"], ["slot"]),
        node("Mod", ["position", "block_size"], ["offset"]),
        node("GatherElements", ["chosen", "slot"], ["block"], axis=1),
        node("Mul", ["block", "block_size"], ["start"]),
        node("Add", ["start", "offset"], [ids]),
    ]
