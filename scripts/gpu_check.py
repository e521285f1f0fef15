"""The GPU check of issue 39 in one call: train, export, test, verify, count copies, bench; tables under OUT.

    python scripts/gpu_check.py --mode gpu --out OUT [--data cmn.txt]    (scripts/gpu_check.sh calls it)
    python scripts/gpu_check.py --mode cpu --out OUT                     (the same steps, CPU provider)

`--mode gpu` runs on a machine with an NVIDIA GPU and onnxruntime-gpu (gpu_check.sh installs the carried
wheel); `--mode cpu` runs every step on the CPU provider with a tiny model, so that CI runs this script
(tests/test_gpu_check.py) and it cannot rot. Steps, each its own child process with a time limit, so that a
crash in one (a CUDA library that does not load) is recorded and the next still runs:

  env      versions, providers, nvidia-smi
  train    `seq2onnx train --device cuda` (bf16 autocast: model/train.py) for a minute: tokens/s, steps/s
  export   the fp32 and fp16 bundles (`seq2onnx export`, `--dtype float16`)
  tests    `pytest -m gpu tests/test_gpu.py` (they skip, with one line each, where CUDA cannot run)
  verify   `seq2onnx verify --device cuda` on the fp32 and the fp16 bundle (their printed tables)
  parity   greedy and beam 4 token ids of the fp32 bundle against the PyTorch reference on every test
           sentence; the fp16 bundle's greedy agreement with fp32, BLEU of each, non-finite scores
  copies   host<->device copies per decoder step: the IO binding's inputs and outputs (where each lives),
           the Memcpy nodes onnxruntime put into the decoder graph, and on CUDA the copies CUPTI saw
           (torch.profiler), each per step from two runs of forced lengths (per-batch copies cancel)
  bench    `seq2onnx bench` with the CUDA engines (onnx fp32/fp16, CTranslate2 fp32/fp16) against PyTorch
  torch    the PyTorch reference decoder on the same device (bench's torch engine runs on the CPU only)

OUT gets summary.md (every table), results.json (every step's numbers) and logs.tar.xz (each step's log and
JSON): three files, within the device tool's eight.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the gpu_check_* modules, also when loaded by path
# step_copies: the copies step (child() finds it here); tests/test_gpu.py reads step_copies_of, memcpy_nodes
from gpu_check_copies import memcpy_nodes, sources, step_copies, step_copies_of  # noqa: E402,F401
from gpu_check_report import STEPS, write_outputs  # noqa: E402

# Seconds each step may take at most (GPU mode); the overall --budget-s cuts the later ones shorter.
LIMITS = dict(
    env=60, train=150, export=120, tests=150, verify=200, parity=120, copies=90, bench=180, torch=90
)
TINY = (
    "--pairs 3000 --valid-size 50 --test-size 50 --vocab-size 120 --max-len 40 --d-model 32 --heads 4 "
    "--layers 2 --d-ff 64 --dropout 0 --max-tokens 1500 --warmup 100 --lr 2.0 --max-steps 150 "
    "--eval-every 150 --bleu-sentences 10"
).split()
# The README's Tatoeba recipe (d_model 256, 3+3 layers, d_ff 1024, 3,000 pieces), for one minute.
RECIPE = (
    "--d-model 256 --heads 4 --layers 3 --d-ff 1024 --max-minutes 1 --max-steps 100000 --eval-every 1000 "
    "--bleu-sentences 200"
).split()


def sizes(mode: str) -> dict:
    """The sentences, batches and threads of each step in a mode."""
    if mode == "gpu":
        counts = dict(parity=500, verify=500, tensor=50, bench=100, torch=100, copies_rows=32)
        return dict(device="cuda", **counts, threads=os.cpu_count() or 1)
    return dict(device="cpu", parity=24, verify=24, tensor=4, bench=16, torch=16, copies_rows=4, threads=1)


def cli(*args: str) -> list[str]:
    """The `seq2onnx` command as a child of this Python (works without the console script installed)."""
    return [sys.executable, "-m", "seq2onnx.commands", *args]


def run_logged(cmd: list[str], log: Path, timeout: float) -> int:
    """Runs cmd with its output appended to log; returns its exit status (124 when it ran past timeout)."""
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        try:
            return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            f.write(f"\n[gpu_check] timed out after {timeout:.0f} s\n")
            return 124


# -- the steps: each runs in a child (`--step NAME`), reads ctx, writes WORK/NAME.json ------------------


def step_env(ctx: dict) -> dict:
    import platform

    out = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    try:
        import torch

        out["torch"] = torch.__version__
        out["torch_cuda"] = torch.version.cuda
        out["torch_sees_gpu"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
    except Exception as e:  # the summary says what is missing rather than stopping here
        out["torch_error"] = repr(e)
    from seq2onnx.runtime import ort_install
    from seq2onnx.runtime.devices import cuda_usable

    out["onnxruntime_distributions"] = ort_install.onnxruntime_distributions()
    ort = ort_install.import_onnxruntime()
    out["onnxruntime"] = ort.__version__
    out["providers"] = ort.get_available_providers()
    out["cuda_usable"] = list(cuda_usable())
    if ctx["mode"] == "gpu":
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True)
        out["nvidia_smi"] = smi.stdout.strip().splitlines()[:12]
        if not cuda_usable()[0]:
            raise SystemExit(f"mode gpu, but CUDA cannot run: {cuda_usable()[1]}")
    try:
        import ctranslate2

        out["ctranslate2"] = ctranslate2.__version__
        out["ctranslate2_cuda_devices"] = ctranslate2.get_cuda_device_count()
    except Exception as e:
        out["ctranslate2"] = f"not usable: {e!r}"
    return out


def step_train(ctx: dict) -> dict:
    work, log = Path(ctx["work"]), Path(ctx["log"])
    if ctx["mode"] == "gpu":
        tatoeba = ["--data", ctx["data"], "--src-col", "1", "--tgt-col", "0", "--vocab-size", "3000"]
        data = tatoeba if ctx["data"] else ["--pairs", "20000", "--vocab-size", "1000"]
        args = RECIPE + data
    else:
        args = TINY
    t0 = time.time()
    cmd = cli("train", str(work / "run"), "--device", ctx["sizes"]["device"], "--force", *args)
    rc = run_logged(cmd, log, ctx["timeout"])
    if rc:
        raise SystemExit(f"seq2onnx train exited {rc}")
    state = json.loads((work / "run" / "last" / "train_state.json").read_text())
    history = state["history"]
    # The trainer prints tokens/s on its progress bar (target tokens of every batch over the wall time since
    # the first step); the bar's last line is the run's figure.
    tok_s = re.findall(r"tok_s=([\d,]+)", log.read_text())
    last = history[-1]
    return {
        "seconds": time.time() - t0,
        "steps": state["step"],
        "train_seconds": last["elapsed_s"],
        "steps_per_s": state["step"] / last["elapsed_s"],
        "tokens_per_s": int(tok_s[-1].replace(",", "")) if tok_s else None,
        "precision": "bf16 autocast (model/train.py on CUDA)" if ctx["mode"] == "gpu" else "fp32 (CPU)",
        "valid_bleu": last["valid_bleu"],
        "valid_loss": last["valid_loss"],
        "data": ctx["data"] or "generated",
        "args": args,
    }


def step_export(ctx: dict) -> dict:
    work, log = Path(ctx["work"]), Path(ctx["log"])
    out = {}
    for name, extra in (("fp32", []), ("fp16", ["--dtype", "float16"])):
        t0 = time.time()
        cmd = cli("export", str(work / "run" / "best"), str(work / name), "--force", *extra)
        rc = run_logged(cmd, log, ctx["timeout"])
        if rc:
            raise SystemExit(f"seq2onnx export ({name}) exited {rc}")
        out[name] = {
            "seconds": time.time() - t0,
            "bytes": sum(p.stat().st_size for p in (work / name).iterdir()),
        }
    return out


def step_tests(ctx: dict) -> dict:
    work, log = Path(ctx["work"]), Path(ctx["log"])
    xml = work / "tests.xml"
    pytest = [
        sys.executable,
        "-m",
        "pytest",
        *"-q -rs -m gpu -p no:cacheprovider".split(),
        f"--junitxml={xml}",
    ]
    rc = run_logged(pytest + [str(Path(ctx["repo"]) / "tests" / "test_gpu.py")], log, ctx["timeout"])
    import xml.etree.ElementTree as ET

    cases = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        status = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = child.tag
                message = (child.get("message") or "").splitlines()[0][:200]
                cases.append({"name": case.get("name"), "status": status, "message": message})
                break
        else:
            cases.append({"name": case.get("name"), "status": status, "message": ""})
    counts = {s: sum(c["status"] == s for c in cases) for s in ("passed", "failure", "error", "skipped")}
    if rc not in (0, 5) or counts["failure"] or counts["error"]:
        raise SystemExit(f"pytest exited {rc}: {counts}")
    return {"counts": counts, "cases": cases}


def step_verify(ctx: dict) -> dict:
    work, log = Path(ctx["work"]), Path(ctx["log"])
    s = ctx["sizes"]
    out = {}
    for name in ("fp32", "fp16"):
        report = work / f"verify-{name}.json"
        text = work / f"verify-{name}.txt"
        sizes = ["--sentences", str(s["verify"]), "--tensor-sentences", str(s["tensor"])]
        cmd = cli("verify", str(work / "run" / "best"), str(work / name), "--device", s["device"], *sizes)
        cmd += ["--json", str(report), "--quiet"]
        with open(log, "a") as f:
            f.write(f"$ {' '.join(cmd)}\n")
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=ctx["timeout"] / 2)
        text.write_text(done.stdout + done.stderr)
        with open(log, "a") as f:
            f.write(done.stdout + done.stderr)
        if not report.is_file():
            raise SystemExit(f"seq2onnx verify ({name}) exited {done.returncode} without a report")
        r = json.loads(report.read_text())
        out[name] = {k: r[k] for k in ("passed", "provider", "sentences")}
        out[name].update(exit=done.returncode, table=done.stdout.strip())
    if not all(v["passed"] for v in out.values()):
        raise SystemExit("verify failed: " + ", ".join(k for k, v in out.items() if not v["passed"]))
    return out


def step_parity(ctx: dict) -> dict:
    from seq2onnx.model.metrics import bleu
    from seq2onnx.model.search import translate_ids
    from seq2onnx.runtime.translator import Translator

    work, device = Path(ctx["work"]), ctx["sizes"]["device"]
    model, tok, pairs, srcs = sources(str(work / "run" / "best"), ctx["sizes"]["parity"])
    refs = [t for _, t in pairs]
    eos = model.cfg.eos_id
    strip = lambda ids: ids[:-1] if ids and ids[-1] == eos else ids  # noqa: E731
    t32 = Translator(work / "fp32", device=device)
    t16 = Translator(work / "fp16", device=device)
    out = {"device": t32.device, "decoder": t32.decoder_variant, "sentences": len(srcs)}
    for beam in (1, 4):
        want = [strip(h[0].tokens) for h in translate_ids(model, srcs, beam_size=beam)]
        got = t32.translate_batch(srcs, beam_size=beam, return_scores=True)
        same = sum(g.token_ids[0] == w for g, w in zip(got, want))
        out[f"fp32_beam{beam}"] = {
            "identical": same,
            "of": len(srcs),
            "non_finite_scores": sum(not math.isfinite(s) for g in got for s in g.scores),
            "bleu": bleu([g.hypotheses[0] for g in got], refs),
            "torch_bleu": bleu([tok.decode_target(w) for w in want], refs),
        }
        if beam == 1:
            greedy32 = got
    got16 = t16.translate_batch(srcs, beam_size=1, return_scores=True)
    agree = sum(a.token_ids[0] == b.token_ids[0] for a, b in zip(got16, greedy32))
    b32, b16 = bleu([g.hypotheses[0] for g in greedy32], refs), bleu([g.hypotheses[0] for g in got16], refs)
    out["fp16_greedy"] = dict(
        agree_with_fp32=agree, of=len(srcs), rate=agree / max(len(srcs), 1), bleu_fp32=b32
    )
    out["fp16_greedy"].update(bleu_fp16=b16, bleu_drop=b32 - b16)
    out["fp16_greedy"]["non_finite_scores"] = sum(not math.isfinite(s) for g in got16 for s in g.scores)
    return out


def step_bench(ctx: dict) -> dict:
    work, log, s = Path(ctx["work"]), Path(ctx["log"]), ctx["sizes"]
    if ctx["mode"] == "gpu":
        engines = "onnx-cuda-fp32,onnx-cuda-fp16,ct2-cuda-fp32,ct2-cuda-fp16"
        size = ["--sentences", str(s["bench"])]
    else:
        engines, size = "onnx-cpu-fp32,ct2-cpu-fp32", ["--quick"]
    report = work / "bench.json"
    options = [
        "--engines",
        engines,
        "--threads",
        str(s["threads"]),
        "--bundle-dir",
        str(work / "bench-bundles"),
    ]
    cmd = cli("bench", str(work / "run" / "best"), *options, "--json", str(report), *size)
    rc = run_logged(cmd, log, ctx["timeout"])
    if not report.is_file():
        raise SystemExit(f"seq2onnx bench exited {rc} without a report")
    r = json.loads(report.read_text())
    keys = "engine search batch tokens_per_s agreement agreement_of x_torch x_ct2 peak_rss_mb".split()
    rows = [{k: row.get(k) for k in keys} for row in r.get("best_rows", r["rows"])]
    text = log.read_text()
    table = text[text.rfind("$ ") :]
    if rc:
        raise SystemExit(f"seq2onnx bench exited {rc}")
    return {
        "rows": rows,
        "skipped": r["skipped"],
        "report": table.split("\n", 1)[1] if "\n" in table else table,
    }


def step_torch(ctx: dict) -> dict:
    """The PyTorch reference decoder on the mode's device: bench's configurations, its tokens/s."""
    import torch

    from seq2onnx.export.bundle import DECODING_DEFAULTS as dd
    from seq2onnx.model import checkpoint
    from seq2onnx.model.search import translate_ids

    work, s = Path(ctx["work"]), ctx["sizes"]
    torch.set_num_threads(s["threads"])
    _, _, _, srcs = sources(str(work / "run" / "best"), s["torch"])
    model, _, _ = checkpoint.load(work / "run" / "best", device=s["device"])
    srcs = sorted(srcs, key=len)

    def limit(src):  # bench's maximum length (bench/run.py)
        return min(int(dd["max_length_a"] * len(src)) + dd["max_length_b"], model.cfg.max_positions)

    rows = []
    translate_ids(model, srcs[:2], beam_size=4)  # warm-up: kernels chosen, allocator filled
    for beam, batch in ((1, 1), (1, 32), (4, 1), (4, 32)):
        tokens, t0 = 0, time.perf_counter()
        with torch.inference_mode():
            for i in range(0, len(srcs), batch):
                chunk = srcs[i : i + batch]
                for src, h in zip(
                    chunk,
                    translate_ids(model, chunk, beam_size=beam, max_length=max(limit(x) for x in chunk)),
                ):
                    tokens += min(len(h[0].tokens), limit(src))
        if s["device"] == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        search = "greedy" if beam == 1 else f"beam{beam}"
        row = dict(engine=f"torch-{s['device']}", search=search, batch=batch, tokens_per_s=tokens / seconds)
        rows.append(row | {"sentences": len(srcs)})
    return {"rows": rows, "device": s["device"]}


# -- the parent: runs the steps within the budget, writes OUT ------------------------------------------


def run_step(name: str, ctx: dict, deadline: float) -> dict:
    """Runs one step as a child process (`--step NAME`), within its limit and the time left."""
    work = Path(ctx["work"])
    log = work / "logs" / f"{name}.log"
    left = deadline - time.time()
    limit = LIMITS[name] if ctx["mode"] == "gpu" else LIMITS[name] * 2  # the CPU is slower: a generous bound
    if left < 10:
        return {"status": "not run", "reason": f"the budget was spent ({ctx['budget_s']} s)"}
    timeout = min(limit, left)
    child = dict(ctx, log=str(log), timeout=timeout * 0.95)
    t0 = time.time()
    cmd = [sys.executable, __file__, "--step", name, "--ctx", json.dumps(child)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if ctx["mode"] == "cpu":  # tiny models run fastest on one thread; more thrash on a shared machine
        env.setdefault("OMP_NUM_THREADS", "1")
    with open(log, "a") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=env).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    result_file = work / f"{name}.json"
    result = json.loads(result_file.read_text()) if result_file.is_file() else None
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.is_file() else []
    reason = None if rc == 0 else (tail[0][:300] if tail else "no output")
    status = "ok" if rc == 0 else "failed"
    return dict(status=status, exit=rc, seconds=round(time.time() - t0, 1), result=result, reason=reason)


def child(name: str, ctx: dict) -> int:
    """The child side of run_step: runs step_NAME, writes its result as WORK/NAME.json."""
    result = globals()[f"step_{name}"](ctx)
    (Path(ctx["work"]) / f"{name}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


# Which steps need which: a step whose input failed is not run, and says so.
NEEDS = dict(export="train", verify="export", parity="export", copies="export", bench="train", torch="train")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["gpu", "cpu"], default="gpu")
    p.add_argument(
        "--out", help="summary.md, results.json, logs.tar.xz (default $OUT, else /tmp/gpu-check-out)"
    )
    p.add_argument("--work", help="scratch directory (runs, bundles, logs); default OUT/../gpu-check-work")
    p.add_argument("--data", help="Tatoeba's cmn.txt for the recipe model (default: the generated corpus)")
    p.add_argument("--budget-s", type=float, help="seconds for all steps (default 440 gpu, 600 cpu)")
    p.add_argument("--steps", help=f"comma-separated subset of {','.join(STEPS)}")
    p.add_argument("--step", help=argparse.SUPPRESS)
    p.add_argument("--ctx", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.step:
        return child(args.step, json.loads(args.ctx))
    out = Path(args.out or os.environ.get("OUT") or Path(tempfile.gettempdir()) / "gpu-check-out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work).resolve() if args.work else out.parent / f"{out.name}-work"
    (work / "logs").mkdir(parents=True, exist_ok=True)
    budget = args.budget_s or (440 if args.mode == "gpu" else 600)
    data = str(Path(args.data).resolve()) if args.data else None
    ctx = dict(mode=args.mode, work=str(work), data=data, sizes=sizes(args.mode), budget_s=budget)
    ctx["repo"] = str(Path(__file__).resolve().parents[1])
    wanted = args.steps.split(",") if args.steps else list(STEPS)
    t0 = time.time()
    deadline = t0 + budget
    results: dict = {}
    for name in STEPS:
        need = NEEDS.get(name)
        if name not in wanted:
            results[name] = {"status": "not run", "reason": "not asked for (--steps)"}
        elif need and results.get(need, {}).get("status") == "failed":
            results[name] = {"status": "not run", "reason": f"needs {need}, which failed"}
        else:
            print(f"[gpu_check {time.time() - t0:5.0f} s] {name} ...", flush=True)
            results[name] = run_step(name, ctx, deadline)
            why = f" ({results[name]['reason']})" if results[name].get("reason") else ""
            print(f"[gpu_check {time.time() - t0:5.0f} s] {name}: {results[name]['status']}{why}", flush=True)
        # after every step: a call cut short by its time limit still brings back what was done
        text = write_outputs(out, work, results, args.mode, time.time() - t0)
    print(text)
    return 0 if all(v["status"] == "ok" for k, v in results.items() if k in wanted) else 1


if __name__ == "__main__":
    sys.exit(main())
