"""The continuous batcher's scheduler: one thread that runs rounds over the rows of every search in flight.

Each search is a program (runtime/search.py) and a Member: its rows in the shared batch, and the innermost
step of its program. A round runs the decoder graph ONCE over the rows of every member (the runner:
runtime/fused_rounds.py or runtime/standard_rounds.py), then sends each program its own rows of the output;
serve/batcher.py's ContinuousEngine hands searches to schedulers (its lanes) and says why this design.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading

import numpy as np

from seq2onnx.runtime.beam import BeamProgram, advance_together
from seq2onnx.runtime.plan import SearchJob

from .engine import Cancelled, Job
from .memory import IDLE_S, LATE_TRIM_S, TRIM_AFTER_ROUNDS, release_memory
from .round_profile import round_profile

__all__ = ["Member", "RoundFailed", "Scheduler", "member_of"]


class RoundFailed(RuntimeError):
    """The decoder graph failed on a round: every request in it is answered 500 (not its own fault: no
    422)."""


_SERIALS = itertools.count()  # a member's key in the scheduler's caches (an id() may be reused)


def member_of(search: SearchJob, job: Job) -> Member:
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
        self.placed = None  # its rows in the rounds (runtime/row_layout.py, runtime/fused_rounds.py)
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
        runner: what runs a round's graph (runtime/rounds.py's rounds_runner): a FusedRounds or a
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
        self._trimmed_at, self._release_due, self._clear_due, self._late_trim_due = 0, False, False, False
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
                if self._late_trim_due:  # after a release: what the requests' threads let go of since
                    if not self._cond.wait(timeout=LATE_TRIM_S):
                        self._late_trim_due = False
                        release_memory()
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
        self._release_due, self._trimmed_at, self._late_trim_due = False, self.rounds, True
        release_memory(self.runner.shrink_arena)

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
