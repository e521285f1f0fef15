"""`seq2onnx bench`: the PyTorch reference, the ONNX runtime and CTranslate2 on the same model and sentences.

One run measures, for every engine and for {greedy, beam 4} x {batch 1, batch 32}: target tokens per
second (generated tokens, end token included), sentences per second, per-sentence latency p50/p90 at
batch 1, and the peak resident memory of the engine's process. Each engine runs in a fresh child
process (`python -m seq2onnx.export.benchcli JOB OUT`), so its peak memory is its own and no engine warms
another's caches. All engines use the same number of threads, the same sentences and the same
batches: the sentences are sorted by source length once and cut into batches here, and every engine
gets exactly those batches.

Engines:
  torch            model.search.translate_ids, the PyTorch reference with its key/value cache. Its
                   greedy search is batched; its beam search decodes one sentence at a time (that is
                   the reference implementation), so "torch beam4 batch 32" is 32 sequential searches.
  torch-batched    the same PyTorch model driven by the runtime's own batched search (runtime/search.py):
                   what a batched PyTorch decoder gets, so that the ONNX rows are also compared
                   with PyTorch on equal search terms.
  onnx-cpu-fp32    runtime.translator.Translator on the fp32 bundle, CPU provider.
  onnx-cpu-int8    ... on the int8 (dynamically quantized) bundle.
  onnx-cuda-fp32/fp16   the CUDA provider, only where a GPU is usable (skipped with the reason otherwise).
  ct2-cpu-fp32/int8     CTranslate2 on the same weights (export/ct2convert.py), the peer to beat;
  ct2-cuda-fp32/fp16    optional (`pip install 'seq2onnx[bench]'`). CTranslate2's timings count only
                   when its fp32 greedy outputs equal the PyTorch reference's on every sentence (the
                   proof that the conversion is right); otherwise the benchmark marks them void.

Ratios: "x torch" is tokens/s over the torch row's tokens/s (same search and batch); "x ct2" is
tokens/s over the CTranslate2 row of the same device and precision (torch and fp32 rows against
ct2-*-fp32, int8 against ct2-cpu-int8, fp16 against ct2-cuda-fp16).
"""
from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = [(1, 1), (1, 32), (4, 1), (4, 32)]  # (beam size, batch size); beam 1 is greedy
QUICK_SENTENCES, DEFAULT_SENTENCES = 16, 100

# name -> (kind, device, precision)
ENGINES = {
    "torch": ("torch", "cpu", "fp32"),
    "torch-batched": ("torch-batched", "cpu", "fp32"),
    "onnx-cpu-fp32": ("onnx", "cpu", "fp32"),
    "onnx-cpu-int8": ("onnx", "cpu", "int8"),
    "onnx-cuda-fp32": ("onnx", "cuda", "fp32"),
    "onnx-cuda-fp16": ("onnx", "cuda", "fp16"),
    "ct2-cpu-fp32": ("ct2", "cpu", "fp32"),
    "ct2-cpu-int8": ("ct2", "cpu", "int8"),
    "ct2-cuda-fp32": ("ct2", "cuda", "fp32"),
    "ct2-cuda-fp16": ("ct2", "cuda", "fp16"),
}
CT2_COMPUTE = {"fp32": "float32", "int8": "int8", "fp16": "float16"}
TORCH_BEAM_NOTE = ("torch beam search decodes one sentence at a time (model.search.translate_ids): "
                   "its beam rows at batch 32 are 32 sequential searches")


# -- the child process: one engine ---------------------------------------------------------------

