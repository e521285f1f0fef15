"""Continuous batching: one scheduler runs the decoder step over the rows of every request at once.

Each request is planned by the runtime's own code on a worker thread (Translator.plan, plan_stream:
runtime/plan.py): it tokenizes, batches its sources exactly as translate_batch batches them, and makes
each batch a SearchJob: its sources encoded, its search program (runtime/search.py: a generator that
yields each step's request and is sent the step's output), its forced prefixes. Where translate_batch
runs a job here, this engine hands it to the Scheduler and waits for its result (plan.run). The
scheduler's one thread runs rounds: each round runs decoder.onnx ONCE over the rows of every program,
then sends each program its own rows of the output (under job.force, the step wrapper translate_batch
uses too: forced prefixes). So:
- a new search joins the running batch at the next round; a finished sentence leaves at once (the
  search drops it, `keep`); a request is answered as soon as its last search finishes; a cancelled
  one (its client left, its time ran out) is dropped at the next round;
- the searches (greedy, beam with a sentence's beams together, n-best, scores, sampling, forced
  prefixes) are runtime/search.py's own, so a sentence's result is what translate_batch gives, up to
  the arithmetic of the graph on a batch of another shape (docs/serving.md#continuous-batching);
- between two rounds no thread hands over to another: the programs are advanced in the scheduler's
  thread (a thread per request waiting at every step cost more than the decoder at 128 requests).

The rows of a round sit at different steps. Where the Translator drives the fused decoder (the CPU's
default), the rounds run it over one in-place cache whose rows each begin at their own position
(runtime/fused_rounds.py); elsewhere they run decoder.onnx, which takes each row's own step
(runtime/standard_rounds.py). Either way rows of a greedy and of a beam request, or of sources of different
lengths, share one graph run.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import queue
import threading
from typing import Iterator

from seq2onnx.runtime.options import SearchOptions
from seq2onnx.runtime.plan import SearchJob
from seq2onnx.runtime.rounds import rounds_runner
from seq2onnx.runtime.search import greedy_one_program
from seq2onnx.runtime.text import text_increments
from seq2onnx.runtime.translator import Translator

from .engine import Cancelled, Engine, Job, search_here
from .memory import MAX_ROWS
from .scheduler import Scheduler, member_of

__all__ = ["ContinuousEngine"]


# The widest search decoded alone (ContinuousEngine solo): the hand-off it saves is a fixed cost, worth it for
# a lone client's small requests; a larger one goes to a lane, whose idle time gives its memory back (arena
# shrink, malloc_trim: serve/memory.py), which nothing does after a search decoded alone.
SOLO_MAX_ROWS = 32


class ContinuousEngine(Engine):
    """serve/engine.py's Engine with continuous batching (the module docstring).

    Args:
        translator: the Translator of the bundle served; its decoder.onnx must take per-row steps.
        max_workers: requests prepared at once (tokenized, encoded, then waiting for their searches).
        max_rows: as Engine's.
        decoder: the rounds' graph: "auto" (the fused decoder's in-place rounds where they can run),
            "fused" or "standard" (rounds_runner).
        lanes: schedulers, each with its own rounds and buffers over the same sessions; a search joins the
            lane with the fewest rows in flight and stays there. With the translator's intra_threads at 1,
            two lanes keep two cores busy: one lane's Python (its searches' advance, the round's layout)
            runs while the other's decoder step does, as CTranslate2's inter_threads do.
        solo: a search of at most SOLO_MAX_ROWS rows that finds every lane idle is decoded alone on its
            request's worker thread by the Translator's own search (translate_batch's code, so its result is
            translate_batch's), one at a time: a lone client's request is not handed to a scheduler's thread
            and back. Requests that arrive meanwhile join the lanes as before (so at most lanes + 1 decodes
            run at once); streams always do. False: every search goes to a lane.
    Raises:
        NoServingDecoder: a bundle exported before continuous batching (the message says what to do).
        ValueError: lanes below 1, or as rounds_runner.
    """

    batching = "continuous"

    def __init__(
        self,
        translator: Translator,
        max_workers: int = 1024,
        max_rows: int = MAX_ROWS,
        decoder: str = "auto",
        lanes: int = 1,
        solo: bool = True,
    ):
        if not isinstance(lanes, int) or isinstance(lanes, bool) or lanes < 1:
            raise ValueError(f"lanes={lanes!r}: give an int >= 1 (schedulers over the same sessions)")
        super().__init__(translator, max_rows)
        runners = [rounds_runner(translator, decoder) for _ in range(lanes)]
        self.rounds = runners[0].kind  # the rounds' graph: "fused" or "standard"
        self.schedulers = [
            Scheduler(runner, name="seq2onnx-scheduler" + (f"-{i}" if lanes > 1 else ""))
            for i, runner in enumerate(runners)
        ]
        self.scheduler = self.schedulers[0]
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="seq2onnx-job"
        )
        self._jobs: dict[int, int] = {}  # id(job) -> its sentences, while decoding
        self.solo = solo
        self._solo = threading.Lock()  # held by the one search decoded alone (_alone)
        self._solo_rows = 0  # its rows, for load()
        self.solo_searches = 0  # searches decoded alone so far

    def _scheduled(self, search: SearchJob, job: Job):
        """Runs a planned search: here, alone, where nothing else is decoding, it has at most SOLO_MAX_ROWS
        rows and `solo` allows it (one such search at a time); else in a scheduler (its rows join the running
        batch). Returns its results."""
        rows = search.rows * search.beam_width
        if self.solo and rows <= SOLO_MAX_ROWS and self._solo.acquire(blocking=False):
            try:
                if all(lane.idle() for lane in self.schedulers):
                    return self._alone(search, job, rows)
            finally:
                self._solo.release()
        member = member_of(search, job)
        return self._lane().submit(member, search.program, search.force(member)).result()

    def _alone(self, search: SearchJob, job: Job, rows: int):
        """translate_batch's own search on this worker thread, its step checking `job`'s cancel flag first
        (as RequestEngine's). At one client the hand-off to the scheduler's thread and back and the
        rounds' per-row bookkeeping cost 0.16-0.50x an in-process translate (docs/optimisation-notes.md
        row 51); the lanes still take whatever arrives while it runs."""
        with self._lock:
            self._solo_rows = rows
        try:
            return search_here(self.translator, search, job)
        finally:
            with self._lock:
                self._solo_rows = 0
            self.solo_searches += 1  # under _solo: one at a time

    def _lane(self) -> Scheduler:
        """The scheduler with the fewest rows in flight (the first, of equals)."""
        return min(self.schedulers, key=lambda lane: lane.rows_in_flight)

    def _scheduled_stream(self, text: str, options: SearchOptions, job: Job) -> Iterator[str]:
        """Plans the stream now (this thread encodes it), starts its program in the scheduler; its pieces."""
        t = self.translator
        search = t.plan_stream(text, options)
        if search is None:
            return iter(())
        member = member_of(search, job)
        chosen: queue.SimpleQueue = queue.SimpleQueue()
        program = greedy_one_program(
            start_id=t.start_id,
            eos_id=t.eos_id,
            max_length=search.max_length,
            min_length=search.min_length,
            on_token=chosen.put,
        )
        done = self._lane().submit(member, program, search.force(member))
        done.add_done_callback(lambda _: chosen.put(None))

        def tokens() -> Iterator[int]:
            while (token := chosen.get()) is not None:
                if token != t.eos_id:
                    yield token
            done.result()  # the program's error, if it ended with one (Cancelled)

        return text_increments(t.detokenize, tokens())

    @contextlib.contextmanager
    def _decoding(self, job: Job, sentences: int):
        """`job` is counted in load() inside the block."""
        with self._lock:
            self._jobs[id(job)] = sentences
        try:
            yield
        finally:
            with self._lock:
                self._jobs.pop(id(job), None)

    def submit(self, texts: list[str], options: SearchOptions) -> Job:
        job = Job()

        def work():
            try:
                if job.cancelled.is_set():  # left while queued: not even encoded
                    raise Cancelled("cancelled before decoding")
                with self._decoding(job, len(texts)):  # plan, then hand the jobs to the scheduler
                    plan = self.translator.plan(texts, options)
                    result = plan.run(lambda search: self._scheduled(search, job))
                job.future.set_result(result)
            except BaseException as e:  # the job carries it (Cancelled included)
                job.future.set_exception(e)

        self._pool.submit(work)
        return job

    def stream(self, text: str, options: SearchOptions, job: Job) -> Iterator[str]:
        with self._decoding(job, 1):
            pieces = self._scheduled_stream(text, options, job)  # its member is made now, on this thread
        with self._decoding(job, 1):
            yield from pieces

    def load(self) -> dict:
        with self._lock:
            requests, sentences = len(self._jobs), sum(self._jobs.values())
        return {
            "active_requests": requests,
            "active_sentences": sentences,
            "active_rows": (sum(lane.load()["active_rows"] for lane in self.schedulers) + self._solo_rows)
            if requests
            else 0,
        }

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for lane in self.schedulers:
            lane.close()
