"""Measures what each runtime optimisation brings, one switch at a time, in one run.

    python benchmarks/ablate.py BUNDLE [--int8 BUNDLE_INT8] [--sentences 200] [--repeat 3]

Every variant translates the same sentences (the generated corpus, or --data TSV's first column)
with beam 4 at batch 32 and greedy at batch 1; the table gives target tokens per second and the
ratio to the default configuration. Results go with docs/optimisation-notes.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.translator import Translator  # noqa: E402


def load_sentences(n: int, data: str | None, col: int) -> list[str]:
    if data:
        lines = Path(data).read_text(encoding="utf-8-sig").splitlines()
        return [l.split("\t")[col] for l in lines if l.strip()][-n:]
    from model.corpus import generate_pairs  # stdlib only: no torch

    return [s for s, _ in generate_pairs(n, seed=4242)]


def measure(translator: Translator, texts: list[str], beam: int, batch: int, repeat: int) -> float:
    """Median target tokens per second over `repeat` passes (end token counted)."""
    translator.translate_batch(texts[:batch], beam_size=beam, max_batch_size=batch)  # warm-up
    rates = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        tokens = 0
        for start in range(0, len(texts), batch):
            for r in translator.translate_batch(texts[start : start + batch], beam_size=beam, max_batch_size=batch):
                tokens += len(r.token_ids[0]) + 1
        rates.append(tokens / (time.perf_counter() - t0))
    return statistics.median(rates)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle")
    p.add_argument("--int8", help="the int8 bundle of the same checkpoint")
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--data", help="TSV to take sentences from (its last --sentences lines)")
    p.add_argument("--col", type=int, default=0, help="source column of --data")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    texts = load_sentences(args.sentences, args.data, args.col)
    variants = {
        "default (all optimisations, top-k from graph, 2 threads)": dict(),
        "full log_probs downloaded (no graph top-k)": dict(top_k_from_graph=False),
        "graph optimisation: basic": dict(optimization="basic"),
        "graph optimisation: none": dict(optimization="none"),
        "1 intra-op thread": dict(intra_threads=1),
    }
    rows = []
    for name, kw in variants.items():
        kw = {"intra_threads": 2, **kw}
        tr = Translator(args.bundle, device="cpu", **kw)
        rows.append((name, measure(tr, texts, 4, 32, args.repeat), measure(tr, texts, 1, 1, args.repeat)))
    if args.int8:
        tr = Translator(args.int8, device="cpu", intra_threads=2)
        rows.append(("int8 bundle", measure(tr, texts, 4, 32, args.repeat), measure(tr, texts, 1, 1, args.repeat)))
    base = rows[0]
    print(f"{len(texts)} sentences, median of {args.repeat}; target tokens/s (ratio to default)")
    print(f"{'variant':<58} {'beam4 batch32':>20} {'greedy batch1':>20}")
    for name, beam, greedy in rows:
        print(f"{name:<58} {beam:>10.0f} ({beam / base[1]:.2f}x) {greedy:>10.0f} ({greedy / base[2]:.2f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps([{"variant": n, "beam4_batch32": b, "greedy_batch1": g}
                                               for n, b, g in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
