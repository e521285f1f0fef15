"""The fused decoder's (decoder_fused.onnx) static step loop: translate_batch's step on the fused graph.

The graph writes each layer's cache in place (runtime/fused_graph.py): every input and output is an array of
the step's FusedBuffers, bound once per batch (and again only when finished sentences leave it). A step
writes the tokens, the step number and the beams' cache indirection into those arrays and runs; top-k or
log-probabilities come back in preallocated arrays.

The search (runtime/search.py) drives a step as `step(tokens, cache_indices, t, keep)`, where
row r continues row cache_indices[r] of the previous step and `keep` drops finished sentences.
Here that becomes:
- beams: row (b, w) continues beam p = cache_indices[r] - (first row of b before the step) of
  its sentence; the cache is not copied, the indirection table follows p:
  indir[b, w, :t-1] = old[b, p, :t-1], indir[b, w, t-1] = p;
- finished sentences: the buffers are compacted in place (rows of kept sentences moved to the
  front, positions 0..t-1 only), once per change of the batch, never per step;
- the first step of a beam search has one row per sentence while the buffers have W: it runs on
  the first B rows with beam width 1 (its own binding), and position 0 is then copied to the W rows
  of each sentence;
- the buffers and bindings are runtime/fused_graph.py's FusedBuffers, bound by FusedGraph.bind; they
  outlive the batch in the graph's pool, offered to the next batch of the same rows.
"""

from __future__ import annotations

import numpy as np

from .binding import rows_answer, wanted_outputs


