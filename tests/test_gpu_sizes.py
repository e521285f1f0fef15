"""scripts/hf_real_sizes.py on the GPU (issue 57; scripts/gpu_sizes.sh runs it): its plan puts the goals' rows
first, an engine absent here is skipped by name, the report compares every engine's ids with generate() fp32,
and the CPU mode of gpu_sizes.sh runs end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiny import scratch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import hf_real_sizes as sizes  # noqa: E402
from hf_sizes_report import markdown, same  # noqa: E402

GPU = sizes.PRESETS["cuda"] | {"device": "cuda"}
PREP = ("build", "prepare", "export-fp32", "export-fp16", "ct2-convert")  # what the GPU's engines need
ENGINES = sizes.GPU_ENGINES + sizes.LAST


def test_plan_puts_each_models_goal_rows_before_the_other_ct2_types():
    steps = sizes.plan(["marian", "nllb"], list(ENGINES))
    assert steps[:6] == [("marian", s) for s in PREP] + [("marian", "ours-fp16")]
    nllb = steps.index(("nllb", "build"))
    assert {e for m, e in steps[:nllb]} >= {"ours-fp16", "ct2-float16", "generate-fp32", "ours-fp32"}
    assert steps[-4:] == [
        ("marian", "ct2-int8_float16"),
        ("marian", "ct2-float32"),
        ("nllb", "ct2-int8_float16"),
        ("nllb", "ct2-float32"),
    ]
    assert len(steps) == len(set(steps)) == 2 * (len(PREP) + len(ENGINES))
    # only the preparation the engines asked for need; variants last
    assert sizes.plan(["nllb"], ["generate-fp32"], ["ours-fp32-tf32"]) == [
        ("nllb", "build"),
        ("nllb", "prepare"),
        ("nllb", "export-fp32"),
        ("nllb", "generate-fp32"),
        ("nllb", "ours-fp32-tf32"),
    ]


def test_an_engine_absent_here_is_skipped_by_name():
    def find(name):
        return None if name == "ctranslate2" else object()

    assert sizes.absent("ct2-float16", "cuda", find) == "skipped: ctranslate2 is not installed here"
    assert sizes.absent("ct2-convert", "cuda", find) == "skipped: ctranslate2 is not installed here"
    assert sizes.absent("ours-fp16", "cuda", find) is None
    assert (
        sizes.absent("generate-fp32", "cpu", lambda n: None) == "skipped: transformers is not installed here"
    )
    assert sizes.absent("ct2-int8_float16", "cpu", lambda n: object()) == (
        "skipped: CTranslate2 computes float16 on CUDA only"
    )
    assert sizes.needs("ct2-float32") == ["build", "prepare", "ct2-convert"]
    assert sizes.needs("ours-fp16-standard") == ["build", "prepare", "export-fp16"]


def test_engine_specs_turn_tf32_off_for_float32_only():
    mode, work = GPU, Path("/w")
    spec = sizes.engine_spec("generate-fp32", work, "nllb", mode)
    assert (
        spec["engine"] == "torch"
        and spec["dtype"] == "float32"
        and spec["env"] == {"NVIDIA_TF32_OVERRIDE": "0"}
    )
    assert spec["max_batch"] == 128 and spec["device"] == "cuda"
    assert "env" not in sizes.engine_spec("ct2-float16", work, "nllb", mode)
    tf32 = sizes.engine_spec("ours-fp32-tf32", work, "nllb", mode)
    assert (
        tf32["tuning"] == {"tf32": True} and "env" not in tf32 and tf32["bundle"] == "/w/out/nllb/bundle-fp32"
    )
    assert sizes.engine_spec("ct2-int8_float16", work, "m", mode)["compute_type"] == "int8_float16"
    cpu = sizes.engine_spec("ct2-float32-t1-mkl", work, "m", sizes.PRESETS["cpu"] | {"device": "cpu"})
    assert (cpu["threads"], cpu["env"], cpu["compute_type"]) == (1, {"CT2_USE_MKL": "1"}, "float32")


def test_each_bundle_variant_is_exported_with_its_own_options():
    cpu, work = sizes.PRESETS["cpu"] | {"device": "cpu"}, Path("/w")
    got = {
        v: {k: spec[k] for k in ("quantize", "dtype", "table_bits", "out")}
        for v in ("fp32", "int8", "int4", "int4t4", "fp16")
        for spec in [sizes.prep_spec(f"export-{v}", "m", work, cpu, {})]
    }
    assert got == {
        "fp32": dict(quantize=None, dtype="float32", table_bits=None, out="/w/out/m/bundle-fp32"),
        "int8": dict(quantize="int8", dtype="float32", table_bits=None, out="/w/out/m/bundle-int8"),
        "int4": dict(quantize="int4", dtype="float32", table_bits=None, out="/w/out/m/bundle-int4"),
        "int4t4": dict(quantize="int4", dtype="float32", table_bits=4, out="/w/out/m/bundle-int4t4"),
        "fp16": dict(quantize=None, dtype="float16", table_bits=None, out="/w/out/m/bundle-fp16"),
    }
    assert sizes.needs("ours-int4t4") == ["build", "prepare", "export-int4t4"]
    assert sizes.engine_spec("ours-int4t4", work, "m", cpu)["bundle"] == "/w/out/m/bundle-int4t4"


def test_ct2_counts_equal_when_only_the_forced_end_token_differs():
    ref = [[5, 6, 7], [5, 6]]
    assert same([[5, 6, 7, 9], [5, 6]], ref, limit=4) == "2/2"  # cut at the limit, one longer
    assert same([[5, 6, 7, 9], [5, 6]], ref) == "1/2"
    assert same([[5, 6, 8, 9], [5, 7]], ref, limit=4) == "0/2"
    assert same(None, ref) == "—"


def _record(outputs: dict, **extra) -> dict:
    rows = {
        r: {"seconds": 1.0, "tokens": 10 * len(o), "sentences": len(o), "outputs": o}
        for r, o in outputs.items()
    }
    return {
        "status": "ok",
        "seconds": 1.0,
        "result": {"rows": rows, "load_s": 0.5, "gpu_peak_mb": 100.0} | extra,
    }


def test_report_names_skipped_engines_and_counts_ids_against_generate(tmp_path):
    table = tmp_path / "id_to_token.json"
    table.write_text(json.dumps(["</s>", "a", "b", "c"]))
    rows = {"greedy b1": [[1, 2]], "greedy b32": [[1, 2], [2, 3]]}
    steps = {
        "build": {"status": "ok", "result": {"parameters": 1000}},
        "prepare": {"status": "ok", "result": {"table": str(table)}},
        "generate-fp32": _record(rows),
        "ours-fp32": _record({"greedy b1": [[1, 2]], "greedy b32": [[1, 2], [2, 1]]}),
        "ours-fp16": _record(rows, gpu_peak_mb=150.0),
        "ct2-float16": _record({"greedy b1": [["a", "b"]], "greedy b32": [["a", "b"], ["b", "c"]]}),
        "ct2-float32": {"status": "skipped: ctranslate2 is not installed here"},
    }
    settings = {
        "device": "cuda",
        "budget_s": 450,
        "sentences": 2,
        "batch1": 1,
        "max_new_tokens": 8,
        "rows": [("greedy", 1, 32), ("greedy", 1, 1)],
        "command": "x",
        "engines": ["ours-fp16", "ct2-float16", "generate-fp32", "ours-fp32", "ct2-float32"],
    }
    text = markdown({"env": {"mode": "gpu"}, "settings": settings, "steps": {"nllb": steps}, "seconds": 9})
    assert "| ct2-float32 | skipped: ctranslate2 is not installed here |" in text
    assert "| ours-fp32 | 1/1 | 1/2 |" in text  # ids against generate() fp32, greedy b1 then b32
    assert "| ct2-float16 | 1/1 | 2/2 |" in text  # tokens mapped to ids through the prepare step's table
    assert "| ours-fp16 = ours-fp32 | 1/1 | 1/2 |" in text
    assert "| GPU peak, ours fp16 / CTranslate2 float16 | 1.50× | ≤ 1.2× |" in text
    assert "| ours fp16 / CTranslate2 float16, greedy b32 | 1.00× | ≥ 1.0× |" in text


@pytest.mark.slow
def test_cpu_mode_measures_every_engine_it_can_and_names_the_rest():
    out = scratch("gpu-sizes-out")
    engines = "ours-fp16,ct2-float16,generate-fp32,ours-fp32,ct2-float32"
    prep = ("build", "prepare", "export-fp32", "export-fp16", "ct2-convert")
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_sizes.sh"), "--cpu", "--models", "marian", "--engines", engines],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, PYTHON=sys.executable, OUT=str(out)),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.xz", "results.json", "summary.md"]
    steps = json.loads((out / "results.json").read_text())["steps"]["marian"]
    status = {k: v["status"] for k, v in steps.items()}
    assert status == {
        **{s: "ok" for s in prep},
        "ours-fp16": "ok",
        "generate-fp32": "ok",
        "ours-fp32": "ok",
        "ct2-float32": "ok",
        "ct2-float16": "skipped: CTranslate2 computes float16 on CUDA only",
    }, status
    rows = steps["ours-fp32"]["result"]["rows"]
    assert sorted(rows) == ["beam4 b1", "beam4 b4", "beam4 b8", "greedy b1", "greedy b4", "greedy b8"]
    assert all(r["tokens"] > 0 for r in rows.values())
    summary = (out / "summary.md").read_text()
    for row in (
        "| ours-fp32 | 2/2 | 8/8 | 8/8 | 2/2 | 8/8 | 8/8 |",  # ids = generate() fp32, every row
        "| ct2-float32 | 2/2 | 8/8 | 8/8 | 2/2 | 8/8 | 8/8 |",
        "| ct2-float16 | skipped: CTranslate2 computes float16 on CUDA only |",
    ):
        assert row in summary, summary


def test_a_step_past_the_budget_or_after_a_failure_is_not_run(tmp_path):
    ctx = {
        "work": tmp_path,
        "mode": GPU,
        "budget": 450,
        "deadline": 0.0,
        "sizes": {"nllb": sizes.SIZES["nllb"]},
    }
    assert sizes.run_step("nllb", "build", ctx, {}) == {"status": "not run: the budget was spent (450 s)"}
    failed = {
        "nllb": {"build": {"status": "ok"}, "prepare": {"status": "ok"}, "export-fp16": {"status": "failed"}}
    }
    assert sizes.run_step("nllb", "ours-fp16", ctx, failed) == {"status": "not run: needs export-fp16"}
    assert not list(tmp_path.iterdir())  # nothing was started


def test_gpu_memory_is_the_rise_over_the_baseline_and_its_peak(monkeypatch):
    import time

    import hf_sizes_common

    used = {"mb": 1000.0}
    monkeypatch.setattr(hf_sizes_common.GpuMemory, "_reader", staticmethod(lambda: lambda: used["mb"]))
    gpu = hf_sizes_common.GpuMemory()
    used["mb"] = 1800.0
    time.sleep(0.2)  # sampled every 20 ms
    used["mb"] = 1200.0
    assert (gpu.now_mb(), gpu.peak_mb()) == (200.0, 800.0)
    gpu.close()
    monkeypatch.setattr(hf_sizes_common.GpuMemory, "_reader", staticmethod(lambda: None))
    assert (hf_sizes_common.GpuMemory().now_mb(), hf_sizes_common.GpuMemory().peak_mb()) == (None, None)
