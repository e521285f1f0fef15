"""int8 graphs whose every row is computed alone: per-row activation scales, per-channel weights.

onnxruntime's dynamic quantization (quantize_dynamic, DynamicQuantizeMatMul) scales a linear
layer's input by ONE (min, max) over the whole tensor, i.e. over every sentence of the batch: a
sentence's codes, and so its translation, change with its neighbours. Here each row (one target
position of one hypothesis, or one source position) gets its own scale, as CTranslate2 does, so a
row's result is the same alone and in any batch. Weights are quantized once, per output channel.

Every linear layer with constant fp32 weights W (K, N) -- MatMul, Gemm, and FusedGemm(Relu) of the
fused decoder -- becomes, with m = max|x| over the row (K values):

    codes = QuantizeLinear(x / m, 1/127, 128)             uint8, one pass per input tensor (shared
                                                          by the layers that read it, e.g. Q, K, V)
    y     = (codes - 128) @ Wq  x  (s_w / 127)  x  m  +  b   [Relu]

with Wq = round(W / s_w) + z_w per output column n: int8 codes in [-128, 127], s_w = (max - min of
W[:, n], 0 included) / 255 and z_w the code of 0, so 0 is exact. These are the uint8 codes of the
column's own range minus 128 (the zero point moved with them): the products are a u8 x u8
product's, to the bit, while uint8 x int8 is onnxruntime's fast integer product: with VNNI
(vpdpbusd) or on ARM it accumulates in 32 bits, exactly, ~2x its u8 x u8 kernel at 32-128 rows
(docs/optimisation-notes.md, row 27). On x86 CPUs without VNNI its kernel adds pairs of products in
signed 16 bits (vpmaddubsw) and saturates (255 x 128 x 2 > 32,767; onnxruntime documents this as
the u8s8 saturation issue): there the runtime reads the int8 weights as uint8 (w + 128, zero point
+ 128: one bit flipped, runtime/exact_int8.py) for onnxruntime's exact u8 x u8 kernel, and turns on
its `session.x64quantprecision`, which does the same rewrite, for a weight it cannot flip
(runtime/u8s8_probe.py asks onnxruntime which case a CPU is). Measured alternatives (row 27):
symmetric int8 weights (max|w| / 127), and 7-bit activations (which never saturate) change
agreement with PyTorch by -3 to +1 points on 500 sentences; 7-bit weights (`reduce_range`) lose
accuracy (row 8).

A row whose values are all 0 gives m = 0 and codes of 0/0: whatever codes QuantizeLinear makes of
them, the integer product is finite and is multiplied by m = 0, so y = b exactly (tested), and no
guard node is needed.

In the standard-opset graphs (encoder.onnx, decoder.onnx) the product is MatMulInteger -> Cast ->
Mul(s_w / 127): plain opset-17 operators, so a host without com.microsoft kernels runs them. The
fused decoder (already com.microsoft) uses MatMulIntegerToFloat, which folds the Cast and the
weight scale into the product. Attention products (QK^T, softmax . V), embeddings, layer norms and
the contrib attention kernels stay fp32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


from .graph_layers import (
    GROUPS,
    MS_DOMAIN,
    Initializers,
    QuantizeError,
    attrs,
    id_tables,
    layer_group,
    linear_weights,
    self_attention_triples,
)
from .quantize_tables import quantize_tables
from .weights import TensorWriter, constants_to_initializers

ACTIVATION_QMAX = 127  # activation codes 128 +- 127: uint8 with zero point 128, symmetric
ACTIVATION_ZERO = 128
SCHEME = {  # what bundle.json's `quantization_scheme` records
    "name": "int8-per-row-u8s8",
    "activations": {
        "bits": 8,
        "type": "uint8",
        "zero_point": ACTIVATION_ZERO,
        "range": [1, 255],
        "scale": f"per row: max|x| / {ACTIVATION_QMAX}, at run time",
        "block_size": "row (the whole input dimension)",
    },
    "weights": {
        "bits": 8,
        "type": "int8",
        "zero_point": "per output channel: the code of 0",
        "range": [-128, 127],
        "scale": "per output channel: (max - min, 0 included) / 255",
        "block_size": "column (the whole input dimension)",
    },
    "batch_invariant": True,
    "exact_products": "u8 x s8 where onnxruntime's kernel accumulates in 32 bits (VNNI, ARM); elsewhere on "
    "x86 the runtime sets session.x64quantprecision (u8 x u8)",
    "fp32": "attention products, softmax, embeddings, layer norms, contrib attention kernels",
}


TABLES = {  # what bundle.json's quantization_scheme.tables records where the embeddings are int8
    "bits": 8,
    "type": "int8",
    "zero_point": 0,
    "range": [-127, 127],
    "scale": "per row: max|e| / 127",
    "lookup": "Gather of the codes and of the row scales, DequantizeLinear (scale 1, zero point 0), Mul",
    "tied_projection": "the same codes, transposed (a Transpose node onnxruntime folds at load), against "
    "per-row activation codes as every linear layer",
}


# keep_float's layer groups (an ablation: scripts/int4_quality.py's int8 rows): the names the exporter gives
def quantize_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantizes weights per output column: W ~ (codes - zero point) x scale, with 0 exactly representable.

    The 256 levels span each column's own [min, max] (0 included), as uint8 codes would; stored as
    int8 (uint8 code - 128, the zero point moved with them), so the products are the same as a
    uint8 x uint8 product's, on onnxruntime's faster u8 x s8 kernel.

    Args:
        w: W (K, N) fp32.

    Returns:
        (codes (K, N) int8, scale (N,), zero point (N,) int8).
    """
    low, high = np.minimum(w.min(axis=0), 0), np.maximum(w.max(axis=0), 0)
    scale = ((high - low) / 255).astype(np.float32)
    scale[scale == 0] = 1.0  # an all-zero column: codes = zero point = -128
    zero = np.clip(np.round(-low / scale), 0, 255)
    codes = np.clip(np.round(w / scale) + zero, 0, 255)
    return (codes - 128).astype(np.int8), scale, (zero - 128).astype(np.int8)


