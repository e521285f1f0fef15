"""Translator: drives the encoder and decoder-step graphs of a bundle with onnxruntime.

The decoder's key/value cache never leaves the device: each step binds the previous step's
`present_*` OrtValues as the next step's `past_*` inputs (IO binding), uploads only the new
tokens, the step and the cache indices, and downloads only the log-probabilities.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import onnxruntime as ort
import sentencepiece as spm

from . import bundle as names
from .bundle import BundleError, read_bundle
from .search import SearchResult, TopK, beam_search, candidates_needed, greedy_search, sample, stream_greedy

_NP_DTYPE = {"float32": np.float32, "float16": np.float16}


@dataclass(frozen=True)
class TranslationResult:
    """One source's n-best: detokenised text, target ids (end token excluded), scores (sum of
    log-probabilities, end token included) when asked for."""

    hypotheses: list[str]
    token_ids: list[list[int]]
    scores: list[float] | None = None

    def __repr__(self) -> str:
        scores = "" if self.scores is None else f", scores={[round(s, 4) for s in self.scores]}"
        return f"TranslationResult(hypotheses={self.hypotheses!r}{scores})"


def _cuda_usable() -> tuple[bool, str]:
    """Whether onnxruntime can run its CUDA provider here, and why not."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False, f"this onnxruntime ({ort.__version__}) has no CUDA provider; install onnxruntime-gpu"
    try:
        ctypes.CDLL("libcuda.so.1" if os.name != "nt" else "nvcuda.dll")
    except OSError:
        return False, "no NVIDIA driver found (libcuda could not be loaded): this machine has no usable GPU"
    return True, ""


