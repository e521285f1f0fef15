"""What the HTTP front end (serve/app.py) drives: an Engine that translates requests.

Two engines share this interface:
- ContinuousEngine (serve/batcher.py): one scheduler runs the decoder step over the rows of every
  request at once; a request's sentences join the running batch at the next step boundary.
- RequestEngine (here): each request is decoded as its own batch (Translator.translate_batch) on a
  thread pool: `seq2onnx serve --batching request`, the baseline the load benchmark compares with.

An engine never limits how many requests wait: admission (the bounded queue, 503) is the front end's.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Iterator

from seq2onnx.runtime.options import OptionError, SearchOptions
from seq2onnx.runtime.rounds import arena_release
from seq2onnx.runtime.translator import Translator
from seq2onnx.serve.memory import MAX_ROWS, IdleRelease


class Cancelled(Exception):
    """A job was cancelled (its client left, or its time ran out): its rows left the batch."""


class Job:
    """One request's translation under way.

    Attributes:
        future: concurrent.futures.Future of list[TranslationResult] (one per text, in order); it
            raises Cancelled after cancel(), or the search's error.
    """

    def __init__(self):
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        """Asks the engine to drop this job's sentences at the next step boundary (idempotent)."""
        self.cancelled.set()


class Engine:
    """The interface of an engine (see the module docstring).

    Args:
        translator: the Translator of the bundle served.
        max_rows: decoder rows one request may hold at once: min(texts, max_batch_size) x beam_size (x
            num_hypotheses when sampling). A legal beam_size of 1000 would otherwise hold every other
            request's memory hostage.
    """

    #: the name `seq2onnx serve --batching` gives this engine, and /metrics and /ready report
    batching = "none"
    #: searches decoded alone on their request's thread so far (ContinuousEngine's solo path; /metrics)
    solo_searches = 0

    def __init__(self, translator: Translator, max_rows: int = MAX_ROWS):
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"max_rows={max_rows!r}; give an int >= 1")
        self.translator, self.max_rows = translator, max_rows
        self._lock = threading.Lock()
        # _count's, load()'s default
        self._active = {"active_requests": 0, "active_sentences": 0, "active_rows": 0}

    def check(self, options: dict, texts: int = 1) -> SearchOptions:
        """Returns the SearchOptions of a request's options (translate_batch's names) for `texts` texts.

        Raises:
            ValueError, TypeError: a wrong value, an unknown name, or more rows than max_rows (the message
            names
                the option, the value, the limit and the fix).
        """
        options = self.translator.search_options(**options)
        width = options.num_hypotheses if options.sampling else options.beam_size
        rows = min(texts, options.max_batch_size) * width
        if rows > self.max_rows:
            together = min(texts, options.max_batch_size)
            raise OptionError(
                "beam_size",
                options.beam_size,
                limit=f"{self.max_rows} decoder rows per request",
                shown=f"{options.beam_size}, num_hypotheses={options.num_hypotheses}",
                says=f" over {together} texts decoded together make {rows} decoder rows; "
                f"the limit (--max-rows) is {self.max_rows} per request: ",
                hint="use a smaller beam_size, fewer hypotheses or texts, or raise --max-rows",
            )
        return options

    def submit(self, texts: list[str], options: SearchOptions) -> Job:
        """Starts translating `texts` with `options`; returns at once."""
        raise NotImplementedError

    def stream(self, text: str, options: SearchOptions, job: Job) -> Iterator[str]:
        """Yields the greedy translation of one text piece by piece (Translator.generate_tokens's pieces).

        Blocking: the front end iterates it on a worker thread. job.cancel() ends it at the next step.
        """
        raise NotImplementedError

    def load(self) -> dict:
        """Returns {"active_requests", "active_sentences", "active_rows"}: what is being decoded now (_count's
        sums).
        """
        with self._lock:
            return dict(self._active)

    def _on_pool(
        self, pool: concurrent.futures.Executor, texts: list[str], options: SearchOptions, decode
    ) -> Job:
        """Runs decode(job) -> results on `pool` as a new job: never if it was cancelled while queued; counted
        in load() while it runs; its result or error on job.future (the pool thread lives on)."""
        job = Job()

        def work():
            if job.cancelled.is_set():  # left before its turn: never decoded
                job.future.set_exception(Cancelled("cancelled before decoding"))
                return
            self._count(len(texts), options, +1)
            try:
                job.future.set_result(decode(job))
            except BaseException as e:  # the job carries it
                job.future.set_exception(e)
            finally:
                self._count(len(texts), options, -1)

        pool.submit(work)
        return job

    def _count(self, sentences: int, options: SearchOptions, sign: int) -> None:
        """Adds (sign +1) or removes (-1) one request of `sentences` texts to what load() reports."""
        with self._lock:
            self._active["active_requests"] += sign
            self._active["active_sentences"] += sign * sentences
            self._active["active_rows"] += sign * sentences * options.beam_size

    def close(self) -> None:
        """Stops the engine's threads once every submitted job is answered (the front end drains first)."""


class RequestEngine(Engine):
    """Each request decoded as its own batch by Translator.translate_batch, `workers` requests at a time.

    Args:
        translator: the Translator of the bundle served.
        workers: requests decoded at once (threads sharing the one Translator).
        max_rows: as Engine's.
    """

    batching = "request"

    def __init__(self, translator: Translator, workers: int = 2, max_rows: int = MAX_ROWS):
        super().__init__(translator, max_rows)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="seq2onnx-request"
        )
        # after a burst, idle: the arenas and the heaps give back what it took (serve/memory.py)
        self.release = IdleRelease(arena_release(translator))

    def submit(self, texts: list[str], options: SearchOptions) -> Job:
        return self._on_pool(self._pool, texts, options, lambda job: self._translate_as(job, texts, options))

    def _translate_as(self, job: Job, texts: list[str], options: SearchOptions):
        """The runtime's own code decodes (plan, then run here); its step only checks first whether the
        job was cancelled (its client left, its time ran out), so that an abandoned request frees its worker
        at the next step."""
        t = self.translator
        plan = t.plan(texts, options)
        self.release.started(len(texts) * max(options.beam_size, options.num_hypotheses))
        try:
            return plan.run(lambda search: search_here(t, search, job))
        finally:
            self.release.ended()

    def stream(self, text: str, options: SearchOptions, job: Job) -> Iterator[str]:
        self._count(1, options, +1)
        try:
            for piece in self.translator.stream(text, options):
                if job.cancelled.is_set():
                    return
                yield piece
        finally:
            self._count(1, options, -1)

    def close(self) -> None:
        # a job never started is never answered: it was cancelled
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.release.close()


def search_here(translator: Translator, search, job: Job):
    """Runs a planned search (runtime/plan.py's SearchJob) on this thread by the translator's own search, its
    step under `cancellable`: RequestEngine's searches, and ContinuousEngine's searches decoded alone."""
    return translator.search(search, wrap=lambda step: cancellable(step, job))


def cancellable(step, job: Job):
    """Returns `step` made to raise Cancelled first once `job` was cancelled, so that an abandoned request
    stops at its next step (RequestEngine's searches, and ContinuousEngine's searches decoded alone).

    Args:
        step: a search step (tokens, cache_indices, t, keep) -> its output.
        job: the request's Job.
    """

    def checked(tokens, cache_indices, t, keep):
        if job.cancelled.is_set():
            raise Cancelled("the request was cancelled")
        return step(tokens, cache_indices, t, keep)

    return checked
