"""The fused decoder (decoder_fused.onnx): which decoder a Translator drives, and the static step loop.

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
- the buffers and bindings outlive the batch (StepBuffers): the Translator offers them to the
  next batch of the same shape.
"""

from __future__ import annotations

import numpy as np

from . import bundle as names
from .search import TopK


class DecoderUnavailable(RuntimeError):
    """SessionTuning(decoder="fused") where the fused decoder cannot run: the message says why."""


def pick_decoder(bundle: names.Bundle, device: str, wanted: str, load) -> tuple[str, object, str]:
    """Picks the decoder a Translator drives and loads its session.

    Args:
        bundle: the bundle read.
        device: "cpu" or "cuda", the device picked.
        wanted (str): SessionTuning.decoder: "auto", "standard" or "fused".
        load (Callable[[str], onnxruntime.InferenceSession]): load(label) creates the session of the
            bundle's graph `label` and raises where onnxruntime cannot.

    Returns:
        (variant, session, reason): the fused decoder where the bundle has it, the provider is the
        CPU and this onnxruntime can create its session; otherwise the standard decoder, with why.

    Raises:
        DecoderUnavailable: (a RuntimeError) "fused" is asked for and cannot run.
    """
    if wanted == names.STANDARD:
        return (
            names.STANDARD,
            load(names.DECODER_LABELS[names.STANDARD]),
            "asked for the standard decoder (SessionTuning)",
        )
    why = None
    if names.FUSED not in bundle.decoder_variants:
        why = (
            "the bundle has no fused decoder (exported with --decoder standard, or float16: the CPU kernels "
            "are float32-only, so fp16 bundles have only the standard one)"
        )
    elif device != "cpu":
        # The CUDA kernel of DecoderMaskedMultiHeadAttention wants another key layout in the cache.
        why = (
            f"the fused decoder's cache layout is the CPU kernels'; the {device} provider runs the standard "
            "one"
        )
    else:
        try:
            return (
                names.FUSED,
                load(names.DECODER_LABELS[names.FUSED]),
                ("the bundle has a fused decoder and this onnxruntime runs its com.microsoft operators"),
            )
        except Exception as e:  # onnxruntime's own exception types: an operator it lacks, a damaged file
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            why = f"this onnxruntime cannot run the fused decoder ({first[:300]})"
    if wanted == names.FUSED:
        raise DecoderUnavailable(f"SessionTuning(decoder='fused') cannot be honoured: {why}")
    return names.STANDARD, load(names.DECODER_LABELS[names.STANDARD]), why


