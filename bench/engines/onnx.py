"""Engines `onnx-*`: runtime.translator.Translator on the fp32 or int8 bundle (export/quantize.py:
per-row activation scales), on the CPU provider or, where a GPU is usable, CUDA (fp32, fp16)."""

from __future__ import annotations

from seq2onnx.bench.settings import Setting, describe_setting

from .base import Runner, register


@register
class OnnxRunner(Runner):
    """The runtime's Translator on one bundle; in parallel, shared by `parallel` threads."""

    kind = "onnx"
    variants = {
        "onnx-cpu-fp32": ("cpu", "fp32"),
        "onnx-cpu-int8": ("cpu", "int8"),
        "onnx-cuda-fp32": ("cuda", "fp32"),
        "onnx-cuda-fp16": ("cuda", "fp16"),
    }

    def __init__(self, job: dict, device: str, precision: str):
        super().__init__(job, device, precision)
        import onnxruntime

        from seq2onnx.runtime.translator import Translator

        self.version = onnxruntime.__version__
        self.tr = Translator(job["bundles"][precision], device=device, intra_threads=self.threads)
        self.pool = None
        if self.parallel > 1:  # one Translator shared by `parallel` threads, each taking the next batch
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(self.parallel)

    def run(self, indices, beam):
        res = self.tr.translate_batch(
            [self.sources[i] for i in indices],
            beam_size=beam,
            length_penalty=1.0,
            max_batch_size=max(len(indices), 1),
        )
        return [list(r.token_ids[0]) for r in res]

    def run_many(self, chunks, beam):
        return list(self.pool.map(lambda chunk: self.run(chunk, beam), chunks))

    def describe(self) -> str:
        return (
            f"onnxruntime {self.version} ({self.tr.device}), "
            f"{describe_setting(self.kind, Setting(self.threads, self.parallel))}"
        )
