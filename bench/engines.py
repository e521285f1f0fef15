"""`seq2onnx bench`'s child process: one engine, loaded once, timed over the job's batches.

Run as `python -m seq2onnx.bench.engines JOB.json OUT.json` by bench/run.py: every
engine, at every thread setting (bench/settings.py), gets a fresh process, so its peak memory is its
own and no engine warms another's caches.

Engines (name -> kind, device, precision in ENGINES):
  torch            model.search.translate_ids, the PyTorch reference with its key/value cache. Its
                   greedy search is batched; its beam search decodes one sentence at a time (that is
                   the reference implementation), so "torch beam4 batch 32" is 32 sequential searches.
  torch-batched    the same PyTorch model driven by the runtime's own batched search (runtime/search.py):
                   what a batched PyTorch decoder gets, so that the ONNX rows are also compared
                   with PyTorch on equal search terms.
  onnx-cpu-fp32    runtime.translator.Translator on the fp32 bundle, CPU provider.
  onnx-cpu-int8    ... on the int8 bundle (export/quantize.py: per-row activation scales).
  onnx-cuda-fp32/fp16   the CUDA provider, only where a GPU is usable.
  ct2-cpu-fp32/int8, ct2-cuda-fp32/fp16   CTranslate2 on the same weights (export/ctranslate2/convert.py).

This module imports nothing heavy at its top: the parent reads ENGINES from it, and each runner
imports its own engine only in the child.
"""
from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from pathlib import Path

from seq2onnx.bench.settings import PARALLEL_KINDS, Setting, describe_setting

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
PEAK_RSS_NOTE = "every engine runs in its own process: peak RSS is that process's own peak (VmHWM on Linux)"


# -- memory -----------------------------------------------------------------------------------------

