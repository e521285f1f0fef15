"""Giving memory back after a burst: the serving scheduler's part of issue 37, item 8.

Two allocators keep what a burst of large rounds took, and neither gives it back by itself:
- onnxruntime's CPU arenas, the decoder's and the encoder's (whose outputs, the cross keys and values, live as
  long as their searches), which the rounds shrink through runtime/arena.py's `ArenaShrink` (its docstring
  says how; runtime/graphs.py `shrink_encoder_arena` for the encoder's);
- glibc's malloc keeps freed blocks of the numpy arrays (the rounds' inputs, the cross rows of
  runtime/row_layout.py, the encoder's outputs on the request threads' arenas) below its mmap threshold in its
  heaps; `trim()` calls malloc_trim(0), which returns their free pages, when the scheduler falls idle (the
  scheduler drops its cache and cross rows then too).
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import ctypes.util
import os

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
