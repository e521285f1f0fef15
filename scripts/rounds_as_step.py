"""translate_batch through the serving rounds (a round of one member per step) against its own step loop.

    python scripts/rounds_as_step.py BUNDLE --data TSV [--src-col 0] [--sentences 64] [--min-length 5]

The measurement behind docs/decoder-graphs.md ("Why translate_batch is not yet a round of one"): one
Translator (CPU, 1 intra thread) translates the sentences at greedy b1 / b32 and beam 4 b1 / b32 / beam 3 b32,
once through its own search (runtime/fused_step.py's FusedStep) and once with each search step answered by
serve/fused_rounds.py's FusedRounds, the two passes alternating and the first of each not timed. Prints each
row's time ratio (rounds / step loop), how many sentences got the same tokens, and the largest score
difference. Read the ratios, not the times: on a shared machine the speed drifts.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from seq2onnx.runtime.search import run
from seq2onnx.runtime.translator import Translator
from seq2onnx.serve.fused_rounds import FusedRounds
from seq2onnx.serve.round_profile import NoProfile
from seq2onnx.serve.scheduler import Member

ROWS = [
    ("greedy b1", 1, 1),
    ("greedy b32", 1, 32),
    ("beam 4 b1", 4, 1),
    ("beam 4 b32", 4, 32),
    ("beam 3 b32", 3, 32),
]  # (label, beam size, batch)


def rounds_search(t: Translator):
    """A Translator.search whose step is a one-member round of one FusedRounds, kept between calls."""
    runner, prof = FusedRounds(t.graphs.decoder, t.graphs.spec), NoProfile()

    def search(job, wrap=None):
        src_mask, cross = job.encoded
        member = Member(None, src_mask.numpy(), [c.numpy() for c in cross], job.top_k, job.beam_width)

        def step(tokens, cache_indices, step_t, keep):
            tokens = np.asarray(tokens, np.int64).reshape(-1)
            indices = np.asarray(cache_indices, np.int64).reshape(-1)
            return runner.run([(member, tokens, indices, step_t, keep, job.beam_width)], prof)[member]

        try:
            return run(job.program, job.force(step))
        finally:
            runner.leave(member)

    return search


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle")
    p.add_argument("--data", required=True, help="a TSV of sources")
    p.add_argument("--src-col", type=int, default=0, help="the sources' column (default 0)")
    p.add_argument("--sentences", type=int, default=64, help="sentences per row (default 64)")
    p.add_argument("--min-length", type=int, default=5, help="min_decoding_length (an untrained model)")
    a = p.parse_args()
    with open(a.data, encoding="utf-8") as f:
        texts = [line.rstrip("\n").split("\t")[a.src_col] for _, line in zip(range(a.sentences), f)]
    t = Translator(a.bundle, device="cpu", intra_threads=1)
    paths = {"step": t.search, "rounds": rounds_search(t)}
    for label, beam, batch in ROWS:
        options = dict(beam_size=beam, min_decoding_length=a.min_length, return_scores=True)
        batches = [texts[i : i + batch] for i in range(0, len(texts), batch)]
        seconds, got = dict.fromkeys(paths, 0.0), {}
        for rep in range(2):
            for name, search in paths.items():
                t.search = search
                start = time.perf_counter()
                got[name] = [r for b in batches for r in t.translate_batch(b, **options)]
                seconds[name] += (time.perf_counter() - start) if rep else 0.0
        pairs = list(zip(got["step"], got["rounds"]))
        same = sum(x.token_ids == y.token_ids for x, y in pairs)
        diff = max(abs(u - v) for x, y in pairs for u, v in zip(x.scores, y.scores))
        ratio = seconds["rounds"] / seconds["step"]
        print(
            f"{label:11s} rounds/step {ratio:.2f}  same tokens {same}/{len(texts)}"
            f"  largest score difference {diff:.1e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
