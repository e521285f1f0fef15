"""Serving rounds on the standard decoder (decoder.onnx): the rounds of serve/batcher.py's Scheduler where the
fused decoder cannot run them (the CUDA provider, float16 bundles, fused graphs exported before row_start).

decoder.onnx takes each row's own step (`step` of shape [rows], Transformer.decode_step): row r's cached
positions are the LAST step[r] slots of the shared cache, right-aligned, since every round appends one slot
for every row; the slots before them are masked (layers.own_past_bias). A new row continues any row (all
its slots are masked). The cross keys and values are given per row (a sentence's copied for each of its
beams, runtime/row_layout.py): rows of a greedy and of a beam request, or of sources of different lengths,
share one graph run. Each round's Concat copies the whole cache, and rows follow cache_indices by copying:
runtime/fused_rounds.py does neither.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import bundle as names
from .arena import ArenaShrink
from .binding import rows_answer, wanted_outputs
from .row_layout import RowLayout
from .standard_graph import StandardGraph

# the decoder's output types, for arrays that its outputs are written into
_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}


class NoServingDecoder(ValueError):
    """The bundle's decoder.onnx takes one step for all rows (exported before serve/ existed)."""


def check_decoder(session, bundle_path) -> None:
    """Raises NoServingDecoder where decoder.onnx takes one step for all rows (the message says what to
    do)."""
    step = next(i for i in session.get_inputs() if i.name == names.STEP)
    if step.shape == [1]:
        raise NoServingDecoder(
            f"{bundle_path}: its decoder.onnx takes one step for all rows (input {names.STEP!r} of shape "
            "[1]): it was "
            "exported before continuous batching. Export the checkpoint again with `seq2onnx export`, or "
            "serve this "
            "bundle with --batching request"
        )