class Translator:
    """Translates with a bundle made by `seq2onnx export`.

    Args:
        bundle_dir: the bundle directory (bundle.json, encoder.onnx, decoder.onnx, tokenizers).
        device: "auto" (CUDA where onnxruntime can run it, else the CPU), "cuda" or "cpu".
        intra_threads: threads inside each operator (0: onnxruntime's default, the core count).
        optimization: onnxruntime graph optimization level, "all" (default), "extended", "basic"
            or "none" (for measuring what the optimizations bring).
        top_k_from_graph: download each step's 2K candidates from the decoder's TopK outputs
            (default) rather than the full [rows, vocab] log-probabilities (for measuring).
        check_hashes: verify every file's sha256 against bundle.json before loading.
        thread_spinning: let onnxruntime's idle intra-op threads spin between operators
            (onnxruntime's own default). Off by default here: between two decoder steps the search
            runs in Python, and a spinning thread takes a core from it (greedy decoding at batch 1
            ran 2x faster on 2 cores without spinning; docs/optimisation-notes.md, row 5).
    Raises:
        BundleError: the bundle is missing, damaged or of another format version.
        RuntimeError: device="cuda" where CUDA cannot run (the message says why).
    """

    def __init__(self, bundle_dir: str | Path, device: str = "auto", *, intra_threads: int = 0,
                 check_hashes: bool = True, optimization: str = "all", top_k_from_graph: bool = True,
                 thread_spinning: bool = False):
        if device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"device={device!r}; choose 'auto', 'cuda' or 'cpu'")
        self.bundle = read_bundle(bundle_dir, check_hashes=check_hashes)
        cfg = self.bundle.model
        self.n_layers, self.n_heads, self.head_dim = cfg["n_decoder_layers"], cfg["n_heads"], cfg["d_model"] // cfg["n_heads"]
        self.max_positions = cfg["max_positions"]
        self.tgt_vocab = cfg["tgt_vocab_size"]
        ids = self.bundle.special_ids
        self.pad_id, self.eos_id, self.start_id = ids["pad"], ids["eos"], ids["decoder_start"]
        self.cache_dtype = _NP_DTYPE[self.bundle.dtype]
        options = ort.SessionOptions()
        levels = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL, "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                  "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}
        if optimization not in levels:
            raise ValueError(f"optimization={optimization!r}; choose one of {', '.join(levels)}")
        options.graph_optimization_level = levels[optimization]
        self.top_k_from_graph = top_k_from_graph
        options.intra_op_num_threads = intra_threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if thread_spinning else "0")
        options.log_severity_level = 3  # no warnings about provider fallbacks on stderr
        self.device, self.device_reason = self._pick_device(device)
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if self.device == "cuda" else ["CPUExecutionProvider"]
        try:
            self.encoder = ort.InferenceSession(str(self.bundle.file("encoder")), options, providers=providers)
            self.decoder = ort.InferenceSession(str(self.bundle.file("decoder")), options, providers=providers)
        except Exception as e:  # onnxruntime raises its own types for unreadable graphs
            raise BundleError(f"{self.bundle.path}: onnxruntime cannot load the graphs: {e}") from e
        if self.device == "cuda" and self.decoder.get_providers()[0] != "CUDAExecutionProvider":
            if device == "cuda":
                raise RuntimeError("onnxruntime's CUDA provider did not start (check the CUDA and cuDNN libraries)")
            self.device, self.device_reason = "cpu", "the CUDA provider did not start; using the CPU"
        self._check_graphs()
        try:
            self.source_tokenizer = spm.SentencePieceProcessor(model_file=str(self.bundle.file("source_tokenizer")))
            self.target_tokenizer = spm.SentencePieceProcessor(model_file=str(self.bundle.file("target_tokenizer")))
        except Exception as e:
            raise BundleError(f"{self.bundle.path}: a SentencePiece model cannot be read: {e}") from e
        self._ort_device = "cuda" if self.device == "cuda" else "cpu"

    @staticmethod
    def _pick_device(device: str) -> tuple[str, str]:
        if device == "cpu":
            return "cpu", "asked for the CPU"
        usable, why = _cuda_usable()
        if usable:
            if hasattr(ort, "preload_dlls"):
                try:
                    ort.preload_dlls()
                except Exception:  # older wheels or CUDA libraries found another way
                    pass
            return "cuda", "onnxruntime's CUDA provider"
        if device == "cuda":
            raise RuntimeError(f"device='cuda' cannot run: {why}; use device='cpu' or 'auto'")
        return "cpu", why

    def _check_graphs(self) -> None:
        """The graphs' inputs and outputs are those bundle.json and this runtime expect."""
        for label, session in (("encoder", self.encoder), ("decoder", self.decoder)):
            spec = self.bundle.meta["graphs"][label]
            have = ([i.name for i in session.get_inputs()], [o.name for o in session.get_outputs()])
            want = ([i["name"] for i in spec["inputs"]], [o["name"] for o in spec["outputs"]])
            if sorted(have[0]) != sorted(want[0]) or sorted(have[1]) != sorted(want[1]):
                raise BundleError(
                    f"{self.bundle.file(label)}: its inputs/outputs {have} differ from bundle.json's {want}"
                )

    # -- public API -----------------------------------------------------------------------------

    def translate(self, text: str, **options) -> str:
        """Translates one string; options as for translate_batch."""
        return self.translate_batch([text], **options)[0].hypotheses[0]

    def translate_batch(
        self,
        source: Sequence[str | Sequence[int]],
        *,
        beam_size: int | None = None,
        num_hypotheses: int = 1,
        length_penalty: float | None = None,
        max_decoding_length: int | None = None,
        min_decoding_length: int | None = None,
        return_scores: bool = False,
        truncate: bool = False,
        max_batch_size: int = 32,
        sampling_temperature: float | None = None,
        sampling_topk: int = 0,
        sampling_topp: float = 1.0,
        seed: int | None = None,
    ) -> list[TranslationResult]:
        """Translates texts (or source token id lists) and returns one result per source, in order.

        beam_size 1 is greedy search; sampling_temperature switches to random sampling.
        max_decoding_length defaults to max_length_a x source length + max_length_b (bundle.json),
        capped by the model's positions. An empty or whitespace-only text gives an empty translation.
        Raises TypeError for items that are neither str nor ids, ValueError for a source longer than
        the model's positions (unless truncate=True) and for impossible settings.
        """
        defaults = self.bundle.decoding
        beam_size = defaults["beam_size"] if beam_size is None else beam_size
        length_penalty = defaults["length_penalty"] if length_penalty is None else length_penalty
        min_decoding_length = defaults.get("min_length", 0) if min_decoding_length is None else min_decoding_length
        if isinstance(source, (str, bytes)):
            raise TypeError("translate_batch takes a list of sources; for one string use translate(text)")
        if beam_size < 1:
            raise ValueError(f"beam_size={beam_size}; it must be at least 1 (1 is greedy search)")
        if sampling_temperature is None and not 1 <= num_hypotheses <= beam_size:
            raise ValueError(f"num_hypotheses={num_hypotheses} must lie in [1, beam_size={beam_size}]")
        if num_hypotheses < 1:
            raise ValueError(f"num_hypotheses={num_hypotheses}; it must be at least 1")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size}; it must be at least 1")
        if max_decoding_length is not None and not 1 <= max_decoding_length <= self.max_positions:
            raise ValueError(
                f"max_decoding_length={max_decoding_length}; this model has {self.max_positions} positions "
                "(max_positions in bundle.json): choose 1..that"
            )
        ids = [self._source_ids(i, item, truncate) for i, item in enumerate(source)]
        results: list[TranslationResult | None] = [None] * len(ids)
        todo = [i for i, s in enumerate(ids) if s is not None]
        for i, s in enumerate(ids):
            if s is None:  # empty text: nothing to translate
                results[i] = TranslationResult([""] * num_hypotheses, [[]] * num_hypotheses,
                                               [0.0] * num_hypotheses if return_scores else None)
        todo.sort(key=lambda i: len(ids[i]))  # similar lengths share a batch: less padding
        for start in range(0, len(todo), max_batch_size):
            chunk = todo[start : start + max_batch_size]
            found = self._search([ids[i] for i in chunk], beam_size=beam_size, num_hypotheses=num_hypotheses,
                                 length_penalty=length_penalty, max_decoding_length=max_decoding_length,
                                 min_decoding_length=min_decoding_length, sampling_temperature=sampling_temperature,
                                 sampling_topk=sampling_topk, sampling_topp=sampling_topp, seed=seed)
            for i, r in zip(chunk, found):
                tokens = [h[:-1] if h and h[-1] == self.eos_id else h for h in r.hypotheses]
                results[i] = TranslationResult([self.target_tokenizer.decode(t) for t in tokens], tokens,
                                               r.scores if return_scores else None)
        return results  # type: ignore[return-value]

    def generate_tokens(self, text: str, *, max_decoding_length: int | None = None,
                        min_decoding_length: int = 0) -> Iterator[str]:
        """Greedy decoding of one text, yielding each target piece as soon as it is decided."""
        ids = self._source_ids(0, text, False)
        if ids is None:
            return
        limit = self._max_lengths([ids], max_decoding_length)[0]
        step = self._step_fn(np.array([ids], dtype=np.int64), np.array([len(ids)], dtype=np.int64),
                             top_k=candidates_needed(1, min_decoding_length))
        for token in stream_greedy(step, start_id=self.start_id, eos_id=self.eos_id, max_length=int(limit),
                                   min_length=min_decoding_length):
            yield self.target_tokenizer.id_to_piece(token)

    def translate_iterable(self, lines: Iterable[str], *, read_batch_size: int = 256, **options) -> Iterator[TranslationResult]:
        """Translates a stream of lines, reading read_batch_size at a time, yielding in input order."""
        buffer: list[str] = []
        for line in lines:
            buffer.append(line)
            if len(buffer) >= read_batch_size:
                yield from self.translate_batch(buffer, **options)
                buffer = []
        if buffer:
            yield from self.translate_batch(buffer, **options)

    # -- internals ------------------------------------------------------------------------------

    def prepare_source(self, text: str, *, truncate: bool = False) -> tuple[list[int], bool]:
        """Source token ids of one text, end token included, as translate_batch feeds them to the
        encoder, and whether they were cut to the model's positions. An empty or whitespace-only
        text gives ([], False).

        Raises ValueError when the text has more tokens than the model's positions and truncate
        is False (the message names both numbers and the fix).
        """
        if not isinstance(text, str):
            raise TypeError(f"text is {type(text).__name__}; give a str")
        if not text.strip():
            return [], False
        # Lone surrogates cannot be encoded as UTF-8: replace them rather than fail inside spm.
        if not text.isascii():
            text = text.encode("utf-8", "replace").decode("utf-8")
        ids = self.source_tokenizer.encode(text) + [self.eos_id]
        if len(ids) <= self.max_positions:
            return ids, False
        if not truncate:
            raise ValueError(
                f"{len(ids)} tokens; this model was exported for at most {self.max_positions} positions "
                "(max_positions in bundle.json): shorten it or pass truncate=True"
            )
        return ids[: self.max_positions - 1] + [self.eos_id], True

    def _source_ids(self, index: int, item, truncate: bool) -> list[int] | None:
        vocab = self.bundle.model["src_vocab_size"]
        if isinstance(item, str):
            try:
                ids, _ = self.prepare_source(item, truncate=truncate)
            except ValueError as e:
                raise ValueError(f"source {index} has {e}") from None
            return ids or None
        if isinstance(item, (list, tuple, np.ndarray)) and all(isinstance(x, (int, np.integer)) for x in item):
            ids = [int(x) for x in item]
            if not ids:
                return None
            bad = [x for x in ids if not 0 <= x < vocab]
            if bad:
                raise ValueError(f"source {index}: token ids {bad[:5]} are outside the source vocabulary [0, {vocab})")
            if ids[-1] != self.eos_id:
                ids.append(self.eos_id)
        else:
            raise TypeError(f"source {index} is {type(item).__name__}; give a str or a list of token ids")
        if len(ids) > self.max_positions:
            if not truncate:
                raise ValueError(
                    f"source {index} has {len(ids)} tokens; this model was exported for at most "
                    f"{self.max_positions} positions (max_positions in bundle.json): shorten it or pass truncate=True"
                )
            ids = ids[: self.max_positions - 1] + [self.eos_id]
        return ids

    def _max_lengths(self, sources: list[list[int]], max_decoding_length: int | None) -> np.ndarray:
        if max_decoding_length is not None:
            return np.full(len(sources), max_decoding_length, dtype=np.int64)
        a, b = self.bundle.decoding["max_length_a"], self.bundle.decoding["max_length_b"]
        return np.array([min(int(a * len(s)) + b, self.max_positions) for s in sources], dtype=np.int64)

    def _search(self, sources: list[list[int]], *, beam_size, num_hypotheses, length_penalty, max_decoding_length,
                min_decoding_length, sampling_temperature, sampling_topk, sampling_topp, seed) -> list[SearchResult]:
        if sampling_temperature is not None and num_hypotheses > 1:
            # n independent samples per source: each source decoded n times in one batch
            flat = self._search([s for s in sources for _ in range(num_hypotheses)], beam_size=1, num_hypotheses=1,
                                length_penalty=length_penalty, max_decoding_length=max_decoding_length,
                                min_decoding_length=min_decoding_length, sampling_temperature=sampling_temperature,
                                sampling_topk=sampling_topk, sampling_topp=sampling_topp, seed=seed)
            n = num_hypotheses
            return [SearchResult([h for r in flat[i * n:(i + 1) * n] for h in r.hypotheses],
                                 [x for r in flat[i * n:(i + 1) * n] for x in r.scores]) for i in range(len(sources))]
        lengths = np.array([len(s) for s in sources], dtype=np.int64)
        src = np.full((len(sources), int(lengths.max())), self.pad_id, dtype=np.int64)
        for row, s in enumerate(sources):
            src[row, : len(s)] = s
        # Sampling needs the whole distribution; searches need only their candidates.
        top_k = candidates_needed(beam_size, min_decoding_length)
        if sampling_temperature is not None or not self.top_k_from_graph:
            top_k = None
        step = self._step_fn(src, lengths, top_k=min(top_k, self.tgt_vocab) if top_k else None)
        common = dict(start_id=self.start_id, eos_id=self.eos_id, max_lengths=self._max_lengths(sources, max_decoding_length),
                      min_length=min_decoding_length)
        if sampling_temperature is not None:
            return sample(step, len(sources), temperature=sampling_temperature, top_k=sampling_topk, top_p=sampling_topp,
                          seed=seed, **common)
        if beam_size == 1:
            return greedy_search(step, len(sources), **common)
        return beam_search(step, len(sources), beam_size=beam_size, length_penalty=length_penalty,
                           num_hypotheses=num_hypotheses, **common)

    def _to_device(self, array: np.ndarray) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(array, self._ort_device, 0)

    def _step_fn(self, src: np.ndarray, lengths: np.ndarray, top_k: int | None):
        """Encodes the sources once and returns the search's step over the decoder graph.

        With top_k the step downloads the graph's TopK outputs ([rows, top_k]); without, the full
        log-probabilities ([rows, vocab])."""
        binding = self.encoder.io_binding()
        binding.bind_cpu_input(names.SRC_IDS, src)
        binding.bind_cpu_input(names.SRC_LENGTHS, lengths)
        for name in [names.SRC_MASK, *names.cross_names(self.n_layers)]:
            binding.bind_output(name, self._ort_device)
        self.encoder.run_with_iobinding(binding)
        src_mask, *cross = binding.get_outputs()
        empty = np.zeros((src.shape[0], self.n_heads, 0, self.head_dim), dtype=self.cache_dtype)
        state = {"past": [self._to_device(empty) for _ in range(2 * self.n_layers)], "cross": cross, "mask": src_mask}
        wanted = [names.LOG_PROBS] if top_k is None else [names.TOPK_LOG_PROBS, names.TOPK_IDS]
        k_input = np.array([top_k or 1], dtype=np.int64)
        cross_names, past_names, present_names = (names.cross_names(self.n_layers), names.past_names(self.n_layers),
                                                  names.present_names(self.n_layers))

        def step(tokens: np.ndarray, cache_indices: np.ndarray, t: int, keep: np.ndarray | None) -> np.ndarray:
            if keep is not None:
                # Finished sentences leave: their cross keys/values and mask go too. This happens
                # a few times per batch, not per step, so a round trip through the host is cheap.
                state["cross"] = [self._to_device(np.ascontiguousarray(v.numpy()[keep])) for v in state["cross"]]
                state["mask"] = self._to_device(np.ascontiguousarray(state["mask"].numpy()[keep]))
            b = self.decoder.io_binding()
            b.bind_cpu_input(names.TOKENS, np.ascontiguousarray(tokens, dtype=np.int64))
            b.bind_cpu_input(names.STEP, np.array([t], dtype=np.int64))
            b.bind_cpu_input(names.CACHE_INDICES, np.ascontiguousarray(cache_indices, dtype=np.int64))
            b.bind_cpu_input(names.TOP_K, k_input)
            for name, value in zip(past_names, state["past"]):
                b.bind_ortvalue_input(name, value)
            for name, value in zip(cross_names, state["cross"]):
                b.bind_ortvalue_input(name, value)
            b.bind_ortvalue_input(names.SRC_MASK, state["mask"])
            for name in present_names:
                b.bind_output(name, self._ort_device)
            for name in wanted:
                b.bind_output(name, "cpu")  # only what the search needs comes down
            self.decoder.run_with_iobinding(b)
            outputs = b.get_outputs()
            state["past"] = outputs[: len(present_names)]
            if top_k is None:
                return outputs[-1].numpy()
            return TopK(outputs[-2].numpy(), outputs[-1].numpy(), self.tgt_vocab)

        return step
