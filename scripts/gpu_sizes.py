"""Issue 57: OPUS-MT (Marian-74M) and NLLB-600M sizes on the GPU, ours against generate() and CTranslate2.

    python scripts/gpu_sizes.py --mode gpu --out OUT      (scripts/gpu_sizes.sh calls it, after the install)
    python scripts/gpu_sizes.py --mode cpu --out OUT      (tiny configs on the CPU provider: CI runs this)

For each model (built on the machine with random, seeded weights from its published config, by
scripts/hf_sizes_jobs.py's build job, as scripts/hf_real_sizes.py does on the CPU): our fp32 and fp16 bundles
exported there, CTranslate2's conversion, then each engine alone in a child process of its own (so that the
GPU's used memory is that engine's): ours fp32 and fp16 on onnxruntime's CUDA provider, transformers'
generate() fp32 (TF32 off: the token-id reference of every row) and fp16 on CUDA, CTranslate2 float32,
float16 and int8_float16 on CUDA. Rows: greedy and beam 4 at batch 1, 32 and 128. Per engine: tokens/s per
row, load seconds, GPU memory after load and at peak (NVML), token ids against generate() fp32 on every row,
and each fp16 engine's agreement with its fp32 sibling.

Every step is a child with its own time limit inside the overall budget (--budget-s), in PLAN's order: the
rows the goals are about first (ours fp16, CTranslate2 float16, generate() fp32 and fp16, ours fp32), the
other CTranslate2 types last; a step the budget does not reach is reported as not run. OUT's summary.md and
results.json are written again after every step, so a call cut short still brings back what was done.
An engine whose Python module is absent here is skipped by name. --ours-variants adds our variants to A/B
(docs/optimisation-notes.md, "CUDA at real sizes"): SessionTuning's decoder and TF32 switches.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_sizes_report import markdown  # noqa: E402
from hf_sizes_common import SIZES, TINY, run_job, test_sentences, write_atomic  # noqa: E402

MODES = {  # rows (search, beam, batch) in the order measured: batch 32 first, the goals' rows
    "gpu": dict(
        device="cuda",
        sentences=128,
        batch1=8,
        max_new_tokens=32,
        threads=1,
        budget=450,
        spm_texts=None,
        rows=[
            ("greedy", 1, 32),
            ("beam4", 4, 32),
            ("greedy", 1, 1),
            ("beam4", 4, 1),
            ("greedy", 1, 128),
            ("beam4", 4, 128),
        ],
    ),
    # tiny models: 2,000 sentences are plenty for 1,000 pieces; a loose budget (no device time at stake)
    "cpu": dict(
        device="cpu",
        sentences=8,
        batch1=2,
        max_new_tokens=8,
        threads=1,
        budget=1200,
        spm_texts=2000,
        rows=[
            ("greedy", 1, 4),
            ("beam4", 4, 4),
            ("greedy", 1, 1),
            ("beam4", 4, 1),
            ("greedy", 1, 8),
            ("beam4", 4, 8),
        ],
    ),
}
# Seconds each step may take at most on the GPU (NLLB-600M's are the long ones); the budget cuts later
# ones shorter; on the CPU twice as long (a busy shared machine).
LIMITS = {"build": 90, "prepare": 60, "export-fp32": 150, "export-fp16": 150, "ct2-convert": 90, "engine": 75}
PREP = ("build", "prepare", "export-fp32", "export-fp16", "ct2-convert")
FIRST = ("ours-fp16", "ct2-float16", "generate-fp32", "generate-fp16", "ours-fp32")
LAST = ("ct2-int8_float16", "ct2-float32")
ENGINES = FIRST + LAST
MODULES = {"ours": "onnxruntime", "generate": "transformers", "ct2": "ctranslate2"}
VARIANTS = {"standard": {"decoder": "standard"}, "fused": {"decoder": "fused"}, "tf32": {"tf32": True}}


def plan(models: list[str], engines: list[str], variants: list[str] = ()) -> list[tuple[str, str]]:
    """The steps in order: each model's preparation (what the engines need) and first engines, then every
    model's last engines, then our variants."""
    prep = [s for s in PREP if any(s in needs(e) for e in [*engines, *variants])]
    steps = []
    for m in models:
        steps += [(m, s) for s in prep] + [(m, e) for e in engines if e not in LAST]
    steps += [(m, e) for m in models for e in engines if e in LAST]
    return steps + [(m, v) for m in models for v in variants]


