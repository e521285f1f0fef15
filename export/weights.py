"""One weights file per bundle: every graph's large initializers as ONNX external data, each tensor once.

The encoder, the standard decoder and the fused decoder hold many of the same tensors: the target
embedding (which is also the tied output projection), every decoder layer's weights (the fused
graph's stacked Q, K, V weight is the standard graph's three, one after another), and an int8
bundle's quantized weights. store_weights writes each distinct tensor once into `weights.bin` and
points every graph's initializer at its bytes (ONNX external data: location, offset, length), so the
bundle on disk is as large as the model, and a host that feeds the sessions from one copy of the file
holds each weight once in memory (runtime/weights.py). spec/bundle.json's `weights` states the rules
a host checks; docs/bundle-format.md#weights explains them.

Tensors are matched by their element type and bytes, never by name: the traced graphs and the built
fused graph name the same weight differently. A tensor may also be found as an equal part of a larger
one along its first axis (halves, thirds): that is how three (D, D) weights share the stacked (3D, D)
one. The bytes are compared, not hashed (_ByteIndex): candidates of the same type and length, a short
prefix first, then the whole in 1 MiB pieces read back from the file being written; a reference to a
staging range already stored is pointed at without reading it again. (A sha256 of every tensor, its
parts and every reference to it was 27% of an OPUS-MT-size export on a CPU without SHA instructions.)

An export streams: no graph is ever held in memory with its weights (an NLLB-3.3B graph is several
GiB, past protobuf's 2 GiB). While the graphs are built, each tensor goes, as it is made, through a
TensorWriter into STAGING_FILE beside them, and the graphs refer to it as external data; the int8
rewrite reads the fp32 weights it replaces back one at a time (read_tensor). store_weights then
copies the tensors the finished graphs still use into the bundle's weights file, in the order that
lets parts be found in their wholes, and removes the staging file: the fp32 weights an int8 bundle
replaced are never copied.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from seq2onnx.runtime import bundle as names

MIN_EXTERNAL_BYTES = 1024  # smaller initializers (shapes, scalars, small biases) stay inside the graph
PARTS = (2, 3)  # a tensor's equal parts along its first axis that a smaller tensor may be
STAGING_FILE = "weights.staging"  # the export's working file; store_weights removes it


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


class _ByteIndex:
    """Where tensors lie in a file being written, found by element type, length and their bytes.

    Args:
        path: the file (read back through its own descriptor; the writer flushes before find).
    """

    PREFIX = 64  # bytes compared first: two different weights almost never share them
    PIECE = 1 << 20  # a candidate is compared in pieces: no second copy of a large tensor in memory

    def __init__(self, path: Path):
        self._fd = os.open(path, os.O_RDONLY)
        self._at: dict[tuple[int, int], list[int]] = {}  # (type, length) -> offsets, first written first

    def add(self, data_type: int, length: int, offset: int) -> None:
        self._at.setdefault((data_type, length), []).append(offset)

    def find(self, data_type: int, raw: bytes | memoryview) -> int | None:
        """The offset of the first tensor (or part) of this type whose bytes are `raw`, or None."""
        view = memoryview(raw).cast("B")
        for offset in self._at.get((data_type, len(view)), ()):
            if self._read(offset, min(self.PREFIX, len(view))) != view[: self.PREFIX]:
                continue
            if all(
                self._read(offset + at, min(self.PIECE, len(view) - at)) == view[at : at + self.PIECE]
                for at in range(0, len(view), self.PIECE)
            ):
                return offset
        return None

    def _read(self, offset: int, length: int) -> bytes:
        return os.pread(self._fd, length, offset)

    def close(self) -> None:
        os.close(self._fd)


class TensorWriter:
    """Writes tensors, as they are made, into a staging file the graphs refer to as external data.

    Each distinct tensor (element type and bytes) is written once; a tensor under MIN_EXTERNAL_BYTES
    stays inside its graph. Use as a context manager, or call close().

    Args:
        path: the staging file (created, or appended to).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._out = open(self.path, "ab")  # noqa: SIM115 - held across graphs, closed by close()
        self._index = _ByteIndex(self.path)

    def tensor(self, name: str, array) -> onnx.TensorProto:
        """The initializer `name` holding `array`: external data in the staging file, or inline if small.

        Args:
            name: the initializer's name.
            array: a numpy array (or anything np.asarray takes); copied only if not contiguous.
        """
        array = np.asarray(array)
        if not array.flags.c_contiguous:  # (np.ascontiguousarray would make a scalar (1,))
            array = np.ascontiguousarray(array)
        if array.nbytes < MIN_EXTERNAL_BYTES:
            return numpy_helper.from_array(array, name)
        data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        raw = memoryview(array.astype(array.dtype.newbyteorder("<"), copy=False)).cast("B")
        self._out.flush()  # what was written is what find reads back
        offset = self._index.find(data_type, raw)
        if offset is None:
            self._out.write(b"\0" * (-self._out.tell() % names.WEIGHTS_ALIGNMENT))
            offset = self._out.tell()
            self._out.write(raw)
            self._index.add(data_type, len(raw), offset)
        tensor = onnx.TensorProto(name=name, data_type=data_type, dims=array.shape)
        _point(tensor, self.path.name, offset, array.nbytes)
        return tensor

    def flush(self) -> None:
        """Makes what was written readable from the file (before a graph referring to it is checked)."""
        self._out.flush()

    def close(self) -> None:
        self._out.close()
        self._index.close()

    def __enter__(self) -> TensorWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _point(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Makes `tensor` external data: `length` bytes at `offset` of the file `location` (its raw data, if
    any, dropped)."""
    tensor.ClearField("raw_data")
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = onnx.TensorProto.EXTERNAL


def _external(tensor: onnx.TensorProto) -> tuple[str, int, int]:
    """(location, offset, length) of an external tensor."""
    info = {e.key: e.value for e in tensor.external_data}
    return info["location"], int(info.get("offset", 0)), int(info["length"])


def read_tensor(directory: Path, tensor: onnx.TensorProto) -> np.ndarray:
    """The values of an initializer, read from its external data file alone when it has one (not the
    whole graph's): memory-mapped, read-only, so that only the pages used are read (the int8 rewrite
    needs only the shape of a tied projection whose codes the table's quantization made).

    Args:
        directory: the directory of the graph, where its external data files are.
        tensor: the initializer.
    """
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return numpy_helper.to_array(tensor)
    location, offset, length = _external(tensor)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")
    if length == 0:
        return np.zeros(tuple(tensor.dims), dtype)
    array = np.memmap(
        Path(directory) / location, dtype=dtype, mode="r", offset=offset, shape=(length // dtype.itemsize,)
    )
    return array.reshape(tuple(tensor.dims))


def store_weights(directory: Path, files: list[str]) -> WeightsReport:
    """Moves the large initializers of the graphs `files` in `directory` into one weights file.

    Each graph file is rewritten with its initializers of MIN_EXTERNAL_BYTES or more pointing into
    names.WEIGHTS_FILE (written beside them); a tensor already in the file, whole or as an equal part of
    a larger one, is pointed at rather than written again. A tensor held in a staging file
    (TensorWriter) is read from it one at a time; the staging files are removed at the end.

    Args:
        directory: the bundle being written.
        files: the graph file names, one loaded at a time in this order, each graph's largest tensors
            first: a graph holding stacked weights (the fused decoder's QKV) goes before the one holding
            their parts, so that a part is found in its whole.

    Returns:
        What was written.

    Raises:
        ValueError: a graph already refers to the weights file (this runs once per export).
    """
    directory = Path(directory)
    report = WeightsReport(directory / names.WEIGHTS_FILE)
    placed: dict[tuple, int] = {}  # a staging range (location, offset, length, type) -> offset in the file
    sources: dict[str, object] = {}  # staging file name -> its open file
    index = None
    try:
        with open(report.path, "wb") as out:
            index = _ByteIndex(report.path)
            for name in files:  # one graph in memory at a time, without the weights it refers to
                proto = onnx.load(str(directory / name), load_external_data=False)
                found = _large_initializers(name, proto)
                found += separate_packed_operands(proto.graph)
                found.sort(key=lambda tensor: -_size(tensor))  # wholes before their parts
                for tensor in found:  # read one at a time: a large graph's weights are gigabytes
                    size, offset = _store(directory, tensor, out, index, placed, sources, report)
                    report.referenced += size
                    report.references += 1
                    report.per_graph[name] = report.per_graph.get(name, 0) + size
                    _point(tensor, names.WEIGHTS_FILE, offset, size)
                del found
                onnx.save(proto, str(directory / name))  # the graph alone: its tensors' bytes are in the file
                del proto
            report.stored = out.tell()
    finally:
        if index is not None:
            index.close()
        for handle in sources.values():
            handle.close()
    for staging in sources:
        (directory / staging).unlink()
    return report


def _store(
    directory: Path,
    tensor: onnx.TensorProto,
    out,
    index: _ByteIndex,
    placed: dict,
    sources: dict,
    report: WeightsReport,
) -> tuple[int, int]:
    """(length, offset in the weights file) of one large initializer, writing its bytes there unless they
    (or a tensor they are an equal part of) are there already."""
    staged = (
        (*_external(tensor), tensor.data_type) if tensor.data_location == onnx.TensorProto.EXTERNAL else None
    )
    if staged in placed:  # the same staging range as a tensor stored before: the same bytes
        return staged[2], placed[staged]
    raw = _bytes(directory, tensor, sources)
    out.flush()
    offset = index.find(tensor.data_type, raw)
    if offset is None:
        out.write(b"\0" * (-out.tell() % names.WEIGHTS_ALIGNMENT))
        offset = out.tell()
        out.write(raw)
        report.tensors += 1
        index.add(tensor.data_type, len(raw), offset)
        _register_parts(index, tensor, len(raw), offset)
    if staged is not None:
        placed[staged] = offset
    return len(raw), offset


def _size(tensor: onnx.TensorProto) -> int:
    """A large initializer's length in bytes, without reading it."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return _external(tensor)[2]
    return len(tensor.raw_data)


def _bytes(directory: Path, tensor: onnx.TensorProto, sources: dict) -> bytes:
    """A large initializer's bytes: its raw data, or read from the staging file it refers to."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return tensor.raw_data
    location, offset, length = _external(tensor)
    if location not in sources:
        sources[location] = open(directory / location, "rb")  # noqa: SIM115 - closed by store_weights
    handle = sources[location]
    handle.seek(offset)
    raw = handle.read(length)
    if len(raw) != length:
        raise ValueError(f"{location}: {length} bytes at offset {offset} were asked, {len(raw)} are there")
    return raw


def _large_initializers(name: str, proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The initializers of MIN_EXTERNAL_BYTES or more (large Constant nodes made initializers first), as
    raw bytes or as references to a staging file.

    Raises:
        ValueError: an initializer that already refers to the weights file.
    """
    constants_to_initializers(proto.graph)
    found = []
    for tensor in proto.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            if _external(tensor)[0] == names.WEIGHTS_FILE:
                raise ValueError(f"{name}: initializer {tensor.name!r} is already in {names.WEIGHTS_FILE}")
            found.append(tensor)
            continue
        if not tensor.HasField("raw_data"):  # typed fields (float_data, ...) -> raw bytes
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name))
        if len(tensor.raw_data) >= MIN_EXTERNAL_BYTES:
            found.append(tensor)
    return found


# the operators whose constant second operand onnxruntime's CPU kernels pack into their own layout at load
PACKED_OPERAND = {"MatMul": 1, "Gemm": 1, "FusedGemm": 1, "FusedMatMul": 1}


def separate_packed_operands(graph: onnx.GraphProto) -> list[onnx.TensorProto]:
    """Gives each product that multiplies by an initializer another node also reads (the tied output
    projection: a Gemm by the embedding table that the lookup's Gather reads) an initializer of its own,
    a second name for the same tensor, which store_weights points at the same bytes in the weights file.

    Why: onnxruntime packs a product's constant operand into its own layout at load and lets the
    initializer go once every reader has packed it. A table the Gather also reads stays mapped, and the
    packing has read every page of it: the tied table stays resident twice, as file pages and packed
    (+1 GB at NLLB-600M size). Under its own name the product's copy is unmapped once packed, and the
    Gather's pages are only the rows looked up (docs/optimisation-notes.md row 37). On disk nothing changes.

    Returns:
        The initializers added (their bytes are the originals', read where those are).
    """
    by_name = {tensor.name: tensor for tensor in graph.initializer}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            if name in by_name:
                readers[name] = readers.get(name, 0) + 1
    taken = set(by_name) | {value.name for value in graph.input} | {o for n in graph.node for o in n.output}
    added = []
    for node in graph.node:
        slot = PACKED_OPERAND.get(node.op_type)
        if slot is None or len(node.input) <= slot or readers.get(node.input[slot], 0) < 2:
            continue
        original = by_name[node.input[slot]]
        if _size(original) < MIN_EXTERNAL_BYTES:
            continue  # stays inside the graph: nothing large is held twice
        alias, k = f"{original.name}.packed", 1
        while alias in taken:
            k += 1
            alias = f"{original.name}.packed{k}"
        tensor = graph.initializer.add()  # (append would copy: the graph's own is the one to point)
        tensor.CopyFrom(original)
        tensor.name = alias
        taken.add(alias)
        readers[original.name] -= 1
        node.input[slot] = alias
        added.append(tensor)
    return added


def constants_to_initializers(graph: onnx.GraphProto, min_bytes: int = MIN_EXTERNAL_BYTES) -> None:
    """Turns Constant nodes of at least `min_bytes` into initializers of the same name: a large one (the
    tracer's positional table) can then live in the weights file (a Constant's value cannot be external
    data), and a layer's bias that the tracer folded into a Constant is an initializer that
    export/quantize.py can read."""
    keep = []
    for node in graph.node:
        value = (
            next((a.t for a in node.attribute if a.name == "value"), None)
            if node.op_type == "Constant"
            else None
        )
        if value is not None and len(node.output) == 1 and numpy_helper.to_array(value).nbytes >= min_bytes:
            tensor = numpy_helper.from_array(numpy_helper.to_array(value), node.output[0])
            graph.initializer.append(tensor)
        else:
            keep.append(node)
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)


def _register_parts(index: _ByteIndex, tensor: onnx.TensorProto, length: int, offset: int) -> None:
    """Registers the equal parts of a tensor along its first axis (halves, thirds) as found at their
    offsets (after the wholes before them: the first match wins)."""
    rows = tensor.dims[0] if tensor.dims else 0
    for k in PARTS:
        if rows < k or rows % k or length % k:
            continue
        step = length // k
        if step < MIN_EXTERNAL_BYTES:
            continue
        for i in range(k):
            if (offset + i * step) % names.WEIGHTS_ALIGNMENT:
                break  # a part must start where a host may read it from: aligned
            index.add(tensor.data_type, step, offset + i * step)


def check_stored_graph(path: Path) -> None:
    """Runs onnx.checker on a graph file whose initializers point into the weights file.

    From the file, so that the checker follows the external references itself (each must name a file
    inside the bundle's directory) without a copy of the weights in Python.

    Raises:
        onnx.checker.ValidationError: the graph or one of its references does not check.
    """
    onnx.checker.check_model(str(path))