class FusedStep:
    """One batch's static step loop over a fused decoder session; a `search.Step` callable.

    Called as step(tokens, cache_indices, t, keep). What a step returns lives in arrays reused by
    the next step: a caller copies what it keeps.

    Args:
        graph: the FusedGraph (runtime/fused_graph.py) of the decoder_fused.onnx session (CPU).
        src_mask: (B, S) bool, the encoder's output.
        cross: per layer key then value, (B, H, S, Dh) float32: the encoder's outputs. Both are
            numpy arrays or the encoder's OrtValues (CPU), bound as they are; the first compaction
            writes in place, into a copy unless `writable`.
        beam_width: W, the beams per sentence after the first step (1 for greedy and sampling).
        max_length: the most positions the cache may need: at least the batch's longest decoding.
        positions: the positions to allocate first (BufferPool.positions; None: max_length). Where a step
            would write past them, the buffers grow by half (at most to max_length), over the rows still in
            use (_grow).
        top_k: candidates per row to return as TopK; None returns the full log-probabilities.
        buffers: a FusedBuffers left by an earlier batch (BufferPool.take), used if it fits.
        writable: nothing reads src_mask and cross after the search, so compaction may move their rows in
            place (a batch of 32 OPUS-MT-size sentences of 30 tokens: ~24 MB not copied); False when the
            caller reads them after the search (the attention pass).

    Attributes:
        buffers: this batch's FusedBuffers, for the caller to offer to the next batch.
    """

    _compacted = False  # rows moved: bound from _mask and _cross, no longer the encoder's OrtValues
    _writable = False  # compaction may move the encoder's rows in place (else it copies them first)

    def __init__(
        self,
        graph,
        *,
        src_mask: np.ndarray,
        cross: list[np.ndarray],
        beam_width: int,
        max_length: int,
        top_k: int | None,
        buffers=None,
        writable: bool = False,
        positions: int | None = None,
    ):
        values = [src_mask, *cross]
        self._writable = writable
        # the encoder's OrtValues, bound as they are until the first compaction (wrapping costs ~5 us each)
        self._values = None if any(isinstance(v, np.ndarray) for v in values) else values
        self._mask = np.ascontiguousarray(_host(src_mask), dtype=bool)
        self._cross = [np.ascontiguousarray(_host(c), dtype=np.float32) for c in cross]
        batch, width = self._mask.shape[0], beam_width
        rows = batch * width
        first = max_length if positions is None else positions
        if buffers is None or buffers.capacity != rows or buffers.positions < first:
            buffers = graph.buffers(rows, first, mapped=True)
        self._limit = max(max_length, buffers.positions)
        buffers.indirection[:rows] = 0  # a width of 1 reads none of it, but the kernel wants zeros
        self.graph, self.buffers, self.width, self.top_k = graph, buffers, width, top_k
        self.batch = batch  # sentences in the buffers now
        self._sentences = np.arange(batch)  # sliced to index the sentences in the buffers
        self._cache, self._tokens, self._step = buffers.cache, buffers.tokens, buffers.step
        # (sentences, W, positions): beam w of sentence b is row b x W + w
        self._indirection = buffers.indirection.reshape(batch, width, buffers.positions)
        self._k, self._wanted = wanted_outputs([top_k])
        self._bind()

    @property
    def cache(self) -> list[np.ndarray]:
        """The key/value cache the kernel writes in place, per layer key then value: (rows, H, max_length,
        Dh) each."""
        return self._cache

    def _run_binding(self, sentences: int, width: int):
        """The binding of a run over the first sentences x width rows (FusedGraph.bind: made once per shape,
        the encoder's outputs rebound when they changed), and its outputs by name. The encoder's outputs are
        its own OrtValues while the batch is whole, else our arrays' first rows."""
        if self._values is not None and not self._compacted:
            encoded = self._values
        else:
            encoded = [a[:sentences] for a in [self._mask, *self._cross]]
        return self.graph.bind(
            self.buffers,
            rows=sentences * width,
            width=width,
            top_k=self._k,
            wanted=self._wanted,
            encoded=dict(zip(self.graph.encoded_names, encoded)),
        )

    def _bind(self) -> None:
        """Binds the first batch x W rows of every array, sharing memory: at the start and again when the rows
        change (a compaction)."""
        self._binding, self._out = self._run_binding(self.batch, self.width)

    def _first_step(self, tokens: np.ndarray) -> dict:
        """A beam search's first step on one row per sentence: its W beams would all compute the
        same start (W times the work, at batch 32 ~15% of a beam search: notes row 17). The rows
        are the first B of the buffers, with beam width 1. Position 0 of sentence j then moves to
        row j x W, its beam 0: every later step reads position 0 through the indirection, whose
        entry for it is always 0 (step 1's beams all continue the one row of their sentence).
        Returns the outputs by name."""
        b, w = self.batch, self.width
        binding, out = self._run_binding(b, 1)
        self._tokens[:b] = tokens
        self._step[0] = 0
        self.graph.session.run_with_iobinding(binding)
        for array in self._cache:  # row j -> row j*W; numpy buffers the overlapping source
            array[: b * w : w, :, 0] = array[:b, :, 0]
        return out

    def _compact(self, keep: np.ndarray, t: int) -> None:
        """Moves the kept sentences' rows to the front of every buffer (positions < t only).

        keep is strictly ascending (checked by __call__), so the kept sentences form runs that each
        move as one block to a lower index, or stay: the run before the first finished sentence
        never moves. Less is copied than by a gather of every kept row; numpy buffers a run only
        where its source and destination overlap."""
        w = self.width
        if not (self._compacted or self._writable):  # the caller reads them after the search (attention)
            self._mask, self._cross = self._mask.copy(), [c.copy() for c in self._cross]
        self._compacted = True
        for src, dst, n in _runs(keep):
            if src == dst:
                continue
            for array in self._cache:
                array[dst * w : (dst + n) * w, :, :t] = array[src * w : (src + n) * w, :, :t]
            for array in self._cross:
                array[dst : dst + n] = array[src : src + n]
            self._mask[dst : dst + n] = self._mask[src : src + n]
            self._indirection[dst : dst + n, :, :t] = self._indirection[src : src + n, :, :t]
        self.batch = keep.size
        self._bind()

    def _grow(self, t: int) -> None:
        """Makes room for position t (written by step t): every buffer again, with half as many positions more
        (at most the limit), over the rows still in use only (FusedBuffers.regrow). A batch's cache then holds
        what its longest live sentence reached, for the sentences still decoding, not every row's limit."""
        positions = max(t + 1, min(self._limit, self.buffers.positions * 3 // 2))
        self._binding = self._out = None  # they point at the arrays that go
        self.buffers.regrow(self.batch * self.width, positions, t)
        self._tokens = self.buffers.tokens
        self._indirection = self.buffers.indirection.reshape(self.batch, self.width, positions)
        self._bind()

    def _reorder(self, parents: np.ndarray, t: int) -> None:
        """Beam w of sentence b continues beam parents[b, w], whose position t-1 is in its own row."""
        ind = self._indirection[: self.batch]
        if t > 1:
            # take_along_axis, cheaper
            ind[:, :, : t - 1] = ind[self._sentences[: self.batch, None], parents, : t - 1]
        ind[:, :, t - 1] = parents

    def __call__(self, tokens: np.ndarray, cache_indices: np.ndarray, t: int, keep: np.ndarray | None):
        """Runs step t.

        Args:
            tokens: [rows, 1] the rows' last tokens (one row per sentence at a beam search's step 0).
            cache_indices: [rows], the previous step's row each row continues (within its sentence).
            t: the step's position.
            keep: strictly ascending indices of the sentences that go on, or None for all.

        Returns:
            The log-probabilities [rows, vocab], or a TopK of [rows, top_k] with top_k.

        Raises:
            ValueError: cache_indices that leave their sentence, a bad keep, or a wrong number of rows.
        """
        w = self.width
        if t > 0 and w > 1:
            # The previous step had 1 row per sentence (t == 1) or w; sentence j was keep[j] there.
            sentences = self._sentences[: self.batch] if keep is None else np.asarray(keep)
            prev_width = 1 if t == 1 else w
            parents = (np.asarray(cache_indices).reshape(-1, w) - sentences[:, None] * prev_width).astype(
                np.int32
            )
            if parents.min(initial=0) < 0 or parents.max(initial=0) >= prev_width:
                raise ValueError(
                    f"step {t}: cache_indices {cache_indices.tolist()} do not continue beams of their own "
                    "sentences; the fused decoder reorders beams only within a sentence"
                )
        if keep is not None:
            keep = np.asarray(keep)
            if keep.size == 0 or (np.diff(keep) <= 0).any() or keep[0] < 0 or keep[-1] >= self.batch:
                raise ValueError(
                    f"step {t}: keep {keep.tolist()} must be strictly ascending indices of some of the "
                    f"{self.batch} sentences of the previous step"
                )
            self._compact(keep, t)
        if t > 0 and w > 1:
            self._reorder(parents, t)
        if t >= self.buffers.positions:
            self._grow(t)
        rows = self.batch * w
        first = t == 0 and w > 1  # one row per sentence given, w rows in the buffers
        given = tokens.shape[0]
        if given != (self.batch if first else rows):
            raise ValueError(
                f"step {t}: {given} token rows for {self.batch} sentences x {1 if first else w} beams"
            )
        if first:
            out = self._first_step(tokens)
        else:
            self._tokens[:rows] = tokens
            self._step[0] = t
            self.graph.session.run_with_iobinding(self._binding)
            out = self._out
        return rows_answer(out, self.top_k, slice(None), self.graph.vocab)


def _host(value) -> np.ndarray:
    """A numpy array, or an OrtValue's array (on the CPU it shares the OrtValue's memory)."""
    return value if isinstance(value, np.ndarray) else value.numpy()


def _runs(keep: np.ndarray) -> list[tuple[int, int, int]]:
    """(source, destination, length) of each run of consecutive indices in ascending `keep`."""
    breaks = np.flatnonzero(np.diff(keep) != 1) + 1
    starts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((starts, [keep.size])))
    return [(int(keep[i]), int(i), int(n)) for i, n in zip(starts, lengths)]