def buffer_bytes(
    rows: int,
    width: int,
    max_length: int,
    top_k: int | None,
    *,
    n_layers: int,
    n_heads: int,
    head_dim: int,
    vocab: int,
) -> int:
    """Returns the bytes of a StepBuffers' arrays (StepBuffers.nbytes): the one formula behind the pool's
    bound.

    Args:
        rows, width, max_length, top_k: the buffers' key: rows (sentences x width), beams per sentence,
            cache positions, candidates per row (None: the full log-probabilities).
        n_layers, n_heads, head_dim, vocab: the model's sizes.
    """
    cache = 2 * n_layers * rows * n_heads * max_length * head_dim * 4
    indirection = (rows // width) * (width + (1 if width > 1 else 0)) * max_length * 4  # + the first step's
    out = rows * 4  # row_start
    out += rows * vocab * 4 if top_k is None else rows * top_k * (4 + 8)
    return cache + indirection + out


def takes_row_start(session) -> bool:
    """Tells whether a fused decoder session takes `row_start` (rows that begin at different positions:
    serving rounds); fused graphs exported before it do not."""
    return any(i.name == names.ROW_START for i in session.get_inputs())


_ONE = np.ones(1, np.int32)  # beam_width of a beam search's first step (never written)


def _bind_input(binding, held: dict, name: str, array: np.ndarray):
    """Binds `array` as input `name`, sharing its memory; `held` keeps the OrtValue (and so the
    array) alive while the binding points at it. Returns the OrtValue."""
    import onnxruntime  # imported (and its install checked) by runtime.translator before any session exists

    held[name] = value = onnxruntime.OrtValue.ortvalue_from_numpy(array)
    binding.bind_ortvalue_input(name, value)
    return value


def _bind_output(binding, held: dict, name: str, array: np.ndarray) -> None:
    """Binds `array` as output `name`: onnxruntime writes into it."""
    import onnxruntime

    held[name] = value = onnxruntime.OrtValue.ortvalue_from_numpy(array)
    binding.bind_ortvalue_output(name, value)


class StepBuffers:
    """The arrays a fused step loop binds and their IO bindings, kept between batches by a StepBufferPool.

    Allocating and binding them anew for every sentence cost ~0.3 ms, 3-5% of a one-sentence
    greedy translation (docs/optimisation-notes.md, row 16). Contents need no reset between
    batches: a step writes position t of the cache before any step reads it, and beam search
    writes the indirection positions it reads (FusedStep._reorder). The encoder's inputs (mask,
    cross keys/values) are bound by every batch before its first run.

    Args:
        session (onnxruntime.InferenceSession): the fused decoder's session.
        key: (rows, width, cache positions, top_k).
        n_layers: decoder layers.
        n_heads: attention heads.
        head_dim: head size.
        vocab: target vocabulary size.

    Attributes:
        key: as given.
        nbytes: the arrays' bytes (buffer_bytes).
        binding: the IO binding of the step loop.
        bound_rows: rows the cache, tokens and outputs are bound for now (0: none).
    """

    def __init__(self, session, key: tuple, *, n_layers: int, n_heads: int, head_dim: int, vocab: int):
        rows, width, max_length, top_k = key
        self.key = key  # (rows, width, cache positions, top_k)
        self.cache = [
            np.zeros((rows, n_heads, max_length, head_dim), np.float32) for _ in range(2 * n_layers)
        ]
        self.indirection = np.zeros((rows // width, width, max_length), np.int32)
        self.tokens = np.zeros((rows, 1), np.int64)
        self.step = np.zeros(1, np.int32)
        # every row of a batch begins at position 0 (graphs exported before row_start lack the input)
        self.row_start = np.zeros(rows, np.int32) if takes_row_start(session) else None
        self.fixed = {
            names.BEAM_WIDTH: np.array([width], np.int32),
            names.TOP_K: np.array([top_k or 1], np.int64),
        }
        if top_k is None:
            self.out = {names.LOG_PROBS: np.zeros((rows, vocab), np.float32)}
        else:
            self.out = {
                names.TOPK_LOG_PROBS: np.zeros((rows, top_k), np.float32),
                names.TOPK_IDS: np.zeros((rows, top_k), np.int64),
            }
        self.nbytes = buffer_bytes(*key, n_layers=n_layers, n_heads=n_heads, head_dim=head_dim, vocab=vocab)
        self.binding = session.io_binding()
        self.bound_rows = 0  # rows the cache, tokens and outputs are bound for now (0: none)
        self.held: dict[str, object] = {}  # name -> OrtValue bound by pointer: must outlive the binding
        # A beam search's first step: one row per sentence, beam width 1 (FusedStep._first_step).
        self.first_binding, self.first_sentences, self.first_held = None, 0, {}
        self.first_indirection = np.zeros((rows // width, 1, max_length), np.int32) if width > 1 else None

    def fits(self, rows: int, width: int, max_length: int, top_k: int | None) -> bool:
        """Tells whether a batch of these rows, beams, positions and top-k can use these buffers.

        Args:
            rows: sentences x width.
            width: beams per sentence.
            max_length: the positions needed (buffers with more positions fit too).
            top_k: candidates per row, or None.

        Returns:
            True when rows, width and top_k are the buffers' and they hold enough positions.
        """
        r, w, m, k = self.key
        return (r, w, k) == (rows, width, top_k) and m >= max_length

    def forget_encoded(self, encoded_names: list[str]) -> None:
        """Drops the last batch's encoder outputs, so that a spare does not keep them alive.

        The bindings keep pointers to them: every batch rebinds these inputs before it runs.

        Args:
            encoded_names: the encoder outputs' input names (src_mask and the cross keys/values).
        """
        for held in (self.held, self.first_held):
            for name in encoded_names:
                held.pop(name, None)


class StepBufferPool:
    """A Translator's spare StepBuffers between batches, shared by its threads.

    list.remove and append are atomic: two threads never get the same buffers. Only small buffers
    are kept: a batch of many rows decodes far longer than it takes to make its buffers, and
    keeping them would hold tens of MB between calls.

    Args:
        n_layers: decoder layers.
        n_heads: attention heads.
        head_dim: head size.
        vocab: target vocabulary size.
    """

    spares = 2  # batches of one or two shapes (e.g. greedy and beam 4 at batch 1) reuse theirs
    max_bytes = 4 << 20  # 1 row x 128 positions is ~0.8 MB at d_model 256, 3 layers
    position_quantum = 32  # a kept buffer's positions are a multiple of this: similar lengths share it

    def __init__(self, *, n_layers: int, n_heads: int, head_dim: int, vocab: int):
        self.dims = dict(n_layers=n_layers, n_heads=n_heads, head_dim=head_dim, vocab=vocab)
        self.encoded_names = [names.SRC_MASK, *names.cross_names(n_layers)]
        self._spares: list[StepBuffers] = []

    def positions(self, rows: int, width: int, max_length: int, top_k: int | None) -> int:
        """Returns the cache positions to allocate for a batch decoding up to max_length.

        Rounded up (to position_quantum) where the buffers are small enough to keep, exact otherwise
        (rounding every batch up raised the bench's peak RSS by ~17 MB at beam 4 x 32 rows). A step
        reads positions < step only: more cost no time.

        Args:
            rows, width, top_k: as StepBuffers.fits.
            max_length: the batch's longest decoding.
        """
        rounded = -(-max_length // self.position_quantum) * self.position_quantum
        small = buffer_bytes(rows, width, rounded, top_k, **self.dims) <= self.max_bytes
        return rounded if small else max_length

    def take(self, rows: int, width: int, max_length: int, top_k: int | None) -> StepBuffers | None:
        """Takes the smallest spare that fits (StepBuffers.fits); it is now the caller's.

        Args:
            rows, width, max_length, top_k: as StepBuffers.fits.

        Returns:
            The buffers, or None if none fits.
        """
        fitting = sorted(
            (b for b in list(self._spares) if b.fits(rows, width, max_length, top_k)), key=lambda b: b.key[2]
        )
        for buffers in fitting:
            try:
                self._spares.remove(buffers)
            except ValueError:  # another thread took it first
                continue
            return buffers
        return None

    def give(self, buffers: StepBuffers | None) -> None:
        """Keeps a finished batch's buffers (the newest `spares`), if small (max_bytes).

        Only after a search that ended normally: one that raised may have left them half bound.

        Args:
            buffers: the batch's buffers; None is ignored.
        """
        if buffers is None or buffers.nbytes > self.max_bytes:
            return
        buffers.forget_encoded(self.encoded_names)
        self._spares.append(buffers)
        del self._spares[: -self.spares]


class FusedStep:
    """One batch's static step loop over a fused decoder session; a `search.Step` callable.

    Called as step(tokens, cache_indices, t, keep). What a step returns lives in arrays reused by
    the next step: a caller copies what it keeps.

    Args:
        session: the decoder_fused.onnx session (CPU).
        src_mask: (B, S) bool, the encoder's output.
        cross: per layer key then value, (B, H, S, Dh) float32: the encoder's outputs. Both are
            bound as they are (copied only before the first compaction, which writes in place, so
            that the caller's arrays stay the encoder's).
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
        batch, width = src_mask.shape[0], beam_width
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
        self._mask = np.ascontiguousarray(src_mask, dtype=bool)
        self._cross = [np.ascontiguousarray(c, dtype=np.float32) for c in cross]
        self._cache, self._indirection, self._tokens = buffers.cache, buffers.indirection, buffers.tokens
        self._step, self._out = buffers.step, buffers.out
        self._past, self._present = names.past_names(n_layers), names.present_names(n_layers)
        self._cross_names = names.cross_names(n_layers)
        self._binding = buffers.binding
        self._bind()

    @property
    def cache(self) -> list[np.ndarray]:
        """The key/value cache the kernel writes in place, per layer key then value: (rows, H, max_length,
        Dh) each."""
        return self._cache

    def _bind(self) -> None:
        """Binds the first batch x W rows of every array, sharing memory. The cache, tokens and
        outputs are rebound only when the rows change (a compaction, or buffers made for another
        batch); the encoder's mask and cross keys/values are this batch's, bound anew."""
        buffers, binding, held = self.buffers, self._binding, self.buffers.held
        b, rows = self.batch, self.batch * self.width
        self._encoded = {names.SRC_MASK: _bind_input(binding, held, names.SRC_MASK, self._mask[:b])}
        for name, array in zip(self._cross_names, self._cross):
            self._encoded[name] = _bind_input(binding, held, name, array[:b])
        if buffers.bound_rows != rows:
            self._bind_rows(binding, held, rows, buffers.fixed[names.BEAM_WIDTH], self._indirection[:b])
            buffers.bound_rows = rows

    def _bind_rows(
        self, binding, held: dict, rows: int, beam_width: np.ndarray, indirection: np.ndarray
    ) -> None:
        """Binds what depends on the rows a run computes: the first `rows` rows of the tokens, the cache
        (one OrtValue as past and present: updated in place) and the outputs, with the beam width and
        indirection for them; the step number and top-k alike, so each binding is complete."""
        _bind_input(binding, held, names.STEP, self._step)
        _bind_input(binding, held, names.TOP_K, self.buffers.fixed[names.TOP_K])
        _bind_input(binding, held, names.BEAM_WIDTH, beam_width)
        _bind_input(binding, held, names.CACHE_INDIRECTION, indirection)
        _bind_input(binding, held, names.TOKENS, self._tokens[:rows])
        if self.buffers.row_start is not None:
            _bind_input(binding, held, names.ROW_START, self.buffers.row_start[:rows])
        for past, present, array in zip(self._past, self._present, self._cache):
            binding.bind_ortvalue_output(present, _bind_input(binding, held, past, array[:rows]))
        for name, array in self._out.items():
            _bind_output(binding, held, name, array[:rows])

    def _first_step(self, tokens: np.ndarray) -> None:
        """A beam search's first step on one row per sentence: its W beams would all compute the
        same start (W times the work, at batch 32 ~15% of a beam search: notes row 17). The rows
        are the first B of the buffers, with beam width 1. Position 0 of sentence j then moves to
        row j x W, its beam 0: every later step reads position 0 through the indirection, whose
        entry for it is always 0 (step 1's beams all continue the one row of their sentence)."""
        buffers, b, w = self.buffers, self.batch, self.width
        if buffers.first_sentences != b:
            binding, held = self.session.io_binding(), {}
            # indirection unread: width 1
            self._bind_rows(binding, held, b, _ONE, buffers.first_indirection[:b])
            buffers.first_binding, buffers.first_held, buffers.first_sentences = binding, held, b
        # this batch's encoder outputs, as the main binding has them
        for name, value in self._encoded.items():
            buffers.first_held[name] = value
            buffers.first_binding.bind_ortvalue_input(name, value)
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
        if self.top_k is None:
            return self._out[names.LOG_PROBS][take]
        return TopK(self._out[names.TOPK_LOG_PROBS][take], self._out[names.TOPK_IDS][take], self.vocab)


def _runs(keep: np.ndarray) -> list[tuple[int, int, int]]:
    """(source, destination, length) of each run of consecutive indices in ascending `keep`."""
    breaks = np.flatnonzero(np.diff(keep) != 1) + 1
    starts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((starts, [keep.size])))
    return [(int(keep[i]), int(i), int(n)) for i, n in zip(starts, lengths)]
