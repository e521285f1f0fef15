"""The floor of a decoder step: its weight matrices' products alone, onnxruntime against numpy.

    python scripts/gemm.py BUNDLE [--rounds 7] [--rows 1 128]

A decoder step multiplies its input rows by every weight matrix of the decoder once: per layer the
self-attention's Q, K, V (one packed D x 3D) and output (D x D), the cross-attention's query and
output (D x D each; its keys and values come from the encoder), the feed-forward's D x F and F x D,
then the generator D x V. This times exactly those products, with random weights of the bundle's
shapes, as one graph of bare `MatMul` nodes in onnxruntime (1 and 2 intra-op threads, weights
prepacked or not, idle threads sleeping; and 2 threads spinning as the runtime's decoder does,
runtime/options.py `spin_settings`) and as numpy's `x @ W` (whatever BLAS numpy has, its own threads).
Rounds interleave the variants, because this machine's speed drifts over minutes.

What it tells: at 1 row (greedy search, one sentence) a step cannot be faster than its products;
compare the fused step of `scripts/step.py` and a whole token of `seq2onnx bench`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from seq2onnx.runtime.options import spin_settings

sys.path.insert(0, str(Path(__file__).resolve().parent))  # timing.py, also when loaded by path
from timing import interleaved_us  # noqa: E402


def weight_shapes(model: dict) -> list[tuple[int, int]]:
    """(in, out) of every weight matrix one decoder step multiplies by, from bundle.json's `model`."""
    d, f, v = model["d_model"], model["d_ff"], model["tgt_vocab_size"]
    per_layer = [(d, 3 * d), (d, d), (d, d), (d, d), (d, f), (f, d)]
    return per_layer * model["n_decoder_layers"] + [(d, v)]


def products_graph(shapes: list[tuple[int, int]], seed: int = 0) -> bytes:
    """One MatMul per weight, each with its own input (rows x in): no node waits for another."""
    rng = np.random.default_rng(seed)
    nodes, inits, inputs, outputs = [], [], [], []
    for i, (k, n) in enumerate(shapes):
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, ["rows", k]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["rows", n]))
        weight = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [f"x{i}", f"w{i}"], [f"y{i}"], name=f"product{i}"))
    graph = helper.make_graph(nodes, "decoder_products", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", help="a bundle directory: its bundle.json gives the shapes")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 128])
    args = p.parse_args()
    meta_path = Path(args.bundle) / "bundle.json"
    if not meta_path.is_file():
        print(f"error: {meta_path} does not exist; give a bundle directory (seq2onnx export writes one)",
              file=sys.stderr)
        return 2
    shapes = weight_shapes(json.loads(meta_path.read_text())["model"])
    megabytes = sum(k * n for k, n in shapes) * 4 / 1e6
    model = products_graph(shapes)
    sessions = {}
    for threads, packed, spinning in ((1, True, "none"), (1, False, "none"), (2, True, "none"),
                                      (2, False, "none"), (2, True, "bounded")):
        o = ort.SessionOptions()
        o.intra_op_num_threads = threads
        for key, value in spin_settings(spinning, "decoder", ort.__version__).items():
            o.add_session_config_entry(key, value)
        o.add_session_config_entry("session.disable_prepacking", "0" if packed else "1")
        o.log_severity_level = 3
        label = (f"onnxruntime {threads} "
                 f"thread{'s' if threads > 1 else ''}{'' if packed else ', not prepacked'}"
                 f"{', spinning' if spinning == 'bounded' else ''}")
        sessions[label] = ort.InferenceSession(model, o, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    weights = [(rng.standard_normal((k, n)) * 0.05).astype(np.float32) for k, n in shapes]
    print(f"{len(shapes)} weight matrices, {megabytes:.1f} MB fp32; onnxruntime {ort.__version__}, numpy "
          f"{np.__version__}")
    for rows in args.rows:
        calls = max(10, 300 // rows)
        feeds = {f"x{i}": rng.standard_normal((rows, k)).astype(np.float32)
                 for i, (k, _) in enumerate(shapes)}
        xs = list(feeds.values())
        runs = {label: (lambda s=s: s.run(None, feeds)) for label, s in sessions.items()}
        runs["numpy x @ W"] = lambda: [x @ w for x, w in zip(xs, weights)]
        med = interleaved_us(runs, args.rounds, calls)
        print(f"{rows} row{'s' if rows > 1 else ''}, median of {args.rounds} rounds x {calls} calls: "
              + ", ".join(f"{label} {us:,.0f} us" for label, us in med.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
