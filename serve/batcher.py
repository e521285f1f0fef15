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
(serve/fused_rounds.py); elsewhere they run decoder.onnx, which takes each row's own step
(serve/standard_rounds.py). Either way rows of a greedy and of a beam request, or of sources of different
lengths, share one graph run.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import itertools
import logging
import queue
import threading
from typing import Iterator

import numpy as np

from seq2onnx.runtime import bundle as names
from seq2onnx.runtime.beam import BeamProgram, advance_together
from seq2onnx.runtime.fused_step import takes_row_start
from seq2onnx.runtime.options import SearchOptions
from seq2onnx.runtime.plan import SearchJob
from seq2onnx.runtime.search import greedy_one_program
from seq2onnx.runtime.text import text_increments
from seq2onnx.runtime.translator import Translator

from .engine import Cancelled, Engine, Job, search_here
from .fused_rounds import FusedRounds
from .memory import IDLE_S, TRIM_AFTER_ROUNDS, trim
from .round_profile import round_profile
from .standard_rounds import NoServingDecoder, StandardRounds, check_decoder

__all__ = ["ContinuousEngine", "Member", "NoServingDecoder", "RoundFailed", "Scheduler"]

log = logging.getLogger("seq2onnx.serve")


# The widest search decoded alone (ContinuousEngine solo): the hand-off it saves is a fixed cost, worth it for
# a lone client's small requests; a larger one goes to a lane, whose idle time gives its memory back (arena
# shrink, malloc_trim: serve/memory.py), which nothing does after a search decoded alone.
SOLO_MAX_ROWS = 32


class RoundFailed(RuntimeError):
    """The decoder graph failed on a round: every request in it is answered 500 (not its own fault: no
    422)."""


_SERIALS = itertools.count()  # a member's key in the scheduler's caches (an id() may be reused)


def _member(search: SearchJob, job: Job) -> Member:
    """The member of a planned search: its encoder outputs on the host, for the scheduler's per-row inputs."""
    src_mask, cross = search.encoded
    return Member(job, src_mask.numpy(), [c.numpy() for c in cross], search.top_k, search.beam_width)


class Member:
    """One search's rows in the shared batch, and the innermost step of its program: it answers with its
    rows of the round's output (the scheduler sets `answer` before it sends the program its output).

    Args:
        job: the request's Job (its cancel flag is read at every round).
        src_mask: (B, S) bool, the encoder's mask of this search's sources.
        cross: per layer and kind (B, H, S, Dh), the encoder's keys and values.
        top_k: candidates per row the search needs, or None for the full log-probabilities.
        width: rows per sentence after the first step (beam_size; 1 for greedy search and sampling).
    """

    def __init__(
        self, job: Job, src_mask: np.ndarray, cross: list[np.ndarray], top_k: int | None, width: int = 1
    ):
        self.job, self.top_k, self.src_mask, self.cross, self.width = job, top_k, src_mask, cross, width
        self.placed = None  # its rows in the rounds (serve/layout.py, serve/fused_rounds.py)
        self.serial = next(_SERIALS)
        self.version = 0  # changes when sentences leave: its per-row cross is then made again
        # its first row in the previous round's output (None before its first step)
        self.offset: int | None = None
        self.answer = None

    @property
    def rows(self) -> int:
        """The rows its search takes at its widest: sentences x width."""
        return self.src_mask.shape[0] * self.width

    def drop(self, keep: np.ndarray) -> None:
        """Finished sentences leave: their encoder outputs go too (`keep`: the sentences still decoding)."""
        self.cross = [c[keep] for c in self.cross]
        self.src_mask = self.src_mask[keep]
        self.version += 1

    def __call__(self, tokens, cache_indices, t, keep):
        return self.answer


class _Search:
    """A program in the scheduler: its member, the step that answers it (the member under its wrappers),
    its pending request (tokens, cache_indices, t, keep) and the future of its result. `together`: a beam
    program answered by its member's TopK alone (nothing forced), which the round advances together with the
    others (runtime/beam.py advance_together)."""

    def __init__(self, member: Member, program, step):
        self.member, self.program, self.step = member, program, step
        self.together = isinstance(program, BeamProgram) and step is member and member.top_k is not None
        self.request: tuple | None = None
        self.future: concurrent.futures.Future = concurrent.futures.Future()


