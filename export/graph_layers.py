"""The linear layers and id tables of an exported graph, as the quantizers read them: export/quantize.py
(int8, per-row scales) and export/quantize_nbits.py (int4, MatMulNBits) rewrite the same layers."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from seq2onnx.runtime import bundle as names

from .weights import read_tensor

MS_DOMAIN = "com.microsoft"
ID_INPUTS = (names.SRC_IDS, names.TOKENS)  # the graph inputs of token ids: lookups in them are embeddings


# each group's linear layers, in encoder.onnx / decoder.onnx (traced) and decoder_fused.onnx (built by name).
# The cross-attention's key and value projections are in the encoder graph. "embeddings" is the id tables'
# lookups and the output projection (tied or not).
GROUPS = {
    "embeddings": re.compile(r"(^|/)generator(/|$)"),
    "encoder_self_attention": re.compile(r"encoder_layers\.\d+/sub_attn/"),
    "encoder_feed_forward": re.compile(r"encoder_layers\.\d+/sub_ff/"),
    "decoder_self_attention": re.compile(r"^/sub_self|^l\d+_(qkv|self_out)$"),
    "cross_attention": re.compile(r"^/w_[kv](_\d+)?/|^/sub_cross|^l\d+_cross_"),
    "decoder_feed_forward": re.compile(r"^/sub_ff/|^l\d+_ff_"),
}


# the standard decoder's self-attention Q, K and V products as the tracer names them (layer 1: "w_q_1")
SELF_QKV = re.compile(r"^/sub_self/w_([qkv])(_\d+)?/")


def self_attention_triples(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """Each layer's [Q, K, V] products of a traced decoder's self-attention, by each one's node name, where
    all three read the same input: the fused decoder multiplies by their weights stacked (export/quantize.py
    gives the standard decoder the same int8 codes, so that the weights file holds them once)."""
    layers: dict[str, dict[str, onnx.NodeProto]] = {}
    for node in graph.node:
        match = SELF_QKV.match(node.name)
        if match and node.op_type in ("Gemm", "MatMul") and len(node.input) > 1:
            layers.setdefault(match.group(2) or "", {})[match.group(1)] = node
    found = {}
    for parts in layers.values():
        if len(parts) == 3 and len({n.input[0] for n in parts.values()}) == 1:
            triple = [parts[k] for k in "qkv"]
            found.update({n.name: triple for n in triple})
    return found


def layer_group(node: onnx.NodeProto, tables: set[str] | dict) -> str | None:
    """The GROUPS entry a linear layer belongs to (a weight that is an id table: "embeddings"), or None."""
    if len(node.input) > 1 and node.input[1] in tables:
        return "embeddings"
    return next((g for g, pattern in GROUPS.items() if pattern.search(node.name)), None)


class QuantizeError(ValueError):
    """A graph that cannot be quantized: the message names it and why."""


def attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def linear_weights(node: onnx.NodeProto, inits: dict[str, np.ndarray]):
    """Reads the weights of a linear node with constant fp32 weights.

    Args:
        node (onnx.NodeProto): a node: MatMul, Gemm (alpha = beta = 1, no transA) or FusedGemm(Relu).
        inits (dict[str, np.ndarray]): the graph's initializers by name.

    Returns:
        (W (K, N), bias (N,) or None, activation or None), W transposed back (a view) when transB is set;
        None for any other node (it stays as it is).
    """
    if (
        node.op_type not in ("MatMul", "Gemm", "FusedGemm")
        or len(node.input) < 2
        or node.input[1] not in inits
    ):
        return None
    w = inits[node.input[1]]
    if w.ndim != 2 or w.dtype != np.float32:
        return None
    if node.op_type == "MatMul":
        return w, None, None
    a = attrs(node)
    if a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0 or a.get("transA", 0):
        return None
    activation = None
    if node.op_type == "FusedGemm":
        activation = a.get("activation", b"")
        activation = activation.decode() if isinstance(activation, bytes) else activation
        if activation != "Relu" or any(k.startswith("activation_") for k in a):
            return None
    if a.get("transB", 0):
        w = w.T
    bias = None
    if len(node.input) > 2 and node.input[2]:
        bias = inits.get(node.input[2])
        if bias is None or bias.shape != (w.shape[1],) or bias.dtype != np.float32:
            return None
    return w, bias, activation  # a view: a tied table's projection needs its codes, never this copy


def id_tables(graph: onnx.GraphProto, inits: dict[str, np.ndarray]) -> list[onnx.NodeProto]:
    """The Gather / GatherND nodes of constant fp32 tables whose indices are token ids (a graph input
    `src_ids` or `tokens`, through Reshapes): the embeddings, never the positional table."""
    made_by = {o: n for n in graph.node for o in n.output}
    found = []
    for node in graph.node:
        if node.op_type not in ("Gather", "GatherND") or node.input[0] not in inits:
            continue
        table, index = inits[node.input[0]], node.input[1]
        while index in made_by and made_by[index].op_type in ("Reshape", "Unsqueeze", "Squeeze", "Cast"):
            index = made_by[index].input[0]
        if table.ndim == 2 and table.dtype == np.float32 and index in ID_INPUTS:
            found.append(node)
    return found


class Initializers(Mapping):
    """A graph's initializers by name as numpy arrays, each read when asked (from its external data
    file, when it has one) and not kept: a large model's graph is not held whole in memory."""

    def __init__(self, graph: onnx.GraphProto, directory: Path | None):
        self.tensors = {t.name: t for t in graph.initializer}
        self.directory = directory

    def alias(self, name: str, existing: str) -> None:
        """`name` holds the same values as the initializer `existing` (an Identity's output)."""
        self.tensors[name] = self.tensors[existing]

    def __getitem__(self, name: str) -> np.ndarray:
        tensor = self.tensors[name]
        if tensor.data_location == onnx.TensorProto.EXTERNAL and self.directory is None:
            raise QuantizeError(f"initializer {name!r} is external data: pass the graph's directory")
        return read_tensor(self.directory, tensor)

    def __contains__(self, name) -> bool:
        return name in self.tensors

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


def rewrite_graph_file(directory: Path, name: str, rewrite, writer, check) -> object:
    """Reads one graph file with its weights left outside, rewrites it with `rewrite(proto)`, writes it back
    (the writer's new tensors flushed first), checks the file with `check(path)`, and returns what `rewrite`
    returned.

    Raises:
        QuantizeError: naming the file (as `rewrite` raised it); `check`'s own errors.
    """
    path = Path(directory) / name
    proto = onnx.load(str(path), load_external_data=False)  # its fp32 weights read one at a time
    try:
        result = rewrite(proto)
    except QuantizeError as e:
        raise QuantizeError(f"{name}: {e}") from None
    onnx.save(proto, str(path))
    del proto
    if writer is not None:
        writer.flush()
    check(path)
    return result
