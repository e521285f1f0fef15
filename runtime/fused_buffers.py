"""The fused step loop's buffers between batches: StepBuffers (the arrays a FusedStep binds, and their
bindings) and the Translator's StepBufferPool of spares (runtime/fused_step.py says how they are used)."""

from __future__ import annotations

import numpy as np

from . import bundle as names
from .decoders import takes_row_start


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
        self.binding = None  # made by the first batch (FusedStep._bind: runtime/binding.py's fused_binding)
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
