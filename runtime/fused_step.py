"""The fused decoder's (decoder_fused.onnx) static step loop: translate_batch's step on the fused graph.

The fused graph (docs/fused-decoder.md) keeps each layer's self-attention cache in ONE buffer of
[rows, heads, max_length, head_dim], bound both as `past_*` and `present_*`: the contrib kernel
writes the new position in place. So the bindings need not change from step to step: every
input and output is a numpy array owned here and wrapped once in an OrtValue that shares its
memory (CPU), bound once per batch (and again only when finished sentences leave it). A step
writes the tokens, the step number and the beams' cache indirection into those arrays and runs;
top-k or log-probabilities come back in preallocated arrays.

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
- the buffers and bindings outlive the batch (runtime/fused_buffers.py's StepBuffers): the
  Translator offers them to the next batch of the same shape.
"""

from __future__ import annotations

import numpy as np

from . import bundle as names
from .binding import bind_fused, fused_binding, fused_inputs, rows_answer
from .fused_buffers import StepBuffers


_ONE = np.ones(1, np.int32)  # beam_width of a beam search's first step (never written)


class FusedStep:
    """One batch's static step loop over a fused decoder session; a `search.Step` callable.

    Called as step(tokens, cache_indices, t, keep). What a step returns lives in arrays reused by
    the next step: a caller copies what it keeps.

    Args:
        session: the decoder_fused.onnx session (CPU).
        src_mask: (B, S) bool, the encoder's output.
        cross: per layer key then value, (B, H, S, Dh) float32: the encoder's outputs. Both are
            numpy arrays or the encoder's OrtValues (CPU), bound as they are (copied only before the
            first compaction, which writes in place, so that the caller's arrays stay the encoder's).
        n_layers: decoder layers.
        n_heads: attention heads.
        head_dim: head size.
        beam_width: W, the beams per sentence after the first step (1 for greedy and sampling).
        max_length: the cache's positions: at least the batch's longest decoding (StepBufferPool.positions).
        top_k: candidates per row to return as TopK; None returns the full log-probabilities.
        vocab: the target vocabulary size.
        buffers: a StepBuffers left by an earlier batch (StepBufferPool.take), used if it fits.

    Attributes:
        buffers: this batch's StepBuffers, for the caller to offer to the next batch.
    """

    _owned = False  # are _mask and _cross our copies (else the encoder's arrays)?

    def __init__(
        self,
        session,
        *,
        src_mask: np.ndarray,
        cross: list[np.ndarray],
        n_layers: int,
        n_heads: int,
        head_dim: int,
        beam_width: int,
        max_length: int,
        top_k: int | None,
        vocab: int,
        buffers: StepBuffers | None = None,
    ):
        values = [src_mask, *cross]
        # the encoder's OrtValues, bound as they are until the first compaction (wrapping costs ~5 us each)
        self._values = None if any(isinstance(v, np.ndarray) for v in values) else values
        self._mask = np.ascontiguousarray(_host(src_mask), dtype=bool)
        self._cross = [np.ascontiguousarray(_host(c), dtype=np.float32) for c in cross]
        batch, width = self._mask.shape[0], beam_width
        if buffers is None or not buffers.fits(batch * width, width, max_length, top_k):
            buffers = StepBuffers(
                session,
                (batch * width, width, max_length, top_k),
                n_layers=n_layers,
                n_heads=n_heads,
                head_dim=head_dim,
                vocab=vocab,
            )
        self.buffers, self.session, self.width, self.vocab, self.top_k = buffers, session, width, vocab, top_k
        self.batch = batch  # sentences in the buffers now
        self._sentences = np.arange(batch)  # sliced to index the sentences in the buffers
        self._cache, self._indirection, self._tokens = buffers.cache, buffers.indirection, buffers.tokens
        self._step, self._out = buffers.step, buffers.out
        self._cross_names = names.cross_names(n_layers)
        self._bind()

    @property
    def cache(self) -> list[np.ndarray]:
        """The key/value cache the kernel writes in place, per layer key then value: (rows, H, max_length,
        Dh) each."""
        return self._cache

    def _bind(self) -> None:
        """Binds the first batch x W rows of every array, sharing memory. The cache, tokens and
        outputs are bound anew (a new binding) only when the rows change (a compaction, or buffers made for
        another batch); else only the encoder's mask and cross keys/values, this batch's, are rebound."""
        buffers, b, rows = self.buffers, self.batch, self.batch * self.width
        encoded_names = [names.SRC_MASK, *self._cross_names]
        if self._values is not None and not self._owned:  # the whole batch: the encoder's own OrtValues
            encoded = dict(zip(encoded_names, self._values))
        else:
            encoded = dict(zip(encoded_names, (a[:b] for a in [self._mask, *self._cross])))
        if buffers.bound_rows != rows:
            width, indirection = buffers.fixed[names.BEAM_WIDTH], self._indirection[:b]
            buffers.binding, buffers.held = self._rows_binding(rows, width, indirection, encoded)
            buffers.bound_rows = rows
        else:
            bind_fused(buffers.binding, buffers.held, encoded)
        self._binding = buffers.binding
        self._encoded = {name: buffers.held[name] for name in encoded_names}

    def _rows_binding(self, rows: int, beam_width: np.ndarray, indirection: np.ndarray, encoded: dict):
        """A new binding (and the OrtValues it holds) of the first `rows` rows of the tokens, the cache (past
        and present alike: updated in place) and the outputs, with the beam width and indirection for them,
        the step number, top-k and the encoder's outputs `encoded`: complete."""
        row_start = self.buffers.row_start
        inputs = fused_inputs(
            tokens=self._tokens[:rows],
            step=self._step,
            top_k=self.buffers.fixed[names.TOP_K],
            beam_width=beam_width,
            indirection=indirection,
            row_start=None if row_start is None else row_start[:rows],
        )
        cache = [array[:rows] for array in self._cache]
        outputs = {name: array[:rows] for name, array in self._out.items()}
        return fused_binding(self.session, {**inputs, **encoded}, cache, outputs)

    def _first_step(self, tokens: np.ndarray) -> None:
        """A beam search's first step on one row per sentence: its W beams would all compute the
        same start (W times the work, at batch 32 ~15% of a beam search: notes row 17). The rows
        are the first B of the buffers, with beam width 1. Position 0 of sentence j then moves to
        row j x W, its beam 0: every later step reads position 0 through the indirection, whose
        entry for it is always 0 (step 1's beams all continue the one row of their sentence)."""
        buffers, b, w = self.buffers, self.batch, self.width
        if buffers.first_sentences != b:  # indirection unread: width 1
            made = self._rows_binding(b, _ONE, buffers.first_indirection[:b], self._encoded)
            buffers.first_binding, buffers.first_held = made
            buffers.first_sentences = b
        else:  # this batch's encoder outputs, as the main binding has them
            bind_fused(buffers.first_binding, buffers.first_held, self._encoded)
        self._tokens[:b] = tokens
        self._step[0] = 0
        self.session.run_with_iobinding(buffers.first_binding)
        for array in self._cache:  # row j -> row j*W; numpy buffers the overlapping source
            array[: b * w : w, :, 0] = array[:b, :, 0]

    def _compact(self, keep: np.ndarray, t: int) -> None:
        """Moves the kept sentences' rows to the front of every buffer (positions < t only).

        keep is strictly ascending (checked by __call__), so the kept sentences form runs that each
        move as one block to a lower index, or stay: the run before the first finished sentence
        never moves. Less is copied than by a gather of every kept row; numpy buffers a run only
        where its source and destination overlap."""
        w = self.width
        if not self._owned:  # the encoder's arrays: the caller may still read them (attention pass)
            self._mask, self._cross = self._mask.copy(), [c.copy() for c in self._cross]
            self._owned = True
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
        rows = self.batch * w
        first = t == 0 and w > 1  # one row per sentence given, w rows in the buffers
        given = tokens.shape[0]
        if given != (self.batch if first else rows):
            raise ValueError(
                f"step {t}: {given} token rows for {self.batch} sentences x {1 if first else w} beams"
            )
        if first:
            self._first_step(tokens)
            take = slice(0, self.batch)
        else:
            self._tokens[:rows] = tokens
            self._step[0] = t
            self.session.run_with_iobinding(self._binding)
            take = slice(0, rows)
        return rows_answer(self._out, self.top_k, take, self.vocab)


def _host(value) -> np.ndarray:
    """A numpy array, or an OrtValue's array (on the CPU it shares the OrtValue's memory)."""
    return value if isinstance(value, np.ndarray) else value.numpy()


def _runs(keep: np.ndarray) -> list[tuple[int, int, int]]:
    """(source, destination, length) of each run of consecutive indices in ascending `keep`."""
    breaks = np.flatnonzero(np.diff(keep) != 1) + 1
    starts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((starts, [keep.size])))
    return [(int(keep[i]), int(i), int(n)) for i, n in zip(starts, lengths)]
