"""Where a one-sentence translate_batch call spends its Python: the batch-1 profile.

    python scripts/profile_batch1.py BUNDLE [--data TSV] [--src-col 0] [--sentences 200] [--beam 1]

One Translator (CPU, 1 intra thread) translates each sentence alone, twice over (the first pass warms the
pools), then once more under cProfile. Prints the wall time per call and the share of the profiled time
under each part of a call: planning (tokenising, limits, jobs; encoding excluded), encoding, the decoder
step's set-up, the search's Python (the search less its step set-up and decoder runs), the decoder's runs
(onnxruntime, GIL released), detokenising, and the rest. cProfile adds its own cost to every Python call, so
read the shares, not the sums.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scaffold as sc  # noqa: E402

from seq2onnx.runtime.translator import Translator  # noqa: E402

# part -> the functions (file suffix, name) whose cumulative time is that part's
PARTS = {
    "plan": [("runtime/plan.py", "__init__"), ("runtime/plan.py", "search_job")],
    "encode": [("runtime/graphs.py", "encode"), ("runtime/translator.py", "encode")],  # now, and before 56
    "step set-up": [
        ("runtime/graphs.py", "step"),
        ("runtime/graphs.py", "recycle"),
        ("runtime/translator.py", "decoder_step"),
        ("runtime/translator.py", "recycle"),
    ],
    "detokenize": [("runtime/translator.py", "detokenize")],
}


def _decoder_runs(stats: pstats.Stats) -> float:
    """The cumulative time of the sessions' run_with_iobinding calls that encode() did not make."""
    total = 0.0
    for (file, _, function), (*_, callers) in stats.stats.items():
        if function == "run_with_iobinding" and file.endswith("onnxruntime_inference_collection.py"):
            total += sum(ct for (_, _, caller), (_, _, _, ct) in callers.items() if caller != "encode")
    return total


def _cumulative(stats: pstats.Stats, file_suffix: str, name: str) -> float:
    total = 0.0
    for (file, _, function), (_, _, _, cumulative, _) in stats.stats.items():
        if function == name and file.endswith(file_suffix):
            total += cumulative
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle")
    sc.add_sentences(p, 200, col=0)
    p.add_argument("--beam", type=int, default=1, help="beam size (default 1: greedy)")
    lower = "min_decoding_length (default 0): the end comes no sooner (an untrained model)"
    p.add_argument("--min-length", type=int, default=0, help=lower)
    a = p.parse_args()
    texts = sc.read_sentences(a.data, a.src_col, a.sentences, a.seed)
    t = Translator(a.bundle, device="cpu", intra_threads=1)
    options = dict(beam_size=a.beam, min_decoding_length=a.min_length)
    for _ in range(2):
        start = time.perf_counter()
        for text in texts:
            t.translate_batch([text], **options)
        wall = (time.perf_counter() - start) / len(texts) * 1e3
    profile = cProfile.Profile()
    profile.enable()
    for text in texts:
        t.translate_batch([text], **options)
    profile.disable()
    stats = pstats.Stats(profile)
    total = _cumulative(stats, "runtime/translator.py", "translate_batch")
    print(f"{t.decoder_variant} decoder, beam {a.beam}: {wall:.3f} ms per call (unprofiled, 2nd pass)")
    steps = _cumulative(stats, "runtime/translator.py", "search")
    parts = {part: sum(_cumulative(stats, *f) for f in fs) for part, fs in PARTS.items()}
    parts["decoder runs"] = _decoder_runs(stats)
    parts["plan"] -= parts["encode"]  # a job is encoded when it is made (plan.py's search_job)
    parts["search's Python"] = steps - parts["decoder runs"] - parts["step set-up"]
    parts["other"] = total - sum(parts.values())
    for part, seconds in parts.items():
        print(f"  {part:16s} {seconds / total:6.1%}")


if __name__ == "__main__":
    main()
