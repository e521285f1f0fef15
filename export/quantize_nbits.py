"""int4 (and block-wise int8) graphs: every linear layer one com.microsoft MatMulNBits node (issue 58).

Each linear layer with constant fp32 weights W (K, N) -- MatMul, Gemm, FusedGemm(Relu), as
export/quantize.py finds them -- becomes

    y = MatMulNBits(x, codes, scales[, zero points], bias)  [Relu]

with W's columns cut into blocks of `block` input features, each block with its own scale (and, when asked,
zero point): export/nbits.py. `accuracy_level` 4 has onnxruntime quantize x to int8 inside the kernel, per
block of each row, and multiply in integers: a row's codes are its own (docs/optimisation-notes.md, rows
59-61, for what that does and does not make batch-invariant). onnxruntime-web computes the same nodes with
fp32 activations whatever the attribute (docs/precision.md).

The embedding tables go through GatherBlockQuantized, in `table_bits` (8 or 4) with the same blocks. A tied
output projection (the Gemm by the target table, transB) is a MatMulNBits in `table_bits` whose codes and
scales are the table's own bytes: export/weights.py stores equal bytes once, so the file holds them once.
The fused decoder's GatherND of ids (R, 1) becomes a Squeeze and the same lookup; a table looked up any other
way, or whose width is no whole number of blocks, stays fp32.

Every graph then needs com.microsoft kernels, the standard decoder too: spec/bundle.json's
`quantization_schemes` names the operators and the oldest onnxruntime each host was run with, and both
hosts refuse a bundle whose scheme they do not know or cannot run, by name (runtime/checks.py,
js/src/checks.js).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .nbits import quantize_rows
from .graph_layers import (
    GROUPS,
    MS_DOMAIN,
    Initializers,
    QuantizeError,
    attrs,
    id_tables,
    layer_group,
    linear_weights,
    rewrite_graph_file,
)
from .weights import TensorWriter, constants_to_initializers

BLOCK = 32  # values per block along K (probe: docs/optimisation-notes.md row 59)
LEVEL = 4  # accuracy_level: int8 activations per block of each row, integer products
# --activations: MatMulNBits' accuracy_level by what it does to the inputs; 0 is what onnxruntime-web computes
# whatever the attribute (docs/precision.md), so a level-0 bundle decodes alike on every host
ACTIVATIONS = {"int8": LEVEL, "float32": 0}
# a bundle's weights have zero points: more greedy agreement with fp32 on both trained models measured, at
# about the same speed and 2.5% more bytes (docs/precision.md; optimisation-notes row 65)
SYMMETRIC = False
# with 8-bit tables the encoder's self-attention is 8-bit too (the group whose 4 bits cost the most
# agreement, measured group by group); with 4-bit tables (the smallest bundle) every layer is 4-bit
EIGHT_BIT = frozenset({"encoder_self_attention"})
# bits 8 is for measurements (6c5edd9:scripts/nbits_probe.py, row 60): spec/bundle.json lists no such
# scheme, so the hosts refuse a bundle made with it
SCHEME_NAMES = {4: "int4-matmulnbits", 8: "int8-matmulnbits"}


def _inline(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(value, name)


class _NBitsRewriter:
    """The new node list of one graph and the initializers it adds, layer by layer."""

    def __init__(
        self,
        graph: onnx.GraphProto,
        bits: int,
        block: int,
        symmetric: bool,
        table_bits: int | None,
        directory: Path | None,
        writer: TensorWriter | None,
        level: int = 4,
        eight_bit: frozenset[str] = frozenset(),
    ):
        self.bits, self.block, self.symmetric, self.table_bits = bits, block, symmetric, table_bits
        self.level, self.eight_bit = level, eight_bit
        constants_to_initializers(graph, 0)  # a bias the tracer folded into a Constant
        self.inits = Initializers(graph, directory)
        for node in graph.node:  # and one shared with an equal bias through an Identity
            if node.op_type == "Identity" and node.input[0] in self.inits:
                self.inits.alias(node.output[0], node.input[0])
        # the id tables, before their lookups are rewritten: an untied projection by one is "embeddings"
        self.table_names = {n.input[0] for n in id_tables(graph, self.inits)}
        self.writer = writer
        self.added: dict[str, onnx.TensorProto] = {}
        self.nodes: list[onnx.NodeProto] = []
        # table initializer -> its codes (V, nb, blob), scales (V, nb), zero points or None, at table_bits
        self.tables: dict[str, tuple] = {}
        self.lookups = 0
        if table_bits is not None:
            self._quantize_lookups(graph)

    def const(self, name: str, value: np.ndarray) -> str:
        """An initializer added under `name` (once)."""
        if name not in self.added:
            write = self.writer.tensor if self.writer is not None else _inline
            self.added[name] = write(name, np.asarray(value))
        return name

    def _quantize_lookups(self, graph: onnx.GraphProto) -> None:
        """Rewrites each Gather of an id table as a GatherBlockQuantized of its codes (in place)."""
        last_dim_one = {
            i.name
            for i in graph.input
            if i.type.tensor_type.shape.dim and i.type.tensor_type.shape.dim[-1].dim_value == 1
        }
        rewritten = []
        for node in id_tables(graph, self.inits):
            name = node.input[0]
            table = self.inits[name]
            ids = node.input[1]
            if node.op_type == "GatherND" and not attrs(node).get("batch_dims", 0) and ids in last_dim_one:
                # the fused decoder's lookup: ids (R, 1) -> rows (R, D) is a Gather of the ids squeezed
                axes, ids = (
                    self.const(f"{node.name}/nbits/axes", np.array([-1], np.int64)),
                    f"{node.name}/nbits/ids",
                )
                rewritten.append(helper.make_node("Squeeze", [node.input[1], axes], [ids], name=ids))
            elif node.op_type != "Gather" or attrs(node).get("axis", 0) != 0:
                continue  # another lookup keeps its fp32 table
            if table.shape[1] % self.block:
                continue  # GatherBlockQuantized gathers rows of whole blocks
            if name not in self.tables:
                self.tables[name] = quantize_rows(table, self.table_bits, self.block, self.symmetric)
            codes, scales, zeros = self.tables[name]
            base = f"{name}/nbits{self.table_bits}"
            inputs = [
                self.const(f"{base}/codes", codes.reshape(len(codes), -1)),
                ids,
                self.const(f"{base}/scales", scales),
            ]
            if zeros is not None:
                inputs.append(self.const(f"{base}/zero_points", zeros))
            lookup = helper.make_node(
                "GatherBlockQuantized",
                inputs,
                list(node.output),
                name=f"{node.name}/nbits",
                domain=MS_DOMAIN,
                bits=self.table_bits,
                block_size=self.block,
                gather_axis=0,
                quantize_axis=1,
            )
            node.CopyFrom(lookup)
            self.lookups += 1
        if rewritten:  # the Squeezes go first: a graph's nodes stay in an order that runs
            nodes = rewritten + list(graph.node)
            del graph.node[:]
            graph.node.extend(nodes)

    def linear(
        self, node: onnx.NodeProto, w: np.ndarray, bias: np.ndarray | None, activation: str | None
    ) -> None:
        """The MatMulNBits (and Relu) that replace one linear layer."""
        x, y = node.input[0], node.output[0]
        tag = node.name or y
        k, n = w.shape
        tied = (
            node.op_type != "MatMul" and bool(attrs(node).get("transB", 0)) and node.input[1] in self.tables
        )
        if tied:
            bits = self.table_bits
        elif self.eight_bit and layer_group(node, self.table_names) in self.eight_bit:
            bits = 8  # a layer whose error moves the outputs most, kept at 8 bits
        else:
            bits = self.bits
        if tied:  # the table's own bytes: E (V, D) is the projection's (N, K)
            codes, scales, zeros = self.tables[node.input[1]]
            base = f"{node.input[1]}/nbits{bits}/projection"
        else:
            codes, scales, zeros = quantize_rows(np.ascontiguousarray(w.T), bits, self.block, self.symmetric)
            base = f"{node.input[1]}/nbits{bits}"
        inputs = [
            x,
            self.const(f"{base}/codes", codes),
            self.const(f"{base}/scales", scales.reshape(-1)),
            "",
            "",
        ]
        if zeros is not None:
            inputs[3] = self.const(f"{base}/zero_points", zeros.reshape(-1))
        if bias is not None:
            inputs.append(self.const(f"{tag}/nbits/bias", bias))
        while inputs[-1] == "":
            inputs.pop()
        out = y if activation is None else f"{tag}/nbits/linear"
        self.nodes.append(
            helper.make_node(
                "MatMulNBits",
                inputs,
                [out],
                name=f"{tag}/nbits",
                domain=MS_DOMAIN,
                K=k,
                N=n,
                bits=bits,
                block_size=self.block,
                accuracy_level=self.level,
            )
        )
        if activation is not None:
            self.nodes.append(
                helper.make_node(activation, [out], [y], name=f"{tag}/nbits/{activation.lower()}")
            )


def quantize_model_nbits(
    proto: onnx.ModelProto,
    *,
    bits: int = 4,
    block: int = BLOCK,
    symmetric: bool = True,
    table_bits: int | None = 8,
    directory: Path | None = None,
    writer: TensorWriter | None = None,
    level: int = LEVEL,
    eight_bit: frozenset[str] = frozenset(),
) -> dict:
    """Rewrites every linear layer of `proto` (in place) as MatMulNBits, and its id tables' lookups.

    Args:
        proto: the graph.
        bits: 4 or 8, the linear layers' codes.
        block: values per block along the input features (a power of 2, at least 16).
        symmetric: no zero points (the block's largest magnitude and 0 exact); else one per block.
        level: MatMulNBits' accuracy_level: 4 (int8 activations per block; the CPU's fast path), or 0
            (fp32 activations, what onnxruntime-web computes whatever the attribute: docs/precision.md).
        table_bits: 8 or 4 for the tables (GatherBlockQuantized) and a tied projection; None keeps them fp32
            (a tied projection is then quantized as any layer, at `bits`).
        directory: where the graph's external data lies.
        writer: where the new tensors go (export/weights.py); None: inside the proto.
        eight_bit: groups of export/graph_layers.py's GROUPS whose linear layers get 8-bit codes (the
            same operator and blocks); "embeddings" is an untied output projection (a tied one has
            `table_bits`).

    Returns:
        {"linear_layers": count, "lookups": tables' lookups rewritten, "product": "MatMulNBits"}.

    Raises:
        QuantizeError: no linear layer to quantize, or a layer whose input features are no whole blocks.
    """
    if unknown := set(eight_bit) - set(GROUPS):
        raise QuantizeError(
            f"eight_bit: unknown groups {sorted(unknown)}; the groups are {', '.join(GROUPS)}"
        )
    graph = proto.graph
    r = _NBitsRewriter(graph, bits, block, symmetric, table_bits, directory, writer, level, eight_bit)
    count = _rewrite_layers(graph, r)
    if count == 0:
        raise QuantizeError(
            f"graph {graph.name!r} has no linear layer with constant fp32 weights to quantize"
        )
    _replace_nodes(proto, r)
    return {"linear_layers": count, "lookups": r.lookups, "product": "MatMulNBits"}


def _rewrite_layers(graph: onnx.GraphProto, r: _NBitsRewriter) -> int:
    """Feeds each node of `graph` to the rewriter: a linear layer rewritten, any other node kept. Returns
    how many linear layers were quantized.

    Raises:
        QuantizeError: a layer with fewer input features than one block holds.
    """
    count = 0
    for node in graph.node:
        found = linear_weights(node, r.inits)
        if found is None:
            r.nodes.append(node)
            continue
        if found[0].shape[0] < 16:
            raise QuantizeError(
                f"layer {node.name!r}: {found[0].shape[0]} input features; MatMulNBits needs "
                "at least 16 (one block)"
            )
        count += 1
        r.linear(node, *found)
    return count


def _replace_nodes(proto: onnx.ModelProto, r: _NBitsRewriter) -> None:
    """Writes the rewriter's nodes into `proto`'s graph, with the initializers they use (the fp32 weights
    now quantized go), and com.microsoft's opset, which MatMulNBits needs."""
    graph = proto.graph
    used = {name for n in r.nodes for name in n.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.node[:]
    graph.node.extend(r.nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + [t for name, t in r.added.items() if name in used])
    if not any(o.domain == MS_DOMAIN for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))


def scheme(
    bits: int,
    block: int,
    symmetric: bool,
    table_bits: int | None,
    layers: dict,
    level: int = LEVEL,
    eight_bit: frozenset[str] = frozenset(),
) -> dict:
    """bundle.json's `quantization_scheme` for a MatMulNBits bundle."""
    weights = {
        "bits": bits,
        "type": f"uint{bits} codes, packed" if bits == 4 else "uint8",
        "block_size": block,
        "zero_point": "none: 2^(bits-1)" if symmetric else "per block",
        "scale": "per block of each output channel: "
        + ("largest |w| / -2^(bits-1)" if symmetric else "(max - min, 0 included) / (2^bits - 1)"),
    }
    tables = (
        "fp32"
        if table_bits is None
        else {
            "bits": table_bits,
            "block_size": block,
            "lookup": "GatherBlockQuantized",
            "tied_projection": f"MatMulNBits bits {table_bits} on the table's own codes and scales "
            "(stored once)",
        }
    )
    if eight_bit:
        weights["8_bit_groups"] = sorted(eight_bit)
    return {
        "name": SCHEME_NAMES[bits],
        "operators": ["MatMulNBits"] + ([] if table_bits is None else ["GatherBlockQuantized"]),
        "activations": {
            "accuracy_level": level,
            "bits": 8,
            "scale": f"per block of {block} values of each row, at run time, inside the kernel",
        },
        "weights": weights,
        "tables": tables,
        "batch_invariant": "ids and scores (block 16)"
        if block < 32
        else "ids: the 4-bit kernel's one-row "
        "path rounds its sums differently from block 32 on (docs/precision.md)",
        "fp32": "attention products, softmax, layer norms, positional table, contrib attention kernels",
        "graphs": layers,
    }


def quantize_graphs_nbits(
    directory: Path,
    files: dict[str, str],
    *,
    bits: int = 4,
    block: int = BLOCK,
    symmetric: bool = SYMMETRIC,
    table_bits: int | None = 8,
    writer: TensorWriter | None = None,
    level: int = LEVEL,
    eight_bit: frozenset[str] | None = None,
) -> dict:
    """Quantizes the graph files of a bundle directory in place (quantize_model_nbits on each).

    Args:
        directory: the bundle directory.
        files: {label: file name} of the graphs.
        bits, block, symmetric, table_bits, level, eight_bit: as quantize_model_nbits; eight_bit None:
            EIGHT_BIT with 8-bit tables, none with 4-bit ones.
        writer: where the new tensors go; None: inside each graph.

    Returns:
        bundle.json's `quantization_scheme` (scheme()).

    Raises:
        QuantizeError: a graph without linear layers, naming it.
        onnx.checker.ValidationError: a rewritten graph that does not check.
    """
    if block < 16 or block & (block - 1):
        raise QuantizeError(f"block size {block}: expected a power of 2, at least 16")
    if eight_bit is None:
        eight_bit = EIGHT_BIT if table_bits == 8 else frozenset()

    def rewrite(proto):
        return quantize_model_nbits(
            proto,
            bits=bits,
            block=block,
            symmetric=symmetric,
            table_bits=table_bits,
            directory=Path(directory),
            writer=writer,
            level=level,
            eight_bit=eight_bit,
        )

    def check(path: Path) -> None:  # contrib ops have no ONNX schema: structure and types only
        onnx.checker.check_model(str(path))

    layers = {}
    for label, name in files.items():
        layers[label] = rewrite_graph_file(Path(directory), name, rewrite, writer, check)
    return scheme(bits, block, symmetric, table_bits, layers, level, eight_bit)
