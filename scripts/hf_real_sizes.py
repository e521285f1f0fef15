"""Real sizes: Hugging Face Marian, M2M100 (NLLB) and mBART at their published sizes with random weights,
imported and timed against transformers' generate() and CTranslate2, on the CPU or the GPU.

    python scripts/hf_real_sizes.py --work DIR [--models marian,nllb] [--variants fp32,int8,int4] [--tiny]
    python scripts/hf_real_sizes.py --device cuda --out OUT      (scripts/gpu_sizes.sh, after the install)

Each model directory is written by transformers' own save_pretrained (seeded weights, a SentencePiece model
trained on English with filler pieces up to the real vocabulary), cached under WORK/models. Every step is a
child process of its own (hf_sizes_jobs.py: build, prepare, export, ct2_convert, engine), so that each has
its own peak RSS (and its own GPU memory), within its time limit and the budget (--budget-s). An engine's
name says what runs: generate-fp32|fp16 (the reference: TF32 off), ours-fp32|int8|int4|fp16[-standard|
-fused|-tf32], ct2-float32|int8|float16|int8_float16[-tN threads][-mkl]. An engine whose module is absent
here is skipped by name. OUT's summary.md and results.json are written after every step (a run cut short
still gives what was done), with the other models' results of an earlier run into OUT kept.
docs/benchmarks.md and docs/gpu.md ("Real sizes") give the tables and how to read them.
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
import scaffold as sc  # noqa: E402
from hf_sizes_common import ROWS, SIZES, TINY, mem_available_gb, run_job, test_sentences, write_json  # noqa: E402
from hf_sizes_report import markdown  # noqa: E402


def _rows(*batches: int) -> list[tuple[str, int, int]]:
    """(search, beam, batch): greedy and beam 4 at each batch, in the order measured."""
    return [(search, beam, b) for b in batches for search, beam in (("greedy", 1), ("beam4", 4))]


GPU_ROWS, TINY_ROWS = _rows(32, 1, 128), _rows(4, 1, 8)  # on the GPU batch 32 first: the goals' rows
PRESETS = {  # per device (and --tiny): sentences, batch-1 sentences, new tokens, threads, budget, rows
    "cuda": dict(sentences=128, batch1=8, max_new_tokens=32, threads=1, budget=450, rows=GPU_ROWS),
    "cpu": dict(sentences=32, batch1=8, max_new_tokens=32, threads=2, budget=None, rows=ROWS),
    # tiny models: 2,000 sentences are plenty for 1,000 pieces
    "tiny": dict(
        sentences=8, batch1=2, max_new_tokens=8, threads=1, budget=1200, rows=TINY_ROWS, spm_texts=2000
    ),
}
# Seconds each step may take at most on the GPU (NLLB-600M's are the long ones); twice that for --tiny on
# a busy CPU; --job-timeout (default 3600) on the CPU at real sizes.
LIMITS = {"build": 90, "prepare": 60, "export-fp32": 150, "export-fp16": 150, "ct2-convert": 90, "engine": 75}
# our bundles: int4t4 is `--quantize int4 --table-bits 4` (the smallest; docs/precision.md)
OURS = ("fp32", "int8", "int4", "int4t4", "fp16")
PREP = ("build", "prepare", *(f"export-{v}" for v in OURS), "ct2-convert")
GPU_ENGINES = ("ours-fp16", "ct2-float16", "generate-fp32", "generate-fp16", "ours-fp32")
LAST = ("ct2-int8_float16", "ct2-float32")  # on the GPU, after every model's goal rows
MODULES = {"ours": "onnxruntime", "generate": "transformers", "ct2": "ctranslate2"}
VARIANTS = {"standard": {"decoder": "standard"}, "fused": {"decoder": "fused"}, "tf32": {"tf32": True}}


def default_engines(
    device: str, variants: list[str], threads: int, ct2_threads: list[int], mkl: bool
) -> list[str]:
    """The engines timed by default: on the GPU issue 57's; on the CPU generate(), our variants and
    CTranslate2 fp32 and int8 at each thread setting (and fp32 on MKL with --ct2-mkl)."""
    if device == "cuda":
        return [*GPU_ENGINES, *LAST]
    ct2 = [f"ct2-{t}-t{n}" for t in ("float32", "int8") for n in ct2_threads]
    return ["generate-fp32", *(f"ours-{v}" for v in variants), *ct2] + (
        [f"ct2-float32-t{threads}-mkl"] if mkl else []
    )


def plan(
    models: list[str], engines: list[str], variants: list[str] = (), repeat: int = 1
) -> list[tuple[str, str]]:
    """The steps in order: each model's preparation (what its engines need) and engines (--repeat rounds,
    the order rotated: no engine always first; round r > 1 as ENGINE@r), then every model's LAST engines,
    then the A/B variants."""
    prep = [s for s in PREP if any(s in needs(e) for e in [*engines, *variants])]
    first = [e for e in engines if e not in LAST]
    steps = []
    for m in models:
        steps += [(m, s) for s in prep]
        for r in range(repeat):
            order = first[r % len(first) :] + first[: r % len(first)] if first else []
            steps += [(m, e if r == 0 else f"{e}@{r + 1}") for e in order]
    steps += [(m, e) for m in models for e in engines if e in LAST]
    return steps + [(m, v) for m in models for v in variants]


def needs(step: str) -> list[str]:
    """The preparation steps a step needs."""
    if step in PREP:
        return [] if step == "build" else ["build"]
    kind, precision = step.split("@")[0].split("-")[:2]
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
    if device == "cpu" and step.startswith("ct2-") and "float16" in step:
        return "skipped: CTranslate2 computes float16 on CUDA only"
    return None


def engine_spec(name: str, work: Path, model: str, mode: dict) -> dict:
    """The engine job's settings for an engine name (see the module's docstring)."""
    kind, precision, *rest = name.split("@")[0].split("-")
    out = work / "out" / model
    rows = mode["rows"]
    spec = dict(threads=mode["threads"], device=mode["device"], max_batch=max(b for *_, b in rows), rows=rows)
    fp32 = precision in ("fp32", "float32")
    if mode["device"] == "cuda" and fp32 and "tf32" not in rest:  # full float32 products in any library
        spec["env"] = {"NVIDIA_TF32_OVERRIDE": "0"}
    if kind == "ours":
        tuning = VARIANTS[rest[0]] if rest else {}
        return spec | dict(engine="ours", bundle=str(out / f"bundle-{precision}"), tuning=tuning)
    if kind == "generate":
        return spec | {"engine": "torch", "dtype": "float32" if fp32 else "float16"}
    threads = [int(x[1:]) for x in rest if x.startswith("t")]
    spec |= {"engine": "ct2", "ct2_dir": str(out / "ct2"), "compute_type": precision}
    if "mkl" in rest:
        spec["env"] = {"CT2_USE_MKL": "1"}
    return spec | ({"threads": threads[0]} if threads else {})


def prep_spec(step: str, model: str, work: Path, mode: dict, size: dict) -> dict:
    """The job's settings for a preparation step."""
    mdir, out = work / "models" / model, work / "out" / model
    if step == "build":
        return dict(job="build", size=size, out=str(mdir) + ".partial", max_texts=mode.get("spm_texts"))
    if step == "prepare":
        sentences = test_sentences(mode["sentences"])
        return dict(
            job="prepare", model_dir=str(mdir), sentences=sentences, vocab_out=str(out / "id_to_token.json")
        )
    if step == "ct2-convert":  # on the CPU also its int8 conversion: the anchor of an int8 bundle's size
        return dict(
            job="ct2_convert", model_dir=str(mdir), out=str(out / "ct2"), int8=mode["device"] == "cpu"
        )
    precision = step.split("-")[1]
    quantize = precision[:4] if precision.startswith("int") else None
    dtype = "float16" if precision == "fp16" else "float32"
    spec = dict(job="export", model_dir=str(mdir), out=str(out / f"bundle-{precision}"), quantize=quantize)
    return spec | {"dtype": dtype, "table_bits": 4 if precision == "int4t4" else None}


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
    mdir = work / "models" / model
    if step == "build" and (mdir / "build.json").is_file():  # cached under WORK/models
        cached = json.loads((mdir / "build.json").read_text()) | {"cached": True}
        return {"status": "ok", "seconds": 0.0, "result": cached}
    left = ctx["deadline"] - time.time()
    if left < 15:
        return {"status": f"not run: the budget was spent ({ctx['budget']:.0f} s)"}
    if step in PREP:
        spec = prep_spec(step, model, work, mode, ctx["sizes"][model])
    else:
        spec = engine_spec(step, work, model, mode) | {
            "job": "engine",
            "prepared": str(work / "out" / model / "prepared.json"),
            "max_new_tokens": mode["max_new_tokens"],
            "model_dir": str(mdir),
            "batch1_sentences": mode["batch1"],
        }
    (work / "out" / model).mkdir(parents=True, exist_ok=True)
    partial = work / "jobs" / f"{model}-{step}.result.json.partial"
    partial.unlink(missing_ok=True)  # an earlier run's in the same WORK
    t = time.time()
    r = run_job(spec, work, f"{model}-{step}", min(ctx["limit"](step), left), ctx["max_rss_gb"])
    record = {"status": "ok" if "error" not in r else "failed", "seconds": round(time.time() - t, 1)}
    if "error" in r:
        record["error"] = r["error"][-600:]
        if partial.is_file():  # an engine cut short: the rows it finished
            r = json.loads(partial.read_text()) | {"error": r["error"]}
    elif step == "build":
        Path(spec["out"]).rename(mdir)
        r["weights_bytes"] = (mdir / "model.safetensors").stat().st_size
        (mdir / "build.json").write_text(json.dumps(r))
    elif step == "prepare":
        (work / "out" / model / "prepared.json").write_text(json.dumps(r, ensure_ascii=False))
        r = {k: r[k] for k in ("source_lens", "forced_token", "target_lang")} | {"table": spec["vocab_out"]}
    record["result"] = r
    return record


