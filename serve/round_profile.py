"""Where a serving round's time goes, behind an environment flag (issue 36, item 3).

SEQ2ONNX_PROFILE_ROUNDS=1 makes the scheduler (serve/batcher.py) time each phase of its rounds (wall and the
thread's CPU time: under HTTP load the difference is mostly waiting for the GIL) with
time.perf_counter_ns and log a summary every 2,000 rounds and at close: per round and per row, the
decoder run against the Python around it (the scheduler's bookkeeping, the cross rows' layout, the
inputs and binding, the outputs' hand-out and the search programs' advancement). Off, each phase costs a
call that does nothing.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("seq2onnx.serve")
ENABLED = os.environ.get("SEQ2ONNX_PROFILE_ROUNDS", "") not in ("", "0")
PHASES = ("start", "sched", "layout", "inputs", "bind", "run", "outputs", "advance")


class RoundProfile:
    """Nanoseconds per phase, summed over rounds; `lap(phase)` charges the time since the last lap."""

    def __init__(self, every: int = 2000):
        self.every = every
        self.reset()

    def reset(self) -> None:
        self.ns = dict.fromkeys(PHASES, 0)
        self.cpu = dict.fromkeys(PHASES, 0)  # the scheduler thread's CPU time: the rest is waiting (the GIL)
        self.rounds = self.rows = self.searches = 0
        self.begin()

    def begin(self) -> None:
        self._last, self._last_cpu = time.perf_counter_ns(), time.thread_time_ns()

    def lap(self, phase: str) -> None:
        now, cpu = time.perf_counter_ns(), time.thread_time_ns()
        self.ns[phase] += now - self._last
        self.cpu[phase] += cpu - self._last_cpu
        self._last, self._last_cpu = now, cpu

    def end_round(self, rows: int, searches: int) -> None:
        self.rounds += 1
        self.rows += rows
        self.searches += searches
        if self.rounds >= self.every:
            self.report()

    def report(self) -> None:
        if not self.rounds:
            return
        total = sum(self.ns.values())
        per_round = {k: v / self.rounds / 1000 for k, v in self.ns.items()}
        shares = ", ".join(
            f"{k} {v:.0f} us ({100 * self.ns[k] / max(1, total):.0f}%, cpu {cpu / self.rounds / 1000:.0f})"
            for (k, v), cpu in zip(per_round.items(), self.cpu.values())
        )
        log.warning(
            "round profile: %d rounds, %.1f rows and %.1f searches per round; per round %.0f us "
            "(python %.0f us, %.1f us per row; scheduler thread cpu %.0f us): %s",
            self.rounds,
            self.rows / self.rounds,
            self.searches / self.rounds,
            total / self.rounds / 1000,
            (total - self.ns["run"]) / self.rounds / 1000,
            (total - self.ns["run"]) / max(1, self.rows) / 1000,
            sum(self.cpu.values()) / self.rounds / 1000,
            shares,
        )
        self.reset()


class NoProfile:
    """RoundProfile's methods doing nothing (the flag is off)."""

    def begin(self) -> None:
        pass

    def lap(self, phase: str) -> None:
        pass

    def end_round(self, rows: int, searches: int) -> None:
        pass

    def report(self) -> None:
        pass


def round_profile() -> RoundProfile | NoProfile:
    """A RoundProfile when SEQ2ONNX_PROFILE_ROUNDS is set, else a NoProfile."""
    return RoundProfile() if ENABLED else NoProfile()
