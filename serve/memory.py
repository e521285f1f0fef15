"""Giving memory back after a burst: the serving scheduler's part of issue 37, item 8.

Two allocators keep what a burst of large rounds took, and neither gives it back by itself:
- onnxruntime's CPU arena (a BFC arena) grows by chunks to hold the largest round's tensors (the cache is
  rows x slots x layers x d_model) and keeps them for the session's life. Its documented remedy is a run
  option, "memory.enable_memory_arena_shrinkage", which frees the arena's wholly unused chunks at the end of
  that run; `ArenaShrink` asks for it on a round once the rows have fallen to half of their peak since the
  last shrink (not every round: freed chunks would be allocated again at the next growth);
- glibc's malloc keeps freed blocks of the numpy arrays (the rounds' inputs, the cross rows of
  serve/layout.py, the encoder's outputs on the request threads' arenas) below its mmap threshold in its
  heaps; `trim()` calls malloc_trim(0), which returns their free pages, when the scheduler falls idle (the
  scheduler drops its cache and cross rows then too).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# What a decoder row in flight costs, measured: 16 clients of 8-32 texts at beam 4 (2,048 rows) took the 0.7M
# demo model to a 3.1 GB peak (issue 60), about 1.5 MiB a row, mostly allocator and arena growth; larger
# models cost more per row (their caches), so this is a floor, not an estimate.
ROW_BYTES = 3 << 19
MEMORY_SHARE = 0.5  # of the machine's memory, for every process's rows together
# ... and never more than this many per process: what a burst holds at its peak, onnxruntime's arena and the
# heaps keep in part after it. Measured on the demo model, 16 clients of issue 60's heavy requests for 1 min
# (scripts/soak.py --mix heavy): the memory-based default (~7,800 rows on a 23 GB machine) peaked at 750 MB
# and kept 348 MB idle against 178 MB warm (1.96x); 1,024 rows peaked at 646 and kept 248 (1.38x), and
# answered more requests (114 against 102: less memory to fault in); 512 rows 289 and 225 (1.24x), 150.
ROWS_CAP = 1024


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


SHRINK_KEY = "memory.enable_memory_arena_shrinkage"
IDLE_S = 0.2  # idle this long after a burst, the scheduler gives memory back (the requests' threads are done)
# a trim costs a walk of the heaps: not after every one-sentence request of a lone client
TRIM_AFTER_ROUNDS = 64
# a shrink frees chunks that the next growth allocates again: not on every falling round
MIN_ROUNDS_BETWEEN = 8


class ArenaShrink:
    """When a round should run with onnxruntime's arena shrinkage, and the RunOptions that ask for it.

    Args:
        device: "cpu" or "cuda": whose arena is shrunk (the CPU's always: outputs are bound there too).
    """

    def __init__(self, device: str = "cpu"):
        import onnxruntime

        self.options = onnxruntime.RunOptions()
        self.options.add_run_config_entry(SHRINK_KEY, "cpu:0;gpu:0" if device == "cuda" else "cpu:0")
        self.peak, self.since, self.count = 0, 0, 0

    def run_options(self, rows: int):
        """The RunOptions for a round of `rows` rows: the shrinking ones, or None (onnxruntime's defaults)."""
        self.peak, self.since = max(self.peak, rows), self.since + 1
        if not self.enabled or 2 * rows > self.peak or self.since < MIN_ROUNDS_BETWEEN:
            return None
        self.peak, self.since, self.count = rows, 0, self.count + 1
        return self.options

    enabled = True  # False once a session refused the option (it has no arena: nothing to shrink)

    def run(self, session, binding, rows: int = 0, shrink: bool = False) -> None:
        """session.run_with_iobinding(binding), under shrinkage when `shrink` or run_options(rows) says so.

        A session without an arena (enable_cpu_mem_arena off) refuses the option ("Did not find an arena based
        allocator"): the run is made again without it, and shrinking is off from then on.
        """
        options = (self.options if self.enabled else None) if shrink else self.run_options(rows)
        try:
            session.run_with_iobinding(binding, options)
        except Exception as e:
            if options is None or "arena" not in str(e):
                raise
            self.enabled = False
            session.run_with_iobinding(binding)


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
