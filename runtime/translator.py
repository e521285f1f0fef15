"""Translator: a bundle loaded (its files read once and checked, its tokenizers and sessions made) and the
public API over it. The sessions are driven through runtime/graphs.py, planning is runtime/plan.py's, the
searches runtime/search.py's and runtime/beam.py's; the device comes from runtime/devices.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from .bundle import Bundle, read_bundle
from .checks import check_graphs, check_tokenizers, read_graphs
from .graphs import Graphs
from .model_spec import ModelSpec
from .model_options import check_prefix_length
from .option_spec import takes_options
from .options import OptionError, SearchOptions, resolve_search_options, unknown_options
from .plan import Plan, SearchJob, stream_job
from .search import SearchResult, Step, run, stream_greedy
from .session_tuning import SessionTuning, check_intra_threads, default_intra_threads
from .session_cache import SessionCache
from .devices import DEVICES
from .sessions import Beside, open_sessions
from .source import Sources
from .result import TranslationResult  # noqa: F401  (re-exported: the public result type)
from .text import text_increments
from .vocab import Vocabulary, load_tokenizers
from .weights import verified

_NP_DTYPE = {"float32": np.float32, "float16": np.float16}


class Translator:
    """Translates with a bundle made by `seq2onnx export`.

    Everything bundle.json states that the graphs or the tokenizers also state is checked at load (vocabulary
    sizes, special ids, layers, heads, head size, positions, dtype): a bundle that would translate garbage is
    refused at once.

    Args:
        bundle_dir: the bundle directory (bundle.json, encoder.onnx, decoder.onnx, tokenizers), or a
            Bundle that read_bundle returned (it keeps its files' bytes: `seq2onnx web` copies those).
        device: "auto" (CUDA where onnxruntime can run it, else the CPU), "cuda" or "cpu".
        intra_threads: threads inside each operator, 0 (OMP_NUM_THREADS where set, as torch reads it; else
            onnxruntime's default, one per core) to os.cpu_count().
        check_hashes: verify every file's sha256 against bundle.json before loading.
        cache_dir: where, on the CPU, onnxruntime's optimized graphs are kept with their weights packed for
            this machine, so that later loads skip optimizing and packing (runtime/session_cache.py; ~2.8x
            the bundle on disk; only with check_hashes). None (the default): no cache, nothing written.
        _tuning: SessionTuning, knobs for measuring the defaults (benchmarks only; another type is a
            TypeError).
    Attributes:
        decoder_variant, decoder_reason: "fused" or "standard", the decoder graph driven, and why.
        encoder, decoder: the onnxruntime sessions of the encoder and of the decoder driven.
        sources: runtime/source.py's Sources: texts or ids to the encoder's ids (`ids`, `prepare`), and
            padding (`pad`).
        ort_device: "cpu" or "cuda", where the encoder's outputs and the cache stay.
        spec: runtime/model_spec.py's ModelSpec: the sizes, special ids and decoding defaults planning reads.
        graphs: runtime/graphs.py's Graphs: the sessions as a search drives them (encode, step, recycle,
            attention).
        The seam below translate_batch (plan, search, graphs, ...) is runtime/plan.py's; serve/ drives it.
    Raises:
        BundleError: the bundle is missing, damaged, of another format version, or its
            bundle.json disagrees with its graphs or tokenizers (the message names the field).
        ValueError: a bad device, intra_threads or check_hashes.
        RuntimeError: device="cuda" where CUDA cannot run, or _tuning forces the fused decoder where it cannot
            (says why).
    """

    def __init__(
        self,
        bundle_dir: str | Path,
        device: str = "auto",
        *,
        intra_threads: int = 0,
        check_hashes: bool = True,
        cache_dir: str | Path | None = None,
        _tuning: SessionTuning | None = None,
    ):
        if device not in DEVICES:
            raise OptionError(
                "device",
                device,
                limit="one of auto, cuda, cpu",
                says="; ",
                hint="choose 'auto', 'cuda' or 'cpu'",
            )
        intra_threads = check_intra_threads(intra_threads)
        if not isinstance(check_hashes, bool):
            raise OptionError(
                "check_hashes", check_hashes, limit="True or False", says="; ", hint="give True or False"
            )
        cache = None if cache_dir is None else SessionCache(cache_dir)  # a bad directory is refused first
        tuning = SessionTuning() if _tuning is None else _tuning
        if not isinstance(tuning, SessionTuning):
            raise TypeError(f"_tuning is {type(tuning).__name__}; give a SessionTuning")
        # Every file is read once, hash-checked on those bytes, and every session and tokenizer is made
        # from them: a bundle replaced on disk later cannot mix into this one (runtime/bundle.py).
        own = not isinstance(bundle_dir, Bundle)
        bundle = (
            read_bundle(bundle_dir, check_hashes=check_hashes, defer_weights_hash=True) if own else bundle_dir
        )
        with verified(bundle.weights):  # hashed while the sessions are made; checked before anything else
            self._load(bundle, bundle_dir, device, tuning, intra_threads, cache)
        if own:
            self.bundle = bundle.without_data()  # the sessions hold what they need

    def _load(self, bundle: Bundle, bundle_dir, device: str, tuning: SessionTuning, intra_threads, cache):
        """The constructor's work once the bundle is read: sessions, and beside them tokenizers, vocabulary,
        checks."""
        self.bundle = bundle
        self.spec = spec = ModelSpec.of_bundle(bundle, tuning.top_k_from_graph)  # what planning reads
        self.n_layers, self.n_heads, self.head_dim = spec.n_layers, spec.n_heads, spec.head_dim
        self.max_positions, self.src_vocab = spec.max_positions, spec.src_vocab
        self.tgt_vocab = spec.tgt_vocab
        self.pad_id, self.eos_id, self.start_id = spec.pad_id, spec.eos_id, spec.start_id
        self.cache_dtype = _NP_DTYPE[self.bundle.dtype]
        graphs = read_graphs(bundle)  # every listed graph parsed, its references checked before onnxruntime's
        # The tokenizers load in a thread while this one makes the sessions (onnxruntime lets go of the GIL
        # while it packs the weights): 0.1 s of an OPUS-MT-size load no longer waits before the sessions. The
        # sessions stay in the caller's thread: made in another, their load's transient copies (int8 weights
        # rewritten for the exact kernel) went to a glibc thread arena and stayed resident (+40-70 MB at the
        # OPUS-MT-size int8 peak). A bundle read here is ours: a graph's bytes go once its session is made.
        tokenizers = Beside(lambda: self._load_tokenizers(bundle), "tokenizers")
        try:
            s = open_sessions(
                bundle,
                device,
                tuning,
                intra_threads,
                release_bytes=not isinstance(bundle_dir, Bundle),
                check_late=lambda label, session: check_graphs(bundle, {label: session}, graphs),
                cache=cache,
                graphs=graphs,
            )
        finally:
            tokenizers.wait()  # nothing goes on being made after a failed load returns
        tokenizers.result()
        self.device, self.device_reason = s.device, s.device_reason
        self.encoder, self.decoder = s.encoder, s.decoder
        self.decoder_variant, self.decoder_reason = s.variant, s.reason
        # every graph checked now; the standard decoder, not loaded yet, from its file (runtime/onnx_info.py)
        check_graphs(bundle, {**graphs, **s.by_label()}, graphs)
        threads = (
            intra_threads or default_intra_threads() or os.cpu_count() or 1
        )  # onnxruntime's default: cores
        self.graphs = Graphs(s, self.spec, self.cache_dtype, bundle.path, threads)
        self.ort_device = self.graphs.ort_device

    def _load_tokenizers(self, bundle: Bundle) -> None:
        """Tokenizers, the vocabulary's maps and the sources' preparation, checked against bundle.json."""
        self.source_tokenizer, self.target_tokenizer = load_tokenizers(bundle)
        # Maps, prefixes and languages of an imported model (runtime/vocab.py); identity for ours.
        self.vocabulary = Vocabulary.of_bundle(
            bundle, self.source_tokenizer.get_piece_size(), self.target_tokenizer.get_piece_size()
        )
        check_tokenizers(self.bundle, self.source_tokenizer, self.target_tokenizer, self.vocabulary)
        self.sources = Sources(
            self.source_tokenizer,
            pad_id=self.pad_id,
            eos_id=self.eos_id,
            vocab=self.src_vocab,
            max_positions=self.max_positions,
            vocabulary=self.vocabulary,
        )
        self._decode = self.vocabulary.decoder(self.target_tokenizer)

    # -- public API -----------------------------------------------------------------------------

    @takes_options("text")
    def translate(self, text: str, **options) -> str:
        """Returns the best hypothesis (str) for one string.

        Args:
            text: the source text.
            OPTIONS
        Raises:
            TypeError: text is not a str, or an option translate does not take.
            ValueError: as translate_batch.
        """
        if not isinstance(text, str):
            raise TypeError(f"text is {type(text).__name__}; give a str (translate_batch takes lists)")
        unknown_options(options, "translate", "text")
        return self.plan([text], self.search_options(**options)).run(self.search)[0].hypotheses[0]

    @takes_options("batch")
    def translate_batch(self, source: Sequence[str | Sequence[int]], **options) -> list[TranslationResult]:
        """Returns one TranslationResult per source, in the order given, for texts (or source token id lists).

        The options are SearchOptions's (runtime/options.py declares each one once: its doc, limits and
        names); each is checked by type and range, and against the model, before any work starts.

        Args:
            source: texts, or source ids (the end token is added when missing). An empty or whitespace-only
                text gives an empty translation.
            OPTIONS
        Raises:
            TypeError: an item that is neither a str nor ids, or an unknown option (naming it and the
                options).
            ValueError: a source longer than the model's positions (unless truncate) or an option of
                a wrong type or range (an OptionError: the message names the option, its value and the fix).
        """
        return self.plan(source, self.search_options(**options)).run(self.search)  # plan, then run here

    def search_options(self, **options) -> SearchOptions:
        """Returns SearchOptions, with the bundle's beam_size, length_penalty, min_decoding_length where None
        or left out.

        Args:
            **options: translate_batch's options by name; all are checked against the model too.
        Raises:
            ValueError: a value of the wrong type or range; TypeError: an unknown name.
        """
        return resolve_search_options(options, self.bundle.decoding, self.max_positions, self.tgt_vocab)

    @takes_options("stream")
    def generate_tokens(self, text: str, **options) -> Iterator[str]:
        """Yields the greedy translation of one text piece by piece, as soon as each token is decided.

        Each piece is what its token adds to the detokenised text (held back while an incomplete UTF-8 byte
        sequence): the pieces join to translate(text, beam_size=1) exactly, spaces included. Options are
        checked at this call, not later.

        Args:
            text: the source text.
            OPTIONS
        Raises:
            TypeError: text is not a str, or an option generate_tokens does not take; ValueError: as
                translate_batch, or min_decoding_length >= the text's maximum length.
        """
        if not isinstance(text, str):
            raise TypeError(f"text is {type(text).__name__}; give a str")
        unknown_options(options, "generate_tokens", "stream")
        return self.stream(text, self.search_options(beam_size=1, **options))

    def translate_iterable(
        self, lines: Iterable[str], *, read_batch_size: int = 256, **options
    ) -> Iterator[TranslationResult]:
        """Yields the TranslationResult of each line of a stream, in input order.

        Args:
            lines: the source texts.
            read_batch_size: lines read, then translated, at a time.
            **options: translate_batch's, checked when this is called.
        Raises:
            ValueError: a bad read_batch_size or option; TypeError: an unknown option.
        """
        if isinstance(read_batch_size, bool) or not isinstance(read_batch_size, int) or read_batch_size < 1:
            raise OptionError(
                "read_batch_size", read_batch_size, limit="an int >= 1", says="; ", hint="give an int >= 1"
            )
        resolved = self.search_options(**options)
        return self._iterate(lines, read_batch_size, resolved)

    def prepare_source(
        self,
        text: str,
        *,
        truncate: bool = False,
        source_lang: str | None = None,
        target_lang: str | None = None,
    ) -> tuple[list[int], bool]:
        """Returns (ids, whether they were cut) of one text, as translate_batch feeds the ids to the encoder.

        The ids end with the end token; an empty or whitespace-only text gives ([], False). A huge text costs
        only what its first positions need: it is tokenised by prefixes (runtime/source.py says why the ids
        are the same).

        Args:
            text: the source text.
            truncate: cut the ids to the model's positions instead of refusing the text.
            source_lang, target_lang: as translate_batch's (they choose a multilingual model's source prefix).
        Raises:
            TypeError: text is not a str; ValueError: too many tokens without truncate (naming both counts and
                the fix).
        """
        if not isinstance(text, str):
            raise TypeError(f"text is {type(text).__name__}; give a str")
        if not text.strip():
            return [], False
        prefix, _ = self.prefixes(1, self.search_options(source_lang=source_lang, target_lang=target_lang))
        return self.sources.prepare(text, truncate, prefix)

    # -- the seam: planning, the step functions, detokenisation (runtime/plan.py; serve/ drives these) ----

    def plan(self, source: Sequence[str | Sequence[int]], options: SearchOptions) -> Plan:
        """Plans a translate_batch call: its sources checked and tokenized now, its jobs made when taken.

        Args:
            source: as translate_batch's.
            options: SearchOptions (search_options()).
        Returns:
            The Plan (runtime/plan.py): plan.run(self.search) is translate_batch's result.
        Raises:
            TypeError, ValueError: as translate_batch.
        """
        return Plan(self, source, options)

    def plan_stream(self, text: str, options: SearchOptions) -> SearchJob | None:
        """Plans generate_tokens: one text's greedy SearchJob, encoded now (its program None: a streaming
        runner makes its own); None for an empty text.

        Raises:
            TypeError, ValueError: as generate_tokens.
        """
        return stream_job(self, text, options)

    def search(self, job: SearchJob, wrap: Callable[[Step], Step] | None = None) -> list[SearchResult]:
        """Runs a job's search here, over this translator's decoder; returns one SearchResult per source.

        Args:
            job: a SearchJob of plan().jobs().
            wrap: step -> the step the search calls (serve/engine.py's cancel check); the job's forced
                prefixes go over it.
        """
        step = self.graphs.step(
            job.encoded,
            rows=job.rows,
            top_k=job.top_k,
            max_length=job.max_length,
            beam_width=job.beam_width,
            writable=not job.keeps_encoding,
        )
        found = run(job.program, job.force(step if wrap is None else wrap(step)))
        self.graphs.recycle(step)
        return found

    def stream(self, text: str, options: SearchOptions) -> Iterator[str]:
        """generate_tokens with options already checked (beam_size 1): plan_stream, then run here.

        Raises:
            ValueError: as generate_tokens (at this call).
        """
        job = self.plan_stream(text, options)
        if job is None:
            return iter(())
        step = self.graphs.step(job.encoded, rows=1, top_k=job.top_k, max_length=job.max_length)
        forced = job.force(step)

        def tokens() -> Iterator[int]:
            yield from stream_greedy(
                forced,
                start_id=self.start_id,
                eos_id=self.eos_id,
                max_length=job.max_length,
                min_length=job.min_length,
            )
            self.graphs.recycle(step)  # once the stream is read to its end

        return text_increments(self.detokenize, tokens())

    def detokenize(self, ids: Sequence[int]) -> str:
        """Returns the text of target ids (end token excluded), as TranslationResult.hypotheses hold it."""
        return self._decode(ids)

    def prefixes(self, n: int, options: SearchOptions) -> tuple[list[int], list[list[int]]]:
        """Returns (the source ids' prefix, each of n sources' forced target ids) of options' languages and
        target_prefix.

        Raises:
            ValueError: an unknown language, or a target_prefix of the wrong length or ids, or too long for
                the model's positions.
        """
        source, target = self.vocabulary.prefixes(
            n,
            source_lang=options.source_lang,
            target_lang=options.target_lang,
            target_prefix=options.target_prefix,
            tgt_vocab=self.tgt_vocab,
            eos_id=self.eos_id,
        )
        if options.target_prefix is not None:
            check_prefix_length(options.target_prefix, target, self.max_positions)
        return source, target

    # -- internals ------------------------------------------------------------------------------

    def _iterate(
        self, lines: Iterable[str], read_batch_size: int, options: SearchOptions
    ) -> Iterator[TranslationResult]:
        buffer: list[str] = []
        for line in lines:
            buffer.append(line)
            if len(buffer) >= read_batch_size:
                yield from self.plan(buffer, options).run(self.search)
                buffer = []
        if buffer:
            yield from self.plan(buffer, options).run(self.search)