def _peak_rss_mb() -> float:
    """Peak resident set size of this process (VmHWM: this process image's own, unlike ru_maxrss,
    which can carry the parent's peak across fork and exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


def _strip_eos(ids, eos: int) -> list[int]:
    ids = list(ids)
    return ids[:-1] if ids and ids[-1] == eos else ids


def _make_runner(job: dict):
    """A function (indices, beam) -> target ids per index (end token excluded), and a description."""
    kind, device, precision = ENGINES[job["engine"]]
    sources, limits, threads, eos = job["sources"], job["limits"], job["threads"], job["eos_id"]
    if kind == "torch":
        import torch

        from seq2onnx.model import checkpoint
        from seq2onnx.model.search import translate_ids

        torch.set_num_threads(threads)
        model, _, _ = checkpoint.load(job["checkpoint"])

        def run(indices, beam):
            hyps = translate_ids(model, [sources[i] for i in indices], beam_size=beam, length_penalty=1.0,
                                 batch_size=max(len(indices), 1))
            return [_strip_eos(h[0].tokens, eos) for h in hyps]

        return run, f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    if kind == "torch-batched":
        import numpy as np
        import torch

        from seq2onnx.model import checkpoint
        from seq2onnx.runtime.search import beam_search, greedy_search

        torch.set_num_threads(threads)
        model, _, _ = checkpoint.load(job["checkpoint"])
        cfg = model.cfg

        @torch.no_grad()
        def run(indices, beam):
            srcs = [sources[i] for i in indices]
            src = torch.full((len(srcs), max(map(len, srcs))), cfg.pad_id, dtype=torch.long)
            for row, ids in enumerate(srcs):
                src[row, : len(ids)] = torch.tensor(ids)
            state = {"mask": src != cfg.pad_id}
            state["cross"] = model.cross_kv(model.encode(src, state["mask"]))
            state["past"] = model.empty_cache(len(srcs))

            def step(tokens, cache_indices, t, keep):
                if keep is not None:
                    k = torch.from_numpy(keep)
                    state["cross"] = [(a[k], b[k]) for a, b in state["cross"]]
                    state["mask"] = state["mask"][k]
                log_probs, state["past"] = model.decode_step(
                    torch.from_numpy(tokens), torch.tensor([t]), torch.from_numpy(cache_indices), state["past"],
                    state["cross"], state["mask"])
                return log_probs.numpy()

            common = dict(start_id=cfg.decoder_start_id, eos_id=cfg.eos_id,
                          max_lengths=np.array([limits[i] for i in indices]))
            found = (greedy_search(step, len(srcs), **common) if beam == 1 else
                     beam_search(step, len(srcs), beam_size=beam, length_penalty=1.0, **common))
            return [_strip_eos(r.hypotheses[0], eos) for r in found]

        return run, f"torch {torch.__version__} + runtime/search.py, {torch.get_num_threads()} threads"
    if kind == "onnx":
        import onnxruntime

        from seq2onnx.runtime.translator import Translator

        tr = Translator(job["bundles"][precision], device=device, intra_threads=threads)

        def run(indices, beam):
            res = tr.translate_batch([sources[i] for i in indices], beam_size=beam, length_penalty=1.0,
                                     max_batch_size=max(len(indices), 1))
            return [list(r.token_ids[0]) for r in res]

        return run, f"onnxruntime {onnxruntime.__version__} ({tr.device}), intra_op_num_threads={threads}"
    if kind == "ct2":
        import ctranslate2

        tr = ctranslate2.Translator(job["ct2_model"], device=device, compute_type=CT2_COMPUTE[precision],
                                    intra_threads=threads, inter_threads=1)
        src_pieces, tgt_ids = job["source_pieces"], {p: i for i, p in enumerate(job["target_pieces"])}
        unk = job["unk_id"]

        def run(indices, beam):
            tokens = [[src_pieces[t] for t in sources[i]] for i in indices]
            # One maximum length per call: each output is cut at its own sentence's limit afterwards
            # (greedy decisions do not look ahead, so the cut output is what a per-sentence limit gives).
            res = tr.translate_batch(tokens, beam_size=beam, length_penalty=1.0, max_batch_size=max(len(indices), 1),
                                     batch_type="examples", max_decoding_length=max(limits[i] for i in indices))
            return [[tgt_ids.get(p, unk) for p in r.hypotheses[0]][: limits[i]] for i, r in zip(indices, res)]

        return run, (f"ctranslate2 {ctranslate2.__version__} ({device}, compute_type={CT2_COMPUTE[precision]}), "
                     f"intra_threads={threads} inter_threads=1")
    raise ValueError(f"unknown engine kind {kind}")


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def run_engine(job: dict) -> dict:
    """Loads one engine, then for each (beam, batch): one warm-up call, `repeat` timed passes over all
    the sentences in the job's batches. Returns timings, outputs and memory."""
    t0 = time.perf_counter()
    run, description = _make_runner(job)
    load_s = time.perf_counter() - t0
    rss_loaded = _rss_mb()
    order = job["order"]
    results = []
    for beam, batch in job["configs"]:
        chunks = [order[i : i + batch] for i in range(0, len(order), batch)]
        run(chunks[0], beam)  # warm-up: first-call allocations, graph optimisation, thread pools
        passes = []
        outputs: dict[int, list[int]] = {}
        for _ in range(job["repeat"]):
            times = []
            for chunk in chunks:
                t = time.perf_counter()
                out = run(chunk, beam)
                times.append(time.perf_counter() - t)
                outputs.update(zip(chunk, out))
            passes.append(times)
        totals = [sum(p) for p in passes]
        median_pass = passes[totals.index(sorted(totals)[(len(totals) - 1) // 2])]
        latencies = [statistics.median(p[c] for p in passes) * 1000 for c in range(len(chunks))]
        results.append({
            "beam": beam, "batch": batch, "seconds": sum(median_pass), "pass_seconds": totals,
            "latencies_ms": latencies if batch == 1 else None,
            "batch_latencies_ms": latencies if batch != 1 else None,
            "outputs": [outputs[i] for i in range(len(job["sources"]))],
        })
    return {"engine": job["engine"], "description": description, "load_seconds": load_s,
            "rss_after_load_mb": rss_loaded, "peak_rss_mb": _peak_rss_mb(), "configs": results}


def _child_main(argv: list[str]) -> int:
    job_path, out_path = argv
    job = json.loads(Path(job_path).read_text())
    Path(out_path).write_text(json.dumps(run_engine(job)))
    return 0


# -- the parent: sentences, bundles, children, report ----------------------------------------------

def _version(*dists: str) -> str | None:
    from importlib import metadata

    for d in dists:
        try:
            return metadata.version(d)
        except metadata.PackageNotFoundError:
            continue
    return None


def describe_machine(threads: int) -> dict:
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    physical = None
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
    except ImportError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    try:
        with open("/proc/meminfo") as f:
            mem_gb = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        mem_gb = None
    return {
        "cpu": cpu or platform.processor() or platform.machine(),
        "logical_cores": os.cpu_count(), "usable_cores": usable, "physical_cores": physical,
        "memory_gb": mem_gb, "threads": threads, "load_average_at_start": load,
        "os": platform.platform(), "python": platform.python_version(),
        "versions": {
            "torch": _version("torch"), "onnxruntime": _version("onnxruntime-gpu", "onnxruntime"),
            "ctranslate2": _version("ctranslate2"), "numpy": _version("numpy"), "seq2onnx": _version("seq2onnx"),
        },
    }


def _load_sentences(ckpt_dir: Path, n: int, data: str | None) -> tuple[list[tuple[str, str]], str]:
    from seq2onnx.export.parity import test_sentences
    from seq2onnx.model import checkpoint

    state_path = ckpt_dir / checkpoint.STATE
    options = json.loads(state_path.read_text()).get("options") if state_path.exists() else None
    if data is not None:
        return test_sentences(ckpt_dir, n, data=data), f"{data} (first {n} lines)"
    try:
        pairs = test_sentences(ckpt_dir, n)
    except FileNotFoundError as e:
        from seq2onnx.model.corpus import generate_pairs

        return generate_pairs(n, seed=12345), f"generated corpus ({e})"
    if options and options.get("data"):
        return pairs, f"test split of {options['data']} (the checkpoint's training corpus)"
    return pairs, "test split of the generated corpus (the checkpoint's training corpus)"


def _weights_sha256(ckpt_dir: Path) -> str:
    import hashlib

    from seq2onnx.model import checkpoint

    h = hashlib.sha256()
    with open(ckpt_dir / checkpoint.WEIGHTS, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _ensure_bundle(ckpt_dir: Path, directory: Path, precision: str, weights_sha: str) -> str:
    """Exports the bundle of one precision into `directory`, unless it holds one of these very weights
    (recorded in DIR/../bench-sources.json by an earlier run). Returns what was done."""
    from seq2onnx.export.bundle import export_bundle

    stamps_path = directory.parent / "bench-sources.json"
    stamps = json.loads(stamps_path.read_text()) if stamps_path.is_file() else {}
    if (directory / "bundle.json").is_file() and stamps.get(precision) == weights_sha:
        return "reused"
    if directory.exists() and not (directory / "bundle.json").is_file():
        raise ValueError(f"{directory} exists and is not a bundle; remove it or choose another --bundle-dir")
    dtype, quantize = {"fp32": ("float32", None), "int8": ("float32", "int8"), "fp16": ("float16", None)}[precision]
    export_bundle(ckpt_dir, directory, dtype=dtype, quantize=quantize, force=directory.exists())
    stamps[precision] = weights_sha
    stamps_path.write_text(json.dumps(stamps, indent=1) + "\n")
    return "exported"


def _cuda_reason() -> str | None:
    """None where onnxruntime's CUDA provider can run here, else why not."""
    from seq2onnx.runtime.translator import _cuda_usable

    usable, why = _cuda_usable()
    return None if usable else why


def _ct2_cuda_reason() -> str | None:
    try:
        import ctranslate2

        if ctranslate2.get_cuda_device_count() > 0:
            return None
    except Exception:
        pass
    return "ctranslate2 sees no CUDA device on this machine"


def _run_child(job: dict, workdir: Path, timeout: float | None) -> dict:
    name = job["engine"]
    job_path, out_path = workdir / f"job-{name}.json", workdir / f"result-{name}.json"
    job_path.write_text(json.dumps(job))
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, "-m", "seq2onnx.export.benchcli", str(job_path), str(out_path)],
                          capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0 or not out_path.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{name} failed (exit {proc.returncode}): {' | '.join(tail)}")
    return json.loads(out_path.read_text())


def _target_tokens(outputs: list[list[int]], limits: list[int]) -> int:
    """Generated tokens with the end token: a hypothesis shorter than its limit ended with </s>."""
    return sum(min(len(o) + 1, lim) for o, lim in zip(outputs, limits))


def run_bench(checkpoint_path: str | Path, *, sentences: int | None = None, threads: int = 0,
              bundle_dir: str | Path | None = None, quick: bool = False, engines: list[str] | None = None,
              repeat: int = 1, data: str | None = None, log=print) -> dict:
    """Runs the benchmark and returns the report (what --json writes)."""
    from seq2onnx.export.ct2convert import ct2_available, source_pieces, target_pieces
    from seq2onnx.model import checkpoint

    threads = threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    n = sentences or (QUICK_SENTENCES if quick else DEFAULT_SENTENCES)
    wanted = engines or list(ENGINES)
    unknown = [e for e in wanted if e not in ENGINES]
    if unknown:
        raise ValueError(f"unknown engines {unknown}; choose among {', '.join(ENGINES)}")
    if "torch" not in wanted:
        wanted = ["torch"] + wanted  # the reference every ratio and agreement is against
    ckpt_dir = checkpoint.resolve(checkpoint_path)
    model, tok, _ = checkpoint.load(ckpt_dir)
    cfg = model.cfg
    pairs, origin = _load_sentences(ckpt_dir, n, data)
    if not pairs:
        raise ValueError("no sentences to benchmark")
    sources = [tok.encode_source(s) for s, _ in pairs]
    too_long = sum(len(s) > cfg.max_positions for s in sources)
    sources = [s for s in sources if len(s) <= cfg.max_positions]
    from seq2onnx.export.bundle import DECODING_DEFAULTS as dd

    limits = [min(int(dd["max_length_a"] * len(s)) + dd["max_length_b"], cfg.max_positions) for s in sources]
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))  # the batches every engine gets

    machine = describe_machine(threads)
    report: dict = {
        "checkpoint": str(ckpt_dir), "sentences": len(sources), "sentences_source": origin,
        "sentences_dropped_too_long": too_long, "mean_source_tokens": sum(map(len, sources)) / len(sources),
        "model": cfg.to_dict(), "machine": machine, "threads": threads, "repeat": repeat,
        "configs": [{"search": "greedy" if b == 1 else f"beam{b}", "beam": b, "batch": bs} for b, bs in CONFIGS],
        "max_length": f"min({dd['max_length_a']} x source tokens + {dd['max_length_b']}, {cfg.max_positions})",
        "notes": [TORCH_BEAM_NOTE,
                  "target tokens: generated tokens including the end token, summed over sentences",
                  "every engine runs in its own process: peak RSS is that process's own peak (VmHWM)"],
        "rows": [], "skipped": [],
    }

    tmp = None
    if bundle_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="seq2onnx-bench-")
        root = Path(tmp.name)
    else:
        root = Path(bundle_dir)
        root.mkdir(parents=True, exist_ok=True)
    try:
        skipped: dict[str, str] = {}
        cuda_why = _cuda_reason()
        have_ct2, ct2_why = ct2_available()
        for name in wanted:
            kind, device, _ = ENGINES[name]
            if kind == "ct2" and not have_ct2:
                skipped[name] = ct2_why
            elif device == "cuda" and cuda_why and kind == "onnx":
                skipped[name] = f"no usable GPU: {cuda_why}"
            elif device == "cuda" and kind == "ct2" and (cuda_why or _ct2_cuda_reason()):
                skipped[name] = f"no usable GPU: {cuda_why or _ct2_cuda_reason()}"
        active = [e for e in wanted if e not in skipped]

        bundles: dict[str, str] = {}
        precisions = sorted({ENGINES[e][2] for e in active if ENGINES[e][0] == "onnx"})
        weights_sha = _weights_sha256(ckpt_dir) if precisions else None
        for precision in precisions:
            t = time.perf_counter()
            how = _ensure_bundle(ckpt_dir, root / precision, precision, weights_sha)
            bundles[precision] = str(root / precision)
            log(f"{how} the {precision} bundle {root / precision} ({time.perf_counter() - t:.1f} s)")
        ct2_model = None
        if any(ENGINES[e][0] == "ct2" for e in active):
            from seq2onnx.export.ct2convert import convert_checkpoint

            t = time.perf_counter()
            target = root / "ct2"
            if target.exists():  # converted afresh every run (cheap), so it is always this checkpoint's
                if not (target / "model.bin").is_file():
                    raise ValueError(f"{target} exists and is not a CTranslate2 model; remove it or choose "
                                     "another --bundle-dir")
                shutil.rmtree(target)
            ct2_model = str(convert_checkpoint(ckpt_dir, target))
            log(f"converted the checkpoint for CTranslate2: {ct2_model} ({time.perf_counter() - t:.1f} s)")
        report["bundles"], report["ct2_model"] = bundles, ct2_model

        job_base = {"checkpoint": str(ckpt_dir), "sources": sources, "limits": limits, "order": order,
                    "threads": threads, "eos_id": cfg.eos_id, "unk_id": cfg.unk_id, "repeat": repeat,
                    "configs": CONFIGS, "bundles": bundles, "ct2_model": ct2_model,
                    "source_pieces": source_pieces(tok), "target_pieces": target_pieces(tok)}
        results: dict[str, dict] = {}
        with tempfile.TemporaryDirectory(prefix="seq2onnx-bench-jobs-") as jobs:
            for name in active:
                log(f"running {name} ...")
                try:
                    results[name] = _run_child({**job_base, "engine": name}, Path(jobs), timeout=None)
                except Exception as e:  # one engine failing leaves the others' rows
                    skipped[name] = f"failed: {e}"
        report["skipped"] = [{"engine": k, "reason": v} for k, v in skipped.items()]
        _fill_rows(report, results, limits)
    finally:
        if tmp is not None:
            tmp.cleanup()
    return report