class Scheduler:
    """Runs the decoder graph over the rows of every active search program, one round per step, on its own
    thread.

    Args:
        runner: what runs a round's graph: serve/fused_rounds.py's FusedRounds or serve/standard_rounds.py's
            StandardRounds (run(work, profile) -> answers, leave(member), idle(), clear(), shrink_arena(),
            last_rows).
    """

    def __init__(self, runner, name: str = "seq2onnx-scheduler"):
        self.runner = runner
        self.rows_in_flight = 0  # rows of the searches submitted and not finished (a lane's load)
        self._cond = threading.Condition()
        self._incoming: list[_Search] = []
        self._active: list[_Search] = []  # the rows' order in a round
        self._searches = 0  # submitted and not finished (under _cond: what idle() reads)
        self._closed = False
        # memory given back after bursts (serve/memory.py); the runner's buffers kept while idle
        self._trimmed_at, self._release_due, self._clear_due = 0, False, False
        self.rounds = 0
        self.last_rows = 0
        self.profile = round_profile()  # SEQ2ONNX_PROFILE_ROUNDS=1: where the rounds' time goes
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, member: Member, program, step) -> concurrent.futures.Future:
        """Adds a search program (not started) answered by `step` (member, or a wrapper of it); returns the
        future of its result. It joins the running batch at the next round."""
        search = _Search(member, program, step)
        with self._cond:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            rows = member.rows
            self._incoming.append(search)
            self._searches += 1
            self.rows_in_flight += rows
            self._cond.notify()
        search.future.add_done_callback(lambda _: self._done(rows))
        return search.future

    def _done(self, rows: int) -> None:
        with self._cond:
            self.rows_in_flight -= rows

    def close(self) -> None:
        """Refuses new searches; the loop ends once those running are done."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=30)

    def idle(self) -> bool:
        """No search is running or waiting to start (one being started counts: _searches falls in _finish)."""
        with self._cond:
            return self._searches == 0

    def load(self) -> dict:
        """{"active_searches": searches running now, "active_rows": rows of the last round}."""
        running = sum(not s.future.done() for s in list(self._active))  # read from another thread: a copy
        return {"active_searches": running, "active_rows": self.last_rows if running else 0}

    # -- the rounds (the scheduler's thread only) --------------------------------------------------

    def _loop(self) -> None:
        while (new := self._wait()) is not None:
            self._step(new)
        self.profile.report()

    def _wait(self) -> list[_Search] | None:
        """Blocks until a search is new or active; returns the new ones (None once closed and idle)."""
        with self._cond:
            while not self._incoming and not self._active:
                if self._closed:
                    return None
                # still idle IDLE_S: the runner's buffers go, and after a burst the memory is given back
                if self._clear_due or self._release_due:
                    if not self._cond.wait(timeout=IDLE_S):
                        self._clear_due = False
                        self.runner.clear()
                        if self._release_due:
                            self._release()
                    continue
                self._cond.wait()
            new, self._incoming = self._incoming, []
        return new

    def _step(self, new: list[_Search]) -> None:
        """One round: the new searches start, the cancelled ones leave, the decoder runs over the rows of the
        others and each is sent its rows of the output."""
        prof = self.profile
        prof.begin()
        for search in new:
            self._advance(search, first=True)
        prof.lap("start")
        for search in self._active:
            if search.member.job.cancelled.is_set():
                self._finish(search, error=Cancelled("the request was cancelled"))
        self._active = [s for s in self._active if not s.future.done()]
        if not self._active:
            self._idle()
            return
        work = self._work()
        prof.lap("sched")
        try:
            answers = self._round(work)
        except Exception as e:  # every search of the round fails, as a fault of the server
            self._fail(e)
            return
        self._advance_round(answers)
        prof.lap("advance")
        searches = len(self._active)
        self._active = [s for s in self._active if not s.future.done()]
        if not self._active:
            self._idle()
        prof.lap("sched")
        prof.end_round(self.last_rows, searches)

    def _work(self) -> list[tuple]:
        """(member, tokens, cache indices, step, keep, width) of each active search's request."""
        work = []
        for search in self._active:
            tokens, cache_indices, t, keep = search.request
            work.append(
                (
                    search.member,
                    np.asarray(tokens, dtype=np.int64).reshape(-1),
                    np.asarray(cache_indices, dtype=np.int64).reshape(-1),
                    t,
                    keep,
                    search.member.width,
                )
            )
        return work

    def _round(self, work: list) -> dict:
        """Runs the round's graph (the runner); returns each member's answer."""
        answers = self.runner.run(work, self.profile)
        self.rounds += 1
        self.last_rows = self.runner.last_rows
        return answers

    def _fail(self, e: Exception) -> None:
        """A round failed: every search in it is answered RoundFailed; the cache and the layout go."""
        failed = RoundFailed(f"the decoder step failed: {type(e).__name__}: {e}")
        for search in self._active:
            self._finish(search, error=failed)
        self._active = []
        self.runner.clear()

    def _idle(self) -> None:
        """Nobody reads the cache or the cross inputs any more: the runner drops them once the scheduler has
        stayed idle IDLE_S (a lone client's next request, a few ms later, finds them allocated and bound: at
        one client that was ~0.2 ms of every request, docs/optimisation-notes.md row 40); after a burst
        (TRIM_AFTER_ROUNDS rounds at least: serve/memory.py) the memory is given back then too, when the
        requests' threads have let go of their buffers."""
        self.runner.idle()
        self._clear_due = True
        self._release_due = self.rounds - self._trimmed_at >= TRIM_AFTER_ROUNDS

    def _release(self) -> None:
        """The arena's chunks and the heaps' free pages back to the system (under the lock: a few ms)."""
        self._release_due, self._trimmed_at = False, self.rounds
        gc.collect()  # the burst's searches sit in reference cycles (programs, their steps and members)
        try:
            for _ in range(2 if self.runner.shrink.enabled else 0):  # twice: the first run's tensors may pin
                self.runner.shrink_arena()
        except Exception as e:  # giving memory back must never fail a server: say so, serve on
            log.warning("could not shrink the decoder's memory arena: %s: %s", type(e).__name__, e)
        trim()

    def _advance_round(self, answers: dict) -> None:
        """Sends every active program its rows of the round's output: the beam programs answered by their
        TopK alone all at once (one ranking of their candidates, docs/optimisation-notes.md row 54), the
        others one by one."""
        together = [s for s in self._active if s.together]
        if together:
            outcomes = advance_together([s.program for s in together], [answers[s.member] for s in together])
            for search, outcome in zip(together, outcomes):
                if isinstance(outcome, StopIteration):
                    self._finish(search, result=outcome.value)
                elif isinstance(outcome, BaseException):
                    self._finish(search, error=outcome)
                else:
                    search.request = outcome
        for search in self._active:
            if not search.together:
                search.member.answer = answers[search.member]
                self._advance(search)
                search.member.answer = None

    def _advance(self, search: _Search, first: bool = False) -> None:
        """Sends a program its step's output (or starts it): its next request, or its end."""
        try:
            search.request = (
                next(search.program) if first else search.program.send(search.step(*search.request))
            )
        except StopIteration as done:
            self._finish(search, result=done.value)
            return
        # the program's own error (a ValueError of its options): its request's answer
        except BaseException as e:
            self._finish(search, error=e)
            return
        if first:
            self._active.append(search)

    def _finish(self, search: _Search, *, result=None, error: BaseException | None = None) -> None:
        with self._cond:
            self._searches -= 1
        self.runner.leave(search.member)
        search.program.close()
        search.request = None
        if error is not None:
            search.future.set_exception(error)
        else:
            search.future.set_result(result)


