"""Serving rounds on the fused decoder (decoder_fused.onnx): one in-place cache for every row of every search.

The standard rounds (runtime/standard_rounds.py) run decoder.onnx, whose Concat copies the whole cache every
round and whose rows follow cache_indices by copying. Here each layer's cache is ONE buffer of
[capacity, H, M, Dh] that the kernel (DecoderMaskedMultiHeadAttention) writes in place at position `slot`,
the round's count, for every row at once:
- a search's rows keep their place from its first step to its last: a sentence owns a block of rows (its
  beams; one row for greedy search and sampling), so nothing is copied when other searches join or leave;
- each row began at its own position, `row_start` (the slot of its search's first step): the graph attends
  to positions row_start..slot only and gives the row the position slot - row_start (export/fused.py), so a
  row freed by a finished sentence is taken by the next one with no reset;
- beams follow their parents through the kernel's cache indirection, kept here as absolute rows
  (`_source`: row r's position p is in row _source[r, p]) and given to the kernel relative to the row's group
  of `beam_width` rows; a sentence's block lies inside one group (blocks are powers of two, aligned);
- the kernel reads positions 0..slot of every row, masked or not, so the positions no live row reads are
  dropped (one copy of the live ones) as soon as they are at least `shift_min` and at least the live span,
  and in any case when the M positions run out (else the buffers grow).

The cross keys/values are padded to one source width, and laid out by `cross_group`, the rows one entry
serves: the graph's cross-attention queries each entry with its `rows / entries` rows (export/fused.py).
- While every search in flight has beams of the round's group (all beam 4, say), each sentence's block is one
  group and its beams share ONE entry (cross_group = the group): a sentence's keys/values are stored once, and
  the kernel reads them once for its beams, as translate_batch does.
- A round that mixes widths (a greedy search beside beam searches: several sentences in one group) has one
  entry per row (cross_group 1: a sentence's copied to each of its beams). The layout changes between rounds
  by one copy of the entries (`_relayout`, counted in `copies`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import bundle as names
from .arena import ArenaShrink
from .binding import rows_answer, wanted_outputs
from .fused_graph import FusedGraph


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


class _Placed:
    """A member's rows: a block per sentence (its beams), from the slot of its first step."""

    def __init__(self, blocks: np.ndarray, width: int, start: int):
        self.blocks, self.width, self.start = blocks, width, start


