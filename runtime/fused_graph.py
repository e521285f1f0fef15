"""FusedGraph: the fused decoder (decoder_fused.onnx) as every caller drives it: its buffers, their bindings
and a pool of spares.

The fused graph (docs/fused-decoder.md) keeps each layer's self-attention cache in ONE buffer of
[rows, heads, positions, head_dim], bound both as `past_*` and `present_*`: the contrib kernel writes the new
position in place. So a binding need not change from run to run: every input and output is a numpy array of
a FusedBuffers, wrapped once in an OrtValue that shares its memory (CPU), and a run only writes the tokens,
the step and the indirection into them. Two callers drive it, both through FusedGraph.bind:
translate_batch's static step loop (runtime/fused_step.py's FusedStep) and the serving rounds
(runtime/fused_rounds.py's FusedRounds); runtime/binding.py makes the bindings.

A FusedBuffers keeps the bindings made over its first rows (by rows, beam width, top-k and outputs), so a
batch of a shape seen before binds nothing new but the encoder's outputs; translate_batch's buffers outlive
their batch in the graph's BufferPool, keyed by rows and positions: allocating and binding them anew for
every sentence cost ~0.3 ms, 3-5% of a one-sentence greedy translation (docs/optimisation-notes.md, row 16).
Contents need no reset between batches: a step writes position t of the cache before any step reads it, and
a beam search writes the indirection positions it reads (FusedStep zeroes its rows' indirection first).
"""

from __future__ import annotations

import mmap

import numpy as np

from . import bundle as names
from .binding import bind_fused, fused_binding, fused_inputs
from .fused_step import FusedStep


def buffer_bytes(rows: int, positions: int, top_k: int | None, *, n_layers, n_heads, head_dim, vocab) -> int:
    """Returns the bytes of a FusedBuffers' arrays once a search of `top_k` ran on it (FusedBuffers.nbytes):
    the one formula behind the pool's bound.

    Args:
        rows, positions: the buffers' rows and cache positions.
        top_k: candidates per row of its outputs (None: the full log-probabilities).
        n_layers, n_heads, head_dim, vocab: the model's sizes.
    """
    cache = 2 * n_layers * rows * n_heads * positions * head_dim * 4
    indirection = rows * positions * 4
    per_row = 8 + 4  # tokens, row_start
    per_row += vocab * 4 if top_k is None else top_k * (4 + 8)
    return cache + indirection + rows * per_row


