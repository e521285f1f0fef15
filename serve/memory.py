"""Giving memory back after a burst (issue 37, item 8): the continuous scheduler does it in its loop
(serve/scheduler.py), `--batching request` through IdleRelease (below).

Two allocators keep what a burst of large rounds took, and neither gives it back by itself:
- onnxruntime's CPU arenas, the decoder's and the encoder's (whose outputs, the cross keys and values, live as
  long as their searches), which the rounds shrink through runtime/arena.py's `ArenaShrink` (its docstring
  says how; runtime/graphs.py `shrink_encoder_arena` for the encoder's);
- glibc's malloc keeps freed blocks of the numpy arrays (the rounds' inputs, the cross rows of
  runtime/row_layout.py, the encoder's outputs on the request threads' arenas) below its mmap threshold in its
  heaps; `trim()` calls malloc_trim(0), which returns their free pages, when the engine falls idle (the
  scheduler drops its cache and cross rows then too).
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import ctypes.util
import gc
import logging
import os
import threading
from collections.abc import Callable

# What a decoder row in flight costs, measured: 16 clients of 8-32 texts at beam 4 (2,048 rows) took the 0.7M
# demo model to a 3.1 GB peak (issue 60), about 1.5 MiB a row, mostly allocator and arena growth; larger
# models cost more per row (their caches), so this is a floor, not an estimate.
ROW_BYTES = 3 << 19
MEMORY_SHARE = 0.5  # of the machine's memory, for every process's rows together
# ... and never more than this many per process: what a burst holds at its peak, onnxruntime's arena and
# the heaps keep in part after it. Measured on the demo model with issue 60's heavy requests
# (scripts/soak.py --mix heavy; docs/serving.md): 16 clients for 1 min, the memory-based default (~7,800
# rows on a 23 GB machine) kept 1.96x the warm RSS after idle, 1,024 rows 1.38x, 512 rows 1.24x; 64 clients
# for 10 min, 1,024 rows kept 1.63x (past the 1.5x goal) and 512 rows 1.10x. It is also one request's
# `--max-rows` default (MAX_ROWS): the cap may not go below it; 512 rows are 32 texts together at beam 16.
ROWS_CAP = 512
MAX_ROWS = ROWS_CAP


def rows_in_flight_default(max_rows: int, processes: int = 1) -> int:
    """`--max-rows-in-flight`'s default: the rows that MEMORY_SHARE of this machine's memory holds at
    ROW_BYTES each, shared among `processes`, at most ROWS_CAP, and never below one request's `max_rows`.

    Args:
        max_rows: `--max-rows` (one request's rows at most).
        processes: `--processes`.
    """
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: 8 GiB assumed
        total = 8 << 30
    return max(max_rows, min(ROWS_CAP, int(total * MEMORY_SHARE / ROW_BYTES / max(1, processes))))


class RowGate:
    """`--max-rows-in-flight` as a line, not a refusal: a request waits, in arrival order, until the rows it
    needs are free. Refused with 503 and retried, a large request lost to every smaller one that fit in
    between (a soak's p99 reached 594 s); in line, none overtakes another. The line is bounded by the queue's
    own limits (`--max-queue`, `--timeout`): a waiting request holds its queue slot and nothing else.

    Used on the event loop's thread only (serve/app.py), so it needs no lock.

    Args:
        limit: rows in flight at most, all requests together.
    """

    def __init__(self, limit: int):
        self.limit, self.held = limit, 0
        self._line: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    def take(self, rows: int) -> asyncio.Future:
        """A future done once `rows` are held for the caller (who gives them back with give()). Cancelling it
        leaves the line; rows above the limit are never granted (the caller refuses them first)."""
        granted = asyncio.get_running_loop().create_future()
        self._line.append((rows, granted))
        granted.add_done_callback(lambda f: f.cancelled() and self._admit())
        self._admit()
        return granted

    def give(self, rows: int) -> None:
        """Gives back rows that take() granted, and admits who is next in line."""
        self.held -= rows
        self._admit()

    def _admit(self) -> None:
        while self._line:
            rows, granted = self._line[0]
            if not granted.cancelled():
                if self.held + rows > self.limit:
                    return  # the head waits, and so does everyone behind it: first come, first served
                self.held += rows
                granted.set_result(None)
            self._line.popleft()

    @property
    def waiting(self) -> int:
        """Requests in line for rows."""
        return sum(not granted.done() for _, granted in self._line)


IDLE_S = 0.2  # idle this long after a burst, the scheduler gives memory back (the requests' threads are done)
# ... and trims once more this long after: on a loaded machine a request's thread may still hold its buffers
# (encoder outputs, the answer) at the first trim, and what it frees later would stay resident
LATE_TRIM_S = 2.0
# a trim costs a walk of the heaps: not after every one-sentence request of a lone client
TRIM_AFTER_ROUNDS = 64
TRIM_AFTER_ROWS = 64  # the same for `--batching request`, which sees requests' rows, not rounds

log = logging.getLogger("seq2onnx.serve")


def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim") if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to call
        return None


_TRIM = _malloc_trim()


def trim() -> bool:
    """Returns the C heap's free pages to the system (glibc's malloc_trim(0)); False where there is none."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


def release_memory(shrink: Callable[[], None] | None = None) -> None:
    """Gives memory back after a burst, for both engines (the scheduler's loop, IdleRelease): collects the
    searches' reference cycles (programs, their steps and members), runs `shrink` twice (an arena's one-row
    run under shrinkage; twice, since the first run's tensors may pin a chunk) and trims the C heap. Without
    `shrink`, the late trim. A failing shrink is logged, never raised: a server serves on."""
    gc.collect()
    try:
        for _ in range(2 if shrink else 0):
            shrink()
    except Exception as e:
        log.warning("could not shrink the sessions' memory arenas: %s: %s", type(e).__name__, e)
    trim()


class IdleRelease:
    """Gives memory back once an engine has stayed idle IDLE_S after a burst: `--batching request`'s part of
    item 8 (serve/engine.py RequestEngine; the continuous scheduler does the same in its own loop). After at
    least `after_rows` rows decoded since the last release, once nothing has run for IDLE_S, it collects
    reference cycles, calls `give_back` twice (the arenas' shrink runs, runtime/rounds.py `arena_release`:
    the first run's tensors may pin a chunk) and trims the C heap; LATE_TRIM_S later, still idle, it collects
    and trims once more (what the requests' threads let go of since). Its own thread waits; the work runs
    under its lock, so a request that starts meanwhile waits those few ms.

    Args:
        give_back: shrinks the sessions' arenas; an error is logged, never raised (a server serves on).
        after_rows: rows decoded since the last release before another is due.
    """

    def __init__(self, give_back: Callable[[], None], after_rows: int = TRIM_AFTER_ROWS):
        self._give_back, self._after_rows = give_back, after_rows
        self._cond = threading.Condition()
        self._running, self._rows, self._late, self._closed = 0, 0, False, False
        self.releases = 0  # releases done so far (tests, /metrics-free diagnosis)
        self._thread = threading.Thread(target=self._loop, name="seq2onnx-release", daemon=True)
        self._thread.start()

    def started(self, rows: int) -> None:
        """A request of `rows` decoder rows starts decoding."""
        with self._cond:
            self._running, self._rows = self._running + 1, self._rows + rows
            self._cond.notify()

    def ended(self) -> None:
        """A request that started() ended, however."""
        with self._cond:
            self._running -= 1
            self._cond.notify()

    def close(self) -> None:
        """Stops the thread (a release under way ends first)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        with self._cond:
            while not self._closed:
                due = self._rows >= self._after_rows
                if self._running or not (due or self._late):
                    self._cond.wait()
                elif not self._cond.wait(timeout=IDLE_S if due else LATE_TRIM_S) and not self._running:
                    self._release(due)  # still idle, nothing started or ended meanwhile

    def _release(self, due: bool) -> None:
        release_memory(self._give_back if due else None)  # under the lock: started() waits for it
        self._late = due  # a late trim after a release, none after the late trim
        if due:
            self._rows, self.releases = 0, self.releases + 1
