"""Exact int8 products without onnxruntime's rewrite: int8 weights made uint8 in place, one bit each.

Where this CPU's u8 x s8 kernel saturates (runtime/u8s8_probe.py), onnxruntime's session option
`session.x64quantprecision` makes it rewrite each int8 weight w and its zero point z as uint8 w + 128 and
z + 128, for its exact u8 x u8 kernel. It does so in a graph transformer at every load, into new tensors of
its own: at OPUS-MT size 0.3 s of the int8 decoder's 0.5 s session, and a transient copy of each weight
(docs/optimisation-notes.md row 77). Yet w + 128 as uint8 is w as int8 with its top bit flipped (w XOR 0x80).
So the runtime flips that bit in its private copy of the weights file (runtime/weights.py: WeightsFile.flip)
and sets the tensor's type byte in the graph from INT8 (3) to UINT8 (2), before onnxruntime reads either:
the products are the rewrite's to the bit ((w + 128) - (z + 128) = w - z), and the session needs no option.

A tensor is flipped only where every use of its bytes, in every graph of the bundle, is the weight or the
weight's zero point of an integer product (MatMulInteger, MatMulIntegerToFloat) whose partner is flipped
too. A table also read by a lookup is not (an embedding tied to the output projection: its lookup casts the
codes themselves); a graph that keeps such a product keeps the option, and onnxruntime rewrites that one.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from .onnx_info import GraphInfo
from .u8s8_probe import PRECISION_KEY

INT8, UINT8 = 3, 2  # TensorProto.DataType
# operator -> (the weight's input, the weight's zero point's input)
PRODUCTS = {"MatMulInteger": (1, 3), "MatMulIntegerToFloat": (1, 5)}


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


def plan(graphs: dict[str, GraphInfo]) -> Flips | None:
    """Which int8 tensors a load can flip, over every graph of a bundle (their weights file is shared).

    Args:
        graphs: graph label -> the graph as read (runtime/onnx_info.py), every graph of the bundle.

    Returns:
        The flips, or None where there is none to make.
    """
    uses = {label: _uses(info) for label, info in graphs.items()}
    flippable = {label: _candidates(info, uses[label][0]) for label, info in graphs.items()}
    while True:  # until a range is flipped in every graph that reads it, or in none
        safe: dict[tuple[int, int], bool] = {}
        for label, info in graphs.items():
            for t in info.external:
                safe[_range(t)] = safe.get(_range(t), True) and t.name in flippable[label]
        spans = sorted(safe)
        cluster, end = [], -1
        for a, n in spans + [(1 << 62, 0)]:  # tensors whose bytes overlap unalike: none of them
            if a >= end:
                if len(cluster) > 1:
                    safe.update(dict.fromkeys(cluster, False))
                cluster, end = [], a
            cluster.append((a, n))
            end = max(end, a + n)
        changed = False
        for label, info in graphs.items():
            keep = {t.name for t in info.external if not safe[_range(t)]}
            kept = _paired(flippable[label] - keep, uses[label][1])
            changed |= kept != flippable[label]
            flippable[label] = kept
        if not changed:
            break
    type_bytes, inline, complete = {}, {}, {}
    for label, info in graphs.items():
        names, pairs = flippable[label], uses[label][1]
        type_bytes[label] = tuple(sorted(t.type_at for t in info.external if t.name in names))
        type_bytes[label] += tuple(sorted(at for name, (at, _) in info.inline_int8.items() if name in names))
        inline[label] = tuple(sorted(raw for name, (_, raw) in info.inline_int8.items() if name in names))
        complete[label] = all(w in names for w, _ in pairs)
    if not any(type_bytes.values()):
        return None
    return Flips(tuple(r for r in spans if safe[r] and r[1]), type_bytes, inline, complete)


def _uses(info: GraphInfo) -> tuple[dict, list[tuple[str, str]]]:
    """(name -> its uses as (operator, input index); each integer product's (weight, zero point) names)."""
    uses = defaultdict(set)
    pairs = []
    for op, inputs, _ in info.nodes:
        for i, name in enumerate(inputs):
            uses[name].add((op, i))
        if op in PRODUCTS:
            w, z = PRODUCTS[op]
            pairs.append((inputs[w] if len(inputs) > w else "", inputs[z] if len(inputs) > z else ""))
    return uses, pairs


def _candidates(info: GraphInfo, uses: dict) -> set[str]:
    """The graph's int8 initializers that it uses only as integer products' weights and zero points."""
    int8 = [t.name for t in info.external if t.data_type == INT8 and t.type_at >= 0] + list(info.inline_int8)
    return {name for name in int8 if all(i in PRODUCTS.get(op, ()) for op, i in uses[name])}


def _paired(names: set[str], pairs: list[tuple[str, str]]) -> set[str]:
    """`names` less every weight whose zero point is not among them, and every zero point whose weight is
    not (one flipped without the other would shift its products)."""
    names = set(names)
    changed = True
    while changed:
        changed = False
        for w, z in pairs:
            if (w in names) != (z in names):
                names.discard(w)
                names.discard(z)
                changed = True
    return names


def _range(t) -> tuple[int, int]:
    return int(t.entries.get("offset", "0")), int(t.entries.get("length", "0"))