def engine_spec(name: str, work: Path, model: str, mode: dict) -> dict:
    """The engine job's settings for an engine name: ours-fp16, generate-fp32, ct2-int8_float16,
    ours-fp32-standard (a variant: VARIANTS), ..."""
    kind, precision, *variant = name.split("-", 2)
    out = work / "out" / model
    spec = {
        "threads": mode["threads"],
        "device": mode["device"],
        "max_batch": max(b for _, _, b in mode["rows"]),
        "rows": mode["rows"],
    }
    fp32 = precision in ("fp32", "float32")
    if mode["device"] == "cuda" and fp32 and "tf32" not in variant:  # full float32 products in any library
        spec["env"] = {"NVIDIA_TF32_OVERRIDE": "0"}
    if kind == "ours":
        return spec | {
            "engine": "ours",
            "bundle": str(out / f"bundle-{precision}"),
            "tuning": VARIANTS[variant[0]] if variant else {},
        }
    if kind == "generate":
        return spec | {"engine": "torch", "dtype": "float32" if fp32 else "float16"}
    return spec | {"engine": "ct2", "ct2_dir": str(out / "ct2"), "compute_type": precision}


def needs(step: str) -> list[str]:
    """The preparation steps a step needs."""
    if step in PREP:
        return [] if step == "build" else ["build"]
    kind, precision = step.split("-")[:2]
    own = {"ours": f"export-{precision}", "ct2": "ct2-convert"}.get(kind)
    return ["build", "prepare"] + ([own] if own else [])


def absent(step: str, device: str, find=importlib.util.find_spec) -> str | None:
    """Why a step cannot run here (the Python module it needs is not installed; CTranslate2's float16 types
    on the CPU, which it refuses), or None."""
    if step in PREP:
        module = "ctranslate2" if step == "ct2-convert" else "transformers"
    else:
        module = MODULES[step.split("-")[0]]
    if find(module) is None:
        return f"skipped: {module} is not installed here"
    if device == "cpu" and step.startswith("ct2-") and step.endswith("float16"):
        return "skipped: CTranslate2 computes float16 on CUDA only"
    return None


def prep_spec(step: str, model: str, work: Path, mode: dict, size: dict) -> dict:
    """The job's settings for a preparation step."""
    mdir, out = work / "models" / model, work / "out" / model
    if step == "build":
        return {"job": "build", "size": size, "out": str(mdir), "max_texts": mode["spm_texts"]}
    if step == "prepare":
        return {
            "job": "prepare",
            "model_dir": str(mdir),
            "sentences": test_sentences(mode["sentences"]),
            "vocab_out": str(out / "id_to_token.json"),
        }
    if step == "ct2-convert":
        return {"job": "ct2_convert", "model_dir": str(mdir), "out": str(out / "ct2"), "int8": False}
    precision = step.split("-")[1]
    return {
        "job": "export",
        "model_dir": str(mdir),
        "out": str(out / f"bundle-{precision}"),
        "quantize": None,
        "dtype": {"fp32": "float32", "fp16": "float16"}[precision],
    }


def run_step(model: str, step: str, ctx: dict, results: dict) -> dict:
    """Runs one step as a job within its limit and the time left; returns its record."""
    work, mode = ctx["work"], ctx["mode"]
    have = results.setdefault(model, {})
    why = absent(step, mode["device"])
    failed = [n for n in needs(step) if have.get(n, {}).get("status") != "ok"]
    if why:
        return {"status": why}
    if failed:
        return {"status": f"not run: needs {', '.join(failed)}"}
    left = ctx["deadline"] - time.time()
    if left < 15:
        return {"status": f"not run: the budget was spent ({ctx['budget']:.0f} s)"}
    limit = LIMITS.get(step, LIMITS["engine"]) * (1 if mode["device"] == "cuda" else 2)
    if step in PREP:
        spec = prep_spec(step, model, work, mode, ctx["sizes"][model])
    else:
        spec = engine_spec(step, work, model, mode) | {
            "job": "engine",
            "prepared": str(work / "out" / model / "prepared.json"),
            "max_new_tokens": mode["max_new_tokens"],
            "model_dir": str(work / "models" / model),
            "batch1_sentences": mode["batch1"],
        }
    (work / "out" / model).mkdir(parents=True, exist_ok=True)
    partial = work / "jobs" / f"{model}-{step}.result.json.partial"
    partial.unlink(missing_ok=True)  # an earlier run's in the same WORK
    t = time.time()
    r = run_job(spec, work, f"{model}-{step}", min(limit, left))
    record = {"status": "ok" if "error" not in r else "failed", "seconds": round(time.time() - t, 1)}
    if "error" in r:
        record["error"] = r["error"][-600:]
        if partial.is_file():  # an engine cut short: the rows it finished
            r = json.loads(partial.read_text()) | {"error": r["error"]}
    if step == "prepare" and "error" not in r:
        (work / "out" / model / "prepared.json").write_text(json.dumps(r, ensure_ascii=False))
        r = {k: r[k] for k in ("source_lens", "forced_token", "target_lang")} | {"table": spec["vocab_out"]}
    record["result"] = r
    return record


