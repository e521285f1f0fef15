"""StandardGraph: the standard decoder (decoder.onnx, standard opset) as every caller drives it, and its step.

One object per session owns what every run of decoder.onnx needs beside its per-run inputs: the model's
sizes, the cache's dtype and the device where the cache stays. Three callers drive it, all through `run`
(which binds through runtime/binding.py, the one module that binds graphs): translate_batch's step
(StandardStep, below), the forced pass that returns attention (runtime/attention.py) and the continuous
batcher's rounds (runtime/standard_rounds.py).

The key/value cache never leaves the device: each run binds the previous run's `present_*` OrtValues as the
next run's `past_*` inputs, uploads only the new tokens, the steps and the cache indices, and downloads only
what the caller reads: the graph's top-k candidates or, without top_k, the full log-probabilities. The
binding is made per run: its `present_*` grow by one position each step (the graph's Concat), so no binding
outlives its run (the fused decoder's, runtime/fused_graph.py, are kept instead).
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from . import bundle as names
from .binding import bind_decoder, rows_answer, wanted_outputs


class StandardGraph:
    """A decoder.onnx session with its sizes, cache dtype and device.

    Args:
        session (onnxruntime.InferenceSession): the standard decoder's session.
        n_layers, n_heads, head_dim: the decoder's sizes.
        vocab: the target vocabulary's size.
        cache_dtype: numpy dtype of the cache and cross keys/values (the bundle's dtype).
        device: "cpu" or "cuda", where the cache (the `present_*` outputs) stays.
        to_device: numpy array -> OrtValue on `device`.
    """

    variant = names.STANDARD

    def __init__(
        self,
        session,
        *,
        n_layers: int,
        n_heads: int,
        head_dim: int,
        vocab: int,
        cache_dtype,
        device: str,
        to_device: Callable[[np.ndarray], object],
    ):
        self.session, self.n_layers, self.n_heads, self.head_dim = session, n_layers, n_heads, head_dim
        self.vocab, self.cache_dtype, self.device, self.to_device = vocab, cache_dtype, device, to_device

    def empty_past(self, rows: int) -> list:
        """The 2 x layers empty caches ([rows, heads, 0 positions, head_dim]) of a first step, on the
        device."""
        empty = np.zeros((rows, self.n_heads, 0, self.head_dim), dtype=self.cache_dtype)
        return [self.to_device(empty) for _ in range(2 * self.n_layers)]

    def run(
        self,
        *,
        tokens: np.ndarray,
        steps: np.ndarray,
        cache_indices: np.ndarray,
        top_k: int,
        past: list,
        cross: list,
        src_mask,
        outputs: Mapping[str, object],
        present=None,
        runner: Callable | None = None,
    ) -> tuple[list, dict]:
        """Runs decoder.onnx once; returns (the present keys and values, the other outputs by name).

        Args:
            tokens, steps, cache_indices, past, cross, src_mask: as runtime/binding.py's bind_decoder.
            top_k: candidates the TopK outputs give per row (at least 1).
            outputs: the other outputs wanted, in order: {name: "cpu" (downloaded as numpy) or an OrtValue
                written into (returned as it is)}.
            present: None (the cache stays on the device) or 2 x layers OrtValues written into.
            runner: runner(session, binding) runs it (runtime/arena.py's ArenaShrink.run); None: a plain run.
        """
        b = bind_decoder(
            self.session,
            tokens=tokens,
            steps=steps,
            cache_indices=cache_indices,
            top_k=np.array([max(top_k, 1)], dtype=np.int64),
            past=past,
            cross=cross,
            src_mask=src_mask,
            present=self.device if present is None else present,
            outputs=outputs,
        )
        if runner is None:
            self.session.run_with_iobinding(b)
        else:
            runner(self.session, b)
        out = b.get_outputs()
        got = {
            name: value.numpy() if isinstance(where, str) else value
            for (name, where), value in zip(outputs.items(), out[len(past) :])
        }
        return out[: len(past)], got

    def step(
        self,
        encoded: tuple,
        *,
        rows: int,
        top_k: int | None,
        max_length: int = 0,
        beam_width: int = 1,
        writable: bool = False,
    ) -> StandardStep:
        """translate_batch's step over encoded sources (runtime/graphs.py's Graphs.step); max_length and
        beam_width size nothing here (the cache grows by one position a step), as FusedGraph.step's do, and
        the encoder's outputs are only read (`writable` is FusedGraph.step's)."""
        src_mask, cross = encoded
        return StandardStep(self, rows=rows, src_mask=src_mask, cross=cross, top_k=top_k)

    def recycle(self, step) -> None:
        """A standard step keeps nothing between batches (the fused graph's recycle keeps its buffers)."""


class StandardStep:
    """One decoding step over decoder.onnx for a batch whose sources were encoded already.

    Called as the search's step: step(tokens, cache_indices, t, keep) -> log-probabilities
    ([rows, vocab]) or a TopK of [rows, top_k].

    Args:
        graph: the StandardGraph.
        rows: the batch's sources (one cache row each at the first step).
        src_mask: the encoder's src_mask (an OrtValue on the device).
        cross: the encoder's cross keys/values (OrtValues on the device), one per layer and kind.
        top_k: candidates per row to download, or None for the full log-probabilities.
    """

    def __init__(self, graph: StandardGraph, *, rows: int, src_mask, cross: list, top_k: int | None):
        self.graph, self.top_k = graph, top_k
        self.past = graph.empty_past(rows)
        self.cross, self.mask = cross, src_mask
        # only what the search needs comes down
        k, wanted = wanted_outputs([top_k])
        self._wanted, self._k = {name: "cpu" for name in wanted}, k

    def __call__(self, tokens: np.ndarray, cache_indices: np.ndarray, t: int, keep: np.ndarray | None):
        """Runs step t.

        Args:
            tokens: the rows' last tokens ([rows]).
            cache_indices: [rows], picks each row's cache row from the previous step.
            t: the step's position.
            keep: sentence indices; drops finished sentences first (None: all stay).

        Returns:
            The log-probabilities [rows, vocab], or a TopK of [rows, top_k] with top_k.
        """
        to_device = self.graph.to_device
        if keep is not None:
            # Finished sentences leave: their cross keys/values and mask go too. This happens a few
            # times per batch, not per step, so a round trip through the host is cheap.
            self.cross = [to_device(np.ascontiguousarray(v.numpy()[keep])) for v in self.cross]
            self.mask = to_device(np.ascontiguousarray(self.mask.numpy()[keep]))
        self.past, got = self.graph.run(
            tokens=np.ascontiguousarray(tokens, dtype=np.int64),
            steps=np.array([t], dtype=np.int64),
            cache_indices=np.ascontiguousarray(cache_indices, dtype=np.int64),
            top_k=self._k,
            past=self.past,
            cross=self.cross,
            src_mask=self.mask,
            outputs=self._wanted,
        )
        return rows_answer(got, self.top_k, slice(None), self.graph.vocab)
