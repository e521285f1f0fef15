"""Times ONE decoder step of each bundle, alone: no search, no Python between steps.

    python scripts/step.py BUNDLE [BUNDLE ...] [--rounds 7] [--past 10]

For comparing exports of the same checkpoint (e.g. before and after a change to the graph): the
bundles' steps are timed in interleaved rounds (on a shared machine speed drifts over minutes) at
1 row (greedy, one sentence) and 128 rows (beam 4 x 32 sentences), in the sessions of a
`runtime.Translator` with 2 threads. Prints the median microseconds per step and each graph's node
count as exported and after onnxruntime's optimisation. A bundle with decoder_fused.onnx is timed
with both decoders: "BUNDLE" is decoder.onnx (`session.run`), "BUNDLE [fused]" the fused graph
driven by the runtime's static loop (runtime/fused_step.py: bound once, cache updated in place).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort


from seq2onnx.runtime import bundle as names
from seq2onnx.runtime.fused_step import FusedStep
from seq2onnx.runtime.options import SessionTuning
from seq2onnx.runtime.translator import Translator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleaved_us  # noqa: E402


def optimized_node_count(path: Path, tmp: str) -> int:
    """Nodes left after onnxruntime's `all` optimisations (the level Translator uses)."""
    import onnx

    o = ort.SessionOptions()
    o.log_severity_level = 3
    o.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
    ort.InferenceSession(str(path), o, providers=["CPUExecutionProvider"])
    return len(onnx.load(o.optimized_model_filepath, load_external_data=False).graph.node)


def feeds(meta: names.Bundle, rows: int, batch: int, past: int, src_len: int = 12) -> dict:
    cfg = meta.model
    layers, heads, head_dim = cfg["n_decoder_layers"], cfg["n_heads"], cfg["d_model"] // cfg["n_heads"]
    dtype = np.float16 if meta.dtype == "float16" else np.float32
    rng = np.random.default_rng(0)
    f = {names.TOKENS: np.full((rows, 1), 5, np.int64), names.STEP: np.array([past], np.int64),
         names.CACHE_INDICES: np.arange(rows, dtype=np.int64), names.TOP_K: np.array([8], np.int64),
         names.SRC_MASK: np.ones((batch, src_len), bool)}
    for n in names.past_names(layers):
        f[n] = rng.standard_normal((rows, heads, past, head_dim)).astype(dtype)
    for n in names.cross_names(layers):
        f[n] = rng.standard_normal((batch, heads, src_len, head_dim)).astype(dtype)
    return f


def fused_step(t: Translator, f: dict, rows: int, batch: int, past: int, max_length: int = 64):
    """The fused decoder's step as translate_batch drives it, at position `past`, 8 candidates."""
    n = t.n_layers
    step = FusedStep(t.decoder, src_mask=f[names.SRC_MASK], cross=[f[x] for x in names.cross_names(n)],
                     n_layers=n, n_heads=t.n_heads, head_dim=t.head_dim, beam_width=rows // batch,
                     max_length=max_length, top_k=8, vocab=t.tgt_vocab)
    tokens, indices = f[names.TOKENS], np.arange(rows)
    return lambda: step(tokens, indices, past, None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundles", nargs="+")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--past", type=int, default=10, help="cached positions")
    args = p.parse_args()
    import onnx

    # the decoder sessions exactly as the runtime makes them (threads, spinning, optimisation level)
    standard = SessionTuning(decoder="standard")
    translators = {b: Translator(b, device="cpu", intra_threads=2, _tuning=standard) for b in args.bundles}
    bundles = {b: t.bundle for b, t in translators.items()}
    fused = {b: Translator(b, device="cpu", intra_threads=2, _tuning=SessionTuning(decoder="fused"))
             for b, meta in bundles.items() if names.FUSED in meta.decoder_variants}
    with tempfile.TemporaryDirectory() as tmp:
        for b, meta in bundles.items():
            for label in [names.DECODER_LABELS[v] for v in meta.decoder_variants]:
                exported = len(onnx.load(str(meta.file(label)), load_external_data=False).graph.node)
                print(f"{b} {label}: {exported} nodes exported, "
                      f"{optimized_node_count(meta.file(label), tmp)} after optimisation")
    wanted = [names.TOPK_LOG_PROBS, names.TOPK_IDS]
    for rows, batch, calls in ((1, 1, 300), (128, 32, 30)):
        inputs = {b: feeds(meta, rows, batch, args.past) for b, meta in bundles.items()}
        steps = {b: (lambda s=t.decoder, f=inputs[b]: s.run(wanted, f)) for b, t in translators.items()}
        for b, t in fused.items():
            steps[f"{b} [fused]"] = fused_step(t, inputs[b], rows, batch, args.past)
        med = interleaved_us(steps, args.rounds, calls)
        print(f"{rows} rows, past {args.past}: " + ", ".join(f"{b} {us:,.0f} us" for b, us in med.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
