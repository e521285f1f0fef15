"""The memory bandwidth a batch-1 decoder step can use: onnxruntime streaming one fp32 weight matrix.

A greedy step at one row multiplies one row by every weight matrix once, so its time is at least the
weights' bytes over the rate onnxruntime's MatMul streams a matrix too large for the caches. This
times MatMul (1, K) x (K, N) fp32 (1 GiB of weights by default) at each thread setting and prints the
median and best GB/s: the floor docs/benchmarks.md divides a model's bytes per step by.

    python scripts/gemv_bandwidth.py [--k 8192] [--n 32768] [--threads 1,2] [--runs 10]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k", type=int, default=8192, help="the matrix's rows (the input's width; default 8192)")
    p.add_argument("--n", type=int, default=32768, help="the matrix's columns (default 32768: 1 GiB fp32)")
    p.add_argument("--threads", default="1,2", help="intra-op thread settings, comma-separated (default 1,2)")
    p.add_argument("--runs", type=int, default=10, help="timed runs per setting after 3 warm-up runs")
    args = p.parse_args(argv)
    w = np.random.default_rng(0).standard_normal((args.k, args.n), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "gemv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, args.k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, args.n])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gemv.onnx"
        onnx.save(model, str(path), save_as_external_data=True, location="gemv.bin")
        del model, graph
        x = np.ones((1, args.k), np.float32)
        for threads in (int(t) for t in args.threads.split(",")):
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            for _ in range(3):
                session.run(None, {"x": x})
            times = []
            for _ in range(args.runs):
                start = time.perf_counter()
                session.run(None, {"x": x})
                times.append(time.perf_counter() - start)
            print(
                f"threads {threads}: {w.nbytes / np.median(times) / 1e9:.1f} GB/s median, "
                f"{w.nbytes / min(times) / 1e9:.1f} best ({np.median(times) * 1e3:.1f} ms per pass)"
            )
            del session
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