def _fill_rows(report: dict, results: dict[str, dict], limits: list[int]) -> None:
    n = report["sentences"]
    ref = results.get("torch")
    ref_out = {(c["beam"], c["batch"]): c["outputs"] for c in ref["configs"]} if ref else {}
    ref_greedy = ref_out.get((1, 1))
    rows = []
    for name, res in results.items():
        for c in res["configs"]:
            beam, batch = c["beam"], c["batch"]
            tokens = _target_tokens(c["outputs"], limits)
            ref_same = ref_out.get((beam, 1))  # torch, same search, one sentence at a time
            agree = sum(a == b for a, b in zip(c["outputs"], ref_same)) if ref_same else None
            lat = c["latencies_ms"]
            rows.append({
                "engine": name, "kind": ENGINES[name][0], "device": ENGINES[name][1], "precision": ENGINES[name][2],
                "search": "greedy" if beam == 1 else f"beam{beam}", "beam": beam, "batch": batch,
                "seconds": c["seconds"], "pass_seconds": c["pass_seconds"], "target_tokens": tokens,
                "tokens_per_s": tokens / c["seconds"] if c["seconds"] > 0 else None,
                "sentences_per_s": n / c["seconds"] if c["seconds"] > 0 else None,
                "p50_ms": _percentile(lat, 50) if lat else None, "p90_ms": _percentile(lat, 90) if lat else None,
                "batch_latency_p50_ms": _percentile(c["batch_latencies_ms"], 50) if c["batch_latencies_ms"] else None,
                "peak_rss_mb": res["peak_rss_mb"], "rss_after_load_mb": res["rss_after_load_mb"],
                "load_seconds": res["load_seconds"], "description": res["description"],
                "agreement": agree, "agreement_of": n,
                "greedy_agreement": (sum(a == b for a, b in zip(c["outputs"], ref_greedy))
                                     if beam == 1 and ref_greedy else None),
                "outputs": c["outputs"],
            })
    # CTranslate2 counts only when its fp32 greedy outputs are ours: the proof the conversion is right.
    ct2_check = [r for r in rows if r["engine"] == "ct2-cpu-fp32" and r["beam"] == 1]
    ct2 = {"checked": bool(ct2_check), "valid": None, "reason": None}
    if any(r["kind"] == "ct2" for r in rows):
        bad = [r for r in ct2_check if r["greedy_agreement"] != n]
        if not ct2_check:
            ct2.update(valid=False, reason="ct2-cpu-fp32 did not run, so the conversion is unchecked: timings void")
        elif bad:
            worst = min(r["greedy_agreement"] or 0 for r in bad)
            ct2.update(valid=False, reason=f"CTranslate2's fp32 greedy outputs equal ours on only {worst}/{n} "
                       "sentences: the conversion is not the same model, its timings are void")
        else:
            ct2.update(valid=True, reason=f"CTranslate2's fp32 greedy outputs equal ours on {n}/{n} sentences")
        for r in rows:
            if r["kind"] == "ct2":
                r["void"] = not ct2["valid"]
    report["ct2_check"] = ct2
    by_key = {(r["engine"], r["beam"], r["batch"]): r for r in rows}
    for r in rows:
        base = by_key.get(("torch", r["beam"], r["batch"]))
        r["x_torch"] = (r["tokens_per_s"] / base["tokens_per_s"]
                        if base and base["tokens_per_s"] and r["tokens_per_s"] else None)
        device = r["device"]
        precision = "fp32" if r["kind"] == "torch" else r["precision"]
        peer = by_key.get((f"ct2-{device}-{precision}", r["beam"], r["batch"]))
        r["x_ct2_engine"] = peer["engine"] if peer else None
        r["x_ct2"] = (r["tokens_per_s"] / peer["tokens_per_s"]
                      if peer and not peer.get("void") and peer["tokens_per_s"] and r["tokens_per_s"] else None)
    report["rows"] = rows