class FusedRounds:
    """The rounds of serve/batcher.py's Scheduler over the fused decoder (the module docstring).

    The cache, the tokens, `row_start` and the kernel's indirection are a FusedBuffers of the Translator's
    FusedGraph (runtime/fused_graph.py), bound by it as translate_batch's are; the rows' bookkeeping (owners,
    `_source`) and the cross entries are the rounds' own.

    Args:
        graph: the Translator's FusedGraph of a decoder_fused.onnx (CPU) with a `row_start` input.
        shrink_encoder: gives back the encoder's arena with the decoder's (shrink_arena); None: nothing.
    """

    kind = "fused"  # the rounds' graph, as `seq2onnx serve --rounds` names it

    def __init__(self, graph: FusedGraph, shrink_encoder: Callable[[], None] | None = None):
        self.graph, self.decoder, self.vocab = graph, graph.session, graph.vocab
        self.shrink_encoder = shrink_encoder
        self.n_layers, self.n_heads, self.head_dim = graph.n_layers, graph.n_heads, graph.head_dim
        self._cross_names = names.cross_names(self.n_layers)
        self.shrink = ArenaShrink("cpu")
        # the buffers' sizes when a burst begins (they grow when needed), and the source width's quantum
        self.first_positions, self.first_rows, self.width_quantum = 32, 16, 8
        self.shift_min = 8  # the fewest dead positions dropped before the buffer is full (_positions_...)
        self.copies = {"grow_rows": 0, "grow_positions": 0, "shift_positions": 0, "widen": 0, "relayout": 0}
        self.share_cross = True  # beams share their sentence's cross entry where the round allows (docstring)
        self.clear()

    def clear(self) -> None:
        """Drops every buffer (nobody is decoding)."""
        self.capacity, self.positions, self.width, self.slot = 0, 0, 0, 0
        self.owner = np.zeros(0, np.int64)  # the member serial holding a row, -1: free
        self.cache: list[np.ndarray] = []
        self._source = np.zeros((0, 0), np.int32)
        self._relative = np.zeros((0, 0), np.int32)
        self.row_start = np.zeros(0, np.int32)
        self.tokens = np.zeros((0, 1), np.int64)
        self.mask = np.zeros((0, 0), bool)  # (capacity / cross_group, source width), as the cross entries
        self.cross: list[np.ndarray] = []  # per layer key then value: (capacity / cross_group, H, width, Dh)
        self.cross_group = 1  # the rows each cross entry serves: 1, or the round's group (module docstring)
        self._members: dict[int, object] = {}
        self.buffers = None  # the graph's FusedBuffers: cache, tokens, row_start, the kernel's indirection
        self._binding, self._outputs, self._bound = None, {}, None
        self._last_group = 1
        self._generation = 0  # changes with every allocation: a binding points into the buffers it saw
        self._layout = 0  # changes whenever rows are taken or freed (or reallocated): _used() is made again
        self._used_key, self._used_rows = None, (0, np.zeros(0, np.int64))

    def idle(self) -> None:
        """Every search has left: the buffers and the binding stay for the next (clear() drops them); every
        row is free already, and a row taken again masks what it held (`row_start`)."""

    # -- the buffers ------------------------------------------------------------------------------

    def _allocate(self, capacity: int, positions: int, width: int) -> None:
        """(Re)allocates every buffer, keeping what the rows in use hold (a counted copy)."""
        old = (self.capacity, self.positions, self.width)
        keep_rows, keep_pos, keep_w = min(capacity, old[0]), min(positions, old[1]), min(width, old[2])
        buffers = self.graph.buffers(capacity, positions)
        for new, was in zip(buffers.cache, self.cache):
            new[:keep_rows, :, :keep_pos] = was[:keep_rows, :, :keep_pos]
        self.buffers, self.cache, self.tokens, self._relative = (
            buffers,
            buffers.cache,
            buffers.tokens,
            buffers.indirection,
        )
        rows = np.arange(capacity, dtype=np.int32)
        source = np.repeat(rows[:, None], positions, axis=1)
        source[:keep_rows, :keep_pos] = self._source[:keep_rows, :keep_pos]
        self._source = source
        owner = np.full(capacity, -1, np.int64)
        owner[:keep_rows] = self.owner[:keep_rows]
        self.owner = owner
        buffers.row_start[:keep_rows] = self.row_start[:keep_rows]
        self.row_start = buffers.row_start
        entries, keep_entries = capacity // self.cross_group, keep_rows // self.cross_group
        mask = np.zeros((entries, width), bool)
        mask[:, 0] = True  # a free row attends to something (its outputs are unread)
        mask[:keep_entries, :keep_w] = self.mask[:keep_entries, :keep_w]
        self.mask = mask
        cross = [
            np.zeros((entries, self.n_heads, width, self.head_dim), np.float32) for _ in self._cross_names
        ]
        for new, was in zip(cross, self.cross):
            new[:keep_entries, :, :keep_w] = was[:keep_entries, :, :keep_w]
        self.cross = cross
        self.capacity, self.positions, self.width = capacity, positions, width
        self._generation += 1
        self._layout += 1

    def _room(self, rows_needed: int, width: int) -> None:
        """Grows the rows or the source width when a new search needs them (before it is placed)."""
        if width > self.width or self.capacity == 0:
            self.copies["widen"] += self.capacity > 0
            quantum = self.width_quantum
            width = -(-max(width, self.width) // quantum) * quantum
            self._allocate(
                max(self.capacity, self.first_rows), max(self.positions, self.first_positions), width
            )
        while self._free_block(rows_needed) is None:
            self.copies["grow_rows"] += 1
            self._allocate(2 * self.capacity, self.positions, self.width)

    def _free_block(self, size: int) -> int | None:
        """The lowest free block of `size` rows (a power of two) aligned to its size, or None."""
        if size > self.capacity:
            return None
        free = (self.owner < 0).reshape(-1, size).all(axis=1)
        at = np.flatnonzero(free)
        return int(at[0]) * size if at.size else None

    def _positions_for_this_round(self) -> None:
        """Position `slot` must exist, and the positions no live row reads should not be run: drop them (one
        copy of the live positions), or grow.

        The kernel (DecoderMaskedMultiHeadAttention on the CPU) reads positions 0..slot of EVERY row, a dot
        product and a scaled add per position, masked or not: the positions before the earliest live row's
        start cost every round as much as live ones. So they are dropped as soon as they are at least
        `shift_min` and at least as many as the live span they would be copied with (the copy then costs
        about what they cost in one or two rounds: docs/optimisation-notes.md row 55), not only when the
        buffer is full."""
        if self.capacity == 0:  # nothing allocated yet: the first search's _room makes the buffers
            return
        live = self.owner >= 0
        shift = int(self.row_start[live].min()) if live.any() else self.slot
        if self.slot < self.positions:
            if shift >= self.shift_min and shift >= self.slot - shift:
                self._shift(shift)
            return
        if shift >= self.positions // 4:
            self._shift(shift)
        else:
            self.copies["grow_positions"] += 1
            self._allocate(self.capacity, 2 * self.positions, self.width)

    def _shift(self, shift: int) -> None:
        """Drops the first `shift` positions: the live ones (up to `slot`) are copied to the front."""
        self.copies["shift_positions"] += 1
        keep = self.slot - shift
        for array in self.cache:
            array[:, :, :keep] = array[:, :, shift : self.slot]
        self._source[:, :keep] = self._source[:, shift : self.slot]
        np.maximum(self.row_start - shift, 0, out=self.row_start)  # in place: the binding reads it
        self.slot -= shift
        for m in self._members.values():
            m.placed.start -= shift

    def _relayout(self, group: int) -> None:
        """Lays the cross entries out for `group` rows each (1: one per row): one copy of them, through one
        entry per row (a group's rows are one sentence's, so its first row's entry is the sentence's)."""
        old = self.cross_group
        if group == old:
            return
        if self.capacity:
            while self.capacity < group:  # a whole group must fit: grow in the old layout first
                self.copies["grow_rows"] += 1
                self._allocate(2 * self.capacity, self.positions, self.width)
            self.copies["relayout"] += 1

            def relaid(array: np.ndarray) -> np.ndarray:
                per_row = np.repeat(array, old, axis=0) if old > 1 else array
                return np.ascontiguousarray(per_row[::group])

            self.mask = relaid(self.mask)
            self.cross = [relaid(c) for c in self.cross]
            self._generation += 1  # the binding pointed into the old arrays
            self.buffers.bindings.clear()  # an IOBinding holds what it binds: the old arrays would stay alive
        self.cross_group = group

    # -- members ------------------------------------------------------------------------------------

    def _join(self, member, width: int) -> None:
        """Places a new search's sentences: a block of rows each, their cross keys/values copied in."""
        sentences = member.src_mask.shape[0]
        size = _pow2(width)
        self._room(size, member.src_mask.shape[1])
        blocks = np.empty(sentences, np.int64)
        for i in range(sentences):
            if (at := self._free_block(size)) is None:
                self.copies["grow_rows"] += 1
                self._allocate(2 * self.capacity, self.positions, self.width)
                at = self._free_block(size)
            blocks[i] = at
            self.owner[at : at + size] = member.serial
        rows = (blocks[:, None] + np.arange(width)).reshape(-1)
        if self.cross_group > 1:  # a sentence's block is one group: one entry for its beams
            entries, sentence = blocks // self.cross_group, np.arange(sentences)
        else:
            entries, sentence = rows, np.repeat(np.arange(sentences), width)
        s = member.src_mask.shape[1]
        self.mask[entries] = False
        self.mask[entries, :s] = member.src_mask[sentence]
        for array, value in zip(self.cross, member.cross):
            array[entries, :, :s] = value[sentence]
            array[entries, :, s:] = 0
        self._source[rows] = rows[:, None]
        self.row_start[rows] = self.slot
        self._layout += 1
        member.placed = _Placed(blocks, width, self.slot)
        self._members[member.serial] = member

    def leave(self, member) -> None:
        """A search ended (or was cancelled): its rows are free."""
        placed = getattr(member, "placed", None)
        if isinstance(placed, _Placed) and self._members.pop(member.serial, None) is not None:
            self._free(placed.blocks, placed.width)

    def _free(self, blocks: np.ndarray, width: int) -> None:
        """Frees sentences' blocks; their rows' positions point at themselves again, so that the kernel's
        indirection stays inside any group of rows."""
        size = _pow2(width)
        self._layout += 1
        for at in blocks:
            self.owner[at : at + size] = -1
            self._source[at : at + size] = np.arange(at, at + size, dtype=np.int32)[:, None]

    def _drop(self, placed: _Placed, keep) -> np.ndarray:
        """Finished sentences leave (`keep`: the ones still decoding): their blocks are free. Returns the
        blocks of the previous step, which its cache indices index."""
        keep = np.asarray(keep, dtype=np.int64)
        self._free(placed.blocks[np.setdiff1d(np.arange(placed.blocks.size), keep)], placed.width)
        previous, placed.blocks = placed.blocks, placed.blocks[keep]
        return previous

    # -- a round ------------------------------------------------------------------------------------

    def run(self, work: list, prof) -> dict:
        """Runs one round; returns each member's answer (its rows of the output)."""
        self._positions_for_this_round()
        placed_rows, group = self._place(work)
        prof.lap("layout")
        used, every_row, top_k, wanted = self._inputs(work, placed_rows, group)
        prof.lap("inputs")
        got = self._bind(used, group, max(top_k, 1), wanted)
        prof.lap("bind")
        self.shrink.run(self.decoder, self._binding, used)
        prof.lap("run")
        self.slot += 1
        self.last_rows = used
        answers = self._answers(work, placed_rows, every_row, got)
        prof.lap("outputs")
        return answers

    def _place(self, work: list) -> tuple[list[np.ndarray], int]:
        """New searches join; every search's rows this round, and the round's group (its widest beam). Where
        every search's blocks are a group, the cross entries are one per group, else one per row."""
        sizes = {_pow2(w[5]) for w in work}  # the searches' block sizes
        group = max(sizes)
        self._relayout(group if self.share_cross and len(sizes) == 1 else 1)
        slot, placed_rows, beams = self.slot, [], []
        for i, (member, _, cache_indices, t, keep, width) in enumerate(work):
            if t == 0:
                self._join(member, width)
            p = member.placed
            if p.start + t != slot:
                raise RuntimeError(f"a search at step {t} joined at slot {p.start}, now {slot}")
            previous = p.blocks if keep is None else self._drop(p, keep)
            if t == 0 or p.width == 1:  # a row per sentence (greedy, sampling, a beam search's first step)
                placed_rows.append(p.blocks)
            else:  # beams that follow their parents, all such searches at once (_follow)
                placed_rows.append(None)
                beams.append((i, member, cache_indices, t, previous))
        if beams:
            for i, rows in self._follow(beams):
                placed_rows[i] = rows
        return placed_rows, group

    def _follow(self, beams: list) -> list[tuple[int, np.ndarray]]:
        """Beam searches' rows this round, in a few array operations over all of their rows rather than a
        dozen per search: each row's positions before this step's follow its parent's (`_source`), and the
        previous position is the parent. `beams`: (work index, member, cache indices, t, the previous step's
        blocks) each. Returns (work index, its rows) per search.

        A row's positions before its search began are copied from its parent too: they are masked, and every
        row's `_source` stays inside its own block, so the kernel's indirection stays inside the group."""
        out = []
        for w in {m.placed.width for _, m, *_ in beams}:
            same = [b for b in beams if b[1].placed.width == w]
            counts = [m.placed.blocks.size for _, m, *_ in same]
            first = np.concatenate([m.placed.blocks for _, m, *_ in same])  # each sentence's first row
            rows = (first[:, None] + np.arange(w)).reshape(-1)
            # each cache index -> (its sentence in the previous step, its beam), made global: prev_w is 1 at
            # step 1, else w
            indices = np.concatenate([np.asarray(ci, dtype=np.int64).reshape(-1) for _, _, ci, _, _ in same])
            per_row = [c * w for c in counts]
            prev_w = np.repeat([1 if t == 1 else w for _, _, _, t, _ in same], per_row)
            previous = [prev for *_, prev in same]
            offset = np.repeat(np.cumsum([0, *[x.size for x in previous[:-1]]]), per_row)
            parents = np.concatenate(previous)[offset + indices // prev_w] + indices % prev_w
            size = _pow2(w)
            if (parents - parents % size != np.repeat(first, w)).any():
                raise ValueError(f"step cache_indices {indices.tolist()} leave their sentences' beams")
            b = self.slot - 1  # the positions before this step's follow the parent
            self._source[rows, :b] = self._source[parents, :b]
            self._source[rows, b] = parents
            at = 0
            for (i, *_), n in zip(same, per_row):
                out.append((i, rows[at : at + n]))
                at += n
        return out

    def _inputs(self, work: list, placed_rows: list, group: int) -> tuple[int, np.ndarray, int, list[str]]:
        """Writes the round's inputs into the bound arrays; returns (rows run, every member's rows in order,
        the largest top-k asked for (0: none), the outputs wanted)."""
        used, free = self._used(group)
        if free.size:
            self.row_start[free] = self.slot  # a free row reads its own new position only
        # (a free row's token is whatever it last held: any id will do, its outputs are unread)
        if len(work) == 1:
            every_row = placed_rows[0]
            self.tokens[every_row, 0] = work[0][1]
        else:
            every_row = np.concatenate(placed_rows)
            self.tokens[every_row, 0] = np.concatenate([w[1] for w in work])
        if group > 1:
            span = self.slot + 1
            base = (np.arange(used, dtype=np.int32) // group) * group
            relative = self._relative[:used]
            np.subtract(self._source[:used, :span], base[:, None], out=relative[:, :span])
        elif self._last_group > 1:  # a beam width of 1 uses no indirection, but checks it is all 0
            self._relative[:] = 0
        self._last_group = group
        top_k, wanted = wanted_outputs([m.top_k for m, *_ in work])
        self.buffers.step[0] = self.slot
        return used, every_row, top_k, wanted

    def _answers(self, work: list, placed_rows: list, every_row: np.ndarray, got: dict) -> dict:
        """Each member's rows of the output: one gather of every member's rows (the output arrays are written
        again next round), each member's a view of it."""
        got = {name: array[every_row] for name, array in got.items()}
        answers, at = {}, 0
        for (m, *_), rows in zip(work, placed_rows):
            end = at + rows.size
            answers[m] = rows_answer(got, m.top_k, slice(at, end), self.vocab)
            at = end
        return answers

    def _used(self, group: int) -> tuple[int, np.ndarray]:
        """The round's rows (every owned one, rounded up to the group) and the free rows among them; made
        again only when rows were taken or freed, or the group changed."""
        key = (group, self._layout)
        if key != self._used_key:
            owned = np.flatnonzero(self.owner >= 0)
            used = -(-(int(owned[-1]) + 1) // group) * group
            self._used_key, self._used_rows = key, (used, np.flatnonzero(self.owner[:used] < 0))
        return self._used_rows

    def _bind(self, used: int, group: int, top_k: int, wanted: list[str]) -> dict[str, np.ndarray]:
        """The round's IO binding over the first `used` rows (FusedGraph.bind: kept with the buffers by rows,
        group, top-k and outputs), asked for again only when what it binds changed (those, or the buffers and
        the cross entries: _generation): a round only writes into the bound arrays. Returns the output arrays
        by name."""
        key = (used, group, top_k, tuple(wanted), self._generation)
        if key == self._bound:
            return self._outputs
        entries = used // self.cross_group  # the graph's cross-attention: used / entries rows each
        encoded = dict(
            zip(self.graph.encoded_names, [self.mask[:entries], *(c[:entries] for c in self.cross)])
        )
        self._binding, self._outputs = self.graph.bind(
            self.buffers, rows=used, width=group, top_k=top_k, wanted=wanted, encoded=encoded
        )
        self._bound = key
        return self._outputs

    def shrink_arena(self) -> None:
        """Nothing to shrink when idle but onnxruntime's arenas: a one-row round under shrinkage, then the
        encoder's (shrink_encoder)."""
        if not self.shrink.enabled:
            return
        self.clear()
        self._allocate(1, 1, 8)
        self.buffers.step[0] = 0
        self._bind(1, 1, 1, [names.TOPK_LOG_PROBS, names.TOPK_IDS])
        self.shrink.run(self.decoder, self._binding, shrink=True)
        self.clear()
        if self.shrink_encoder is not None:
            self.shrink_encoder()
