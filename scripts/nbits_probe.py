"""Probe: one linear layer as fp32 Gemm, as today's per-row int8 chain, and as MatMulNBits (issue 58).

    nice python scripts/nbits_probe.py [--rounds 7] [--runs 200] [--shapes 512x2048,256x256,...]

For each shape K x N (input x output features) and each candidate, at M = 1 and M = 32 rows, one thread:

- fp32: Gemm (x, W, b);
- int8-rows: export/quantize.py's chain as the fused decoder has it (Abs, ReduceMax, Div, QuantizeLinear,
  MatMulIntegerToFloat, Mul, Add): per-row activation codes, per-column weights;
- nbits b{4,8} a{0,4} k{32,64,128}[z]: com.microsoft MatMulNBits, bits, accuracy_level, block size, `z` with
  zero points (else symmetric), bias inside.

Sessions get the runtime's `session.x64quantprecision` where the CPU's u8 x s8 product saturates (no VNNI:
runtime/u8s8_probe.py), as the runtime does. Columns: median µs per run over `--rounds` rounds (each the
mean of `--runs` runs through an IO binding, an empty graph's run time taken off), whether 32 rows at once
give bit-identical outputs to the same rows run one at a time (batch invariance), and the relative error
max |y - exact| / max |exact| over the 32 rows against
float64 (the quantization's error). The machine is shared: read ratios within one shape, not absolute µs.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from seq2onnx.export.nbits import quantize_rows
from seq2onnx.export.quantize import quantize_model
from seq2onnx.runtime.u8s8_probe import precision_entries

RECIPE = "256x256,256x768,256x1024,1024x256,256x3000"  # the recipe model's layers (QKV fused; the output)


def _model(nodes, inits, k: int, n: int, domains=("com.microsoft",)) -> bytes:
    graph = helper.make_graph(
        nodes,
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
        [numpy_helper.from_array(v, name) for name, v in inits.items()],
    )
    opsets = [helper.make_opsetid("", 17)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9).SerializeToString()


def fp32(w, b) -> bytes:
    return _model(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="layer")], {"w": w, "b": b}, *w.shape
    )


def int8_rows(w, b) -> bytes:
    proto = onnx.load_from_string(fp32(w, b))
    quantize_model(proto, contrib=True, tables=False)
    return proto.SerializeToString()


def nbits(w, b, bits: int, level: int, block: int, zero_points: bool) -> bytes:
    k, n = w.shape
    codes, scales, zeros = quantize_rows(w.T, bits, block, symmetric=not zero_points)
    inits = {"B": codes, "scales": scales.reshape(-1), "bias": b}
    inputs = ["x", "B", "scales", "", "", "bias"]
    if zeros is not None:
        inits["zp"] = zeros.reshape(-1)
        inputs[3] = "zp"
    node = helper.make_node(
        "MatMulNBits",
        inputs,
        ["y"],
        name="layer",
        domain="com.microsoft",
        K=k,
        N=n,
        bits=bits,
        block_size=block,
        accuracy_level=level,
    )
    return _model([node], inits, k, n)


def session(model: bytes) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    for key, value in precision_entries(
        ort
    ).items():  # as the runtime sets it: exact u8 x s8 on CPUs without VNNI
        opts.add_session_config_entry(key, value)
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def per_run(sess: ort.InferenceSession, x: np.ndarray, runs: int) -> float:
    """Seconds per run through an IO binding (inputs and outputs bound once)."""
    binding = sess.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_output("y")
    sess.run_with_iobinding(binding)
    start = time.perf_counter()
    for _ in range(runs):
        sess.run_with_iobinding(binding)
    return (time.perf_counter() - start) / runs


def invariant(sess: ort.InferenceSession, x: np.ndarray) -> tuple[bool, np.ndarray]:
    whole = sess.run(None, {"x": x})[0]
    alone = np.concatenate([sess.run(None, {"x": x[i : i + 1]})[0] for i in range(len(x))])
    return bool(np.array_equal(whole, alone)), whole


def candidates(w, b, bits_list, levels, blocks, zero_points):
    yield "fp32", fp32(w, b)
    yield "int8-rows", int8_rows(w, b)
    for bits, level, block, zp in itertools.product(bits_list, levels, blocks, zero_points):
        yield f"nbits b{bits} a{level} k{block}{'z' if zp else ''}", nbits(w, b, bits, level, block, zp)


def probe_shape(k: int, n: int, args, rng) -> list[dict]:
    # weights and inputs with a trained model's look: small normal weights, activations with a few outliers
    w = (rng.standard_normal((k, n)) * (1 / np.sqrt(k))).astype(np.float32)
    b = (rng.standard_normal(n) * 0.02).astype(np.float32)
    x = rng.standard_normal((32, k)).astype(np.float32)
    x[:, rng.integers(0, k, 4)] *= 8
    exact = x.astype(np.float64) @ w.astype(np.float64) + b
    empty = session(_model([helper.make_node("Identity", ["x"], ["y"])], {}, k, k))
    rows = []
    sessions = {
        name: session(m)
        for name, m in candidates(w, b, args.bits, args.levels, args.blocks, args.zero_points)
    }
    times = {(name, m): [] for name in sessions for m in (1, 32)}
    base = {m: [] for m in (1, 32)}
    for _ in range(args.rounds):  # every candidate once per round: drift in the machine's load is shared
        for m in (1, 32):
            base[m].append(per_run(empty, x[:m, :k], args.runs))
            for name, sess in sessions.items():
                times[(name, m)].append(per_run(sess, x[:m], args.runs))
    for name, sess in sessions.items():
        same, y = invariant(sess, x)
        err = float(np.abs(y - exact).max() / np.abs(exact).max())
        rows.append(
            {
                "shape": f"{k}x{n}",
                "candidate": name,
                "invariant": same,
                "err": err,
                **{
                    f"us_m{m}": 1e6 * (statistics.median(times[(name, m)]) - statistics.median(base[m]))
                    for m in (1, 32)
                },
            }
        )
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="512x2048," + RECIPE)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--bits", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--blocks", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--zero-points", type=int, nargs="+", default=[0, 1], help="0 symmetric, 1 with")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"onnxruntime {ort.__version__}, 1 thread, median of {args.rounds} rounds x {args.runs} runs")
    print(
        "| shape KxN | candidate | µs M=1 | µs M=32 | ×fp32 M=1 | ×fp32 M=32 | 32 rows = 1 at a time "
        "| rel. error |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        k, n = map(int, shape.split("x"))
        rows = probe_shape(k, n, args, rng)
        ref = rows[0]
        for r in rows:
            print(
                f"| {r['shape']} | {r['candidate']} | {r['us_m1']:.1f} | {r['us_m32']:.1f} | "
                f"{ref['us_m1'] / r['us_m1']:.2f} | {ref['us_m32'] / r['us_m32']:.2f} | "
                f"{'yes' if r['invariant'] else 'NO'} | {r['err']:.4f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