# -- output ---------------------------------------------------------------------------------------

def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def format_machine(report: dict) -> str:
    m = report["machine"]
    v = m["versions"]
    cores = f"{m['logical_cores']} logical cores"
    if m.get("physical_cores"):
        cores += f", {m['physical_cores']} physical"
    if m.get("usable_cores") and m["usable_cores"] != m["logical_cores"]:
        cores += f", {m['usable_cores']} usable by this process"
    cfg = report["model"]
    lines = [
        f"machine:   {m['cpu']} ({cores}; {m['memory_gb']} GB), {m['os']}, Python {m['python']}",
        f"threads:   {report['threads']} for every engine (torch.set_num_threads, onnxruntime intra_op_num_threads, "
        f"ctranslate2 intra_threads; inter_threads=1)",
        f"versions:  torch {v['torch']}, onnxruntime {v['onnxruntime']}, ctranslate2 {v['ctranslate2'] or '(not installed)'}, "
        f"numpy {v['numpy']}",
        f"load avg:  {m['load_average_at_start']} at start (other processes on the CPU make timings noisy)",
        f"model:     {report['checkpoint']}: d_model {cfg['d_model']}, {cfg['n_encoder_layers']}+{cfg['n_decoder_layers']} layers, "
        f"{cfg['n_heads']} heads, d_ff {cfg['d_ff']}, vocab {cfg['src_vocab_size']}/{cfg['tgt_vocab_size']}, "
        f"{'pre' if cfg['pre_norm'] else 'post'}-LN",
        f"sentences: {report['sentences']} from the {report['sentences_source']}, {report['mean_source_tokens']:.1f} "
        f"source tokens on average; the same sentences and batches for every engine; max length {report['max_length']}",
    ]
    return "\n".join(lines)


