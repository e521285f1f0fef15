"""Long run: translate 10,000 sentences in a loop with one Translator and report resident memory.

    python benchmarks/soak.py BUNDLE [--sentences 10000] [--batch 32] [--beam 4]

Memory is read from /proc/self/statm (resident set) after every batch. Growth is measured from
the end of the warm-up (the first 10% of the sentences: onnxruntime's arena and caches settle
there) to the end; the run fails (exit 1) when it is 5% or more.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.translator import Translator  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def sentences(n: int) -> list[str]:
    """Varied inputs without torch: the generated corpus's sources (model/corpus.py is stdlib-only)."""
    from model.corpus import generate_pairs

    pool = [s for s, _ in generate_pairs(2000, seed=99)]
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
    warmup_end = max(args.sentences // 10, args.batch)
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
    final = samples[-1][1]
    growth = (final - baseline) / baseline
    peak = max(m for _, m in samples)
    report = {"sentences": len(texts), "beam": args.beam, "batch": args.batch, "rss_after_warmup_mb": baseline,
              "rss_final_mb": final, "rss_peak_mb": peak, "growth_after_warmup": growth, "seconds": time.time() - t0}
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if growth < 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
