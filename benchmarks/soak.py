"""Long run: translate 10,000 sentences in a loop with one Translator and report resident memory.

    python benchmarks/soak.py BUNDLE [--sentences 10000] [--batch 32] [--beam 4]

Memory is read from /proc/self/statm (resident set) after every batch. The inputs cycle through a
pool of 2,000 distinct sentences; the warm-up is the first pass over that pool (at least 10% of
the run), because onnxruntime's arena grows until it has seen every batch shape once and then
reuses its blocks. The resident set then still swings by a few percent from batch to batch (the
allocator returns and takes back pages), so one reading against another measures that swing, not a
leak: growth is the median of the readings over the last tenth of the run against the median over
the tenth after the warm-up. The largest reading is reported too; the run fails (exit 1) when the
growth is 5% or more.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


from seq2onnx.runtime.translator import Translator


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


POOL = 2000


def sentences(n: int) -> list[str]:
    """Varied inputs without torch: the generated corpus's sources (model/corpus.py is stdlib-only)."""
    from seq2onnx.model.corpus import generate_pairs

    pool = [s for s, _ in generate_pairs(POOL, seed=99)]
    return [pool[i % len(pool)] for i in range(n)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle")
    p.add_argument("--sentences", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    translator = Translator(args.bundle, device="cpu")
    texts = sentences(args.sentences)
    # one pass over the distinct inputs (every batch shape seen once), but never more than half the run
    warmup_end = max(min(POOL, args.sentences // 2), args.sentences // 10, args.batch)
    samples: list[tuple[int, float]] = []
    t0 = time.time()
    baseline = None
    for start in range(0, len(texts), args.batch):
        translator.translate_batch(texts[start : start + args.batch], beam_size=args.beam)
        done = min(start + args.batch, len(texts))
        samples.append((done, rss_mb()))
        if baseline is None and done >= warmup_end:
            baseline = samples[-1][1]
        if done % 1000 < args.batch:
            print(f"{done:>6} sentences  rss {samples[-1][1]:.1f} MB  {time.time() - t0:.0f} s", flush=True)
    window = max(args.sentences // 10, args.batch)
    after = [m for done, m in samples if warmup_end <= done < warmup_end + window] or [baseline]
    last = [m for done, m in samples if done > len(texts) - window] or [samples[-1][1]]
    baseline, final = statistics.median(after), statistics.median(last)
    growth = (final - baseline) / baseline
    peak = max(m for _, m in samples)
    peak_after = max(m for done, m in samples if done >= warmup_end)
    report = {"sentences": len(texts), "distinct": min(POOL, len(texts)), "beam": args.beam, "batch": args.batch,
              "warmup_sentences": warmup_end, "rss_after_warmup_mb": baseline, "rss_final_mb": final, "window_sentences": window,
              "rss_peak_mb": peak, "growth_after_warmup": growth,
              "largest_growth_after_warmup": (peak_after - baseline) / baseline, "seconds": time.time() - t0,
              "readings": [{"sentences": d, "rss_mb": round(m, 1)} for d, m in samples]}
    print(json.dumps({k: v for k, v in report.items() if k != "readings"}, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if growth < 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