def format_table(report: dict) -> str:
    head = ["engine", "search", "batch", "tokens/s", "sent/s", "p50 ms", "p90 ms", "peak RSS MB", "x torch", "x ct2",
            "agree"]
    rows = []
    for r in report["rows"]:
        agree = "-" if r["agreement"] is None else f"{r['agreement']}/{r['agreement_of']}"
        rows.append([r["engine"] + (" (VOID)" if r.get("void") else ""), r["search"], str(r["batch"]),
                     _f(r["tokens_per_s"], ".0f"), _f(r["sentences_per_s"], ".1f"), _f(r["p50_ms"], ".1f"),
                     _f(r["p90_ms"], ".1f"), _f(r["peak_rss_mb"], ".0f"), _f(r["x_torch"], ".2f"),
                     _f(r["x_ct2"], ".2f"), agree])
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    def line(cells):
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    out = [line(head), line(["-" * w for w in widths])]
    prev = None
    for r, cells in zip(report["rows"], rows):
        if prev is not None and r["engine"] != prev:
            out.append("")
        prev = r["engine"]
        out.append(line(cells))
    return "\n".join(out)


def format_report(report: dict) -> str:
    parts = [format_machine(report), "", format_table(report), ""]
    parts.append("agree: outputs (best hypothesis) equal to torch's at batch 1 with the same search; "
                 "x torch / x ct2: tokens/s ratios against the torch row and the CTranslate2 row of the same "
                 "device and precision (same search, same batch)")
    parts.append("note: " + TORCH_BEAM_NOTE)
    ct2 = report.get("ct2_check")
    if ct2 and ct2.get("reason"):
        parts.append(("ctranslate2: " if ct2["valid"] else "ctranslate2: VOID: ") + ct2["reason"])
    for s in report["skipped"]:
        parts.append(f"skipped {s['engine']}: {s['reason']}")
    return "\n".join(parts)


