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

from seq2onnx.runtime.options import SearchOptions
from seq2onnx.runtime.translator import Translator


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
    """

    #: the name `seq2onnx serve --batching` gives this engine, and /metrics and /ready report
    batching = "none"

    def __init__(self, translator: Translator):
        self.translator = translator

    def check(self, options: dict) -> SearchOptions:
        """Returns the SearchOptions of a request's options (translate_batch's names).

        Raises:
            ValueError, TypeError: a wrong value or an unknown name (the message names the option, the value and the fix).
        """
        return self.translator.search_options(**options)

    def submit(self, texts: list[str], options: SearchOptions) -> Job:
        """Starts translating `texts` with `options`; returns at once."""
        raise NotImplementedError

    def stream(self, text: str, options: SearchOptions, job: Job) -> Iterator[str]:
        """Yields the greedy translation of one text piece by piece (Translator.generate_tokens's pieces).

        Blocking: the front end iterates it on a worker thread. job.cancel() ends it at the next step.
        """
        raise NotImplementedError

    def load(self) -> dict:
        """Returns {"active_requests", "active_sentences", "active_rows"}: what is being decoded now."""
        raise NotImplementedError

    def close(self) -> None:
        """Stops the engine's threads once every submitted job is answered (the front end drains first)."""


class RequestEngine(Engine):
    """Each request decoded as its own batch by Translator.translate_batch, `workers` requests at a time.

    Args:
        translator: the Translator of the bundle served.
        workers: requests decoded at once (threads sharing the one Translator).
    """

    batching = "request"

    def __init__(self, translator: Translator, workers: int = 2):
        super().__init__(translator)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="seq2onnx-request")
        self._lock = threading.Lock()
        self._active = {"active_requests": 0, "active_sentences": 0, "active_rows": 0}

    def submit(self, texts: list[str], options: SearchOptions) -> Job:
        job = Job()

        def work():
            if job.cancelled.is_set():  # left before its turn: never decoded
                job.future.set_exception(Cancelled("cancelled before decoding"))
                return
            self._count(len(texts), options, +1)
            try:
                job.future.set_result(self.translator._translate(texts, options))
            except BaseException as e:  # the job carries it; the pool thread lives on
                job.future.set_exception(e)
            finally:
                self._count(len(texts), options, -1)

        self._pool.submit(work)
        return job

    def stream(self, text: str, options: SearchOptions, job: Job) -> Iterator[str]:
        self._count(1, options, +1)
        try:
            for piece in self.translator._stream_text(text, options):
                if job.cancelled.is_set():
                    return
                yield piece
        finally:
            self._count(1, options, -1)

    def _count(self, sentences: int, options: SearchOptions, sign: int) -> None:
        with self._lock:
            self._active["active_requests"] += sign
            self._active["active_sentences"] += sign * sentences
            self._active["active_rows"] += sign * sentences * options.beam_size

    def load(self) -> dict:
        with self._lock:
            return dict(self._active)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
