"""One linear layer's time in onnxruntime-web (WebAssembly, one thread) and onnxruntime-node, per operator.

Why an int4 bundle is slow in the browser (docs/precision.md, Hosts): one K x N layer as fp32 MatMul,
MatMulNBits (4 bits, block 32, zero points; accuracy level 0 and 4) and MatMulInteger (uint8 x int8), run at
M = 1 and 32 rows, each the mean of 20 (M = 1) or 5 runs after one warm-up, in Node with the JavaScript host's
own onnxruntime-web and onnxruntime-node (js/node_modules: `npm ci --prefix js` first).

    python scripts/web_kernel_probe.py [--k 1024 --n 4096]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scaffold import md_table, parser  # noqa: E402

JS = Path(__file__).resolve().parents[1] / "js" / "node_modules"
RUN = """
import fs from 'node:fs';
const [dir, host, ...names] = process.argv.slice(2);
const ort = await import(host === 'web' ? '%s/onnxruntime-web/dist/ort.min.mjs'
  : '%s/onnxruntime-node/dist/index.js');
if (host === 'web') ort.env.wasm.numThreads = 1;
const rows = [];
for (const name of names) {
  const model = `${dir}/${name}.onnx`;
  const s = host === 'web' ? await ort.InferenceSession.create(new Uint8Array(fs.readFileSync(model)))
    : await ort.InferenceSession.create(model, { intraOpNumThreads: 1 });
  const k = Number(process.env.K);
  for (const m of [1, 32]) {
    const a = name === 'MatMulInteger' ? new ort.Tensor('uint8', new Uint8Array(m * k).fill(100), [m, k])
      : new ort.Tensor('float32', new Float32Array(m * k).fill(0.5), [m, k]);
    await s.run({ a });
    const n = m === 1 ? 20 : 5, t = performance.now();
    for (let i = 0; i < n; i++) await s.run({ a });
    rows.push([host, name, m, (performance.now() - t) / n]);
  }
}
console.log(JSON.stringify(rows));
"""


def graphs(directory: Path, k: int, n: int) -> list[str]:
    """Writes the four one-layer graphs; returns their names."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng, block = np.random.default_rng(0), 32
    codes = rng.integers(0, 256, (n, k // block, block // 2), dtype=np.uint8)
    scales = (rng.random(n * (k // block)) * 0.01).astype(np.float32)
    zeros = np.full(n * ((k // block + 1) // 2), 0x88, np.uint8)
    nbits = [numpy_helper.from_array(x, name) for x, name in ((codes, "b"), (scales, "s"), (zeros, "z"))]
    layers = {
        "MatMul fp32": ([helper.make_node("MatMul", ["a", "w"], ["y"])], [numpy_helper.from_array(
            rng.standard_normal((k, n)).astype(np.float32), "w")]),
        "MatMulInteger": ([helper.make_node("MatMulInteger", ["a", "w"], ["y"])], [numpy_helper.from_array(
            rng.integers(-128, 128, (k, n), dtype=np.int8), "w")]),
    }  # fmt: skip
    for level in (0, 4):
        node = helper.make_node("MatMulNBits", ["a", "b", "s", "z"], ["y"], domain="com.microsoft", K=k, N=n,
                                bits=4, block_size=block, accuracy_level=level)  # fmt: skip
        layers[f"MatMulNBits level {level}"] = ([node], nbits)
    for name, (nodes, weights) in layers.items():
        integer = name == "MatMulInteger"
        x = helper.make_tensor_value_info("a", TensorProto.UINT8 if integer else TensorProto.FLOAT, ["m", k])
        y = helper.make_tensor_value_info("y", TensorProto.INT32 if integer else TensorProto.FLOAT, ["m", n])
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
        model = helper.make_model(helper.make_graph(nodes, name, [x], [y], weights), opset_imports=opsets)
        model.ir_version = 8
        onnx.save(model, str(directory / f"{name}.onnx"))
    return list(layers)


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--k", type=int, default=1024, help="input features (a multiple of 32)")
    p.add_argument("--n", type=int, default=4096, help="output features")
    args = p.parse_args(argv)
    if not (JS / "onnxruntime-web").is_dir():
        p.error(f"{JS} has no onnxruntime-web: run `npm ci --prefix js` first")
    with tempfile.TemporaryDirectory() as tmp:
        names, script = graphs(Path(tmp), args.k, args.n), Path(tmp) / "run.mjs"
        script.write_text(RUN % (JS, JS))
        rows = []
        for host in ("web", "node"):
            env = dict(os.environ, K=str(args.k))
            out = subprocess.run(["node", str(script), tmp, host, *names], capture_output=True, text=True,
                                 check=True, env=env)  # fmt: skip
            rows += json.loads(out.stdout.strip().splitlines()[-1])
    ms = {(h, name, m): t for h, name, m, t in rows}
    table = [[name, *(f"{ms[h, name, m]:.2f}" for h in ("web", "node") for m in (1, 32))] for name in names]
    print(f"{args.k} x {args.n}, ms per run, one thread\n")
    print("\n".join(md_table(["operator", "web M 1", "web M 32", "node M 1", "node M 32"], table)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
