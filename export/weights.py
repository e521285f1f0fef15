"""One weights file per bundle: every graph's large initializers as ONNX external data, each tensor once.

The encoder, the standard decoder and the fused decoder hold many of the same tensors: the target
embedding (which is also the tied output projection), every decoder layer's weights (the fused
graph's stacked Q, K, V weight is the standard graph's three, one after another), and an int8
bundle's quantized weights. store_weights writes each distinct tensor once into `weights.bin` and
points every graph's initializer at its bytes (ONNX external data: location, offset, length), so the
bundle on disk is as large as the model, and a host that feeds the sessions from one copy of the file
holds each weight once in memory (runtime/weights.py). spec/bundle.json's `weights` states the rules
a host checks; docs/bundle-format.md#weights explains them.

Tensors are matched by their bytes and element type (sha256), never by name: the traced graphs and
the built fused graph name the same weight differently. A tensor may also be found as an equal part of
a larger one along its first axis (halves, thirds): that is how three (D, D) weights share the stacked
(3D, D) one.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import external_data_helper, numpy_helper

from seq2onnx.runtime import bundle as names

MIN_EXTERNAL_BYTES = 1024  # smaller initializers (shapes, scalars, small biases) stay inside the graph
PARTS = (2, 3)  # a tensor's equal parts along its first axis that a smaller tensor may be


@dataclass
class WeightsReport:
    """What store_weights wrote.

    Attributes:
        path: the weights file.
        stored: bytes in the file (each distinct tensor once, alignment included).
        referenced: bytes of every graph's external initializers counted per graph (what separate
            graph files would have held).
        tensors: distinct tensors stored.
        references: initializers pointing into the file, over all graphs.
    """

    path: Path
    stored: int = 0
    referenced: int = 0
    tensors: int = 0
    references: int = 0
    per_graph: dict = field(default_factory=dict)


def _key(data_type: int, raw: bytes | memoryview) -> tuple[int, int, str]:
    return data_type, len(raw), hashlib.sha256(raw).hexdigest()


def store_weights(directory: Path, files: list[str]) -> WeightsReport:
    """Moves the large initializers of the graphs `files` in `directory` into one weights file.

    Each graph file is rewritten with its initializers of MIN_EXTERNAL_BYTES or more pointing into
    names.WEIGHTS_FILE (written beside them); a tensor already in the file, whole or as an equal part of
    a larger one, is pointed at rather than written again.

    Args:
        directory: the bundle being written.
        files: the graph file names, one loaded at a time in this order, each graph's largest tensors
            first: a graph holding stacked weights (the fused decoder's QKV) goes before the one holding
            their parts, so that a part is found in its whole.

    Returns:
        What was written.

    Raises:
        ValueError: a graph already holds external data (this runs once, on self-contained graphs).
    """
    directory = Path(directory)
    report = WeightsReport(directory / names.WEIGHTS_FILE)
    where: dict[tuple[int, int, str], int] = {}  # (type, length, sha256) -> offset in the file
    with open(report.path, "wb") as out:
        for name in files:  # one graph in memory at a time: a large model's graphs are gigabytes each
            proto = onnx.load(str(directory / name))
            found = _large_initializers(name, proto)
            found.sort(key=lambda tensor: -len(tensor.raw_data))  # wholes before their parts
            for tensor in found:
                size, key = len(tensor.raw_data), _key(tensor.data_type, tensor.raw_data)
                if key not in where:
                    out.write(b"\0" * (-out.tell() % names.WEIGHTS_ALIGNMENT))
                    where[key] = out.tell()
                    out.write(tensor.raw_data)
                    report.tensors += 1
                    _register_parts(where, tensor, tensor.raw_data, where[key])
                report.referenced += size
                report.references += 1
                report.per_graph[name] = report.per_graph.get(name, 0) + size
                external_data_helper.set_external_data(tensor, names.WEIGHTS_FILE, offset=where[key],
                                                       length=size)
                tensor.ClearField("raw_data")
                tensor.data_location = onnx.TensorProto.EXTERNAL
            onnx.save(proto, str(directory / name))  # the graph alone: its tensors' bytes are in the file
            del proto, found
        report.stored = out.tell()
    return report


def _large_initializers(name: str, proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The initializers of MIN_EXTERNAL_BYTES or more (large Constant nodes made initializers first), as
    raw bytes.

    Raises:
        ValueError: an initializer that is already external data.
    """
    constants_to_initializers(proto.graph)
    found = []
    for tensor in proto.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            raise ValueError(f"{name}: initializer {tensor.name!r} is already external data")
        if not tensor.HasField("raw_data"):  # typed fields (float_data, ...) -> raw bytes
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name))
        if len(tensor.raw_data) >= MIN_EXTERNAL_BYTES:
            found.append(tensor)
    return found


def constants_to_initializers(graph: onnx.GraphProto, min_bytes: int = MIN_EXTERNAL_BYTES) -> None:
    """Turns Constant nodes of at least `min_bytes` into initializers of the same name: a large one (the
    tracer's positional table) can then live in the weights file (a Constant's value cannot be external
    data), and a layer's bias that the tracer folded into a Constant is an initializer that
    export/quantize.py can read."""
    keep = []
    for node in graph.node:
        value = (next((a.t for a in node.attribute if a.name == "value"), None)
                 if node.op_type == "Constant" else None)
        if value is not None and len(node.output) == 1 and numpy_helper.to_array(value).nbytes >= min_bytes:
            tensor = numpy_helper.from_array(numpy_helper.to_array(value), node.output[0])
            graph.initializer.append(tensor)
        else:
            keep.append(node)
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)


def _register_parts(where: dict, tensor: onnx.TensorProto, raw: bytes, offset: int) -> None:
    """Registers the equal parts of a tensor along its first axis (halves, thirds) as found at their
    offsets."""
    rows = tensor.dims[0] if tensor.dims else 0
    view = memoryview(raw)
    for k in PARTS:
        if rows < k or rows % k or len(raw) % k:
            continue
        step = len(raw) // k
        if step < MIN_EXTERNAL_BYTES:
            continue
        for i in range(k):
            if (offset + i * step) % names.WEIGHTS_ALIGNMENT:
                break  # a part must start where a host may read it from: aligned
            where.setdefault(_key(tensor.data_type, view[i * step:(i + 1) * step]), offset + i * step)


def check_stored_graph(path: Path) -> None:
    """Runs onnx.checker on a graph file whose initializers point into the weights file.

    From the file, so that the checker follows the external references itself (each must name a file
    inside the bundle's directory) without a copy of the weights in Python.

    Raises:
        onnx.checker.ValidationError: the graph or one of its references does not check.
    """
    onnx.checker.check_model(str(path))
