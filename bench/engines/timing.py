"""The child's timing loop and memory measures: one engine, loaded once, timed over the job's batches."""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from pathlib import Path

from .base import Runner, make_runner


def rss_mb() -> float:
    """Returns the resident set size of this process now, in MiB (psutil's memory_info().rss)."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    """Returns the peak resident set size of this process, in MiB.

    Linux: the kernel's high-water mark VmHWM from /proc/self/status. psutil reports no peak on
    Linux, and resource.getrusage's ru_maxrss is no use here: exec hands the parent's peak to the
    child (measured: a child of a parent holding 600 MB reported ru_maxrss 611 MB, VmHWM 13 MB), and
    the parent of these children holds the PyTorch model. Windows: psutil's peak_wset, the same
    measure. Elsewhere (macOS): ru_maxrss, in bytes there, the only peak the system offers.
    """
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024  # kB
        except OSError:
            pass
    if sys.platform == "win32":
        import psutil

        return psutil.Process().memory_info().peak_wset / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def _one_pass(runner: Runner, chunks: list[list[int]], beam: int, outputs: dict) -> list[float]:
    """Decodes every chunk once; returns the times: per chunk, or the pass's wall time in parallel."""
    if runner.parallel == 1:
        times = []
        for chunk in chunks:
            t = time.perf_counter()
            out = runner.run(chunk, beam)
            times.append(time.perf_counter() - t)
            outputs.update(zip(chunk, out))
        return times
    t = time.perf_counter()  # the batches overlap: only the pass's wall time means something
    for chunk, out in zip(chunks, runner.run_many(chunks, beam)):
        outputs.update(zip(chunk, out))
    return [time.perf_counter() - t]


def _time_config(runner: Runner, job: dict, beam: int, batch: int) -> dict:
    """One (beam, batch) configuration: a warm-up call, then `repeat` timed passes over every sentence."""
    order = job["order"]
    chunks = [order[i : i + batch] for i in range(0, len(order), batch)]
    if runner.parallel == 1:
        runner.run(chunks[0], beam)  # warm-up: first-call allocations, graph optimisation, thread pools
    else:
        runner.run_many(chunks[: runner.parallel], beam)  # every worker's first call
    outputs: dict[int, list[int]] = {}
    passes = [_one_pass(runner, chunks, beam, outputs) for _ in range(job["repeat"])]
    totals = [sum(p) for p in passes]
    median_pass = passes[totals.index(sorted(totals)[(len(totals) - 1) // 2])]
    latencies = (
        [statistics.median(p[c] for p in passes) * 1000 for c in range(len(chunks))]
        if runner.parallel == 1
        else None
    )
    return {
        "beam": beam,
        "batch": batch,
        "seconds": sum(median_pass),
        "pass_seconds": totals,
        "latencies_ms": latencies if batch == 1 else None,
        "batch_latencies_ms": latencies if batch != 1 else None,
        "outputs": [outputs[i] for i in range(len(job["sources"]))],
    }


def run_engine(job: dict) -> dict:
    """Loads one engine, then times it per (beam, batch) configuration.

    For each (beam, batch): one warm-up call, `repeat` timed passes over all the sentences in the
    job's batches.

    Args:
        job: the job that bench/run.py wrote (configs, order, repeat, ...).

    Returns:
        Timings, outputs and memory: the engine, its description, load time, RSS after load, peak
        RSS and one entry per configuration.

    Raises:
        ValueError: an unknown engine, or a parallel setting for an engine without one.
    """
    t0 = time.perf_counter()
    runner = make_runner(job)
    load_s = time.perf_counter() - t0
    rss_loaded = rss_mb()
    results = [_time_config(runner, job, beam, batch) for beam, batch in job["configs"]]
    return {
        "engine": job["engine"],
        "intra_threads": job["threads"],
        "parallel": runner.parallel,
        "description": runner.describe(),
        "load_seconds": load_s,
        "rss_after_load_mb": rss_loaded,
        "peak_rss_mb": peak_rss_mb(),
        "configs": results,
    }


def main(argv: list[str]) -> int:
    """The child's entry point.

    Args:
        argv: [JOB.json, OUT.json]: reads the job from argv[0], writes the result to argv[1].

    Returns:
        0.
    """
    job_path, out_path = argv
    job = json.loads(Path(job_path).read_text())
    Path(out_path).write_text(json.dumps(run_engine(job)))
    return 0
