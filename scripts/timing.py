"""Interleaved rounds, the timing every script here shares: this machine's speed drifts over
minutes, so each round times every variant once, seconds apart, and a variant's figure is its
median over rounds."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def interleaved_us(runs: dict[str, Callable[[], object]], rounds: int, calls: int) -> dict[str, float]:
    """Median microseconds per call of each run, over `rounds` rounds of `calls` calls each, after
    one warm-up call per run (thread pools, first allocations)."""
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(rounds):
        for label, run in runs.items():
            t = time.perf_counter()
            for _ in range(calls):
                run()
            times[label].append((time.perf_counter() - t) / calls * 1e6)
    return {label: statistics.median(v) for label, v in times.items()}