def rss_mb() -> float:
    """Returns the resident set size of this process now, in MiB (psutil's memory_info().rss)."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    """Returns the peak resident set size of this process, in MiB.

    Linux: the kernel's high-water mark VmHWM from /proc/self/status. psutil reports no peak on
    Linux, and resource.getrusage's ru_maxrss is no use here: exec hands the parent's peak to the
    child (measured: a child of a parent holding 600 MB reported ru_maxrss 611 MB, VmHWM 13 MB), and
    the parent of these children holds the PyTorch model. Windows: psutil's peak_wset, the same
    measure. Elsewhere (macOS): ru_maxrss, in bytes there, the only peak the system offers.
    """
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024  # kB
        except OSError:
            pass
    if sys.platform == "win32":
        import psutil

        return psutil.Process().memory_info().peak_wset / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


# -- the engines ------------------------------------------------------------------------------------

def _strip_eos(ids, eos: int) -> list[int]:
    ids = list(ids)
    return ids[:-1] if ids and ids[-1] == eos else ids


def make_runner(job: dict):
    """Loads the job's engine and wraps it as one function.

    Args:
        job: the job (engine, sources, limits, threads, eos_id and the engine's checkpoint, bundles or model).

    Returns:
        (run, description, run_many): run(indices, beam) -> target ids per index (end token
        excluded); the engine and its settings in words; with job["parallel"] > 1,
        run_many(chunks, beam) -> run's answer per chunk, the chunks decoded `parallel` at a time
        (bench/settings.py says how each engine does it), else None.

    Raises:
        ValueError: an unknown engine kind, or a parallel setting for an engine without one.
    """
    kind, device, precision = ENGINES[job["engine"]]
    sources, limits, threads, eos = job["sources"], job["limits"], job["threads"], job["eos_id"]
    parallel = job.get("parallel", 1)
    if parallel > 1 and kind not in PARALLEL_KINDS:
        raise ValueError(f"{job['engine']} has no parallel setting")
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

        return run, f"torch {torch.__version__}, {torch.get_num_threads()} threads", None
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

        return run, f"torch {torch.__version__} + runtime/search.py, {torch.get_num_threads()} threads", None
    if kind == "onnx":
        import onnxruntime

        from seq2onnx.runtime.translator import Translator

        tr = Translator(job["bundles"][precision], device=device, intra_threads=threads)

        def run(indices, beam):
            res = tr.translate_batch([sources[i] for i in indices], beam_size=beam, length_penalty=1.0,
                                     max_batch_size=max(len(indices), 1))
            return [list(r.token_ids[0]) for r in res]

        run_many = None
        if parallel > 1:  # one Translator shared by `parallel` threads, each taking the next batch
            from concurrent.futures import ThreadPoolExecutor

            pool = ThreadPoolExecutor(parallel)

            def run_many(chunks, beam):
                return list(pool.map(lambda chunk: run(chunk, beam), chunks))

        return (run, f"onnxruntime {onnxruntime.__version__} ({tr.device}), "
                f"{describe_setting(kind, Setting(threads, parallel))}", run_many)
    if kind == "ct2":
        import ctranslate2

        tr = ctranslate2.Translator(job["ct2_model"], device=device, compute_type=CT2_COMPUTE[precision],
                                    intra_threads=threads, inter_threads=parallel)
        src_pieces, tgt_ids = job["source_pieces"], {p: i for i, p in enumerate(job["target_pieces"])}
        unk = job["unk_id"]

        def call(indices, beam, asynchronous=False):
            tokens = [[src_pieces[t] for t in sources[i]] for i in indices]
            # One maximum length per call: each output is cut at its own sentence's limit afterwards
            # (greedy decisions do not look ahead, so the cut output is what a per-sentence limit gives).
            # min_decoding_length 0: CTranslate2's default 1 forbids the end token at the first step, which
            # our convention (and PyTorch's search) allows. max_batch_size = the call's sentences: one
            # batch per call, the bench's batch.
            return tr.translate_batch(tokens, beam_size=beam, length_penalty=1.0, max_batch_size=max(len(indices), 1),
                                      batch_type="examples", max_decoding_length=max(limits[i] for i in indices),
                                      min_decoding_length=0, asynchronous=asynchronous)

        def ids(indices, res):
            return [[tgt_ids.get(p, unk) for p in r.hypotheses[0]][: limits[i]] for i, r in zip(indices, res)]

        def run(indices, beam):
            return ids(indices, call(indices, beam))

        run_many = None
        if parallel > 1:  # every batch queued at once: CTranslate2's inter_threads workers take them in turn

            def run_many(chunks, beam):
                pending = [call(chunk, beam, asynchronous=True) for chunk in chunks]
                return [ids(chunk, [a.result() for a in res]) for chunk, res in zip(chunks, pending)]

        return run, (f"ctranslate2 {ctranslate2.__version__} ({device}, compute_type={CT2_COMPUTE[precision]}), "
                     f"{describe_setting(kind, Setting(threads, parallel))}"), run_many
    raise ValueError(f"unknown engine kind {kind}")


def run_engine(job: dict) -> dict:
    """Loads one engine, then times it per (beam, batch) configuration.

    For each (beam, batch): one warm-up call, `repeat` timed passes over all the sentences in the
    job's batches.

    Args:
        job: the job that bench/run.py wrote (configs, order, repeat, ...).

    Returns:
        Timings, outputs and memory: the engine, its description, load time, RSS after load, peak
        RSS and one entry per configuration.
    """
    t0 = time.perf_counter()
    run, description, run_many = make_runner(job)
    load_s = time.perf_counter() - t0
    rss_loaded = rss_mb()
    order = job["order"]
    parallel = job.get("parallel", 1)
    results = []
    for beam, batch in job["configs"]:
        chunks = [order[i : i + batch] for i in range(0, len(order), batch)]
        if run_many is None:
            run(chunks[0], beam)  # warm-up: first-call allocations, graph optimisation, thread pools
        else:
            run_many(chunks[:parallel], beam)  # every worker's first call
        passes = []
        outputs: dict[int, list[int]] = {}
        for _ in range(job["repeat"]):
            times = []
            if run_many is None:
                for chunk in chunks:
                    t = time.perf_counter()
                    out = run(chunk, beam)
                    times.append(time.perf_counter() - t)
                    outputs.update(zip(chunk, out))
            else:  # the batches overlap: only the pass's wall time means something
                t = time.perf_counter()
                for chunk, out in zip(chunks, run_many(chunks, beam)):
                    outputs.update(zip(chunk, out))
                times.append(time.perf_counter() - t)
            passes.append(times)
        totals = [sum(p) for p in passes]
        median_pass = passes[totals.index(sorted(totals)[(len(totals) - 1) // 2])]
        latencies = ([statistics.median(p[c] for p in passes) * 1000 for c in range(len(chunks))]
                     if run_many is None else None)
        results.append({
            "beam": beam, "batch": batch, "seconds": sum(median_pass), "pass_seconds": totals,
            "latencies_ms": latencies if batch == 1 else None,
            "batch_latencies_ms": latencies if batch != 1 else None,
            "outputs": [outputs[i] for i in range(len(job["sources"]))],
        })
    return {"engine": job["engine"], "intra_threads": job["threads"], "parallel": parallel,
            "description": description, "load_seconds": load_s,
            "rss_after_load_mb": rss_loaded, "peak_rss_mb": peak_rss_mb(), "configs": results}


def main(argv: list[str]) -> int:
    """The child's entry point.

    Args:
        argv: [JOB.json, OUT.json]: reads the job from argv[0], writes the result to argv[1].

    Returns:
        0.
    """
    job_path, out_path = argv
    job = json.loads(Path(job_path).read_text())
    Path(out_path).write_text(json.dumps(run_engine(job)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
