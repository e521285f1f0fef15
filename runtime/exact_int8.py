"""Exact int8 products without onnxruntime's rewrite: int8 weights made uint8 in place, one bit each.

Where this CPU's u8 x s8 kernel saturates (runtime/u8s8_probe.py), onnxruntime's session option
`session.x64quantprecision` makes it rewrite each int8 weight w and its zero point z as uint8 w + 128 and
z + 128, for its exact u8 x u8 kernel. It does so in a graph transformer at every load, into new tensors of
its own: at OPUS-MT size 0.3 s of the int8 decoder's 0.5 s session, and a transient copy of each weight
(docs/optimisation-notes.md row 77). Yet w + 128 as uint8 is w as int8 with its top bit flipped (w XOR 0x80).
So the runtime flips that bit in its private copy of the weights file (runtime/weights.py: WeightsFile.flip)
and sets the tensor's type byte in the graph from INT8 (3) to UINT8 (2), before onnxruntime reads either:
the products are the rewrite's to the bit ((w + 128) - (z + 128) = w - z), and the session needs no option.

A tensor is flipped only where every read of its bytes, in every graph of the bundle, subtracts a zero point
that is flipped with it: the weight or the zero point of an integer product (MatMulInteger,
MatMulIntegerToFloat), or of a DequantizeLinear, directly or after moves that do not change values (Gather,
GatherND, Transpose). So an embedding table tied to the output projection flips with the lookups that
dequantize it (export/quantize_tables.py); one whose lookups cast the codes as they are (bundles exported
before) does not, and its graph keeps the option: onnxruntime rewrites that product. A table that no product
reads is left as it is: nothing would gain from the flip.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from .onnx_info import GraphInfo
from .u8s8_probe import PRECISION_KEY

INT8, UINT8 = 3, 2  # TensorProto.DataType
# operator -> (the input of codes it reads relative to a zero point, that zero point's input)
ZERO_POINTED = {"MatMulInteger": (1, 3), "MatMulIntegerToFloat": (1, 5), "DequantizeLinear": (0, 2)}
PRODUCTS = ("MatMulInteger", "MatMulIntegerToFloat")
MOVES = ("Gather", "GatherND", "Transpose")  # input 0's values moved about, not changed
DEPTH = 3  # moves followed from an initializer at most (a lookup or a transposition is one)


@dataclass(frozen=True)
class Flips:
    """Which bytes of a weights file, and which type bytes of each graph, one load flips.

    Attributes:
        ranges: (offset, length) in the weights file of each flipped tensor, sorted, none overlapping.
        type_bytes: graph label -> the positions of its flipped tensors' type bytes.
        inline: graph label -> the (start, end) of its flipped tensors' bytes kept inside the graph.
        complete: graph label -> whether none of its integer products keeps an int8 weight (it then needs
            no precision option).
    """

    ranges: tuple[tuple[int, int], ...]
    type_bytes: dict
    inline: dict
    complete: dict

    def graph(self, label: str, data: bytes) -> bytes:
        """A graph's bytes with its flipped tensors typed uint8, those inside it flipped (`data` where it has
        none)."""
        positions = self.type_bytes.get(label, ())
        if not positions:
            return data
        out = bytearray(data)
        for at in positions:
            out[at] = UINT8
        for start, end in self.inline.get(label, ()):
            np.frombuffer(out, np.uint8)[start:end] ^= 0x80
        return bytes(out)

    def entries(self, label: str, entries: dict) -> dict:
        """Session config entries, without the precision option where the graph has no int8 product left."""
        if self.complete.get(label):
            return {k: v for k, v in entries.items() if k != PRECISION_KEY}
        return entries

    def apply(self, buffer, offset: int = 0) -> None:
        """Flips, in `buffer` (the file's bytes from `offset` on), the top bit of every byte of `ranges`:
        the file flipped, or flipped back (what a hash of the file as checked reads)."""
        codes = np.frombuffer(buffer, np.uint8)
        first = max(bisect.bisect_right(self.ranges, (offset,)) - 1, 0)  # sorted, none overlapping
        for start, length in self.ranges[first:]:
            if start >= offset + len(codes):
                break
            lo, hi = max(start, offset), min(start + length, offset + len(codes))
            if lo < hi:
                codes[lo - offset : hi - offset] ^= 0x80


def flip(weights, graphs: dict[str, GraphInfo] | None) -> None:
    """Flips, in a bundle's weights (runtime/weights.py's WeightsFile, or None), what plan(graphs) allows."""
    if weights is not None and graphs and (flips := plan(graphs)) is not None:
        weights.flip(flips)


def as_flipped(weights, label: str, data: bytes, entries: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    """A graph's bytes and session entries as its session is made: where `weights` were flipped, the graph's
    flipped tensors typed uint8, and no precision option where none is left int8."""
    flips = None if weights is None else weights.flips
    if flips is None:
        return data, entries
    return flips.graph(label, data), flips.entries(label, entries)


def plan(graphs: dict[str, GraphInfo]) -> Flips | None:
    """Which int8 tensors a load can flip, over every graph of a bundle (their weights file is shared).

    Args:
        graphs: graph label -> the graph as read (runtime/onnx_info.py), every graph of the bundle.

    Returns:
        The flips, or None where there is none to make.
    """
    read = {label: _Reads(info) for label, info in graphs.items()}
    flippable = {label: r.candidates() for label, r in read.items()}
    # flippable only shrinks: until each range is flipped in every graph that reads it, or in none
    while True:
        safe = _safe_ranges(graphs, flippable)
        # bytes a product reads somewhere (only those are worth flipping; a table they share is flipped
        # wherever it is read)
        needed = {
            _range(t)
            for label, info in graphs.items()
            for t in info.external
            if t.name in flippable[label] and t.name in read[label].products
        }
        changed = False
        for label, info in graphs.items():
            ranges = {t.name: _range(t) for t in info.external}
            kept = set()
            for group in read[label].groups():
                outside = [ranges[n] for n in group if n in ranges]
                if (
                    group <= flippable[label]
                    and all(safe[r] for r in outside)
                    and (group & read[label].products or any(r in needed for r in outside))
                ):
                    kept |= group
            changed |= kept != flippable[label]
            flippable[label] = kept
        if not changed:
            break
    type_bytes, inline, complete = {}, {}, {}
    for label, info in graphs.items():
        names = flippable[label]
        type_bytes[label] = tuple(sorted(t.type_at for t in info.external if t.name in names))
        type_bytes[label] += tuple(sorted(at for name, (at, _) in info.inline_int8.items() if name in names))
        inline[label] = tuple(sorted(raw for name, (_, raw) in info.inline_int8.items() if name in names))
        complete[label] = all(w in names for w in read[label].weights)
    if not any(type_bytes.values()):
        return None
    flipped = {
        _range(t) for label, info in graphs.items() for t in info.external if t.name in flippable[label]
    }
    return Flips(tuple(sorted(r for r in flipped if r[1])), type_bytes, inline, complete)


def _safe_ranges(graphs: dict[str, GraphInfo], flippable: dict[str, set[str]]) -> dict[tuple[int, int], bool]:
    """Each range of the weights file that graphs read -> whether every tensor over it is flippable, in every
    graph (and no other tensor's bytes overlap it unalike)."""
    safe: dict[tuple[int, int], bool] = {}
    for label, info in graphs.items():
        for t in info.external:
            safe[_range(t)] = safe.get(_range(t), True) and t.name in flippable[label]
    cluster, end = [], -1
    for a, n in sorted(safe) + [(1 << 62, 0)]:  # tensors whose bytes overlap unalike: none of them
        if a >= end:
            if len(cluster) > 1:
                safe.update(dict.fromkeys(cluster, False))
            cluster, end = [], a
        cluster.append((a, n))
        end = max(end, a + n)
    return safe


class _Reads:
    """How one graph reads its int8 initializers: which read them only relative to a zero point, and which
    go together (a weight and its zero point; a table, its lookups' zero point and its projection's)."""

    def __init__(self, info: GraphInfo):
        self.info = info
        self.uses = defaultdict(list)  # name -> [(operator, input index, outputs)]
        made_by = {}  # a moved value -> what it was moved from
        for op, inputs, outputs in info.nodes:
            for i, name in enumerate(inputs):
                self.uses[name].append((op, i, outputs))
            if op in MOVES and inputs:
                made_by.update(dict.fromkeys(outputs, inputs[0]))
        self.graph_outputs = {v.name for v in info.outputs}
        self.pairs = []  # (the codes' initializer, their zero point) of each op reading codes around one
        self.weights, self.products = [], set()  # integer products' weights; what products read
        for op, inputs, _ in info.nodes:
            if op in ZERO_POINTED:
                c, z = ZERO_POINTED[op]
                codes = inputs[c] if len(inputs) > c else ""
                for _ in range(DEPTH):  # back through the moves, to the initializer
                    codes = made_by.get(codes, codes)
                pair = (codes, inputs[z] if len(inputs) > z else "")
                self.pairs.append(pair)
                if op in PRODUCTS:
                    self.weights.append(pair[0])
                    self.products.update(pair)

    def _reads(self, name: str, depth: int = DEPTH) -> list[tuple[str, int]]:
        """(operator, input index) of each read of `name`, through the moves ("", 0: it leaves the graph)."""
        found = [("", 0)] if name in self.graph_outputs else []
        for op, i, outputs in self.uses[name]:
            if op in MOVES and i == 0 and depth:
                found += [r for out in outputs for r in self._reads(out, depth - 1)] or [(op, i)]
            else:
                found.append((op, i))
        return found

    def candidates(self) -> set[str]:
        """The int8 initializers read only as codes or zero points of ops that subtract the one from the
        other (ZERO_POINTED)."""
        int8 = [t.name for t in self.info.external if t.data_type == INT8 and t.type_at >= 0]
        return {
            name
            for name in int8 + list(self.info.inline_int8)
            if all(i in ZERO_POINTED.get(op, ()) for op, i in self._reads(name))
        }

    def groups(self) -> list[set[str]]:
        """The initializers that must flip together: connected by the pairs."""
        parent: dict[str, str] = {}

        def root(n: str) -> str:
            while parent.setdefault(n, n) != n:
                n = parent[n]
            return n

        for a, b in self.pairs:
            parent[root(a)] = root(b)
        groups = defaultdict(set)
        for n in parent:
            groups[root(n)].add(n)
        return list(groups.values())


def _range(t) -> tuple[int, int]:
    return int(t.entries.get("offset", "0")), int(t.entries.get("length", "0"))
