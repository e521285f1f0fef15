"""The CUDA paths (issue 39): parity with PyTorch, an fp16 bundle's verify, copies per step, both decoders,
training for a few steps.

Marked `gpu`: each skips with one line where onnxruntime's CUDA provider (or, for training, torch's CUDA)
cannot run, and runs, and can fail, where it can. scripts/gpu_check.sh runs them on the GPU machine
(`pytest -m gpu`).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from gpu_copies import memcpy_nodes, step_copies_of
from tiny import scratch, tiny_bundle, tiny_run

from seq2onnx.runtime import bundle as fmt
from seq2onnx.runtime.devices import cuda_usable

pytestmark = pytest.mark.gpu
ORT_CUDA, WHY_NOT = cuda_usable()
needs_ort_cuda = pytest.mark.skipif(not ORT_CUDA, reason=f"onnxruntime cannot run CUDA here: {WHY_NOT}")
needs_torch_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")


def _sources(n: int = 50):
    from seq2onnx.export.parity import test_sentences
    from seq2onnx.model import checkpoint

    model, tok, ckpt_dir = checkpoint.load(tiny_run() / "last")
    pairs = test_sentences(ckpt_dir, n)
    return model, [tok.encode_source(s)[: model.cfg.max_positions] for s, _ in pairs]


def _ids(results) -> list[list[int]]:
    return [r.token_ids[0] for r in results]


@pytest.fixture(scope="module")
def fp16_bundle() -> Path:
    from seq2onnx.export.bundle import export_bundle

    return export_bundle(tiny_run() / "last", scratch("fp16") / "bundle", dtype="float16")


@needs_ort_cuda
@pytest.mark.parametrize("beam", [1, 4])
def test_cuda_fp32_token_ids_equal_pytorch(beam):
    from seq2onnx.model.search import translate_ids
    from seq2onnx.runtime.translator import Translator

    model, srcs = _sources()
    want = [h[0].tokens for h in translate_ids(model, srcs, beam_size=beam)]
    want = [w[:-1] if w and w[-1] == model.cfg.eos_id else w for w in want]
    t = Translator(tiny_bundle(), device="cuda")
    assert t.device == "cuda" and t.encoder.get_providers()[0] == "CUDAExecutionProvider", t.device_reason
    results = t.translate_batch(srcs, beam_size=beam, return_scores=True)
    assert _ids(results) == want
    assert all(math.isfinite(s) for r in results for s in r.scores)


@needs_ort_cuda
def test_fp16_bundle_verifies_on_cuda(fp16_bundle):
    from seq2onnx.export.parity import verify

    report = verify(tiny_run() / "last", fp16_bundle, sentences=50, device="cuda", tensor_sentences=8)
    assert report["provider"] == "CUDA" and report["variant"] == "float16"
    assert report["passed"], [c for c in report["checks"] if not c["passed"]]


@needs_ort_cuda
@pytest.mark.parametrize("beam", [1, 4])
def test_io_binding_copies_per_step(beam):
    """Per step only the new tokens, the step, the cache indices and k go up; only the top-k comes down."""
    from seq2onnx.runtime.session_tuning import SessionTuning
    from seq2onnx.runtime.translator import Translator

    _, srcs = _sources(8)
    t = Translator(tiny_bundle(), device="cuda", _tuning=SessionTuning(decoder="standard"))
    got = step_copies_of(t, srcs, beam, cupti=True)
    n = t.n_layers
    assert got["inputs_from_host"] == sorted([fmt.TOKENS, fmt.STEP, fmt.CACHE_INDICES, fmt.TOP_K])
    assert got["inputs_fed_back"] == sorted(fmt.past_names(n))  # the very values the step before output
    assert got["inputs_per_batch"] == sorted(fmt.cross_names(n) + [fmt.SRC_MASK])
    assert got["input_devices"] == ["cuda"]
    assert got["outputs_read"] == sorted([fmt.TOPK_LOG_PROBS, fmt.TOPK_IDS])
    assert got["outputs_read_devices"] == ["cpu"]
    assert got["outputs_fed_back_devices"] == ["cuda"] and got["same_bindings_every_step"]
    nodes = memcpy_nodes(tiny_bundle(), "cuda")
    cu = got["cupti"]
    assert cu["kernels"] > 0, f"CUPTI saw no kernel of onnxruntime's: its copy counts prove nothing ({got})"
    assert cu["dtoh"] <= len(got["outputs_read"]) + nodes["MemcpyToHost"], (cu, nodes)
    assert cu["htod"] <= len(got["inputs_from_host"]) + nodes["MemcpyFromHost"], (cu, nodes)


@needs_ort_cuda
@pytest.mark.parametrize("beam", [1, 4])
def test_greedy_and_beam_on_both_decoders(beam):
    """CUDA runs the standard decoder (the fused one's cache layout is the CPU kernels'): its ids equal both
    CPU decoders' ids."""
    from seq2onnx.runtime.decoders import DecoderUnavailable
    from seq2onnx.runtime.session_tuning import SessionTuning
    from seq2onnx.runtime.translator import Translator

    _, srcs = _sources()
    cuda = Translator(tiny_bundle(), device="cuda")
    assert cuda.decoder_variant == fmt.STANDARD and "CPU" in cuda.decoder_reason
    fused = Translator(tiny_bundle(), device="cpu", _tuning=SessionTuning(decoder=fmt.FUSED))
    standard = Translator(tiny_bundle(), device="cpu", _tuning=SessionTuning(decoder=fmt.STANDARD))
    assert fused.decoder_variant == fmt.FUSED
    on_cuda = _ids(cuda.translate_batch(srcs, beam_size=beam))
    assert on_cuda == _ids(fused.translate_batch(srcs, beam_size=beam))
    assert on_cuda == _ids(standard.translate_batch(srcs, beam_size=beam))
    with pytest.raises(DecoderUnavailable, match="cache layout"):
        Translator(tiny_bundle(), device="cuda", _tuning=SessionTuning(decoder=fmt.FUSED))


@needs_torch_cuda
def test_training_on_cuda_for_a_few_steps():
    import json

    from seq2onnx.model import checkpoint
    from seq2onnx.model.train import TrainOptions, train

    out = scratch("cuda-train") / "run"
    train(
        TrainOptions(
            out=str(out),
            generated_pairs=2000,
            valid_size=50,
            test_size=50,
            vocab_size=120,
            max_len=40,
            d_model=32,
            n_heads=4,
            layers=2,
            d_ff=64,
            dropout=0.0,
            max_tokens=1500,
            warmup=10,
            max_steps=20,
            eval_every=20,
            bleu_sentences=10,
            seed=3,
            device="cuda",
            progress=False,
        )
    )
    state = json.loads((out / "last" / "train_state.json").read_text())
    assert state["step"] == 20 and math.isfinite(state["history"][-1]["train_loss"])
    # below a uniform guess over the vocabulary: it learnt
    assert state["history"][-1]["train_loss"] < math.log(120), state["history"]
    model, _, _ = checkpoint.load(out / "last", device="cuda")
    assert next(model.parameters()).is_cuda