def rounds_runner(translator: Translator, decoder: str = "auto"):
    """What runs a Translator's serving rounds: the fused decoder's in-place rounds where the Translator
    drives the fused decoder and its graph takes `row_start`, else decoder.onnx's.

    Args:
        translator: the Translator served.
        decoder: "auto", "fused" or "standard" (the rounds' graph; "fused" raises where it cannot run).

    Raises:
        NoServingDecoder: the standard rounds on a decoder.onnx exported before continuous batching.
        ValueError: decoder="fused" where the fused rounds cannot run, or an unknown `decoder`.
    """
    fused = translator.decoder_variant == names.FUSED and takes_row_start(translator.decoder)
    if decoder not in ("auto", "fused", "standard"):
        raise ValueError(f"decoder={decoder!r}: give 'auto', 'fused' or 'standard'")
    if decoder == "fused" and not fused:
        raise ValueError(
            f"{translator.bundle.path}: the fused serving rounds need the fused decoder driven "
            f"({translator.decoder_variant} is) and a decoder_fused.onnx with input {names.ROW_START!r} "
            "(export the bundle again); or serve with the standard rounds"
        )
    t = translator
    sizes = {"n_layers": t.n_layers, "n_heads": t.n_heads, "head_dim": t.head_dim, "vocab": t.tgt_vocab}
    if fused and decoder != "standard":
        return FusedRounds(t.decoder, max_positions=t.max_positions, **sizes)
    standard = t.standard_decoder
    check_decoder(standard, t.bundle.path)
    return StandardRounds(
        standard, cache_dtype=t.cache_dtype, to_device=t.to_device, device=t.ort_device, **sizes
    )


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
        max_rows: int = 1024,
        decoder: str = "auto",
        lanes: int = 1,
        solo: bool = True,
    ):
        if not isinstance(lanes, int) or isinstance(lanes, bool) or lanes < 1:
            raise ValueError(f"lanes={lanes!r}: give an int >= 1 (schedulers over the same sessions)")
        super().__init__(translator, max_rows)
        runners = [rounds_runner(translator, decoder) for _ in range(lanes)]
        self.rounds = "fused" if isinstance(runners[0], FusedRounds) else "standard"  # the rounds' graph
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
        member = _member(search, job)
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
        member = _member(search, job)
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