def environment(mode: str) -> dict:
    """Versions and devices, from a child (the parent imports no torch): what the report's head says."""
    code = (
        "import json, platform, importlib.metadata as md\n"
        "out = {'python': platform.python_version()}\n"
        "for d in ('torch', 'transformers', 'onnxruntime', 'onnxruntime-gpu', 'ctranslate2', 'onnx'):\n"
        "    try: out[d] = md.version(d)\n"
        "    except Exception: pass\n"
        "try:\n import torch; out['gpu'] = torch.cuda.get_device_name(0) if torch.cuda.is_available() "
        "else None\nexcept Exception as e: out['torch_error'] = repr(e)\n"
        "try:\n import onnxruntime as o; out['providers'] = o.get_available_providers()\n"
        "except Exception as e: out['onnxruntime_error'] = repr(e)\n"
        "try:\n import ctranslate2 as c; out['ct2_cuda_devices'] = c.get_cuda_device_count()\n"
        "except Exception as e: out['ctranslate2_error'] = repr(e)\n"
        "print(json.dumps(out))\n"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
        env = json.loads(done.stdout.strip().splitlines()[-1])
    except Exception as e:  # the report says so; the steps still run and fail with their own reasons
        env = {"error": repr(e)[:300]}
    env["mode"], env["cpus"] = mode, os.cpu_count()
    return env


def write_out(out: Path, work: Path, report: dict) -> None:
    """summary.md, results.json (outputs included) and logs.tar.xz (every job's log) into OUT."""
    write_atomic(out / "results.json", json.dumps(report, default=str))  # every output: compact
    write_atomic(out / "summary.md", markdown(report))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for log in sorted((work / "jobs").glob("*.log")):
            tar.add(log, arcname=f"logs/{log.name}")
    (out / "logs.tar.xz").write_bytes(buf.getvalue())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    p.add_argument("--mode", choices=sorted(MODES), default="gpu")
    p.add_argument(
        "--out",
        type=Path,
        help="summary.md, results.json, logs.tar.xz (default $OUT, else /tmp/gpu-sizes-out)",
    )
    p.add_argument("--work", type=Path, help="models, bundles, job logs (default OUT-work)")
    p.add_argument("--models", default="marian,nllb", help="comma-separated subset of marian,nllb")
    p.add_argument(
        "--engines", default=",".join(ENGINES), help=f"comma-separated subset of {','.join(ENGINES)}"
    )
    p.add_argument(
        "--ours-variants",
        default="",
        help="more of our engines to A/B, e.g. ours-fp32-standard,ours-fp32-tf32,ours-fp16-standard "
        f"(ours-PRECISION-VARIANT, VARIANT one of {', '.join(VARIANTS)}); run after the others",
    )
    p.add_argument("--budget-s", type=float, help="seconds for all steps (default 450 gpu, 1200 cpu)")
    args = p.parse_args(argv)
    mode = MODES[args.mode]
    models = [m for m in args.models.split(",") if m]
    engines = [e for e in args.engines.split(",") if e]
    variants = [v for v in args.ours_variants.split(",") if v]
    bad = (
        [m for m in models if m not in ("marian", "nllb")]
        + [e for e in engines if e not in ENGINES]
        + [
            v
            for v in variants
            if not (
                v.count("-") == 2
                and v.split("-")[0] == "ours"
                and v.split("-")[1] in ("fp32", "fp16")
                and v.split("-")[2] in VARIANTS
            )
        ]
    )
    if bad or not models:
        p.error(f"unknown: {', '.join(bad) or 'no model'}; see --help for the choices")
    out = (args.out or Path(os.environ.get("OUT") or Path(tempfile.gettempdir()) / "gpu-sizes-out")).resolve()
    work = (args.work or out.parent / f"{out.name}-work").resolve()
    out.mkdir(parents=True, exist_ok=True)
    (work / "jobs").mkdir(parents=True, exist_ok=True)
    budget = args.budget_s or mode["budget"]
    t0 = time.time()
    ctx = {
        "work": work,
        "mode": mode,
        "budget": budget,
        "deadline": t0 + budget,
        "sizes": {m: (SIZES if args.mode == "gpu" else TINY)[m] for m in models},
    }
    report = {
        "env": environment(args.mode),
        "settings": {k: v for k, v in mode.items()}
        | {
            "models": models,
            "engines": engines + variants,
            "budget_s": budget,
            "command": " ".join(sys.argv),
        },
        "steps": {},
    }
    write_out(out, work, report)
    steps = plan(models, engines, variants)
    for model, step in steps:
        print(f"[gpu_sizes {time.time() - t0:5.0f} s] {model} {step} ...", flush=True)
        record = run_step(model, step, ctx, report["steps"])
        report["steps"].setdefault(model, {})[step] = record
        print(
            f"[gpu_sizes {time.time() - t0:5.0f} s] {model} {step}: {record['status']}"
            + (f" ({record['error'][-200:]})" if record.get("error") else ""),
            flush=True,
        )
        report["seconds"] = time.time() - t0
        write_out(out, work, report)  # after every step: a call cut short still brings back what was done
    print(markdown(report))
    ok = all(
        r["status"] == "ok" or r["status"].startswith("skipped")
        for s in report["steps"].values()
        for r in s.values()
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
