"""The standard decoder's step (decoder.onnx, standard opset), side by side with runtime/fused_step.py.

The key/value cache never leaves the device: each step binds the previous step's `present_*`
OrtValues as the next step's `past_*` inputs (IO binding), uploads only the new tokens, the step
and the cache indices, and downloads only what the search reads: the graph's top-k candidates or,
without top_k, the full log-probabilities.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .binding import bind_decoder, rows_answer, wanted_outputs


class StandardStep:
    """One decoding step over decoder.onnx for a batch whose sources were encoded already.

    Called as the search's step: step(tokens, cache_indices, t, keep) -> log-probabilities
    ([rows, vocab]) or a TopK of [rows, top_k].

    Args:
        decoder: the onnxruntime session of decoder.onnx.
        rows: the batch's sources (one cache row each at the first step).
        src_mask: the encoder's src_mask (an OrtValue on the device).
        cross: the encoder's cross keys/values (OrtValues on the device), one per layer and kind.
        n_layers: decoder layers.
        n_heads: attention heads.
        head_dim: size of one head.
        cache_dtype: numpy dtype of the cache (the bundle's dtype).
        top_k: candidates per row to download, or None for the full log-probabilities.
        vocab: the target vocabulary's size.
        to_device: numpy array -> OrtValue on the session's device.
        device: "cpu" or "cuda", where the cache outputs stay.
    """

    buffers = None  # the fused step's StepBuffers; the standard step keeps none between batches

    def __init__(
        self,
        decoder,
        *,
        rows: int,
        src_mask,
        cross: list,
        n_layers: int,
        n_heads: int,
        head_dim: int,
        cache_dtype,
        top_k: int | None,
        vocab: int,
        to_device: Callable[[np.ndarray], object],
        device: str,
    ):
        self.decoder, self.top_k, self.vocab = decoder, top_k, vocab
        self._to_device, self._device = to_device, device
        # [rows, heads, 0 positions, head_dim]
        empty = np.zeros((rows, n_heads, 0, head_dim), dtype=cache_dtype)
        self.past = [to_device(empty) for _ in range(2 * n_layers)]
        self.cross, self.mask = cross, src_mask
        # only what the search needs comes down
        self._wanted = {name: "cpu" for name in wanted_outputs([top_k])[1]}
        self._k_input = np.array([top_k or 1], dtype=np.int64)

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
        if keep is not None:
            # Finished sentences leave: their cross keys/values and mask go too. This happens a few
            # times per batch, not per step, so a round trip through the host is cheap.
            self.cross = [self._to_device(np.ascontiguousarray(v.numpy()[keep])) for v in self.cross]
            self.mask = self._to_device(np.ascontiguousarray(self.mask.numpy()[keep]))
        b = bind_decoder(
            self.decoder,
            tokens=np.ascontiguousarray(tokens, dtype=np.int64),
            steps=np.array([t], dtype=np.int64),
            cache_indices=np.ascontiguousarray(cache_indices, dtype=np.int64),
            top_k=self._k_input,
            past=self.past,
            cross=self.cross,
            src_mask=self.mask,
            present=self._device,
            outputs=self._wanted,
        )
        self.decoder.run_with_iobinding(b)
        outputs = b.get_outputs()
        got = dict(zip(self._wanted, (o.numpy() for o in outputs[len(self.past) :])))
        self.past = outputs[: len(self.past)]
        return rows_answer(got, self.top_k, slice(None), self.vocab)