def quantize_model(
    proto: onnx.ModelProto,
    *,
    contrib: bool,
    tables: bool = True,
    keep_float: frozenset[str] = frozenset(),
    directory: Path | None = None,
    writer: TensorWriter | None = None,
) -> int:
    """Rewrites every linear layer of `proto` (in place) as described in the module docstring.

    Args:
        proto: the graph.
        contrib: use com.microsoft's MatMulIntegerToFloat (for the fused decoder, which needs
            com.microsoft anyway); otherwise plain opset-17 operators.
        tables: the embedding tables in int8 too, per row (quantize_table), and a tied output
            projection multiplied by their codes; False keeps them fp32.
        keep_float: GROUPS whose layers stay fp32 (empty by default: every layer int8), for measuring
            what each group's int8 costs; "embeddings" keeps the tables and the output projection fp32.
        directory: where the graph's external data lies (its fp32 weights are read one at a time).
        writer: where the int8 tensors go (export/weights.py); None: inside the proto.

    Returns:
        How many layers were quantized.

    Raises:
        QuantizeError: the graph has no linear layer to quantize, or keep_float names no group of GROUPS.
    """
    if unknown := set(keep_float) - set(GROUPS):
        raise QuantizeError(
            f"keep_float: unknown groups {sorted(unknown)}; the groups are {', '.join(GROUPS)}"
        )
    graph = proto.graph
    rewriter = _Rewriter(graph, contrib, tables and "embeddings" not in keep_float, directory, writer)
    count = _rewrite_layers(graph, rewriter, keep_float)
    if count == 0:
        raise QuantizeError(
            f"graph {graph.name!r} has no linear layer with constant fp32 weights to quantize"
        )
    _replace_nodes(proto, rewriter, contrib)
    return count


def _rewrite_layers(graph: onnx.GraphProto, rewriter: _Rewriter, keep_float: frozenset[str]) -> int:
    """Feeds each node of `graph` to the rewriter: a linear layer (not kept fp32) rewritten, a self-attention
    Q, K, V triple stacked, any other node kept. Returns how many linear layers were quantized."""
    ids = {n.input[0] for n in id_tables(graph, rewriter.inits)} if keep_float else set()
    count, triples, stacked = 0, self_attention_triples(graph), set()
    for node in graph.node:
        found = linear_weights(node, rewriter.inits)
        if found is not None and keep_float and layer_group(node, ids | set(rewriter.tables)) in keep_float:
            found = None
        if found is None:
            rewriter.nodes.append(node)
            continue
        count += 1
        if node.name in stacked:
            continue  # made with the first of its Q, K, V
        triple = triples.get(node.name, ())
        parts = [linear_weights(n, rewriter.inits) for n in triple]
        if triple and all(p is not None and p[2] is None for p in parts):
            rewriter.stacked(triple, parts)
            stacked.update(n.name for n in triple)
        else:
            rewriter.linear(node, *found)
    return count


