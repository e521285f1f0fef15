"""Times ONE decoder step: the standard-opset decoder.onnx against the fused contrib-op graph.

    python scripts/fused_step.py [--rounds 7] [--past 10] [--threads 2] [--seed 0]
        [--profile [--profile-rows 1]]
    python scripts/fused_step.py --bundle BUNDLE --data TSV [--src-col 1] [--rounds 3] [--threads 2]

A random model of the Tatoeba size (d_model 256, 3+3 layers, 4 heads, d_ff 1024, vocabulary 3,000)
is exported both ways into a temporary directory. Each graph runs in its own session (CPU, the given
threads, ORT_ENABLE_ALL, the decoder's bounded intra-op spinning, as runtime.Translator makes them);
rounds interleave the two graphs (this shared machine's speed drifts over minutes) at 1 row (greedy, one
sentence) and 128 rows (beam 4 x 32 sentences). Prints the node counts as exported and after onnxruntime's
optimisation, and the median microseconds per step. --profile adds onnxruntime's per-operator
kernel times at --profile-rows rows (default 1; 128 is beam 4 x 32; profiling adds its own
overhead: read the shares, not the sums).

How each step is driven:
- standard: `session.run` of the top-k outputs with a past of `--past` positions, as scripts/step.py;
- fused: IO binding made once, the cache buffers (max_length 64) bound as both past and present,
  `run_with_iobinding` per step: the static loop the fused graph is for.

With --bundle (an fp32 bundle that has decoder_fused.onnx) it measures end to end instead: two
Translators on the bundle, one forced to each decoder (SessionTuning(decoder=...)), translating
the first sentences of --data (greedy one sentence at a time; beam 4 in batches of 32), rounds
interleaved; prints generated tokens/s and, at greedy batch 1, where a step's time goes: the
session run alone (`run_with_iobinding`/`run_with_iobinding` timed inside), the step function
around it, and the whole token (search included), so the Python share of the step shows.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from seq2onnx.export.fused import BEAM_WIDTH, CACHE_INDIRECTION, export_fused_decoder  # noqa: E402
from seq2onnx.export.graphs import export_graphs  # noqa: E402
from seq2onnx.model.config import ModelConfig  # noqa: E402
from seq2onnx.model.transformer import Transformer  # noqa: E402
from seq2onnx.runtime import bundle as names  # noqa: E402
from seq2onnx.runtime.options import spin_settings  # noqa: E402
from timing import interleaved_us  # noqa: E402

MAX_LENGTH, SRC_LEN, TOP_K = 64, 12, 8


def session(path: Path, threads: int, optimized: Path | None = None) -> ort.InferenceSession:
    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    for key, value in spin_settings("bounded", "decoder", ort.__version__).items():  # the runtime's default
        o.add_session_config_entry(key, value)
    o.log_severity_level = 3
    if optimized is not None:
        o.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(str(path), o, providers=["CPUExecutionProvider"])


def standard_step(sess: ort.InferenceSession, cfg: ModelConfig, rows: int, batch: int, past: int):
    rng = np.random.default_rng(0)
    layers, heads, hd = cfg.n_decoder_layers, cfg.n_heads, cfg.head_dim
    feeds = {names.TOKENS: np.full((rows, 1), 5, np.int64), names.STEP: np.array([past], np.int64),
             names.CACHE_INDICES: np.arange(rows, dtype=np.int64), names.TOP_K: np.array([TOP_K], np.int64),
             names.SRC_MASK: np.ones((batch, SRC_LEN), bool)}
    for n in names.past_names(layers):
        feeds[n] = rng.standard_normal((rows, heads, past, hd)).astype(np.float32)
    for n in names.cross_names(layers):
        feeds[n] = rng.standard_normal((batch, heads, SRC_LEN, hd)).astype(np.float32)
    wanted = [names.TOPK_LOG_PROBS, names.TOPK_IDS]
    return lambda: sess.run(wanted, feeds)


def fused_step(sess: ort.InferenceSession, cfg: ModelConfig, rows: int, batch: int, past: int):
    rng = np.random.default_rng(0)
    layers, heads, hd = cfg.n_decoder_layers, cfg.n_heads, cfg.head_dim
    beams = rows // batch
    b = sess.io_binding()
    keep = []  # the arrays bound by pointer must outlive the binding
    for name, value in {names.TOKENS: np.full((rows, 1), 5, np.int64), names.STEP: np.array([past], np.int32),
                        BEAM_WIDTH: np.array([beams], np.int32),
                        CACHE_INDIRECTION: np.zeros((batch, beams, MAX_LENGTH), np.int32),
                        names.ROW_START: np.zeros(rows, np.int32),
                        names.TOP_K: np.array([TOP_K], np.int64),
                        names.SRC_MASK: np.ones((batch, SRC_LEN), bool)}.items():
        keep.append(value)
        b.bind_cpu_input(name, value)
    for n in names.cross_names(layers):
        keep.append(rng.standard_normal((batch, heads, SRC_LEN, hd)).astype(np.float32))
        b.bind_cpu_input(n, keep[-1])
    for past_name, present_name in zip(names.past_names(layers), names.present_names(layers)):
        cache = rng.standard_normal((rows, heads, MAX_LENGTH, hd)).astype(np.float32)
        buffer = ort.OrtValue.ortvalue_from_numpy(cache)
        keep.append(buffer)
        b.bind_ortvalue_input(past_name, buffer)
        b.bind_ortvalue_output(present_name, buffer)
    for name in (names.TOPK_LOG_PROBS, names.TOPK_IDS):  # as the standard step: only the candidates come out
        b.bind_output(name, "cpu")

    def step():
        sess.run_with_iobinding(b)
    step.keep = keep
    return step


def profile(
    path: Path, label: str, make, cfg: ModelConfig, threads: int, past: int, tmp: Path, rows: int = 1
) -> None:
    """onnxruntime's kernel time per operator type, per step, at `rows` rows (beam 4 beyond 1 row)."""
    calls = max(30, 300 // rows)
    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    for key, value in spin_settings("bounded", "decoder", ort.__version__).items():
        o.add_session_config_entry(key, value)
    o.enable_profiling, o.profile_file_prefix, o.log_severity_level = True, str(tmp / label), 3
    sess = ort.InferenceSession(str(path), o, providers=["CPUExecutionProvider"])
    step = make(sess, cfg, rows, max(1, rows // 4), past)
    for _ in range(calls):
        step()
    per_op: dict[str, float] = collections.defaultdict(float)
    run_us = 0.0
    for e in json.loads(Path(sess.end_profiling()).read_text()):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[e["args"]["op_name"]] += e["dur"] / calls
        elif e.get("cat") == "Session" and e["name"] == "model_run":
            run_us += e["dur"] / calls
    top = sorted(per_op.items(), key=lambda kv: -kv[1])
    print(f"{label} profile, {rows} row{'s' if rows > 1 else ''}: run {run_us:,.0f} us, kernels "
          f"{sum(per_op.values()):,.0f} us: "
          + ", ".join(f"{op} {us:,.0f}" for op, us in top))


class _TimedSession:
    """A session proxy that adds up the wall time of run_with_iobinding (the graph alone)."""

    def __init__(self, session):
        self.session, self.seconds, self.calls = session, 0.0, 0

    def run_with_iobinding(self, binding, *args):
        t0 = time.perf_counter()
        self.session.run_with_iobinding(binding, *args)
        self.seconds += time.perf_counter() - t0
        self.calls += 1

    def __getattr__(self, name):
        return getattr(self.session, name)


def end_to_end(args) -> int:
    from seq2onnx.runtime.options import SessionTuning
    from seq2onnx.runtime.translator import Translator

    lines = [line.rstrip("\n").split("\t") for line in open(args.data, encoding="utf-8")]
    texts = [cols[args.src_col] for cols in lines if len(cols) > args.src_col][-args.sentences:]
    tr = {d: Translator(args.bundle, device="cpu", intra_threads=args.threads,
                        _tuning=SessionTuning(decoder=d))
          for d in ("standard", "fused")}
    assert all(t.decoder_variant == d for d, t in tr.items())
    rows = {"greedy batch 1": dict(beam_size=1, max_batch_size=1),
            "beam 4 batch 32": dict(beam_size=4, max_batch_size=32)}
    rates: dict = {(r, d): [] for r in rows for d in tr}
    outputs: dict = {}
    for _ in range(args.rounds):
        for row, kw in rows.items():
            for d, t in tr.items():
                t0 = time.perf_counter()
                out = t.translate_batch(texts, **kw)
                seconds = time.perf_counter() - t0
                tokens = sum(len(r.token_ids[0]) + 1 for r in out)  # end token included: one step each
                rates[row, d].append(tokens / seconds)
                outputs[row, d] = [r.token_ids[0] for r in out]
    for row in rows:
        same = sum(a == b for a, b in zip(outputs[row, "standard"], outputs[row, "fused"]))
        med = {d: statistics.median(rates[row, d]) for d in tr}
        print(f"{row}, {len(texts)} sentences, {args.threads} threads: standard {med['standard']:,.0f} "
              f"tok/s, fused {med['fused']:,.0f} tok/s, fused/standard {med['fused'] / med['standard']:.2f}; "
              f"identical outputs {same}/{len(texts)}")
    # Where a greedy batch-1 token's time goes: session run / step function / whole token.
    for d, t in tr.items():
        timed = _TimedSession(t.decoder)
        t.decoder = timed
        step_seconds = [0.0]

        def timing(step):
            def timed_step(*sa):
                t0 = time.perf_counter()
                out = step(*sa)
                step_seconds[0] += time.perf_counter() - t0
                return out
            return timed_step
        t0 = time.perf_counter()  # translate_batch, planned and run here with each search's step timed
        plan = t.plan(texts, t.search_options(beam_size=1, max_batch_size=1))
        plan.run(lambda job, _t=t: _t.search(job, wrap=timing))
        total = time.perf_counter() - t0
        t.decoder = timed.session
        n = timed.calls
        run_us, step_us, token_us = timed.seconds / n * 1e6, step_seconds[0] / n * 1e6, total / n * 1e6
        print(f"{d} greedy batch 1, {n} steps: session run {run_us:,.0f} us, step function {step_us:,.0f} us "
              f"(Python in the step {(step_us - run_us) / step_us:.0%}), whole token {token_us:,.0f} us "
              f"(Python outside the run {(token_us - run_us) / token_us:.0%})")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--past", type=int, default=10, help="cached positions")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true", help="also print per-operator kernel times")
    p.add_argument("--profile-rows", type=int, default=1,
                   help="rows of the profiled step (default 1; 128: beam 4 x 32)")
    p.add_argument("--bundle", help="measure end to end on this bundle instead (needs --data)")
    p.add_argument("--data", help="TSV of source sentences for --bundle")
    p.add_argument("--src-col", type=int, default=1)
    p.add_argument("--sentences", type=int, default=200,
                   help="sentences of --data (its last ones) for --bundle")
    args = p.parse_args()
    if args.profile_rows != 1 and (args.profile_rows < 4 or args.profile_rows % 4):
        p.error(f"--profile-rows {args.profile_rows}: give 1 (greedy) or a multiple of 4 (beam 4 x "
                "sentences)")
    if args.bundle:
        return end_to_end(args)
    torch.manual_seed(args.seed)
    cfg = ModelConfig(src_vocab_size=3000, tgt_vocab_size=3000, d_model=256, n_heads=4, n_encoder_layers=3,
                      n_decoder_layers=3, d_ff=1024, dropout=0.0)
    model = Transformer(cfg).eval()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        _, standard_path = export_graphs(model, tmp)
        fused_path = export_fused_decoder(model, tmp)
        sessions = {}
        for label, path in (("standard", standard_path), ("fused", fused_path)):
            optimized = tmp / f"{label}.optimized.onnx"
            sessions[label] = session(path, args.threads, optimized)
            ops = [n.op_type for n in onnx.load(str(optimized)).graph.node]
            print(f"{label}: {len(onnx.load(str(path)).graph.node)} nodes exported, {len(ops)} after "
                  f"optimisation ({', '.join(f'{op} {ops.count(op)}' for op in sorted(set(ops)))})")
            if args.profile:
                make = {"standard": standard_step, "fused": fused_step}[label]
                profile(path, label, make, cfg, args.threads, args.past, tmp, args.profile_rows)
    makers = {"standard": standard_step, "fused": fused_step}
    for rows, batch, calls in ((1, 1, 300), (128, 32, 30)):
        steps = {k: makers[k](s, cfg, rows, batch, args.past) for k, s in sessions.items()}
        med = interleaved_us(steps, args.rounds, calls)
        times = ", ".join(f"{k} {v:,.0f} us" for k, v in med.items())
        print(f"{rows} rows, past {args.past}, {args.threads} threads: {times}"
              f"; fused/standard {med['fused'] / med['standard']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