def environment(device: str) -> dict:
    """Versions, CPU and GPU: the report's head (each engine's row says what it ran on: `ran`)."""
    from importlib import metadata

    env = {"python": sys.version.split()[0], "device": device, "cpus": os.cpu_count()}
    for dist in ("torch", "transformers", "onnxruntime", "onnxruntime-gpu", "ctranslate2", "onnx"):
        try:
            env[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    cpu = [
        x.split(":", 1)[1]
        for x in Path("/proc/cpuinfo").read_text().splitlines()
        if x.startswith("model name")
    ]
    gpu = subprocess.run("nvidia-smi -L", shell=True, capture_output=True, text=True).stdout.strip()
    return env | {"cpu": cpu[0].strip() if cpu else "?", "gpu": gpu or None}


def write_out(out: Path, work: Path, report: dict) -> None:
    """summary.md, results.json (outputs included) and logs.tar.xz (every job's log) into OUT."""
    write_json(out / "results.json", report)
    (out / "summary.md").write_text(markdown(report), encoding="utf-8")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for log in sorted((work / "jobs").glob("*.log")):
            tar.add(log, arcname=f"logs/{log.name}")
    (out / "logs.tar.xz").write_bytes(buf.getvalue())


def build_parser() -> argparse.ArgumentParser:
    p = sc.parser(__doc__)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--tiny", action="store_true", help="64-wide configs: the whole pipeline in minutes")
    p.add_argument("--work", type=Path, help="models (cached), bundles, job logs (default OUT-work)")
    p.add_argument(
        "--out", type=Path, help="summary.md, results.json, logs.tar.xz (default WORK/results, else $OUT)"
    )
    p.add_argument(
        "--models", default="marian,nllb", help="a subset of " + ",".join(SIZES) + " (marian,nllb)"
    )
    p.add_argument("--engines", help="engine names, or torch,ours,ct2 for those of the default list")
    p.add_argument("--variants", default="fp32,int8", help="our CPU bundles: of " + ",".join(OURS[:-1]))
    p.add_argument("--ours-variants", default="", help="A/B engines run last, e.g. ours-fp32-tf32 (VARIANTS)")
    p.add_argument("--ct2-threads", help="CTranslate2 intra_threads tried on the CPU (default THREADS,1)")
    p.add_argument("--ct2-mkl", action="store_true", help="also CTranslate2 fp32 with CT2_USE_MKL=1")
    for name in ("sentences", "batch1-sentences", "max-new-tokens", "threads"):
        p.add_argument(f"--{name}", type=int, help="default: the device's preset (PRESETS)")
    p.add_argument("--prepare-only", action="store_true", help="build, export and convert; time nothing")
    p.add_argument("--repeat", type=int, default=1, help="rounds of the engines (speed: the fastest round)")
    p.add_argument("--budget-s", type=float, help="seconds for all steps (default 450 cuda, 1200 --tiny)")
    p.add_argument("--job-timeout", type=float, help="seconds a step may take (default 3600 at real sizes)")
    p.add_argument(
        "--max-job-rss-gb", type=float, help="kill a job past this (default 85%% of the free memory)"
    )
    return p


def _settings(p: argparse.ArgumentParser, args) -> tuple[dict, list[str], list[str], list[str]]:
    """The preset with the options over it, the models, engines and A/B variants; p.error on a bad one."""
    mode = dict(PRESETS["tiny" if args.tiny else args.device], device=args.device)
    for key, value in (
        ("sentences", args.sentences),
        ("batch1", args.batch1_sentences),
        ("threads", args.threads),
    ):
        mode[key] = value if value is not None else mode[key]
    mode["max_new_tokens"] = args.max_new_tokens or mode["max_new_tokens"]
    if min(mode["sentences"], mode["batch1"], mode["threads"], args.repeat) < 1 or mode["max_new_tokens"] < 2:
        p.error("--sentences, --batch1-sentences, --threads and --repeat must be >= 1, --max-new-tokens >= 2")
    models = [m for m in args.models.split(",") if m]
    variants, extra = (
        [v for v in args.variants.split(",") if v],
        [v for v in args.ours_variants.split(",") if v],
    )
    try:
        ct2_threads = sorted(
            {int(x) for x in (args.ct2_threads or f"{mode['threads']},1").split(",")}, reverse=True
        )
    except ValueError:
        p.error(f"--ct2-threads {args.ct2_threads}: give positive integers separated by commas, e.g. 2,1")
    listed = default_engines(args.device, variants, mode["threads"], ct2_threads, args.ct2_mkl)
    groups = {"torch": "generate", "ours": "ours", "ct2": "ct2"}
    engines = []
    for e in (args.engines or ",".join(listed)).split(","):
        engines += [x for x in listed if x.startswith(groups[e] + "-")] if e in groups else [e] if e else []
    bad = [m for m in models if m not in SIZES] + [v for v in variants if v not in OURS[:-1]]
    bad += [e for e in engines + extra if not _known(e)]
    if bad or not models or not engines:
        p.error(f"unknown: {', '.join(bad) or 'no model or engine'}; see --help for the choices")
    return mode, models, engines, extra


def _known(engine: str) -> bool:
    kind, *rest = engine.split("-")
    if kind == "ours":
        return len(rest) in (1, 2) and rest[0] in OURS and rest[1:] in ([], *([v] for v in VARIANTS))
    if kind == "generate":
        return rest in (["fp32"], ["fp16"])
    ok = rest and rest[0] in ("float32", "int8", "float16", "int8_float16")
    return bool(ok) and all(x == "mkl" or (x[:1] == "t" and x[1:].isdigit()) for x in rest[1:])


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    mode, models, engines, extra = _settings(p, args)
    if args.work is None and args.out is None and args.device == "cpu" and "OUT" not in os.environ:
        p.error("--work DIR (or --out DIR) is required")
    default_out = Path(os.environ.get("OUT") or Path(tempfile.gettempdir()) / "gpu-sizes-out")
    out = (args.out or (args.work / "results" if args.work else default_out)).resolve()
    work = (args.work or out.parent / f"{out.name}-work").resolve()
    out.mkdir(parents=True, exist_ok=True)
    (work / "jobs").mkdir(parents=True, exist_ok=True)
    budget = args.budget_s or mode["budget"]
    t0 = time.time()
    factor = 1 if args.device == "cuda" else 2

    def limit(step):
        return args.job_timeout or (
            LIMITS.get(step.split("@")[0], LIMITS["engine"]) * factor if budget else 3600
        )

    sizes = TINY if args.tiny else SIZES
    ctx = dict(work=work, mode=mode, budget=budget, deadline=t0 + (budget or float("inf")), limit=limit)
    ctx |= dict(
        sizes={m: sizes[m] for m in models}, max_rss_gb=args.max_job_rss_gb or 0.85 * mem_available_gb()
    )
    old = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else {}
    settings = mode | dict(models=models, engines=engines + extra, budget_s=budget, repeat=args.repeat)
    report = {"env": environment(args.device), "settings": settings | {"command": " ".join(sys.argv)}}
    report["steps"] = {m: s for m, s in old.get("steps", {}).items() if m not in models}
    write_out(out, work, report)
    steps = plan(models, engines, extra, args.repeat)
    for model, step in [s for s in steps if s[1] in PREP] if args.prepare_only else steps:
        print(f"[hf_real_sizes {time.time() - t0:5.0f} s] {model} {step} ...", flush=True)
        record = run_step(model, step, ctx, report["steps"])
        if "@" in step:  # a later round: its result beside the first round's
            report["steps"][model].setdefault(step.split("@")[0], {}).setdefault("rounds", []).append(
                record.get("result")
            )
        report["steps"].setdefault(model, {})[step] = record
        print(
            f"[hf_real_sizes {time.time() - t0:5.0f} s] {model} {step}: {record['status']}"
            + (f" ({record['error'][-200:]})" if record.get("error") else ""),
            flush=True,
        )
        report["seconds"] = time.time() - t0
        write_out(out, work, report)  # after every step: a run cut short still gives what was done
    print(markdown(report))
    ok = all(
        r["status"] == "ok" or r["status"].startswith("skipped")
        for m in models
        for r in report["steps"][m].values()
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
