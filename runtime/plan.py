"""Planning a translation: sources in, search jobs out; each job's hypotheses in, TranslationResults out.

Translator.translate_batch is "plan, then run here": Translator.plan(source, options) checks and tokenizes
the sources, answers the empty ones and groups the others in batches of similar lengths; each batch is a
SearchJob (its encoded sources, its forced prefixes, its search program, its decoding limits), made when
it is taken so that one batch's encoder outputs at a time are alive. Whoever runs the searches runs each
job and gives its SearchResults back to the plan, which detokenises them (and computes their attention):

    plan = translator.plan(texts, options)
    for job in plan.jobs():
        plan.finish(job, translator.search(job))   # serve/batcher.py hands the job to its scheduler instead
    results = plan.results()                       # or, the same: plan.run(translator.search)

A job's program (runtime/search.py) is answered by a step callable: Translator.search makes the
decoder's step (Translator.graphs.step) and drives the program with it; serve/batcher.py answers many
programs with one decoder run. Either way the step goes under job.force(step), the forced target
prefix and end token (runtime/prefix.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from .model_options import check_min_length
from .options import SearchOptions
from .prefix import force_prefix
from .result import TranslationResult
from .sampling import sample_program
from .beam import beam_program
from .search import Program, SearchResult, Step, greedy_program


@dataclass
class SearchJob:
    """One batch of sources searched together, ready to run.

    Attributes:
        indices: the sources' places in the planned request (Plan.results' order).
        sources: their encoder ids (end token included).
        max_lengths: (B,) int64, each source's maximum decoding length (end token included).
        min_length: the end token is forbidden before this many tokens.
        encoded: (src_mask, cross): the encoder's outputs (OrtValues on the device) of the step's rows: the
            sources, or, when sampling, each source repeated once per sample.
        rows: sentences of the step (the sources; sources x num_hypotheses when sampling).
        beam_width: rows per sentence in the step (beam_size; 1 for greedy search and sampling).
        top_k: candidates per row the step must give (a TopK), or None for the full log-probabilities.
        program: the search program (runtime/search.py), not started; its result is one SearchResult per
            source.
            None for a stream's job (Translator.plan_stream): its runner makes a greedy_one_program.
        prefixes: the forced target ids of each sentence of the step ([] for none).
        end: force_prefix's end-token options (the bundle's forced_eos), or {}.
        sampled: the job samples (its encoded rows repeat sources: no source encoding for attention).
        keeps_encoding: the attention pass reads `encoded` after the search (return_attention), so the step
            must not move its rows in place (runtime/fused_step.py's compaction).
    """

    indices: list[int]
    sources: list[list[int]]
    max_lengths: np.ndarray
    min_length: int
    encoded: tuple
    rows: int
    beam_width: int
    top_k: int | None
    program: Program | None
    prefixes: list[list[int]]
    end: dict = field(default_factory=dict)
    sampled: bool = False
    keeps_encoding: bool = False

    @property
    def max_length(self) -> int:
        """The longest decoding of the job (it sizes a fused step's buffers)."""
        return int(self.max_lengths.max())

    @property
    def source_encoding(self) -> tuple | None:
        """(src_mask, cross) of `sources` themselves, for the attention pass to reuse; None after sampling,
        or where the job was not made to keep it (the step may have moved its rows)."""
        return self.encoded if self.keeps_encoding and not self.sampled else None

    def force(self, step: Step) -> Step:
        """Returns `step` under the job's forced prefixes and end token (itself when nothing is forced)."""
        return force_prefix(step, self.prefixes, **self.end)


def search_job(
    translator,
    indices: list[int],
    sources: list[list[int]],
    max_lengths: np.ndarray,
    options: SearchOptions,
    prefixes: list[list[int]],
) -> SearchJob:
    """The job that searches `sources` with `options`: encodes them (or their sample rows) now.

    Args:
        translator: the Translator whose encoder and bundle the job uses.
        indices: the sources' places in their request.
        sources: encoder ids.
        max_lengths: (B,) int64 maximum decoding lengths.
        options: the checked SearchOptions.
        prefixes: each source's forced target ids.
    """
    t = translator
    common = dict(start_id=t.start_id, eos_id=t.eos_id, min_length=options.min_decoding_length)
    if options.sampling:
        return _sampling_job(t, indices, sources, max_lengths, options, prefixes, common)
    encoded = t.graphs.encode(*t.sources.pad(sources))
    if options.beam_size == 1:
        program = greedy_program(len(sources), max_lengths=max_lengths, **common)
    else:
        program = beam_program(
            len(sources),
            beam_size=options.beam_size,
            length_penalty=options.length_penalty,
            num_hypotheses=options.num_hypotheses,
            max_lengths=max_lengths,
            convention=t.spec.beam_convention,
            **common,
        )
    return SearchJob(
        indices,
        sources,
        max_lengths,
        options.min_decoding_length,
        encoded,
        rows=len(sources),
        beam_width=options.beam_size,
        top_k=t.spec.step_top_k(options.beam_size, options.min_decoding_length),
        program=program,
        prefixes=list(prefixes),
        end=t.spec.forced_end(max_lengths),
        keeps_encoding=options.return_attention,
    )


def _sampling_job(
    t,
    indices: list[int],
    sources: list[list[int]],
    max_lengths: np.ndarray,
    options: SearchOptions,
    prefixes: list[list[int]],
    common: dict,
) -> SearchJob:
    """search_job's job when sampling: n rows per source, encoded now (each source once per sample)."""
    # n independent samples per source, each row keyed by (hypothesis, source ids) so that
    # its generator, hence its sample, does not depend on the rest of the batch.
    n = options.num_hypotheses
    rows = [s for s in sources for _ in range(n)]
    keys = [[h, len(s), *s] for s in sources for h in range(n)]
    flat = sample_program(
        len(rows),
        temperature=options.sampling_temperature,
        top_k=options.sampling_topk,
        top_p=options.sampling_topp,
        seed=options.seed,
        row_keys=keys,
        max_lengths=np.repeat(max_lengths, n),
        **common,
    )
    encoded = t.graphs.encode(*t.sources.pad(rows))
    return SearchJob(
        indices,
        sources,
        max_lengths,
        options.min_decoding_length,
        encoded,
        rows=len(rows),
        beam_width=1,
        top_k=None,  # sampling needs every log-prob
        program=_regroup(flat, n, len(sources)),
        prefixes=[p for p in prefixes for _ in range(n)],
        end=t.spec.forced_end(np.repeat(max_lengths, n)),
        sampled=True,
    )


def stream_job(translator, text: str, options: SearchOptions) -> SearchJob | None:
    """The greedy job of one text for streaming (program None), encoded now; None for an empty text.

    Raises:
        ValueError: as translate_batch; OptionError: min_decoding_length >= the text's maximum length.
    """
    t = translator
    source_prefix, [target_prefix] = t.prefixes(1, options)
    ids = t.sources.ids(0, text, options.truncate, source_prefix)
    if ids is None:
        return None
    limits = t.spec.max_lengths([ids], options)
    check_min_length(options.min_decoding_length, int(limits[0]), len(ids))  # now, not at the first piece
    return SearchJob(
        [0],
        [ids],
        limits,
        options.min_decoding_length,
        t.graphs.encode(*t.sources.pad([ids])),
        rows=1,
        beam_width=1,
        top_k=t.spec.step_top_k(1, options.min_decoding_length),
        program=None,
        prefixes=[target_prefix],
        end=t.spec.forced_end(limits),
    )


class Plan:
    """A translate_batch request planned (Translator.plan): its empty sources answered, the others in jobs.

    Args:
        translator: the Translator.
        source: texts or source ids, as translate_batch's.
        options: the checked SearchOptions.
    Raises:
        TypeError: source is one string, or an item is neither a str nor ids.
        ValueError: as translate_batch (a source too long, min_decoding_length not below a source's maximum
            length), or return_attention with a bundle without the attention output (NoAttentionOutput).
    """

    def __init__(self, translator, source: Sequence, options: SearchOptions):
        if isinstance(source, (str, bytes)):
            raise TypeError("translate_batch takes a list of sources; for one string use translate(text)")
        t, n = translator, options.num_hypotheses
        self.translator, self.options = t, options
        source_prefix, self._target_prefixes = t.prefixes(len(source), options)
        self._ids = ids = [
            t.sources.ids(i, item, options.truncate, source_prefix) for i, item in enumerate(source)
        ]
        self._results: list[TranslationResult | None] = [None] * len(ids)
        todo = [i for i, s in enumerate(ids) if s is not None]
        self._limits = limits = dict(zip(todo, t.spec.max_lengths([ids[i] for i in todo], options)))
        for i in todo:
            check_min_length(options.min_decoding_length, int(limits[i]), len(ids[i]), i)
        if options.return_attention:
            t.graphs.attention_decoder()  # a bundle without the output is refused before searching
        for i, s in enumerate(ids):
            if s is None:  # empty text: nothing to translate
                self._results[i] = TranslationResult(
                    [""] * n,
                    [[]] * n,
                    [0.0] * n if options.return_scores else None,
                    [np.zeros((0, 0), np.float32)] * n if options.return_attention else None,
                )
        todo.sort(key=lambda i: len(ids[i]))  # similar lengths share a batch: less padding
        self._todo = todo

    def jobs(self) -> Iterator[SearchJob]:
        """Yields the search jobs, max_batch_size sources each, shortest sources first; each is made (its
        sources encoded) when taken."""
        size = self.options.max_batch_size
        for start in range(0, len(self._todo), size):
            chunk = self._todo[start : start + size]
            yield search_job(
                self.translator,
                chunk,
                [self._ids[i] for i in chunk],
                np.array([self._limits[i] for i in chunk], dtype=np.int64),
                self.options,
                [self._target_prefixes[i] for i in chunk],
            )

    def finish(self, job: SearchJob, found: list[SearchResult]) -> None:
        """Takes a job's SearchResults (one per source): detokenises them, with their attention if asked."""
        t, options = self.translator, self.options
        found_tokens = [[h[:-1] if h and h[-1] == t.eos_id else h for h in r.hypotheses] for r in found]
        attention = [None] * len(found)
        if options.return_attention:  # sampled jobs' rows repeat their sources: encoded again
            encoded = job.source_encoding or t.graphs.encode(*t.sources.pad(job.sources))
            attention = t.graphs.attention(job.sources, found_tokens, encoded)
        for i, r, tokens, weights in zip(job.indices, found, found_tokens, attention):
            self._results[i] = TranslationResult(
                [t.detokenize(x) for x in tokens],
                tokens,
                r.scores if options.return_scores else None,
                weights,
            )

    def results(self) -> list[TranslationResult]:
        """One TranslationResult per source, in the order given.

        Raises:
            RuntimeError: a job was not finished.
        """
        missing = [i for i, r in enumerate(self._results) if r is None]
        if missing:
            raise RuntimeError(f"sources {missing[:5]} have no result: finish() every job that jobs() yields")
        return list(self._results)  # type: ignore[arg-type]

    def run(self, search: Callable[[SearchJob], list[SearchResult]]) -> list[TranslationResult]:
        """Runs every job with `search` (Translator.search: here), one after the other; returns results()."""
        for job in self.jobs():
            self.finish(job, search(job))
        return self.results()


def _regroup(program, n: int, sources: int):
    """A sampling program's flat results (n rows per source) as one SearchResult of n hypotheses each."""
    flat = yield from program
    return [
        SearchResult(
            [h for r in flat[i * n : (i + 1) * n] for h in r.hypotheses],
            [x for r in flat[i * n : (i + 1) * n] for x in r.scores],
        )
        for i in range(sources)
    ]
