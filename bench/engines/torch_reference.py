"""Engine `torch`: model.search.translate_ids, the PyTorch reference with its key/value cache.

Its greedy search is batched; its beam search decodes one sentence at a time (that is the reference
implementation), so "torch beam4 batch 32" is 32 sequential searches.
"""

from __future__ import annotations

from .base import Runner, register, strip_eos


@register
class TorchRunner(Runner):
    """The PyTorch reference search on the checkpoint."""

    kind = "torch"
    variants = {"torch": ("cpu", "fp32")}

    def __init__(self, job: dict, device: str, precision: str):
        super().__init__(job, device, precision)
        import torch

        from seq2onnx.model import checkpoint
        from seq2onnx.model.search import translate_ids

        torch.set_num_threads(self.threads)
        self.torch, self.translate_ids = torch, translate_ids
        self.model, _, _ = checkpoint.load(job["checkpoint"])

    def run(self, indices, beam):
        hyps = self.translate_ids(
            self.model,
            [self.sources[i] for i in indices],
            beam_size=beam,
            length_penalty=1.0,
            batch_size=max(len(indices), 1),
        )
        return [strip_eos(h[0].tokens, self.eos) for h in hyps]

    def describe(self) -> str:
        return f"torch {self.torch.__version__}, {self.torch.get_num_threads()} threads"
