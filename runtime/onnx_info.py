"""The shapes of an ONNX graph's constant tensors, read from the protobuf by hand (no onnx import).

The runtime checks bundle.json's vocabulary sizes and max_positions against the graphs' own
tables (an embedding's rows, the positional table's rows), which onnxruntime's session does not
expose. Only the few fields needed are decoded; tensor data is skipped by its length, never
copied, so a graph of any size costs one pass over its field headers.

ModelProto.graph = 7; GraphProto.node = 1, initializer = 5; NodeProto.input = 1, output = 2,
op_type = 4, attribute = 5; AttributeProto.name = 1, t = 5; TensorProto.dims = 1, name = 8.
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from pathlib import Path


class GraphReadError(ValueError):
    """The file is not an ONNX model this reader understands."""


def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise GraphReadError("varint longer than 10 bytes")


def _fields(buf, start: int, end: int):
    """(field number, wire type, value) of one message; value is an int (varint) or (start, end)."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == 2:
            n, pos = _varint(buf, pos)
            if pos + n > end:
                raise GraphReadError("a field runs past the end of its message")
            yield number, wire, (pos, pos + n)
            pos += n
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise GraphReadError(f"unsupported protobuf wire type {wire}")


def _text(buf, span) -> str:
    return bytes(buf[span[0]:span[1]]).decode("utf-8", "replace")


def _tensor(buf, span) -> tuple[str, tuple[int, ...]]:
    name, dims = "", []
    for number, wire, value in _fields(buf, *span):
        if number == 1 and wire == 0:
            dims.append(value)
        elif number == 1 and wire == 2:  # packed
            pos = value[0]
            while pos < value[1]:
                d, pos = _varint(buf, pos)
                dims.append(d)
        elif number == 8 and wire == 2:
            name = _text(buf, value)
    return name, tuple(dims)


@dataclass
class GraphInfo:
    """What read_graph_info found in a graph.

    Attributes:
        shapes: constant tensors (initializers and Constant nodes' values): name -> shape.
        nodes: every node as (op_type, inputs, outputs).
    """

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    nodes: list[tuple[str, list[str], list[str]]] = field(default_factory=list)  # (op_type, inputs, outputs)

    def table_shape(self, name: str, depth: int = 4) -> tuple[int, ...] | None:
        """Finds the shape of the constant behind `name`, followed back through casts and dequantization.

        Args:
            name: a tensor name.
            depth: how many Cast, DequantizeLinear or Identity nodes to follow at most.

        Returns:
            The shape, or None where no constant is found.
        """
        if name in self.shapes:
            return self.shapes[name]
        if depth:
            for op, inputs, outputs in self.nodes:
                if name in outputs and op in ("Cast", "DequantizeLinear", "Identity") and inputs:
                    return self.table_shape(inputs[0], depth - 1)
        return None

    def gather_tables(self) -> list[tuple[str, tuple[int, ...]]]:
        """Lists every Gather whose table is a constant.

        Returns:
            (indices input, table shape) of each.
        """
        found = []
        for op, inputs, _ in self.nodes:
            if op == "Gather" and len(inputs) == 2:
                shape = self.table_shape(inputs[0])
                if shape is not None:
                    found.append((inputs[1], shape))
        return found


def read_graph_info(source: Path | bytes) -> GraphInfo:
    """Reads the constant tensors' shapes and the nodes of an ONNX model.

    Args:
        source: the file (memory-mapped), or its bytes.

    Returns:
        The graph's info.

    Raises:
        GraphReadError: the bytes are not an ONNX model this reader can follow.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _read_info(bytes(source))  # slices of bytes are bytes, as an mmap's are
    with open(source, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return _read_info(buf)


def _read_info(buf) -> GraphInfo:
    info = GraphInfo()
    try:
        graphs = [v for n, w, v in _fields(buf, 0, len(buf)) if n == 7 and w == 2]
        if len(graphs) != 1:
            raise GraphReadError(f"{len(graphs)} graphs in the model")
        for number, wire, value in _fields(buf, *graphs[0]):
            if wire != 2:
                continue
            if number == 5:
                name, dims = _tensor(buf, value)
                info.shapes[name] = dims
            elif number == 1:
                op, inputs, outputs, values = "", [], [], []
                for n, w, v in _fields(buf, *value):
                    if w != 2:
                        continue
                    if n == 1:
                        inputs.append(_text(buf, v))
                    elif n == 2:
                        outputs.append(_text(buf, v))
                    elif n == 4:
                        op = _text(buf, v)
                    elif n == 5:
                        values.extend(av for an, aw, av in _fields(buf, *v) if an == 5 and aw == 2)
                if op == "Constant" and values and outputs:
                    info.shapes[outputs[0]] = _tensor(buf, values[0])[1]
                info.nodes.append((op, inputs, outputs))
    except IndexError as e:
        raise GraphReadError("the file ends inside a field") from e
    return info