def _replace_nodes(proto: onnx.ModelProto, rewriter: _Rewriter, contrib: bool) -> None:
    """Writes the rewriter's nodes into `proto`'s graph, with the initializers they use (the fp32 weights
    now quantized go), and com.microsoft's opset where the products need it."""
    graph = proto.graph
    nodes, added = rewriter.nodes, rewriter.added
    used = {name for n in nodes for name in n.input}
    kept = [i for i in graph.initializer if i.name in used]  # the fp32 weights now quantized go
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + [t for name, t in added.items() if name in used])
    if contrib and not any(o.domain == MS_DOMAIN for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))


def _inline(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(value, name)


class _Rewriter:
    """The new node list of one graph, and the initializers it adds, built layer by layer."""

    def __init__(
        self,
        graph: onnx.GraphProto,
        contrib: bool,
        tables: bool,
        directory: Path | None = None,
        writer: TensorWriter | None = None,
    ):
        self.contrib = contrib
        # a bias the tracer folded into a Constant (equal zero biases are shared)
        constants_to_initializers(graph, 0)
        self.inits = Initializers(graph, directory)
        for node in graph.node:  # and one it shares with an equal bias through an Identity
            if node.op_type == "Identity" and node.input[0] in self.inits:
                self.inits.alias(node.output[0], node.input[0])
        self.writer = writer
        self.added: dict[str, onnx.TensorProto] = {}
        self.tables = quantize_tables(graph, self.inits, self.const) if tables else {}
        self.zp = self.const("rowq/zero_point", np.array(ACTIVATION_ZERO, np.uint8))
        # input tensor -> (its uint8 codes, its row max (.., 1))
        self.codes_of: dict[str, tuple[str, str]] = {}
        # (initializer, transposed) -> (codes, zero point, scale / 127)
        self.weights_of: dict[tuple[str, bool], tuple[str, str, str]] = {}
        self.nodes: list[onnx.NodeProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        """An initializer added under `name` (once: a second call returns the first's name)."""
        if name not in self.added:
            write = self.writer.tensor if self.writer is not None else _inline
            self.added[name] = write(name, np.asarray(value))
        return name

    def linear(
        self, node: onnx.NodeProto, w: np.ndarray, bias: np.ndarray | None, activation: str | None
    ) -> None:
        """The nodes that replace one linear layer: codes, integer product, rescaling, bias, Relu."""
        x, y = node.input[0], node.output[0]
        tag = node.name or y
        codes, row_max = self.row_codes(x)
        w_codes, w_zero, w_scale = self.weights(node, w)
        # 3. the integer product (.., N), rescaled per column (weights) and per row (m), then bias and Relu
        self.product(tag, codes, w_codes, w_zero, w_scale)
        out = y if bias is None and activation is None else f"{tag}/rowq/row"
        self.nodes.append(
            helper.make_node("Mul", [f"{tag}/rowq/col", row_max], [out], name=f"{tag}/rowq/row")
        )
        if bias is not None:
            biased = y if activation is None else f"{tag}/rowq/biased"
            self.nodes.append(
                helper.make_node(
                    "Add", [out, self.const(f"{tag}/rowq/bias", bias)], [biased], name=f"{tag}/rowq/bias"
                )
            )
            out = biased
        if activation is not None:
            self.nodes.append(
                helper.make_node(activation, [out], [y], name=f"{tag}/rowq/{activation.lower()}")
            )

    def stacked(self, triple: list[onnx.NodeProto], parts: list[tuple]) -> None:
        """A standard decoder's self-attention Q, K and V as one product by their stacked codes, then split.

        The codes of [W_q | W_k | W_v] (K, 3N) are those of the fused decoder's QKV weight, so the bundle
        stores them once (else 3 x N x K int8 a layer twice: ~6% of an int8 bundle). Each column's integer
        product, scales and bias are the ones it had alone: the same values, bit for bit.
        """
        first = triple[0]
        tag = f"{first.name}/qkv"
        codes, row_max = self.row_codes(first.input[0])
        wq, scale, zero = quantize_weights(np.concatenate([w for w, _, _ in parts], axis=1))
        base = f"{first.input[1]}/rowq_qkv"
        w_scale = (scale / ACTIVATION_QMAX).astype(np.float32)
        self.product(
            tag,
            codes,
            self.const(f"{base}/codes", wq),
            self.const(f"{base}/zero_point", zero),
            self.const(f"{base}/scale", w_scale),
        )
        self.nodes.append(
            helper.make_node("Mul", [f"{tag}/rowq/col", row_max], [f"{tag}/rowq/row"], name=f"{tag}/rowq/row")
        )
        widths = self.const(f"{tag}/widths", np.array([w.shape[1] for w, _, _ in parts], np.int64))
        outs = [n.output[0] if b is None else f"{n.name}/rowq/part" for n, (_, b, _) in zip(triple, parts)]
        self.nodes.append(
            helper.make_node("Split", [f"{tag}/rowq/row", widths], outs, name=f"{tag}/split", axis=-1)
        )
        for node, (_, bias, _), out in zip(triple, parts, outs):
            if bias is not None:
                self.nodes.append(
                    helper.make_node(
                        "Add",
                        [out, self.const(f"{node.name}/rowq/bias", bias)],
                        [node.output[0]],
                        name=f"{node.name}/rowq/bias",
                    )
                )

    def row_codes(self, x: str) -> tuple[str, str]:
        """1. the input's codes (.., K) uint8, once per tensor; m = max|x| per row (.., 1)."""
        if x not in self.codes_of:
            q = f"{x}/rowq"
            scale = self.const("rowq/scale", np.array(1 / ACTIVATION_QMAX, np.float32))
            self.nodes += [
                helper.make_node("Abs", [x], [f"{q}/abs"], name=f"{q}/abs"),
                helper.make_node(
                    "ReduceMax", [f"{q}/abs"], [f"{q}/max"], name=f"{q}/max", axes=[-1], keepdims=1
                ),
                helper.make_node("Div", [x, f"{q}/max"], [f"{q}/unit"], name=f"{q}/unit"),  # in [-1, 1]
                helper.make_node(
                    "QuantizeLinear", [f"{q}/unit", scale, self.zp], [f"{q}/codes"], name=f"{q}/codes"
                ),
            ]
            self.codes_of[x] = (f"{q}/codes", f"{q}/max")
        return self.codes_of[x]

    def weights(self, node: onnx.NodeProto, w: np.ndarray) -> tuple[str, str, str]:
        """2. the weights' codes, zero points and scales / 127, once per initializer (and transposition).

        A tied output projection uses the embedding table's codes, transposed by a node (onnxruntime
        folds it at load): the file holds the codes once.
        """
        key = (node.input[1], node.op_type != "MatMul" and bool(attrs(node).get("transB", 0)))
        if key not in self.weights_of and key[1] and key[0] in self.tables:  # E^T's codes
            table_codes, _, row_scale = self.tables[key[0]]  # (V, D)
            self.nodes.append(
                helper.make_node(
                    "Transpose", [table_codes], [f"{table_codes}/t"], name=f"{table_codes}/t", perm=[1, 0]
                )
            )
            zero = self.const(f"{key[0]}/rowq8/zero_point", np.zeros(w.shape[1], np.int8))
            scale = (row_scale.reshape(-1) / ACTIVATION_QMAX).astype(np.float32)
            self.weights_of[key] = (f"{table_codes}/t", zero, self.const(f"{key[0]}/rowq8/scale_t", scale))
        if key not in self.weights_of:
            wq, scale, zero = quantize_weights(w)
            base = f"{node.input[1]}/rowq" + ("_t" if key[1] else "")
            self.weights_of[key] = (
                self.const(f"{base}/codes", wq),
                self.const(f"{base}/zero_point", zero),
                self.const(f"{base}/scale", (scale / ACTIVATION_QMAX).astype(np.float32)),
            )
        return self.weights_of[key]

    def product(self, tag: str, codes: str, w_codes: str, w_zero: str, w_scale: str) -> None:
        """The integer product rescaled per column, as `{tag}/rowq/col`: MatMulIntegerToFloat with
        contrib, else MatMulInteger -> Cast -> Mul."""
        zp = self.zp
        if self.contrib:
            one = self.const("rowq/one", np.array(1.0, np.float32))
            self.nodes.append(
                helper.make_node(
                    "MatMulIntegerToFloat",
                    [codes, w_codes, one, w_scale, zp, w_zero],
                    [f"{tag}/rowq/col"],
                    name=f"{tag}/rowq/matmul",
                    domain=MS_DOMAIN,
                )
            )
            return
        self.nodes += [
            helper.make_node(
                "MatMulInteger", [codes, w_codes, zp, w_zero], [f"{tag}/rowq/int"], name=f"{tag}/rowq/matmul"
            ),
            helper.make_node(
                "Cast",
                [f"{tag}/rowq/int"],
                [f"{tag}/rowq/float"],
                name=f"{tag}/rowq/cast",
                to=TensorProto.FLOAT,
            ),
            helper.make_node(
                "Mul", [f"{tag}/rowq/float", w_scale], [f"{tag}/rowq/col"], name=f"{tag}/rowq/col"
            ),
        ]
