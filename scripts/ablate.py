"""Measures what each runtime optimisation brings, one switch at a time, in one run.

    python scripts/ablate.py BUNDLE [--int8 BUNDLE_INT8] [--other BUNDLE] [--sentences 200] [--repeat 5]

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


from seq2onnx.runtime.options import SessionTuning
from seq2onnx.runtime.translator import Translator


def load_sentences(n: int, data: str | None, col: int) -> list[str]:
    if data:
        lines = Path(data).read_text(encoding="utf-8-sig").splitlines()
        return [l.split("\t")[col] for l in lines if l.strip()][-n:]
    from seq2onnx.model.corpus import generate_pairs  # stdlib only: no torch

    return [s for s, _ in generate_pairs(n, seed=4242)]


def measure(translator: Translator, texts: list[str], beam: int, batch: int) -> float:
    """Target tokens per second over one pass (end token counted)."""
    t0 = time.perf_counter()
    tokens = 0
    for start in range(0, len(texts), batch):
        chunk = texts[start : start + batch]
        for r in translator.translate_batch(chunk, beam_size=beam, max_batch_size=batch):
            tokens += len(r.token_ids[0]) + 1
    return tokens / (time.perf_counter() - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle")
    p.add_argument("--int8", help="the int8 bundle of the same checkpoint")
    p.add_argument("--other", help="another fp32 bundle of the same checkpoint, e.g. exported by an earlier "
                                   "version")
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--data", help="TSV to take sentences from (its last --sentences lines)")
    p.add_argument("--col", type=int, default=0, help="source column of --data")
    p.add_argument("--repeat", type=int, default=5, help="interleaved rounds")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    texts = load_sentences(args.sentences, args.data, args.col)
    variants = {
        "default (all optimisations, top-k from graph, 2 threads, bounded spinning)": dict(),
        "full log_probs downloaded (no graph top-k)": dict(_tuning=SessionTuning(top_k_from_graph=False)),
        "graph optimisation: basic": dict(_tuning=SessionTuning(optimization="basic")),
        "graph optimisation: none": dict(_tuning=SessionTuning(optimization="none")),
        "1 intra-op thread": dict(intra_threads=1),
        "no thread spinning": dict(_tuning=SessionTuning(thread_spinning="none")),
        "unbounded spinning (onnxruntime's default)":
            dict(_tuning=SessionTuning(thread_spinning="unbounded")),
    }
    translators = {name: Translator(args.bundle, device="cpu", **{"intra_threads": 2, **kw})
                   for name, kw in variants.items()}
    if args.other:
        translators[f"bundle {Path(args.other).name}"] = Translator(args.other, device="cpu", intra_threads=2)
    if args.int8:
        translators["int8 bundle"] = Translator(args.int8, device="cpu", intra_threads=2)
    settings = [(4, 32), (1, 1)]  # beam 4 at batch 32, greedy at batch 1
    for tr in translators.values():  # warm-up
        for beam, batch in settings:
            tr.translate_batch(texts[:batch], beam_size=beam, max_batch_size=batch)
    # Rounds interleave the variants: on a shared machine the speed drifts by tens of percent
    # over minutes, and a variant measured after another would inherit the drift. Each round's
    # ratio compares measurements taken seconds apart; the medians are over rounds.
    rates = {name: {s: [] for s in settings} for name in translators}
    for _ in range(args.repeat):
        for name, tr in translators.items():
            for beam, batch in settings:
                rates[name][(beam, batch)].append(measure(tr, texts, beam, batch))
    default = next(iter(translators))
    rows = []
    for name in translators:
        row = {"variant": name}
        for (beam, batch), key in zip(settings, ("beam4_batch32", "greedy_batch1")):
            mine, base = rates[name][(beam, batch)], rates[default][(beam, batch)]
            row[key] = statistics.median(mine)
            row[key + "_ratio"] = statistics.median(m / b for m, b in zip(mine, base))
        rows.append(row)
    print(f"{len(texts)} sentences, {args.repeat} interleaved rounds; target tokens/s (median) and the "
          "median over rounds of the ratio to the default measured in the same round")
    print(f"{'variant':<70} {'beam4 batch32':>20} {'greedy batch1':>20}")
    for r in rows:
        print(f"{r['variant']:<70} {r['beam4_batch32']:>10.0f} ({r['beam4_batch32_ratio']:.2f}x) "
              f"{r['greedy_batch1']:>10.0f} ({r['greedy_batch1_ratio']:.2f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
