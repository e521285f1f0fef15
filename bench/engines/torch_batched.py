"""Engine `torch-batched`: the PyTorch model driven by the runtime's own batched search (runtime/search.py).

What a batched PyTorch decoder gets, so that the ONNX rows are also compared with PyTorch on equal
search terms.
"""

from __future__ import annotations

from .base import Runner, register, strip_eos


@register
class TorchBatchedRunner(Runner):
    """The checkpoint's decode_step under runtime/search.py's greedy and beam search."""

    kind = "torch-batched"
    variants = {"torch-batched": ("cpu", "fp32")}

    def __init__(self, job: dict, device: str, precision: str):
        super().__init__(job, device, precision)
        import torch

        from seq2onnx.model import checkpoint

        torch.set_num_threads(self.threads)
        self.torch = torch
        self.model, _, _ = checkpoint.load(job["checkpoint"])

    def _step(self, src):
        """The search's step over the model for a padded source batch (its encoder run once here)."""
        torch, model = self.torch, self.model
        state = {"mask": src != model.cfg.pad_id}
        state["cross"] = model.cross_kv(model.encode(src, state["mask"]))
        state["past"] = model.empty_cache(src.shape[0])

        def step(tokens, cache_indices, t, keep):
            if keep is not None:
                k = torch.from_numpy(keep)
                state["cross"] = [(a[k], b[k]) for a, b in state["cross"]]
                state["mask"] = state["mask"][k]
            log_probs, state["past"] = model.decode_step(
                torch.from_numpy(tokens),
                torch.tensor([t]),
                torch.from_numpy(cache_indices),
                state["past"],
                state["cross"],
                state["mask"],
            )
            return log_probs.numpy()

        return step

    def run(self, indices, beam):
        import numpy as np

        from seq2onnx.runtime.beam import beam_search
        from seq2onnx.runtime.search import greedy_search

        torch, cfg = self.torch, self.model.cfg
        srcs = [self.sources[i] for i in indices]
        src = torch.full((len(srcs), max(map(len, srcs))), cfg.pad_id, dtype=torch.long)
        for row, ids in enumerate(srcs):
            src[row, : len(ids)] = torch.tensor(ids)
        common = dict(
            start_id=cfg.decoder_start_id,
            eos_id=cfg.eos_id,
            max_lengths=np.array([self.limits[i] for i in indices]),
        )
        with torch.no_grad():
            step = self._step(src)
            found = (
                greedy_search(step, len(srcs), **common)
                if beam == 1
                else beam_search(step, len(srcs), beam_size=beam, length_penalty=1.0, **common)
            )
        return [strip_eos(r.hypotheses[0], self.eos) for r in found]

    def describe(self) -> str:
        return f"torch {self.torch.__version__} + runtime/search.py, {self.torch.get_num_threads()} threads"
