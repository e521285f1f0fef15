"""The shapes of an ONNX graph's constant tensors, read from the protobuf by hand (no onnx import).

The runtime checks bundle.json's vocabulary sizes and max_positions against the graphs' own
tables (an embedding's rows, the positional table's rows), which onnxruntime's session does not
expose. Only the few fields needed are decoded; tensor data is skipped by its length, never
copied, so a graph of any size costs one pass over its field headers.

ModelProto.graph = 7; GraphProto.node = 1, initializer = 5; NodeProto.input = 1, output = 2,
op_type = 4, attribute = 5; AttributeProto.name = 1, t = 5; TensorProto.dims = 1, data_type = 2,
name = 8, external_data = 13 (StringStringEntryProto key = 1, value = 2), data_location = 14.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from functools import cached_property
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
        key = buf[pos]  # one byte, the common case inline: a load reads ~60k varints
        key, pos = (key, pos + 1) if key < 0x80 else _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == 2:
            n = buf[pos]
            n, pos = (n, pos + 1) if n < 0x80 else _varint(buf, pos)
            if pos + n > end:
                raise GraphReadError("a field runs past the end of its message")
            yield number, wire, (pos, pos + n)
            pos += n
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise GraphReadError(f"unsupported protobuf wire type {wire}")


def _text(buf, span) -> str:
    return bytes(buf[span[0] : span[1]]).decode("utf-8", "replace")


@dataclass(frozen=True)
class ExternalTensor:
    """An initializer whose bytes are ONNX external data (a file beside the graph).

    Attributes:
        name: the initializer's name.
        data_type: its ONNX element type (TensorProto.DataType).
        dims: its shape.
        entries: its external_data entries (location, offset, length, ...), as written.
        type_at: where in the file its data_type's value lies (a one-byte varint for every type the runtime
            reads; runtime/exact_int8.py rewrites it in place), -1 where the field is absent.
    """

    name: str
    data_type: int
    dims: tuple[int, ...]
    entries: dict
    type_at: int = -1


def _external(buf, span, name: str, dims: list) -> ExternalTensor | None:
    data_type, location, entries = 0, 0, {}
    for number, wire, value in _fields(buf, *span):
        if number == 2 and wire == 0:
            data_type = value
        elif number == 14 and wire == 0:
            location = value
        elif number == 13 and wire == 2:
            pair = {n: _text(buf, v) for n, w, v in _fields(buf, *value) if w == 2}
            entries[pair.get(1, "")] = pair.get(2, "")
    if location != 1 and not entries:
        return None
    return ExternalTensor(name, data_type, tuple(dims), entries, _varint_at(buf, span, 2))


def _inline_int8(buf, span) -> tuple[int, tuple[int, int]] | None:
    """(where its data_type's value lies, its raw_data's span) of an int8 tensor kept inside the graph with
    raw_data; None for any other tensor."""
    type_at, raw = -1, None
    for number, wire, value in _fields(buf, *span):
        if number == 2 and wire == 0 and value != 3:
            return None
        if number == 9 and wire == 2:
            raw = value
    if raw is not None:
        type_at = _varint_at(buf, span, 2)
    return (type_at, raw) if raw is not None and type_at >= 0 else None


def _varint_at(buf, span, wanted: int) -> int:
    """Where the value of varint field `wanted` of one message starts in buf (-1: absent)."""
    pos, end = span
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0 and number == wanted:
            return pos
        if wire == 0:
            pos = _varint(buf, pos)[1]
        elif wire == 2:
            n, pos = _varint(buf, pos)
            pos += n
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            return -1
    return -1


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


# ONNX element types (TensorProto.DataType) as onnxruntime's sessions name them
_ELEM_TYPES = {
    1: "tensor(float)",
    2: "tensor(uint8)",
    3: "tensor(int8)",
    6: "tensor(int32)",
    7: "tensor(int64)",
    9: "tensor(bool)",
    10: "tensor(float16)",
}


@dataclass(frozen=True)
class ValueInfo:
    """A graph input or output as read from the file, with the attributes of onnxruntime's NodeArg.

    Attributes:
        name: its name.
        type: its type as onnxruntime names it ("tensor(float)", ...).
        shape: each dimension, a number or a symbolic name (None where the file gives neither).
    """

    name: str
    type: str
    shape: list


def _value_info(buf, span) -> ValueInfo:
    # ValueInfoProto.name = 1, type = 2; TypeProto.tensor_type = 1; Tensor.elem_type = 1, shape = 2;
    # TensorShapeProto.dim = 1; Dimension.dim_value = 1, dim_param = 2
    name, elem, shape = "", 0, []
    for number, wire, value in _fields(buf, *span):
        if number == 1 and wire == 2:
            name = _text(buf, value)
        elif number == 2 and wire == 2:
            for tn, tw, tv in _fields(buf, *value):
                if tn != 1 or tw != 2:
                    continue
                for en, ew, ev in _fields(buf, *tv):
                    if en == 1 and ew == 0:
                        elem = ev
                    elif en == 2 and ew == 2:
                        for dn, dw, dv in _fields(buf, *ev):
                            if dn == 1 and dw == 2:
                                dim = None
                                for n, w, v in _fields(buf, *dv):
                                    dim = (
                                        v if (n, w) == (1, 0) else _text(buf, v) if (n, w) == (2, 2) else dim
                                    )
                                shape.append(dim)
    return ValueInfo(name, _ELEM_TYPES.get(elem, f"tensor({elem})"), shape)


@dataclass
class GraphInfo:
    """What read_graph_info found in a graph.

    Attributes:
        shapes: constant tensors (initializers and Constant nodes' values): name -> shape.
        nodes: every node as (op_type, inputs, outputs).
        external: the initializers whose bytes are external data, with their references.
        inline_int8: the int8 initializers kept inside the graph (raw_data): name -> (where the value of
            its data_type lies, its raw_data's (start, end)), for runtime/exact_int8.py.
    """

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    nodes: list[tuple[str, list[str], list[str]]] = field(default_factory=list)  # (op_type, inputs, outputs)
    external: list[ExternalTensor] = field(default_factory=list)  # initializers kept in a weights file
    inline_int8: dict[str, tuple[int, tuple[int, int]]] = field(default_factory=dict)
    inputs: list["ValueInfo"] = field(default_factory=list)
    outputs: list["ValueInfo"] = field(default_factory=list)

    def get_inputs(self) -> list["ValueInfo"]:
        """The graph's inputs, as an onnxruntime session lists them (name, type, shape)."""
        return self.inputs

    def get_outputs(self) -> list["ValueInfo"]:
        """The graph's outputs, as an onnxruntime session lists them (name, type, shape)."""
        return self.outputs

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
        if depth and name in self._passes:
            return self.table_shape(self._passes[name], depth - 1)
        return None

    @cached_property
    def _passes(self) -> dict[str, str]:
        """Output -> first input of the Cast, DequantizeLinear or Identity node that makes it: made once (an
        int8 graph's ~100 Gathers each scanned every node)."""
        passes = ("Cast", "DequantizeLinear", "Identity")
        return {out: ins[0] for op, ins, outs in self.nodes if op in passes and ins for out in outs}

    def gather_tables(self, packed: tuple[str, int] | None = None) -> list[tuple[str, tuple[int, ...]]]:
        """Lists every Gather whose table is a constant.

        Args:
            packed: (operator, bits) of lookups whose table's codes are packed along its rows (bundle.json's
                quantization_scheme.tables: GatherBlockQuantized): they are listed too, with the table's
                logical shape (rows, codes' bytes x 8 / bits). None: they are not listed.

        Returns:
            (indices input, table shape) of each.
        """
        found = []
        for op, inputs, _ in self.nodes:
            if op == "Gather" and len(inputs) == 2:
                shape = self.table_shape(inputs[0])
                if shape is not None:
                    found.append((inputs[1], shape))
            elif packed and op == packed[0] and len(inputs) >= 3:
                shape = self.table_shape(inputs[0])
                if shape is not None and len(shape) == 2:
                    found.append((inputs[1], (shape[0], shape[1] * 8 // packed[1])))
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
    """The graph's inputs, outputs, initializers and nodes, read from a ModelProto's bytes.

    Raises:
        GraphReadError: not exactly one graph, or the file ends inside a field.
    """
    info = GraphInfo()
    try:
        graphs = [v for n, w, v in _fields(buf, 0, len(buf)) if n == 7 and w == 2]
        if len(graphs) != 1:
            raise GraphReadError(f"{len(graphs)} graphs in the model")
        for number, wire, value in _fields(buf, *graphs[0]):
            if wire != 2:
                continue
            if number in (11, 12):  # GraphProto.input, output
                (info.inputs if number == 11 else info.outputs).append(_value_info(buf, value))
            elif number == 5:
                name, dims = _tensor(buf, value)
                info.shapes[name] = dims
                found = _external(buf, value, name, list(dims))
                if found is not None:
                    info.external.append(found)
                elif (inline := _inline_int8(buf, value)) is not None:
                    info.inline_int8[name] = inline
            elif number == 1:
                _read_node(buf, value, info)
    except IndexError as e:
        raise GraphReadError("the file ends inside a field") from e
    return info


def _read_node(buf, span, info: GraphInfo) -> None:
    """One NodeProto: appends (op_type, inputs, outputs) to info.nodes, and a Constant's shape.

    Args:
        buf: the model's bytes.
        span: the node's (start, end) in buf.
        info: what has been read so far; a Constant node's value shape goes into info.shapes.

    Raises:
        IndexError: the file ends inside a field.
    """
    op, inputs, outputs, attributes = "", [], [], []
    for n, w, v in _fields(buf, *span):
        if w != 2:
            continue
        if n == 1:
            inputs.append(_text(buf, v))
        elif n == 2:
            outputs.append(_text(buf, v))
        elif n == 4:
            op = _text(buf, v)
        elif n == 5:
            attributes.append(v)  # read below for a Constant only (most nodes are not)
    if op == "Constant" and outputs:
        values = [av for a in attributes for an, aw, av in _fields(buf, *a) if an == 5 and aw == 2]
        if values:
            info.shapes[outputs[0]] = _tensor(buf, values[0])[1]
    info.nodes.append((op, inputs, outputs))
