"""verify's tensor tier: the bundle's encoder and decoder-step outputs against the checkpoint's, run in
float64 (what the trained function computes) and in float32 (what PyTorch would give), batches padded;
one Check per (decoder, output) with its worst difference against its bound."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
import torch

from seq2onnx.export.parity_report import Check
from seq2onnx.model.search import translate_ids
from seq2onnx.runtime import bundle as fmt
from seq2onnx.runtime.devices import providers_for
from seq2onnx.runtime.fused_graph import FusedGraph
from seq2onnx.runtime.fused_step import FusedStep
from seq2onnx.runtime.sessions import graph_session
from seq2onnx.runtime.u8s8_probe import precision_entries


def _diff(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    a, b = a.astype(np.float64), b.astype(np.float64)
    finite = np.isfinite(b)
    if not np.array_equal(np.isfinite(a), finite):
        return float("inf"), float("inf")
    d = np.abs(a[finite] - b[finite])
    if d.size == 0:
        return 0.0, 0.0
    big = np.abs(b[finite]) >= 1e-3  # relative error is meaningless near zero
    rel = float((d[big] / np.abs(b[finite][big])).max()) if big.any() else 0.0
    return float(d.max()), rel


class _Worst:
    """Largest differences seen for one output: bundle vs fp64, PyTorch fp32 vs fp64, bundle vs fp32."""

    def __init__(self):
        self.bundle_abs = self.bundle_rel = self.torch_abs = self.vs_torch = self.scale = 0.0

    def update(self, bundle: np.ndarray, torch32: np.ndarray, exact: np.ndarray) -> None:
        a, r = _diff(bundle, exact)
        self.bundle_abs, self.bundle_rel = max(self.bundle_abs, a), max(self.bundle_rel, r)
        self.torch_abs = max(self.torch_abs, _diff(torch32, exact)[0])
        self.vs_torch = max(self.vs_torch, _diff(bundle, torch32)[0])
        finite = np.abs(exact[np.isfinite(exact)])
        self.scale = max(self.scale, float(finite.max()) if finite.size else 0.0)


@torch.no_grad()
def tensor_checks(
    model,
    tok,
    bundle: fmt.Bundle,
    pairs,
    device: str,
    atol: float,
    batch_size: int = 16,
    decoders: tuple[str, ...] = (fmt.STANDARD,),
    log=None,
) -> list[Check]:
    """Checks encoder and decoder-step outputs of the bundle against the checkpoint, batches padded.

    The reference is the checkpoint evaluated in float64: what the trained function computes.
    PyTorch's own fp32 evaluation is measured against it too, because a trained model can be
    sensitive enough that fp32 arithmetic alone misses the fp64 value by more than 1e-4. The bound
    for the log-probabilities is `atol`, widened to 2 x PyTorch fp32's own error where that is
    larger: the bundle must be as exact as PyTorch itself. Keys, values and the cache are
    intermediate activations whose size depends on the model (tens in a trained one), and fp32
    error grows with size, so their `atol` is relative to the largest magnitude of the tensor
    (atol x max(1, max|x|)), with the same widening.

    Args:
        model (Transformer): the checkpoint's model.
        tok (Tokenizer): its tokenizer.
        bundle: the bundle as read_bundle returned it, with its files' bytes (the sessions are made
            from them).
        pairs (list[tuple[str, str]]): the sentences.
        device: "cpu" or "cuda", for the standard graphs.
        atol: the tolerance.
        batch_size: sentences per batch.
        decoders: the decoder variants to check ("standard": decoder.onnx; "fused":
            decoder_fused.onnx on the CPU, through FusedStep).
        log (Callable[[str], None] | None): called with a line of progress per batch.

    Returns:
        The tensor checks: the encoder's mask, then the worst differences per decoder and output.
    """
    parity = _TensorParity(model, bundle, device, decoders)
    mask_ok = True
    for start in range(0, len(pairs), batch_size):
        if log is not None:
            log(f"tensors: sentences {start + 1}-{min(start + batch_size, len(pairs))} of {len(pairs)}")
        chunk = pairs[start : start + batch_size]
        batch = parity.encode([tok.encode_source(s)[: model.cfg.max_positions] for s, _ in chunk])
        mask_ok &= batch.mask_ok
        greedy = translate_ids(model, batch.srcs, beam_size=1)
        paths = {
            "decoder log_probs (teacher-forced)": [
                tok.encode_target(t)[: model.cfg.max_positions - 1] for _, t in chunk
            ],
            "decoder log_probs (greedy path)": [h[0].tokens for h in greedy],
        }
        for label, targets in paths.items():
            parity.decode_path(batch, label, targets)
    checks = [Check("tensor", "encoder src_mask equal", float(not mask_ok), 0.0, mask_ok)]
    return checks + _worst_checks(parity.worst, atol)


@dataclass
class _Batch:
    """One padded batch of sources, encoded by the checkpoint (fp32 and fp64) and by the bundle."""

    srcs: list[list[int]]  # source ids, unpadded
    lengths: torch.Tensor  # (B,)
    mask: torch.Tensor  # (B, S) bool, real positions
    cross: list  # the fp32 model's cross keys/values per layer
    cross64: list  # ... and the fp64 model's
    ort_out: list[np.ndarray]  # the encoder graph's outputs: src_mask, then the cross keys/values
    mask_ok: bool  # the graph's src_mask equals the model's


class _TensorParity:
    """The sessions, the fp64 copy of the model and the worst differences, for tensor_checks."""

    def __init__(self, model, bundle: fmt.Bundle, device: str, decoders: tuple[str, ...]):
        self.model, self.cfg, self.decoders = model, model.cfg, decoders
        self.exact_model = copy.deepcopy(model).double()
        entries = precision_entries(ort)  # int8 products exact on x86 without VNNI, as the runtime's
        self.enc = graph_session(bundle, "encoder", providers_for(device), entries)
        self.dec = graph_session(bundle, fmt.DECODER_LABELS[fmt.STANDARD], providers_for(device), entries)
        # The fused cache layout is the CPU kernels' (runtime/fused_step.py): checked on the CPU.
        self.fused = (
            graph_session(bundle, fmt.DECODER_LABELS[fmt.FUSED], ["CPUExecutionProvider"], entries)
            if fmt.FUSED in decoders
            else None
        )
        self.half = self.enc.get_outputs()[1].type == "tensor(float16)"
        outputs = ("decoder log_probs (teacher-forced)", "decoder log_probs (greedy path)", "decoder cache")
        self.worst = {
            ("", "encoder cross K/V"): _Worst(),
            **{(d, name): _Worst() for d in decoders for name in outputs},
        }
        dec_outputs = [o.name for o in self.dec.get_outputs()]
        self.attention_at = (
            dec_outputs.index(fmt.CROSS_ATTENTION) if fmt.CROSS_ATTENTION in dec_outputs else None
        )
        if fmt.STANDARD in decoders and self.attention_at is not None:  # bundles before 0.3 have none
            self.worst[fmt.STANDARD, "decoder cross_attention"] = _Worst()

    def encode(self, srcs: list[list[int]]) -> _Batch:
        """Pads and encodes one batch three ways; records the cross keys/values' differences."""
        cfg, model, exact_model = self.cfg, self.model, self.exact_model
        lengths = torch.tensor([len(s) for s in srcs])
        src = torch.full((len(srcs), int(lengths.max())), cfg.pad_id, dtype=torch.long)
        for i, s in enumerate(srcs):
            src[i, : len(s)] = torch.tensor(s)
        mask = src != cfg.pad_id
        cross = model.cross_kv(model.encode(src, mask))
        cross64 = exact_model.cross_kv(exact_model.encode(src, mask))
        ort_out = self.enc.run(None, {fmt.SRC_IDS: src.numpy(), fmt.SRC_LENGTHS: lengths.numpy()})
        mask_ok = bool(np.array_equal(ort_out[0], mask.numpy()))
        flat32, flat64 = [t for kv in cross for t in kv], [t for kv in cross64 for t in kv]
        for got, want, exact in zip(ort_out[1:], flat32, flat64):
            for i, v in enumerate(lengths.tolist()):  # real source positions only
                self.worst["", "encoder cross K/V"].update(
                    got[i, :, :v], want[i, :, :v].numpy(), exact[i, :, :v].numpy()
                )
        return _Batch(srcs, lengths, mask, cross, cross64, ort_out, mask_ok)

    def decode_path(self, batch: _Batch, label: str, targets: list[list[int]]) -> None:
        """Steps every decoder along `targets` (teacher-forced or the greedy path), recording the
        log-probabilities', the attention's and, at the end, the cache's differences.

        Compares only real positions: the start token and each row's target, end included.
        Positions after a row's end see pad tokens, out of distribution, and their
        log-probabilities are ill-conditioned even between fp32 and fp64 PyTorch.
        """
        cfg, n, rows_n = self.cfg, self.cfg.n_decoder_layers, len(batch.srcs)
        valid = [min(len(t) + 1, cfg.max_positions) for t in targets]
        steps = max(valid)
        tgt_in = torch.full((rows_n, steps), cfg.pad_id, dtype=torch.long)
        for i, t in enumerate(targets):
            seq = ([cfg.decoder_start_id] + t)[:steps]
            tgt_in[i, : len(seq)] = torch.tensor(seq)
        past, past64 = self.model.empty_cache(rows_n), self.exact_model.empty_cache(rows_n)
        dtype = np.float16 if self.half else np.float32
        ort_past = [np.zeros((rows_n, cfg.n_heads, 0, cfg.head_dim), dtype)] * (2 * n)
        rows = torch.arange(rows_n)
        fused_step = self._fused_step(batch, steps)
        for t in range(steps):
            tokens = tgt_in[:, t : t + 1]
            position = torch.tensor([t])
            log_probs, past, attention = self.model.decode_step(
                tokens, position, rows, past, batch.cross, batch.mask, return_attention=True
            )
            exact, past64, attention64 = self.exact_model.decode_step(
                tokens, position, rows, past64, batch.cross64, batch.mask, return_attention=True
            )
            live = np.array([t < v for v in valid])
            want = (log_probs.numpy()[live], exact.numpy()[live])
            if fmt.STANDARD in self.decoders:
                ort_past = self._standard_step(
                    batch,
                    label,
                    t,
                    tokens,
                    rows,
                    ort_past,
                    live,
                    want,
                    (attention.numpy(), attention64.numpy()),
                )
            if fused_step is not None:
                got = fused_step(tokens.numpy(), rows.numpy(), t, None)
                self.worst[fmt.FUSED, label].update(got[live], *want)
        caches = {
            fmt.STANDARD: ort_past if fmt.STANDARD in self.decoders else None,
            fmt.FUSED: None if fused_step is None else fused_step.cache,
        }  # [rows, H, max_length, Dh]
        self._compare_caches(caches, past, past64, valid)

    def _fused_step(self, batch: _Batch, steps: int) -> FusedStep | None:
        """The runtime's fused step loop over this batch (None without the fused decoder)."""
        if self.fused is None:
            return None
        cfg = self.cfg
        graph = FusedGraph(
            self.fused,
            n_layers=cfg.n_decoder_layers,
            n_heads=cfg.n_heads,
            head_dim=cfg.head_dim,
            vocab=cfg.tgt_vocab_size,
        )
        return FusedStep(
            graph,
            src_mask=batch.ort_out[0],
            cross=batch.ort_out[1:],
            beam_width=1,
            max_length=steps,
            top_k=None,
        )

    def _standard_step(
        self,
        batch: _Batch,
        label: str,
        t: int,
        tokens: torch.Tensor,
        rows: torch.Tensor,
        ort_past: list,
        live: np.ndarray,
        want: tuple[np.ndarray, np.ndarray],
        attention: tuple[np.ndarray, np.ndarray],
    ) -> list:
        """Runs decoder.onnx for step t, records its differences; returns its cache (present_*)."""
        n = self.cfg.n_decoder_layers
        feed_const = {**dict(zip(fmt.cross_names(n), batch.ort_out[1:])), fmt.SRC_MASK: batch.ort_out[0]}
        out = self.dec.run(
            None,
            {
                fmt.TOKENS: tokens.numpy(),
                fmt.STEP: np.array([t], np.int64),
                fmt.CACHE_INDICES: rows.numpy(),
                fmt.TOP_K: np.array([1], np.int64),
                **dict(zip(fmt.past_names(n), ort_past)),
                **feed_const,
            },
        )
        self.worst[fmt.STANDARD, label].update(out[0][live], *want)
        if self.attention_at is not None:
            for i in np.flatnonzero(live):  # real source positions only
                v = int(batch.lengths[i])
                self.worst[fmt.STANDARD, "decoder cross_attention"].update(
                    out[self.attention_at][i, :v], attention[0][i, :v], attention[1][i, :v]
                )
        return out[1 : 1 + 2 * n]

    def _compare_caches(self, caches: dict, past, past64, valid: list[int]) -> None:
        """Records each decoder's final cache against the models' (real positions only)."""
        flat32, flat64 = [x for kv in past for x in kv], [x for kv in past64 for x in kv]
        for variant, cache in caches.items():
            for got, want, exact in zip(cache or [], flat32, flat64):
                for i, v in enumerate(valid):
                    self.worst[variant, "decoder cache"].update(
                        got[i, :, :v], want[i, :, :v].numpy(), exact[i, :, :v].numpy()
                    )


def _worst_checks(worst: dict[tuple[str, str], _Worst], atol: float) -> list[Check]:
    """One Check per (decoder, output): its worst difference against its bound."""
    checks = []
    for (variant, name), w in worst.items():
        scaled = "log_probs" not in name
        bound = max(atol * (max(1.0, w.scale) if scaled else 1.0), 2.0 * w.torch_abs)
        detail = (
            f"vs fp64; PyTorch fp32 {w.torch_abs:.1e}; bundle vs PyTorch fp32 {w.vs_torch:.1e}; "
            f"max rel {w.bundle_rel:.1e}" + (f"; max|x| {w.scale:.1f}" if scaled else "")
        )
        checks.append(
            Check("tensor", f"{name} max abs", w.bundle_abs, bound, w.bundle_abs <= bound, detail, variant)
        )
    return checks
