"""Engines `ct2-*`: CTranslate2 on the same weights (export/ctranslate2/convert.py), CPU fp32/int8 and,
where a GPU is usable, CUDA fp32/fp16."""

from __future__ import annotations

from seq2onnx.bench.settings import Setting, describe_setting

from .base import Runner, register

CT2_COMPUTE = {"fp32": "float32", "int8": "int8", "fp16": "float16"}


@register
class CT2Runner(Runner):
    """A ctranslate2.Translator; in parallel, every batch queued at once for its inter_threads workers."""

    kind = "ct2"
    variants = {
        "ct2-cpu-fp32": ("cpu", "fp32"),
        "ct2-cpu-int8": ("cpu", "int8"),
        "ct2-cuda-fp32": ("cuda", "fp32"),
        "ct2-cuda-fp16": ("cuda", "fp16"),
    }

    def __init__(self, job: dict, device: str, precision: str):
        super().__init__(job, device, precision)
        import ctranslate2

        self.version = ctranslate2.__version__
        self.tr = ctranslate2.Translator(
            job["ct2_model"],
            device=device,
            compute_type=CT2_COMPUTE[precision],
            intra_threads=self.threads,
            inter_threads=self.parallel,
        )
        self.src_pieces = job["source_pieces"]
        self.tgt_ids = {p: i for i, p in enumerate(job["target_pieces"])}
        self.unk = job["unk_id"]

    def _call(self, indices, beam, asynchronous=False):
        tokens = [[self.src_pieces[t] for t in self.sources[i]] for i in indices]
        # One maximum length per call: each output is cut at its own sentence's limit afterwards
        # (greedy decisions do not look ahead, so the cut output is what a per-sentence limit gives).
        # min_decoding_length 0: CTranslate2's default 1 forbids the end token at the first step, which
        # our convention (and PyTorch's search) allows. max_batch_size = the call's sentences: one
        # batch per call, the bench's batch.
        return self.tr.translate_batch(
            tokens,
            beam_size=beam,
            length_penalty=1.0,
            max_batch_size=max(len(indices), 1),
            batch_type="examples",
            max_decoding_length=max(self.limits[i] for i in indices),
            min_decoding_length=0,
            asynchronous=asynchronous,
        )

    def _ids(self, indices, res):
        return [
            [self.tgt_ids.get(p, self.unk) for p in r.hypotheses[0]][: self.limits[i]]
            for i, r in zip(indices, res)
        ]

    def run(self, indices, beam):
        return self._ids(indices, self._call(indices, beam))

    def run_many(self, chunks, beam):
        pending = [self._call(chunk, beam, asynchronous=True) for chunk in chunks]
        return [self._ids(chunk, [a.result() for a in res]) for chunk, res in zip(chunks, pending)]

    def describe(self) -> str:
        return (
            f"ctranslate2 {self.version} ({self.device}, compute_type={CT2_COMPUTE[self.precision]}), "
            f"{describe_setting(self.kind, Setting(self.threads, self.parallel))}"
        )
