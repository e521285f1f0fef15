"""scripts/gemm.py: the products it times are exactly the fused decoder step's weight products."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import onnx

from tiny import tiny_bundle

from seq2onnx.runtime import bundle as fmt

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gemm.py"


def _gemm_module():
    spec = importlib.util.spec_from_file_location("gemm_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shapes_are_the_fused_decoders_weight_matrices():
    bundle = tiny_bundle()
    graph = onnx.load(str(bundle / fmt.FUSED_DECODER_FILE), load_external_data=False).graph
    weights = {i.name: tuple(i.dims) for i in graph.initializer}

    def logical(node) -> tuple[int, int]:  # (in, out): a weight under transB is nn.Linear's (out, in) tensor
        shape = weights[node.input[1]]
        return shape[::-1] if any(a.name == "transB" and a.i == 1 for a in node.attribute) else shape

    # the right-hand side of every product with a constant matrix: Gemm, MatMul, FusedGemm
    used = sorted(logical(n) for n in graph.node if n.op_type in ("Gemm", "MatMul", "FusedGemm") and n.input[1] in weights)
    model = json.loads((bundle / fmt.BUNDLE_JSON).read_text())["model"]
    assert sorted(_gemm_module().weight_shapes(model)) == used


def test_runs_on_a_bundle_and_refuses_a_directory_without_one(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), str(tiny_bundle()), "--rounds", "1", "--rows", "1", "4"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].startswith("1 row,") and lines[2].startswith("4 rows,"), r.stdout
    assert all("numpy x @ W" in line and "onnxruntime 2 threads" in line and "spinning" in line for line in lines[1:]), r.stdout
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "bundle.json does not exist" in r.stderr, r.stderr