# -- the subcommand ---------------------------------------------------------------------------------

def add_bench(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmark the PyTorch reference, the ONNX runtime and CTranslate2 on the same model",
        description="Measure target tokens/s, sentences/s, latency p50/p90 at batch 1 and peak memory for the "
        "PyTorch reference decoder, the ONNX runtime (CPU fp32/int8; CUDA fp32/fp16 where a GPU is usable) and "
        "CTranslate2 on the same weights (optional: pip install 'seq2onnx[bench]'), greedy and beam 4, batch 1 and "
        "32, on the checkpoint's test sentences. Each engine runs in its own process with the same threads.")
    p.add_argument("checkpoint", help="a run directory or one of its step-*/last/best")
    p.add_argument("--bundle-dir", help="keep the bundles here (DIR/fp32, DIR/int8, DIR/ct2) and reuse them on later "
                   "runs while the checkpoint's weights are the same; default: a temporary directory")
    p.add_argument("--sentences", type=int, help=f"test sentences (default {DEFAULT_SENTENCES}; {QUICK_SENTENCES} with --quick)")
    p.add_argument("--data", help="TSV whose first lines to use instead of the checkpoint's test split")
    p.add_argument("--threads", type=int, default=0, help="threads for every engine (default 0: all usable cores)")
    p.add_argument("--repeat", type=int, default=1, help="timed passes per configuration; the median pass is "
                   "reported (default 1)")
    p.add_argument("--engines", help=f"comma-separated subset of: {', '.join(ENGINES)} (torch always runs)")
    p.add_argument("--json", help="write the full report (machine, rows, outputs) to this file")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_SENTENCES} sentences, for tests and CI")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    from seq2onnx.runtime.cli import CommandError, needs_torch

    needs_torch("bench")
    if args.sentences is not None and args.sentences < 1:
        raise CommandError(f"--sentences {args.sentences}: give at least 1")
    if args.threads < 0:
        raise CommandError(f"--threads {args.threads}: give 0 (all cores) or more")
    if args.repeat < 1:
        raise CommandError(f"--repeat {args.repeat}: give at least 1")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()] if args.engines else None
    report = run_bench(args.checkpoint, sentences=args.sentences, threads=args.threads, bundle_dir=args.bundle_dir,
                       quick=args.quick, engines=engines, repeat=args.repeat, data=args.data,
                       log=lambda m: print(m, file=sys.stderr))
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"report written to {args.json}")
    ran = {r["engine"] for r in report["rows"]}
    failed = [s for s in report["skipped"] if s["reason"].startswith("failed")]
    # A void CTranslate2 row is a finding, printed above; an engine that could not run is a failure.
    return 1 if failed or "torch" not in ran else 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
