"""Graphs: a Translator's onnxruntime sessions as the searches drive them: encode, the decoder's step, the
attention pass.

The decoder driven is the fused one (decoder_fused.onnx: runtime/fused_graph.py) where the bundle has it and
this onnxruntime runs it on the chosen provider, else the standard decoder.onnx (runtime/standard_graph.py);
runtime/decoders.py picks it. Every graph's inputs and outputs are bound by runtime/binding.py.
"""

from __future__ import annotations

import numpy as np

from . import bundle as names
from .attention import check_attention_output, forced_attention
from .arena import ArenaShrink
from .binding import bind_encoder
from .fused_graph import FusedGraph, mapped_zeros
from .length_groups import CALL_POSITIONS, length_groups
from .model_spec import ModelSpec
from .search import Step
from .devices import ort
from .standard_graph import StandardGraph


class Graphs:
    """The sessions of a loaded bundle and what drives them (runtime/sessions.py's Sessions).

    Args:
        sessions: the Sessions opened (open_sessions).
        spec: the model's sizes and special ids (runtime/model_spec.py).
        cache_dtype: the numpy dtype of the cache and cross keys/values (the bundle's dtype).
        bundle_path: the bundle's directory, for messages.
        threads: the sessions' intra-op threads (an encoder call's cost in positions grows with them).
    Attributes:
        encoder, decoder: the encoder's session and the driven decoder's.
        variant, reason: "fused" or "standard", the decoder driven, and why.
        decoder_graph: the driven decoder as its callers drive it: a FusedGraph (runtime/fused_graph.py) or a
            StandardGraph (runtime/standard_graph.py); standard_graph is decoder.onnx's in either case.
        device, ort_device: the provider's device ("cpu" or "cuda"), where the encoder's outputs and the cache
            stay.
    """

    def __init__(self, sessions, spec: ModelSpec, cache_dtype, bundle_path, threads: int = 1):
        self.encoder, self.decoder, self._sessions = sessions.encoder, sessions.decoder, sessions
        self._call_positions = CALL_POSITIONS * threads
        self.variant, self.reason = sessions.variant, sessions.reason
        self.device = sessions.device
        self.ort_device = "cuda" if self.device == "cuda" else "cpu"
        self.spec, self.cache_dtype, self._path = spec, cache_dtype, bundle_path
        self._standard_graph: StandardGraph | None = None  # made when first asked for (standard_graph)
        self._encoder_shrink = ArenaShrink("cpu")  # shrink_encoder_arena's run options
        # the driven decoder's graph object: the fused one keeps its buffers and bindings between batches
        self.decoder_graph: FusedGraph | StandardGraph = (
            FusedGraph(
                self.decoder,
                n_layers=spec.n_layers,
                n_heads=spec.n_heads,
                head_dim=spec.head_dim,
                vocab=spec.tgt_vocab,
            )
            if self.variant == names.FUSED
            else self.standard_graph
        )

    def encode(self, src: np.ndarray, lengths: np.ndarray) -> tuple:
        """Runs the encoder over padded sources (Sources.pad): (src_mask, cross keys/values), OrtValues on
        ort_device, bound by the decoders as they are (no copy through numpy).

        On the CPU a batch of unlike lengths is encoded in groups of like lengths (runtime/length_groups.py),
        each padded to its own longest, and put together: the same values at real positions, fewer padded
        ones computed."""
        cut = self.ort_device == "cpu" and len(lengths) > 1
        groups = length_groups(lengths, self._call_positions) if cut else ()
        if len(groups) < 2:
            return self._encode_padded(src, lengths)
        batch, width = src.shape
        whole = None
        for rows in groups:
            longest = int(lengths[rows].max())
            src_mask, cross = self._encode_padded(np.ascontiguousarray(src[rows, :longest]), lengths[rows])
            parts = [value.numpy() for value in (src_mask, *cross)]
            if whole is None:  # the (B, S) mask, (B, H, S, Dh) keys and values: zeros where nothing attends
                whole = [np.zeros((batch, width), parts[0].dtype)]
                whole += [mapped_zeros((batch, p.shape[1], width, p.shape[3]), p.dtype) for p in parts[1:]]
            whole[0][rows, :longest] = parts[0]
            for into, part in zip(whole[1:], parts[1:]):
                into[rows, :, :longest] = part
        src_mask, *cross = (ort.OrtValue.ortvalue_from_numpy(a, "cpu", 0) for a in whole)
        return src_mask, cross

    def _encode_padded(self, src: np.ndarray, lengths: np.ndarray) -> tuple:
        """encode() in one call over the batch as padded."""
        binding = bind_encoder(
            self.encoder, src=src, lengths=lengths, n_layers=self.spec.n_layers, device=self.ort_device
        )
        self.encoder.run_with_iobinding(binding)
        src_mask, *cross = binding.get_outputs()
        return src_mask, cross

    def shrink_encoder_arena(self) -> None:
        """Gives back the chunks of the encoder's onnxruntime arena that nothing uses (serve/scheduler.py,
        after a burst): a one-token run under runtime/arena.py's shrinkage. The encoder's outputs are cut from
        its arena and live as long as their searches (encode's OrtValues), so a burst of long sources grows it
        as much as the decoder's, and no decoder round shrinks it. The run's outputs go into arrays of ours,
        as in the rounds' shrink_arena: one cut from the arena would pin the chunk it came from. CPU only (a
        CUDA session's arena is the device's; nothing here would free it)."""
        shrink = self._encoder_shrink
        if self.device != "cpu" or not shrink.enabled:
            return
        src, lengths = np.full((1, 1), self.spec.eos_id, np.int64), np.ones(1, np.int64)
        src_mask, cross = self.encode(src, lengths)  # cut from the arena: copied, then dropped
        ours = [np.empty_like(value.numpy()) for value in (src_mask, *cross)]
        del src_mask, cross
        n_layers = self.spec.n_layers
        b = bind_encoder(self.encoder, src=src, lengths=lengths, n_layers=n_layers, device="cpu", into=ours)
        shrink.run(self.encoder, b, shrink=True)

    def step(self, encoded: tuple, **shape) -> Step:
        """Returns the search's step (runtime/search.py) over the decoder driven, for sources encoded already.

        Args:
            encoded: encode()'s (src_mask, cross) of the sources.
            **shape: the decoder graph's step() keywords (runtime/fused_graph.py's FusedGraph.step, which
                StandardGraph.step mirrors): rows, the sources (sentences at the first step); top_k, the step
                returns a TopK of [rows, top_k] (ModelSpec.step_top_k), None every log-probability [rows,
                vocab]; max_length, the longest decoding (the fused step's buffers; BufferPool may round it
                up); beam_width, rows per sentence after the first step; writable, nothing reads `encoded`
                after the search, so the step may write into it (compaction).
        Returns:
            A FusedStep or a StandardStep; give it to recycle() once its search ended normally.
        """
        return self.decoder_graph.step(encoded, **shape)

    def recycle(self, step) -> None:
        """Offers a step's buffers to the next batch (a standard step has none). Call it only after a search
        that ended normally: one that raised may have left them half bound."""
        self.decoder_graph.recycle(step)

    def to_device(self, array: np.ndarray):
        """Returns a numpy array as an OrtValue on ort_device."""
        return ort.OrtValue.ortvalue_from_numpy(array, self.ort_device, 0)

    @property
    def standard_graph(self) -> StandardGraph:
        """The standard decoder as every caller drives it (runtime/standard_graph.py): the driven one, or the
        one loaded for return_attention and the continuous batcher where the fused one is driven."""
        if self._standard_graph is None:
            s = self.spec
            self._standard_graph = StandardGraph(
                self.standard_decoder,
                n_layers=s.n_layers,
                n_heads=s.n_heads,
                head_dim=s.head_dim,
                vocab=s.tgt_vocab,
                cache_dtype=self.cache_dtype,
                device=self.ort_device,
                to_device=self.to_device,
            )
        return self._standard_graph

    @property
    def standard_decoder(self):
        """The standard decoder's session: the driven one, or loaded and checked when first asked for
        (return_attention, the continuous batcher) where the fused one is driven (runtime/sessions.py)."""
        return self._sessions.standard

    def attention_decoder(self):
        """Returns the standard decoder with its cross_attention output checked.

        Raises:
            NoAttentionOutput: a bundle exported before 0.3 (runtime/attention.py).
        """
        check_attention_output(self.standard_decoder, self._path)
        return self.standard_decoder

    def attention(
        self, sources: list[list[int]], hypotheses: list[list[list[int]]], encoded: tuple
    ) -> list[list[np.ndarray]]:
        """Each source's hypotheses' cross-attention, by a forced pass (runtime/attention.py).

        Args:
            sources: encoder ids.
            hypotheses: per source, its hypotheses' ids (end token excluded).
            encoded: encode()'s (src_mask, cross) of these very sources.
        """
        n = max(len(h) for h in hypotheses)
        rows = [h[j] if j < len(h) else [] for h in hypotheses for j in range(n)]  # n rows per source
        src_mask, cross = encoded
        s = self.spec
        self.attention_decoder()  # checked: a bundle without the output is refused
        flat = forced_attention(
            self.standard_graph,
            src_mask=src_mask,
            cross=cross,
            rows_per_source=n,
            hypotheses=rows,
            source_lengths=[len(x) for x in sources],
            start_id=s.start_id,
            eos_id=s.eos_id,
        )
        return [flat[i * n : i * n + len(h)] for i, h in enumerate(hypotheses)]