def mapped_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zero array in pages of its own (an anonymous memory map, its pages made at once), given back to the
    system when it is freed; numpy's zeros where the platform has no MAP_POPULATE (Linux has).

    The cache buffers are the runtime's largest allocations and are made again as a batch's steps grow them
    (FusedStep). Made by malloc, a freed one raised glibc's mmap threshold to its size, so that the next ones
    came from the heap, whose freed memory stays resident: at OPUS-MT size the peak rose by 14-20 MB. A map
    of its own is unmapped as soon as the array goes. Its pages are made in the one call (MAP_POPULATE):
    faulted in one by one as the steps first wrote them, they cost 7-10% of a batch at 32 rows.
    """
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    populate = getattr(mmap, "MAP_POPULATE", None)
    if size == 0 or populate is None:
        return np.zeros(shape, dtype)
    pages = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    return np.frombuffer(pages, dtype).reshape(shape)


class FusedBuffers:
    """The arrays a fused decoder run binds by pointer, for `capacity` rows and `positions` cache positions,
    and the bindings made over their first rows.

    Attributes:
        capacity, positions: as given.
        cache: per layer key then value, (capacity, H, positions, Dh) float32, updated in place by the kernel.
        indirection: (capacity, positions) int32: row r's position p is in row (group start + value) (the
            kernel's cache indirection, bound as (rows / width, width, positions)).
        tokens: (capacity, 1) int64, each row's last token.
        step: (1,) int32, the position written (a round: the slot).
        row_start: (capacity,) int32, each row's first position (zeros: translate_batch); None where the graph
            lacks the input.
        bindings: (rows, width, top_k, outputs) -> (IOBinding, the OrtValues it holds, its outputs by name).
    """

    max_bindings = 16  # a batch whose sentences finish one by one binds once per row count

    def __init__(self, graph: FusedGraph, capacity: int, positions: int, mapped: bool = False):
        self.capacity, self.positions, self._vocab = capacity, positions, graph.vocab
        shape = (capacity, graph.n_heads, positions, graph.head_dim)
        # translate_batch's cache: maps of its own, every page used (it grows as needed: FusedStep); the
        # rounds' (rows and positions rounded up to powers of two) stay numpy's: untouched pages cost nothing
        zeros = mapped_zeros if mapped else np.zeros
        self.cache = [zeros(shape, np.float32) for _ in range(2 * graph.n_layers)]
        self.indirection = np.zeros((capacity, positions), np.int32)
        self.tokens = np.zeros((capacity, 1), np.int64)
        self.step = np.zeros(1, np.int32)
        self.row_start = np.zeros(capacity, np.int32) if graph.row_start else None
        self.bindings: dict[tuple, tuple] = {}
        self._outputs: dict[tuple, np.ndarray] = {}

    def output(self, name: str, top_k: int) -> np.ndarray:
        """The (capacity, top_k or vocab) array that runs write output `name` into, made when first asked."""
        key = (name, 0 if name == names.LOG_PROBS else top_k)
        if key not in self._outputs:
            kind = np.int64 if name == names.TOPK_IDS else np.float32
            self._outputs[key] = np.zeros((self.capacity, key[1] or self._vocab), kind)
        return self._outputs[key]

    def regrow(self, rows: int, positions: int, written: int) -> None:
        """Makes the arrays again for their first `rows` rows and `positions` positions (FusedStep's growth),
        keeping the cache's and the indirection's positions < written. The bindings go (they point at the old
        arrays); each cache array is replaced before the next is made, so that one old array at most is alive
        beside the new ones. Tokens and row starts keep their first rows; each run writes its outputs anew."""
        self.bindings.clear()
        for i in range(len(self.cache)):
            old = self.cache[i]
            self.cache[i] = new = mapped_zeros((rows, old.shape[1], positions, old.shape[3]), old.dtype)
            new[:, :, :written] = old[:rows, :, :written]
            del old, new
        indirection = np.zeros((rows, positions), np.int32)
        indirection[:, :written] = self.indirection[:rows, :written]
        self.indirection, self.tokens, self._outputs = indirection, self.tokens[:rows], {}
        self.row_start = None if self.row_start is None else self.row_start[:rows]
        self.capacity, self.positions = rows, positions

    @property
    def nbytes(self) -> int:
        """The bytes of its arrays (buffer_bytes, once a search ran on it)."""
        arrays = [*self.cache, self.indirection, self.tokens, *self._outputs.values()]
        return sum(a.nbytes for a in arrays) + (0 if self.row_start is None else self.row_start.nbytes)

    def forget_encoded(self, encoded_names: list[str]) -> None:
        """Drops our references to the last batch's encoder outputs (every batch rebinds them before it runs).
        The IOBindings hold their own until then: a spare keeps one small batch's (BufferPool.max_bytes)."""
        for _, held, _ in self.bindings.values():
            for name in encoded_names:
                held.pop(name, None)


class FusedGraph:
    """A decoder_fused.onnx session (CPU) with its sizes, and the pool of translate_batch's spare buffers.

    Args:
        session (onnxruntime.InferenceSession): the fused decoder's session.
        n_layers, n_heads, head_dim: the decoder's sizes.
        vocab: the target vocabulary's size.

    Attributes:
        row_start: the graph takes `row_start` (rows that begin at different positions: serving rounds).
        encoded_names: the encoder outputs' input names (src_mask, then the cross keys and values).
        pool: translate_batch's spare FusedBuffers (BufferPool).
    """

    variant = names.FUSED

    def __init__(self, session, *, n_layers: int, n_heads: int, head_dim: int, vocab: int):
        self.session, self.n_layers, self.n_heads, self.head_dim = session, n_layers, n_heads, head_dim
        # graphs exported before `row_start` begin every row at position 0 (no serving rounds on them)
        self.vocab, self.row_start = vocab, any(i.name == names.ROW_START for i in session.get_inputs())
        self.encoded_names = [names.SRC_MASK, *names.cross_names(n_layers)]
        self.pool = BufferPool(self)

    def buffers(self, capacity: int, positions: int, mapped: bool = False) -> FusedBuffers:
        """New buffers of `capacity` rows and `positions` cache positions (zeros), not pooled; `mapped`: the
        cache in maps of its own (mapped_zeros: translate_batch's, which grow)."""
        return FusedBuffers(self, capacity, positions, mapped)

    def bind(
        self, buffers: FusedBuffers, *, rows: int, width: int, top_k: int, wanted: list[str], encoded: dict
    ) -> tuple[object, dict[str, np.ndarray]]:
        """The binding of a run over the first `rows` rows of `buffers`: made once per (rows, width, top_k,
        outputs) and kept in the buffers; the encoder's outputs are rebound where they are not those bound.

        Args:
            buffers: the FusedBuffers run.
            rows: rows run (a multiple of width).
            width: rows per group of the indirection (the beam width; 1: none).
            top_k: candidates the TopK outputs give per row (0: none wanted).
            wanted: the outputs' names (runtime/binding.py's wanted_outputs).
            encoded: src_mask and the cross keys/values by name (encoded_names): arrays or the encoder's
                OrtValues, `rows / entries` rows per entry.

        Returns:
            (the IOBinding, each wanted output's (rows, ...) array, written by every run).
        """
        key = (rows, width, top_k, tuple(wanted))
        made = buffers.bindings.get(key)
        if made is not None:
            binding, held, outputs = made
            changed = {name: value for name, value in encoded.items() if held.get(name) is not value}
            if changed:
                bind_fused(binding, held, changed)
            return binding, outputs
        inputs = fused_inputs(
            tokens=buffers.tokens[:rows],
            step=buffers.step,
            top_k=np.array([max(top_k, 1)], np.int64),
            beam_width=np.array([width], np.int32),
            indirection=buffers.indirection[:rows].reshape(rows // width, width, buffers.positions),
            row_start=None if buffers.row_start is None else buffers.row_start[:rows],
        )
        outputs = {name: buffers.output(name, top_k)[:rows] for name in wanted}
        cache = [array[:rows] for array in buffers.cache]
        binding, held = fused_binding(self.session, {**inputs, **encoded}, cache, outputs)
        buffers.bindings[key] = (binding, held, outputs)
        while len(buffers.bindings) > buffers.max_bindings:
            del buffers.bindings[next(iter(buffers.bindings))]  # the oldest
        return binding, outputs

    def step(
        self,
        encoded: tuple,
        *,
        rows: int,
        top_k: int | None,
        max_length: int,
        beam_width: int = 1,
        writable: bool = False,
    ) -> FusedStep:
        """translate_batch's step over encoded sources (runtime/graphs.py's Graphs.step), on spare buffers
        where the pool has some that fit."""
        width = beam_width
        first = self.pool.positions(rows * width, max_length, top_k)
        src_mask, cross = encoded  # the encoder's OrtValues: bound as they are
        return FusedStep(
            self,
            src_mask=src_mask,
            cross=cross,
            beam_width=width,
            max_length=max_length,
            positions=first,
            top_k=top_k,
            buffers=self.pool.take(rows * width, first),
            writable=writable,
        )

    def recycle(self, step) -> None:
        """Offers a finished step's buffers to the next batch. Only after a search that ended normally: one
        that raised may have left them half bound."""
        inner = getattr(step, "inner", step)  # under force_prefix
        self.pool.give(getattr(inner, "buffers", None))


class BufferPool:
    """A FusedGraph's spare FusedBuffers between translate_batch's batches, shared by its threads.

    list.remove and append are atomic: two threads never get the same buffers. Only small buffers
    are kept: a batch of many rows decodes far longer than it takes to make its buffers, and
    keeping them would hold tens of MB between calls.
    """

    spares = 2  # batches of one or two shapes (e.g. greedy and beam 4 at batch 1) reuse theirs
    max_bytes = 4 << 20  # 1 row x 128 positions is ~0.8 MB at d_model 256, 3 layers
    position_quantum = 32  # a kept buffer's positions are a multiple of this: similar lengths share it
    grow_from = 16  # a batch too large to keep starts with this many positions at most, and grows (FusedStep)

    def __init__(self, graph: FusedGraph):
        self.graph = graph
        self.dims = dict(
            n_layers=graph.n_layers, n_heads=graph.n_heads, head_dim=graph.head_dim, vocab=graph.vocab
        )
        self._spares: list[FusedBuffers] = []

    def positions(self, rows: int, max_length: int, top_k: int | None) -> int:
        """Returns the cache positions to allocate first for a batch of `rows` rows decoding up to max_length.

        Rounded up (to position_quantum) where the buffers are small enough to keep (a step reads positions
        < step only: more cost no time). Otherwise at most grow_from: the step grows the buffers as its
        longest live sentence needs (FusedStep), so that a large batch's cache is not the longest limit for
        every row (its pages are all touched: at beam 4 x 32 on the recipe model, 28.5 MB of the peak;
        rounding every batch up had raised that peak by ~17 MB).
        """
        rounded = -(-max_length // self.position_quantum) * self.position_quantum
        small = buffer_bytes(rows, rounded, top_k, **self.dims) <= self.max_bytes
        return rounded if small else min(max_length, self.grow_from)

    def take(self, rows: int, positions: int) -> FusedBuffers | None:
        """Takes the spare of these rows with the fewest positions that suffice; it is now the caller's.
        Returns None if none fits."""
        fitting = sorted(
            (b for b in list(self._spares) if b.capacity == rows and b.positions >= positions),
            key=lambda b: b.positions,
        )
        for buffers in fitting:
            try:
                self._spares.remove(buffers)
            except ValueError:  # another thread took it first
                continue
            return buffers
        return None

    def give(self, buffers: FusedBuffers | None) -> None:
        """Keeps a finished batch's buffers (the newest `spares`), if small (max_bytes); None is ignored."""
        if buffers is None or buffers.nbytes > self.max_bytes:
            return
        buffers.forget_encoded(self.graph.encoded_names)
        self._spares.append(buffers)
        del self._spares[: -self.spares]