class StandardRounds:
    """The rounds of serve/batcher.py's Scheduler over decoder.onnx (the module docstring).

    Args:
        graph: the Translator's StandardGraph (runtime/standard_graph.py) of a decoder.onnx that takes per-row
            steps (check_decoder): its session, sizes, cache dtype and the device where the cache stays.
        shrink_encoder: gives back the encoder's arena with the decoder's (shrink_arena); None: nothing.
    """

    kind = "standard"  # the rounds' graph, as `seq2onnx serve --rounds` names it

    def __init__(self, graph: StandardGraph, shrink_encoder: Callable[[], None] | None = None):
        import onnxruntime

        self.shrink_encoder = shrink_encoder
        self.graph, self._host, self._to = graph, onnxruntime.OrtValue.ortvalue_from_numpy, graph.to_device
        self._past: list | None = None  # the previous round's present_* OrtValues
        self.layout = RowLayout(
            n_layers=graph.n_layers,
            n_heads=graph.n_heads,
            head_dim=graph.head_dim,
            dtype=graph.cache_dtype,
            to_device=self._to,
            shares_memory=graph.device == "cpu",
        )
        self.shrink = ArenaShrink(graph.device)
        self.last_rows = 0

    def clear(self) -> None:
        """Nobody reads the cache or the cross inputs any more: drop them."""
        self._past = None
        self.layout.clear()

    def idle(self) -> None:
        """Every search has left: the cache and the layout go now (its holes would be kept otherwise)."""
        self.clear()

    def leave(self, member) -> None:
        """A search ended: its rows are holes of the layout until the next search fills them."""

    def shrink_arena(self) -> None:
        """One dummy round of one row under onnxruntime's arena shrinkage: the arena gives back every chunk of
        the last burst (a burst whose rows never fell, its sentences ending together, was never shrunk), then
        the encoder's (shrink_encoder). Its outputs are written into arrays of ours: one left in the arena
        would pin the chunk it was cut from."""
        if not self.shrink.enabled:
            return
        g = self.graph
        cross = self._to(np.zeros((1, g.n_heads, 8, g.head_dim), dtype=g.cache_dtype))
        mask = np.zeros((1, 8), dtype=bool)
        mask[0, 0] = True
        kinds = {o.name: _NUMPY[o.type] for o in g.session.get_outputs()}
        present = [
            self._to(np.zeros((1, g.n_heads, 1, g.head_dim), kinds[name]))
            for name in names.present_names(g.n_layers)
        ]
        on_host = {
            name: self._host(np.zeros((1, 1), kinds[name]))  # on the host, as in a round
            for name in (names.TOPK_LOG_PROBS, names.TOPK_IDS)
        }
        self.graph.run(
            tokens=np.zeros((1, 1), np.int64),
            steps=np.zeros(1, np.int64),
            cache_indices=np.zeros(1, np.int64),
            top_k=1,
            past=self._trimmed_past(0),
            cross=[cross] * (2 * g.n_layers),
            src_mask=mask,
            present=present,
            outputs=on_host,
            runner=lambda session, b: self.shrink.run(session, b, shrink=True),
        )
        if self.shrink_encoder is not None:
            self.shrink_encoder()

    def run(self, work: list, prof) -> dict:
        """Runs one round over work's (member, tokens, cache indices, step, keep, width); returns each
        member's answer (its rows of the output). Sentences that left go first."""
        for member, _, _, _, keep, _ in work:
            if keep is not None:
                member.drop(keep)
        work = [(m, tokens, indices, t) for m, tokens, indices, t, _, _ in work]
        members, rows = [m for m, *_ in work], [len(tokens) for _, tokens, _, _ in work]
        starts = self.layout.place(members, rows)
        prof.lap("layout")
        total = self.layout.used  # the members' rows and the holes between them (dummy rows, outputs unread)
        past = self._trimmed_past(max(t for *_, t in work))
        prev_rows = past[0].shape()[0]
        tokens, steps, indices = self._row_inputs(work, starts, rows, total)
        if indices.max(initial=0) >= prev_rows:
            raise RuntimeError(f"cache row {int(indices.max())} of {prev_rows}: a member skipped a round")
        top_k, wanted = wanted_outputs([m.top_k for m in members])
        src_mask, cross = self.layout.inputs()
        prof.lap("inputs")
        # the cache stays where the graph runs; what the searches read comes down ("run" includes binding)
        self._past, got = self.graph.run(
            tokens=tokens,
            steps=steps,
            cache_indices=indices,
            top_k=top_k,
            past=past,
            cross=cross,
            src_mask=src_mask,
            outputs={name: "cpu" for name in wanted},
            runner=lambda session, b: self.shrink.run(session, b, total),
        )
        prof.lap("run")
        self.last_rows = sum(rows)
        answers = {}
        for m, start, n in zip(members, starts, rows):
            m.offset = int(start)
            answers[m] = rows_answer(got, m.top_k, slice(start, start + n), self.graph.vocab)
        prof.lap("outputs")
        return answers

    @staticmethod
    def _row_inputs(work: list, starts: list[int], rows: list[int], total: int) -> tuple:
        """The round's tokens (total, 1), steps (total,) and cache indices (total,): each member's rows from
        its first row on, the holes' rows zero (a dummy row, or a first step: any row will do, all masked).
        Built with a few array operations over every row, not a few per member."""
        offsets = []
        for m, _, _, t in work:
            if t > 0 and m.offset is None:
                raise RuntimeError("a member at step > 0 has no rows in the previous round")
            offsets.append(m.offset if t > 0 else -1)
        counts = np.array(rows, dtype=np.int64)
        ends = np.cumsum(counts)
        # each row's place: its member's first row + its rank among the member's rows
        at = np.repeat(np.asarray(starts, dtype=np.int64) - (ends - counts), counts) + np.arange(ends[-1])
        tokens = np.zeros((total, 1), dtype=np.int64)
        steps = np.zeros(total, dtype=np.int64)
        indices = np.zeros(total, dtype=np.int64)
        tokens[at, 0] = np.concatenate([tok for _, tok, _, _ in work])
        steps[at] = np.repeat(np.array([t for *_, t in work], dtype=np.int64), counts)
        continued = np.repeat(np.array(offsets, dtype=np.int64), counts)
        local = np.concatenate([local for _, _, local, _ in work])
        indices[at] = np.where(continued >= 0, continued + local, 0)
        return tokens, steps, indices

    def _trimmed_past(self, needed: int) -> list:
        """The previous round's cache, its leading slots cut when no row of this round reads them."""
        if self._past is None:
            return self.graph.empty_past(1)
        length = self._past[0].shape()[2]
        # Cutting copies the whole cache (as each round's Concat does): only once enough slots are idle.
        if length - needed >= max(4, needed // 4):
            self._past = [
                self._to(np.ascontiguousarray(v.numpy()[:, :, length - needed :])) for v in self._past
            ]
        return self._past
