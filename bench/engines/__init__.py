"""`seq2onnx bench`'s child process: one engine, loaded once, timed over the job's batches.

Run as `python -m seq2onnx.bench.engines JOB.json OUT.json` by bench/run.py: every
engine, at every thread setting (bench/settings.py), gets a fresh process, so its peak memory is its
own and no engine warms another's caches.

The engines are a registry (base.py): one Runner class per kind, in its own module, naming its
engines (name -> kind, device, precision in ENGINES):
  torch_reference.py  torch            the PyTorch reference (model.search.translate_ids)
  torch_batched.py    torch-batched    the PyTorch model under the runtime's batched search
  onnx.py             onnx-cpu-fp32/int8, onnx-cuda-fp32/fp16   runtime.translator.Translator
  ct2.py              ct2-cpu-fp32/int8, ct2-cuda-fp32/fp16     CTranslate2 on the same weights
A new engine is one more such class, imported below. timing.py times a runner (run_engine).

This package imports nothing heavy at its top: the parent reads ENGINES from it, and each runner
imports its own engine only in the child.
"""

from __future__ import annotations

# imported for their @register, in this order: ENGINES' order, hence the rows' and the tables'
from . import torch_reference, torch_batched, onnx, ct2  # noqa: F401
from .base import ENGINES, RUNNERS, Runner, make_runner, register, unregister
from .ct2 import CT2_COMPUTE
from .timing import main, peak_rss_mb, rss_mb, run_engine

TORCH_BEAM_NOTE = (
    "torch beam search decodes one sentence at a time (model.search.translate_ids): "
    "its beam rows at batch 32 are 32 sequential searches"
)
PEAK_RSS_NOTE = "every engine runs in its own process: peak RSS is that process's own peak (VmHWM on Linux)"

__all__ = [
    "CT2_COMPUTE",
    "ENGINES",
    "PEAK_RSS_NOTE",
    "RUNNERS",
    "TORCH_BEAM_NOTE",
    "Runner",
    "main",
    "make_runner",
    "peak_rss_mb",
    "register",
    "rss_mb",
    "run_engine",
    "unregister",
]
