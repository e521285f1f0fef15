"""`seq2onnx bench`: the PyTorch reference, the ONNX runtime and CTranslate2 on the same model and sentences.

One run measures, for every engine and for {greedy, beam 4} x {batch 1, batch 32}: target tokens per
second (generated tokens, end token included), sentences per second, per-sentence latency p50/p90 at
batch 1, and the peak resident memory of the engine's process. By default every engine is tried at
each thread setting (bench/settings.py) and compared at its best; --threads N runs every engine at N
threads only. CTranslate2's timings count only when
its fp32 greedy outputs equal the PyTorch reference's on every sentence (the proof that the conversion
is right); otherwise the benchmark marks them void.

The work is done by seq2onnx.bench (its __init__ lists the modules); this module is the command.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from seq2onnx.bench.engines import ENGINES
from seq2onnx.bench.run import DEFAULT_SENTENCES, QUICK_SENTENCES

PSUTIL_MISSING = "`seq2onnx bench` needs psutil, which this install lacks: pip install 'seq2onnx[bench]'"


def add(subparsers) -> None:
    """Adds the `bench` subcommand to the `seq2onnx` parser."""
    p = subparsers.add_parser(
        "bench",
        help="benchmark the PyTorch reference, the ONNX runtime and CTranslate2 on the same model",
        description="Measure target tokens/s, sentences/s, latency p50/p90 at batch 1 and peak memory for "
        "the PyTorch reference decoder, the ONNX runtime (CPU fp32/int8; CUDA fp32/fp16 where a GPU is "
        "usable) and CTranslate2 on the same weights (optional: pip install 'seq2onnx[bench]'), greedy and "
        "beam 4, batch 1 and 32, on the checkpoint's test sentences. Each engine runs in its own process. By "
        "default every engine is tried at each thread setting: 1, 2, 4, ... intra-op threads up to the "
        "cores, and for the ONNX runtime and CTranslate2 also as many batches at once as cores, one thread "
        "each (CTranslate2 inter_threads; for seq2onnx one Translator shared by that many threads); the "
        "report's first table is each engine at its best setting per row, ratios best against best, then "
        "every setting, then every engine at all cores (equal threads). --threads N runs only that last "
        "table, every engine at N threads.",
    )
    p.add_argument("checkpoint", help="a run directory or one of its step-*/last/best")
    p.add_argument(
        "--bundle-dir",
        help="keep the bundles here (DIR/fp32, DIR/int8, DIR/ct2) and reuse them "
        "on later runs while the checkpoint's weights are the same; default: a temporary "
        "directory",
    )
    p.add_argument(
        "--sentences",
        type=int,
        help=f"test sentences (default {DEFAULT_SENTENCES}; {QUICK_SENTENCES} with --quick)",
    )
    p.add_argument("--data", help="TSV whose first lines to use instead of the checkpoint's test split")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="run every engine at N threads only, one batch at "
        "a time (the equal-threads table, no sweep); default 0: sweep the thread settings and "
        "compare each engine at its best",
    )
    p.add_argument(
        "--max-threads",
        type=int,
        default=0,
        help="with the sweep, try at most this many threads "
        "(default 0: all usable cores); the equal-threads table uses this many",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds, each running every engine at every thread "
        "setting once (one timed pass per configuration, the order rotating): tokens/s is the "
        "median pass, x torch / x ct2 the median over rounds of the ratio within a round (default "
        "1)",
    )
    p.add_argument("--engines", help=f"comma-separated subset of: {', '.join(ENGINES)} (torch always runs)")
    p.add_argument("--json", help="write the full report (machine, rows, outputs) to this file")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_SENTENCES} sentences, for tests and CI")
    p.set_defaults(func=run)


def run(args) -> int:
    """Runs the benchmark, prints the report; 1 when an engine could not run, else 0."""
    from seq2onnx.errors import CommandError, needs_torch

    needs_torch("bench")
    if importlib.util.find_spec("psutil") is None:
        raise CommandError(PSUTIL_MISSING)
    if args.sentences is not None and args.sentences < 1:
        raise CommandError(f"--sentences {args.sentences}: give at least 1")
    if args.threads < 0:
        raise CommandError(f"--threads {args.threads}: give 0 (sweep up to all cores) or more")
    if args.max_threads < 0:
        raise CommandError(f"--max-threads {args.max_threads}: give 0 (all cores) or more")
    if args.threads and args.max_threads:
        raise CommandError(
            "--threads N runs every engine at N threads only; --max-threads caps the sweep: give one"
        )
    if args.repeat < 1:
        raise CommandError(f"--repeat {args.repeat}: give at least 1")
    from seq2onnx.bench.report import format_report
    from seq2onnx.bench.run import run_bench

    engines = [e.strip() for e in args.engines.split(",") if e.strip()] if args.engines else None
    report = run_bench(
        args.checkpoint,
        sentences=args.sentences,
        threads=args.threads,
        bundle_dir=args.bundle_dir,
        quick=args.quick,
        engines=engines,
        repeat=args.repeat,
        data=args.data,
        sweep=not args.threads,
        max_threads=args.max_threads,
        log=lambda m: print(m, file=sys.stderr),
    )
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"report written to {args.json}")
    ran = {r["engine"] for r in report["rows"]}
    failed = [s for s in report["skipped"] if s["reason"].startswith("failed")]
    # A void CTranslate2 row is a finding, printed above; an engine that could not run is a failure.
    return 1 if failed or "torch" not in ran else 0
