"""Translator: drives the encoder and decoder-step graphs of a bundle with onnxruntime.

Two decoders, two step classes side by side: the fused one (decoder_fused.onnx, onnxruntime's
com.microsoft kernels, runtime/fused_step.py) where the bundle has it and this onnxruntime runs
it on the chosen provider, else the standard-opset decoder.onnx (runtime/standard_step.py). The
device and session options come from runtime/sessions.py, the searches from runtime/search.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import sentencepiece as spm

from . import bundle as names
from .attention import check_attention_output, forced_attention
from .bundle import Bundle, BundleError, read_bundle
from .checks import check_graphs, check_tokenizers, read_graphs
from .fused_step import FusedStep, StepBufferPool
from .options import SearchOptions, SessionTuning, check_intra_threads, resolve_search_options
from .prefix import force_prefix
from .sampling import sample_program
from .search import SearchResult, beam_program, candidates_needed, greedy_program, run, stream_greedy
from .sessions import DEVICES, ort, open_sessions
from .source import Sources
from .standard_step import StandardStep
from .result import TranslationResult  # noqa: F401  (re-exported: the public result type)
from .text import text_increments
from .vocab import Vocabulary

_NP_DTYPE = {"float32": np.float32, "float16": np.float16}


class Translator:
    """Translates with a bundle made by `seq2onnx export`.

    Everything bundle.json states that the graphs or the tokenizers also state is checked at load (vocabulary sizes,
    special ids, layers, heads, head size, positions, dtype): a bundle that would translate garbage is refused at once.

    Args:
        bundle_dir: the bundle directory (bundle.json, encoder.onnx, decoder.onnx, tokenizers), or a
            Bundle that read_bundle returned (it keeps its files' bytes: `seq2onnx web` copies those).
        device: "auto" (CUDA where onnxruntime can run it, else the CPU), "cuda" or "cpu".
        intra_threads: threads inside each operator, 0 (onnxruntime's default, one per core) to os.cpu_count().
        check_hashes: verify every file's sha256 against bundle.json before loading.
        _tuning: SessionTuning, knobs for measuring the defaults (benchmarks only; another type is a TypeError).
    Attributes:
        decoder_variant, decoder_reason: "fused" or "standard", the decoder graph driven, and why.
    Raises:
        BundleError: the bundle is missing, damaged, of another format version, or its
            bundle.json disagrees with its graphs or tokenizers (the message names the field).
        ValueError: a bad device, intra_threads or check_hashes.
        RuntimeError: device="cuda" where CUDA cannot run, or _tuning forces the fused decoder where it cannot (says why).
    """

    def __init__(self, bundle_dir: str | Path, device: str = "auto", *, intra_threads: int = 0,
                 check_hashes: bool = True, _tuning: SessionTuning | None = None):
        if device not in DEVICES:
            raise ValueError(f"device={device!r}; choose 'auto', 'cuda' or 'cpu'")
        intra_threads = check_intra_threads(intra_threads)
        if not isinstance(check_hashes, bool):
            raise ValueError(f"check_hashes={check_hashes!r}; give True or False")
        tuning = SessionTuning() if _tuning is None else _tuning
        if not isinstance(tuning, SessionTuning):
            raise TypeError(f"_tuning is {type(tuning).__name__}; give a SessionTuning")
        self._tuning = tuning
        # Every file is read once, hash-checked on those bytes, and every session and tokenizer is made
        # from them: a bundle replaced on disk later cannot mix into this one (runtime/bundle.py).
        bundle = bundle_dir if isinstance(bundle_dir, Bundle) else read_bundle(bundle_dir, check_hashes=check_hashes)
        self.bundle = bundle
        cfg = self.bundle.model
        self.n_layers, self.n_heads, self.head_dim = cfg["n_decoder_layers"], cfg["n_heads"], cfg["d_model"] // cfg["n_heads"]
        self.max_positions = cfg["max_positions"]
        self.src_vocab, self.tgt_vocab = cfg["src_vocab_size"], cfg["tgt_vocab_size"]
        ids = self.bundle.special_ids
        self.pad_id, self.eos_id, self.start_id = ids["pad"], ids["eos"], ids["decoder_start"]
        self.cache_dtype = _NP_DTYPE[self.bundle.dtype]
        self._buffer_pool = StepBufferPool(n_layers=self.n_layers, n_heads=self.n_heads, head_dim=self.head_dim,
                                           vocab=self.tgt_vocab)  # the fused step's buffers between batches
        try:
            self.source_tokenizer = spm.SentencePieceProcessor(model_proto=bundle.bytes("source_tokenizer"))
            self.target_tokenizer = spm.SentencePieceProcessor(model_proto=bundle.bytes("target_tokenizer"))
        except BundleError:
            raise
        except Exception as e:
            raise BundleError(f"{bundle.path}: a SentencePiece model cannot be read: {e}") from e
        # Maps, prefixes and languages of an imported model (runtime/vocab.py); identity for ours.
        self.vocabulary = Vocabulary.of_bundle(bundle, self.source_tokenizer.get_piece_size(),
                                               self.target_tokenizer.get_piece_size())
        check_tokenizers(self.bundle, self.source_tokenizer, self.target_tokenizer, self.vocabulary)
        self._sources = Sources(self.source_tokenizer, pad_id=self.pad_id, eos_id=self.eos_id,
                                vocab=self.src_vocab, max_positions=self.max_positions, vocabulary=self.vocabulary)
        self._decode = self.vocabulary.decoder(self.target_tokenizer)
        graphs = read_graphs(bundle)  # every listed graph parsed, whichever decoder is driven
        # a bundle read here is ours: each graph's bytes may go once its session is made (lower peak memory)
        s = open_sessions(bundle, device, tuning, intra_threads, release_bytes=not isinstance(bundle_dir, Bundle),
                          check_late=lambda label, session: check_graphs(bundle, {label: session}, graphs))
        self.device, self.device_reason, self.encoder, self.decoder = s.device, s.device_reason, s.encoder, s.decoder
        self.decoder_variant, self.decoder_reason, self._sessions = s.variant, s.reason, s
        # every graph checked now; one not loaded yet (the standard decoder) from its file (runtime/onnx_info.py)
        check_graphs(bundle, {**graphs, **s.by_label()}, graphs)
        if not isinstance(bundle_dir, Bundle):
            self.bundle = bundle.without_data()  # the sessions hold what they need
        self._ort_device = "cuda" if self.device == "cuda" else "cpu"

    # -- public API -----------------------------------------------------------------------------

    def translate(self, text: str, *, beam_size: int | None = None, length_penalty: float | None = None,
                  max_decoding_length: int | None = None, min_decoding_length: int | None = None,
                  truncate: bool = False, sampling_temperature: float | None = None, sampling_topk: int = 0,
                  sampling_topp: float = 1.0, seed: int | None = None, source_lang: str | None = None,
                  target_lang: str | None = None) -> str:
        """Returns the best hypothesis (str) for one string.

        Args:
            text: the source text; the other options are translate_batch's.
        Raises:
            TypeError: text is not a str; ValueError: as translate_batch.
        """
        if not isinstance(text, str):
            raise TypeError(f"text is {type(text).__name__}; give a str (translate_batch takes lists)")
        options = self.search_options(
            beam_size=beam_size, length_penalty=length_penalty, max_decoding_length=max_decoding_length,
            min_decoding_length=min_decoding_length, truncate=truncate, sampling_temperature=sampling_temperature,
            sampling_topk=sampling_topk, sampling_topp=sampling_topp, seed=seed, source_lang=source_lang,
            target_lang=target_lang)
        return self._translate([text], options)[0].hypotheses[0]

    def translate_batch(self, source: Sequence[str | Sequence[int]], *, beam_size: int | None = None,
                        num_hypotheses: int = 1, length_penalty: float | None = None,
                        max_decoding_length: int | None = None, min_decoding_length: int | None = None,
                        return_scores: bool = False, return_attention: bool = False, truncate: bool = False,
                        max_batch_size: int = 32, sampling_temperature: float | None = None, sampling_topk: int = 0,
                        sampling_topp: float = 1.0, seed: int | None = None, source_lang: str | None = None,
                        target_lang: str | None = None, target_prefix: list | None = None) -> list[TranslationResult]:
        """Returns one TranslationResult per source, in the order given, for texts (or source token id lists).

        Args:
            source: texts, or source ids (the end token is added when missing). An empty or whitespace-only
                text gives an empty translation.
            beam_size: 1 is greedy search; default bundle.json's `decoding.beam_size`.
            num_hypotheses: the n-best to return per source (<= beam_size, or samples).
            length_penalty: α in score / len^α (docs/decoding.md); default bundle.json's.
            max_decoding_length: default max_length_a x source length + max_length_b, capped by the model's positions.
            min_decoding_length: the end token is forbidden before it; default bundle.json's.
            return_scores: fill TranslationResult.scores (log-probabilities, end token included).
            return_attention: fill TranslationResult.attention, computed after the search by a forced pass of the
                standard decoder, so hypotheses and scores are those without it.
            truncate: cut sources longer than the model's positions instead of refusing them.
            max_batch_size: sources decoded together (sorted by length: less padding).
            sampling_temperature: switches to random sampling; each sentence's sample depends only on the seed and
                the sentence, not on its batch.
            sampling_topk, sampling_topp: sample among the k best (0: all), within this probability mass (1.0: all).
            seed: the sampling seed.
            source_lang, target_lang: language codes of a multilingual model (bundle.json's tokens.languages): the
                source's leading token, and the target token forced first (as transformers' forced_bos_token_id).
            target_prefix: per source, a list of target ids forced at the start (CTranslate2's target_prefix; each adds
                0 to the score, docs/decoding.md); it replaces target_lang's token. The ids are in token_ids.
        Raises:
            TypeError: an item that is neither a str nor ids.
            ValueError: a source longer than the model's positions (unless truncate) or an option of
                a wrong type or range (the message names the option, its value and the fix).
        """
        options = self.search_options(
            beam_size=beam_size, num_hypotheses=num_hypotheses, length_penalty=length_penalty,
            max_decoding_length=max_decoding_length, min_decoding_length=min_decoding_length,
            return_scores=return_scores, return_attention=return_attention, truncate=truncate,
            max_batch_size=max_batch_size,
            sampling_temperature=sampling_temperature, sampling_topk=sampling_topk, sampling_topp=sampling_topp,
            seed=seed, source_lang=source_lang, target_lang=target_lang, target_prefix=target_prefix)
        return self._translate(source, options)

    def search_options(self, **options) -> SearchOptions:
        """Returns SearchOptions, with the bundle's beam_size, length_penalty, min_decoding_length where None or left out.

        Args:
            **options: translate_batch's options by name; all are checked against the model too.
        Raises:
            ValueError: a value of the wrong type or range; TypeError: an unknown name.
        """
        return resolve_search_options(options, self.bundle.decoding, self.max_positions, self.tgt_vocab)

    def generate_tokens(self, text: str, *, max_decoding_length: int | None = None,
                        min_decoding_length: int | None = None, truncate: bool = False, source_lang: str | None = None,
                        target_lang: str | None = None) -> Iterator[str]:
        """Yields the greedy translation of one text piece by piece, as soon as each token is decided.

        Each piece is what its token adds to the detokenised text (held back while an incomplete UTF-8 byte sequence): the
        pieces join to translate(text, beam_size=1) exactly, spaces included. Options are checked at this call, not later.

        Args:
            text: the source text; the other options are translate_batch's.
        Raises:
            TypeError: text is not a str; ValueError: as translate_batch, or min_decoding_length >= the text's maximum length.
        """
        if not isinstance(text, str):
            raise TypeError(f"text is {type(text).__name__}; give a str")
        options = self.search_options(beam_size=1, max_decoding_length=max_decoding_length,
                                      min_decoding_length=min_decoding_length, truncate=truncate,
                                      source_lang=source_lang, target_lang=target_lang)
        return self._stream_text(text, options)

    def _stream_text(self, text: str, options: SearchOptions) -> Iterator[str]:
        """generate_tokens with checked options (beam_size 1; serve/ streams with it)."""
        source_prefix, [target_prefix] = self._prefixes(1, options)
        ids = self._sources.ids(0, text, options.truncate, source_prefix)
        if ids is None:
            return iter(())
        [limit] = self._max_lengths([ids], options)
        if options.min_decoding_length >= limit:  # now, not when the first piece is taken
            raise ValueError(
                f"min_decoding_length={options.min_decoding_length} is not below this text's maximum length {limit} "
                f"(max_length_a x {len(ids)} tokens + max_length_b in bundle.json, at most max_positions): pass a "
                "larger max_decoding_length or a smaller min_decoding_length"
            )
        return self._stream(ids, int(limit), options.min_decoding_length, target_prefix)

    def translate_iterable(self, lines: Iterable[str], *, read_batch_size: int = 256, **options) -> Iterator[TranslationResult]:
        """Yields the TranslationResult of each line of a stream, in input order.

        Args:
            lines: the source texts.
            read_batch_size: lines read, then translated, at a time.
            **options: translate_batch's, checked when this is called.
        Raises:
            ValueError: a bad read_batch_size or option; TypeError: an unknown option.
        """
        if isinstance(read_batch_size, bool) or not isinstance(read_batch_size, int) or read_batch_size < 1:
            raise ValueError(f"read_batch_size={read_batch_size!r}; give an int >= 1")
        resolved = self.search_options(**options)
        return self._iterate(lines, read_batch_size, resolved)

    def prepare_source(self, text: str, *, truncate: bool = False, source_lang: str | None = None,
                       target_lang: str | None = None) -> tuple[list[int], bool]:
        """Returns (ids, whether they were cut) of one text, as translate_batch feeds the ids to the encoder.

        The ids end with the end token; an empty or whitespace-only text gives ([], False). A huge text costs
        only what its first positions need: it is tokenised by prefixes (runtime/source.py says why the ids are the same).

        Args:
            text: the source text.
            truncate: cut the ids to the model's positions instead of refusing the text.
            source_lang, target_lang: as translate_batch's (they choose a multilingual model's source prefix).
        Raises:
            TypeError: text is not a str; ValueError: too many tokens without truncate (naming both counts and the fix).
        """
        if not isinstance(text, str):
            raise TypeError(f"text is {type(text).__name__}; give a str")
        if not text.strip():
            return [], False
        prefix, _ = self._prefixes(1, self.search_options(source_lang=source_lang, target_lang=target_lang))
        return self._sources.prepare(text, truncate, prefix)

    # -- internals ------------------------------------------------------------------------------

    def _iterate(self, lines: Iterable[str], read_batch_size: int, options: SearchOptions) -> Iterator[TranslationResult]:
        buffer: list[str] = []
        for line in lines:
            buffer.append(line)
            if len(buffer) >= read_batch_size:
                yield from self._translate(buffer, options)
                buffer = []
        if buffer:
            yield from self._translate(buffer, options)

    def _prefixes(self, n: int, options: SearchOptions) -> tuple[list[int], list[list[int]]]:
        return self.vocabulary.prefixes(n, source_lang=options.source_lang, target_lang=options.target_lang,
                                        target_prefix=options.target_prefix, tgt_vocab=self.tgt_vocab, eos_id=self.eos_id)

    def _forced_end(self, max_lengths) -> dict:
        """force_prefix's end-token options: the bundle's decoding.forced_eos (transformers' forced_eos_token_id)."""
        return {"end_id": self.eos_id, "max_lengths": max_lengths} if self.bundle.decoding.get("forced_eos") else {}

    def _stream(self, ids: list[int], limit: int, min_length: int, target_prefix: list[int]) -> Iterator[str]:
        step = force_prefix(self._step_fn(np.array([ids], dtype=np.int64), np.array([len(ids)], dtype=np.int64),
                                          top_k=self._top_k(1, min_length), max_length=limit), [target_prefix],
                            **self._forced_end([limit]))

        def tokens() -> Iterator[int]:
            yield from stream_greedy(step, start_id=self.start_id, eos_id=self.eos_id, max_length=limit,
                                     min_length=min_length)
            self._recycle(step)  # once the stream is read to its end

        return text_increments(self._decode, tokens())

    def _translate(self, source, options: SearchOptions) -> list[TranslationResult]:
        if isinstance(source, (str, bytes)):
            raise TypeError("translate_batch takes a list of sources; for one string use translate(text)")
        n = options.num_hypotheses
        source_prefix, target_prefixes = self._prefixes(len(source), options)
        ids = [self._sources.ids(i, item, options.truncate, source_prefix) for i, item in enumerate(source)]
        results: list[TranslationResult | None] = [None] * len(ids)
        todo = [i for i, s in enumerate(ids) if s is not None]
        limits = dict(zip(todo, self._max_lengths([ids[i] for i in todo], options)))
        for i in todo:
            if options.min_decoding_length >= limits[i]:
                raise ValueError(
                    f"source {i}: min_decoding_length={options.min_decoding_length} is not below its maximum length "
                    f"{limits[i]} (max_length_a x {len(ids[i])} tokens + max_length_b in bundle.json, at most "
                    f"max_positions): pass a larger max_decoding_length or a smaller min_decoding_length"
                )
        if options.return_attention:
            self._attention_decoder()  # a bundle without the output is refused before searching
        for i, s in enumerate(ids):
            if s is None:  # empty text: nothing to translate
                results[i] = TranslationResult([""] * n, [[]] * n, [0.0] * n if options.return_scores else None,
                                               [np.zeros((0, 0), np.float32)] * n if options.return_attention else None)
        todo.sort(key=lambda i: len(ids[i]))  # similar lengths share a batch: less padding
        for start in range(0, len(todo), options.max_batch_size):
            chunk = todo[start : start + options.max_batch_size]
            found, encoded = self._search([ids[i] for i in chunk], np.array([limits[i] for i in chunk], dtype=np.int64),
                                          options, [target_prefixes[i] for i in chunk])
            found_tokens = [[h[:-1] if h and h[-1] == self.eos_id else h for h in r.hypotheses] for r in found]
            attention = (self._attention([ids[i] for i in chunk], found_tokens, encoded) if options.return_attention
                         else [None] * len(chunk))
            for i, r, tokens, weights in zip(chunk, found, found_tokens, attention):
                results[i] = TranslationResult([self._decode(t) for t in tokens], tokens,
                                               r.scores if options.return_scores else None, weights)
        return results  # type: ignore[return-value]

    @property
    def _standard_decoder(self):
        """The standard decoder's session: the driven one, or loaded and checked when first asked for
        (return_attention, the continuous batcher) where the fused one is driven (runtime/sessions.py)."""
        return self._sessions.standard

    def _attention_decoder(self):
        """The standard decoder (loaded and checked with the bundle), with its cross_attention output."""
        check_attention_output(self._standard_decoder, self.bundle.path)
        return self._standard_decoder

    def _attention(self, sources: list[list[int]], hypotheses: list[list[list[int]]], encoded) -> list[list[np.ndarray]]:
        """Each source's hypotheses' cross-attention, by a forced pass (runtime/attention.py). encoded is the search's
        (src_mask, cross) of these very sources, or None (sampling encodes each source once per sample row): encoded here."""
        n = max(len(h) for h in hypotheses)
        rows = [h[j] if j < len(h) else [] for h in hypotheses for j in range(n)]  # n rows per source
        src_mask, cross = encoded if encoded is not None else self._encode(*self._sources.pad(sources))
        flat = forced_attention(self._attention_decoder(), src_mask=src_mask, cross=cross, rows_per_source=n,
                                hypotheses=rows, source_lengths=[len(s) for s in sources], start_id=self.start_id,
                                eos_id=self.eos_id, n_heads=self.n_heads, head_dim=self.head_dim,
                                cache_dtype=self.cache_dtype, to_device=self._to_device, device=self._ort_device)
        return [flat[i * n : i * n + len(h)] for i, h in enumerate(hypotheses)]

    def _max_lengths(self, sources: list[list[int]], options: SearchOptions) -> np.ndarray:
        if options.max_decoding_length is not None:
            return np.full(len(sources), options.max_decoding_length, dtype=np.int64)
        a, b = self.bundle.decoding["max_length_a"], self.bundle.decoding["max_length_b"]
        return np.array([min(int(a * len(s)) + b, self.max_positions) for s in sources], dtype=np.int64)

    def _top_k(self, beam_size: int, min_length: int) -> int | None:
        """Candidates per row to download from the graph's TopK (None: the full log-probabilities)."""
        if not self._tuning.top_k_from_graph:
            return None
        return min(candidates_needed(beam_size, min_length), self.tgt_vocab)

    def _search(self, sources: list[list[int]], max_lengths: np.ndarray, options: SearchOptions,
                prefixes: list[list[int]]) -> tuple:
        """(results, encoded): encoded is the encoder's (src_mask, cross) of `sources`, which the search
        leaves unchanged, for the attention pass to reuse; None after sampling (its rows repeat sources)."""
        program, step, encoded = self._search_program(sources, max_lengths, options, prefixes)
        found = run(program, step)
        self._recycle(step)
        return found, encoded

    def _search_program(self, sources: list[list[int]], max_lengths: np.ndarray, options: SearchOptions,
                        prefixes: list[list[int]]) -> tuple:
        """(program, step, encoded): the search of `sources` as a program (runtime/search.py), not started, and the
        step that answers it (serve/batcher.py drives many programs with one decoder run per step)."""
        common = dict(start_id=self.start_id, eos_id=self.eos_id, min_length=options.min_decoding_length)
        if options.sampling:
            # n independent samples per source, each row keyed by (hypothesis, source ids) so that
            # its generator, hence its sample, does not depend on the rest of the batch.
            n = options.num_hypotheses
            rows = [s for s in sources for _ in range(n)]
            keys = [[h, len(s), *s] for s in sources for h in range(n)]
            step = force_prefix(self._step_fn(*self._sources.pad(rows), top_k=None,  # sampling needs every log-prob
                                              max_length=int(max_lengths.max())), [p for p in prefixes for _ in range(n)],
                                **self._forced_end(np.repeat(max_lengths, n)))
            flat = sample_program(len(rows), temperature=options.sampling_temperature, top_k=options.sampling_topk,
                                  top_p=options.sampling_topp, seed=options.seed, row_keys=keys,
                                  max_lengths=np.repeat(max_lengths, n), **common)
            return _regroup(flat, n, len(sources)), step, None
        src, lengths = self._sources.pad(sources)
        encoded = self._encode(src, lengths)
        step = force_prefix(self._step_fn(src, lengths, top_k=self._top_k(options.beam_size, options.min_decoding_length),
                                          max_length=int(max_lengths.max()), beam_width=options.beam_size, encoded=encoded),
                            prefixes, **self._forced_end(max_lengths))
        if options.beam_size == 1:
            return greedy_program(len(sources), max_lengths=max_lengths, **common), step, encoded
        return beam_program(len(sources), beam_size=options.beam_size, length_penalty=options.length_penalty,
                            num_hypotheses=options.num_hypotheses, max_lengths=max_lengths,
                            convention=self.bundle.decoding.get("beam_convention", "fairseq"), **common), step, encoded

    def _recycle(self, step) -> None:
        """Offers a fused step's buffers to the next batch (the standard step has none). Called only
        after a search that ended normally: one that raised may have left them half bound."""
        self._buffer_pool.give(getattr(getattr(step, "inner", step), "buffers", None))  # inner: under force_prefix

    def _to_device(self, array: np.ndarray) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(array, self._ort_device, 0)

    def _encode(self, src: np.ndarray, lengths: np.ndarray) -> tuple:
        """The encoder's src_mask and cross keys/values, left on the device as OrtValues."""
        binding = self.encoder.io_binding()
        binding.bind_cpu_input(names.SRC_IDS, src)
        binding.bind_cpu_input(names.SRC_LENGTHS, lengths)
        for name in [names.SRC_MASK, *names.cross_names(self.n_layers)]:
            binding.bind_output(name, self._ort_device)
        self.encoder.run_with_iobinding(binding)
        src_mask, *cross = binding.get_outputs()
        return src_mask, cross

    def _step_fn(self, src: np.ndarray, lengths: np.ndarray, top_k: int | None, *, max_length: int,
                 beam_width: int = 1, encoded: tuple | None = None):
        """Returns the search's step over the decoder graph, encoding the sources once (unless `encoded`: _encode(src, lengths)).

        With top_k the step downloads the graph's TopK outputs ([rows, top_k]); without, all log-probabilities ([rows, vocab]).
        max_length (the batch's longest decoding; StepBufferPool may round it up) and beam_width size the fused cache buffers."""
        src_mask, cross = encoded if encoded is not None else self._encode(src, lengths)
        if self.decoder_variant == names.FUSED:
            rows = src.shape[0] * beam_width
            max_length = self._buffer_pool.positions(rows, beam_width, max_length, top_k)
            return FusedStep(self.decoder, src_mask=src_mask.numpy(), cross=[c.numpy() for c in cross],
                             n_layers=self.n_layers, n_heads=self.n_heads, head_dim=self.head_dim,
                             beam_width=beam_width, max_length=max_length, top_k=top_k, vocab=self.tgt_vocab,
                             buffers=self._buffer_pool.take(rows, beam_width, max_length, top_k))
        return StandardStep(self.decoder, rows=src.shape[0], src_mask=src_mask, cross=cross, n_layers=self.n_layers,
                            n_heads=self.n_heads, head_dim=self.head_dim, cache_dtype=self.cache_dtype, top_k=top_k,
                            vocab=self.tgt_vocab, to_device=self._to_device, device=self._ort_device)


def _regroup(program, n: int, sources: int):
    """A sampling program's flat results (n rows per source) as one SearchResult of n hypotheses per source."""
    flat = yield from program
    return [SearchResult([h for r in flat[i * n:(i + 1) * n] for h in r.hypotheses],
                         [x for r in flat[i * n:(i + 1) * n] for x in r.scores]) for i in range(sources)]
