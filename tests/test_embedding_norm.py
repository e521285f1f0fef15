"""ModelConfig.embedding_norm (mBART's layernorm_embedding, issue 35 item 7): a LayerNorm of each stack's own
after embeddings + positions. Off, the model and its state dict are as before; on, encode, the teacher-forced
pass and decode_step all apply it."""

from __future__ import annotations

import math

import pytest
import torch

from seq2onnx.model.config import ModelConfig
from seq2onnx.model.layers import padding_bias
from seq2onnx.model.transformer import Transformer


def _model(**fields) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        src_vocab_size=40,
        tgt_vocab_size=40,
        d_model=16,
        n_heads=2,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_ff=32,
        dropout=0.0,
        max_positions=16,
        pre_norm=True,
        **fields,
    )
    model = Transformer(cfg).eval()
    with torch.no_grad():  # norms that are not the identity, so that a skipped one shows
        for name, p in model.named_parameters():
            if "embed_norm" in name:
                p.normal_(0.5 if name.endswith("weight") else 0.0, 0.3)
    return model


def test_off_leaves_the_state_dict_as_before():
    keys = set(_model().state_dict())
    assert not any("embed_norm" in k for k in keys)
    with_norm = set(_model(embedding_norm=True).state_dict())
    assert with_norm - keys == {
        f"{s}_embed_norm.{p}" for s in ("encoder", "decoder") for p in ("weight", "bias")
    }


@pytest.mark.parametrize("on", [False, True])
def test_parameter_count(on):
    model = _model(embedding_norm=on)
    assert model.cfg.parameter_count() == sum(p.numel() for p in model.parameters())


def test_encode_normalises_embeddings_plus_positions():
    model = _model(embedding_norm=True)
    src = torch.tensor([[5, 6, 7, 3]])
    mask = torch.ones_like(src, dtype=torch.bool)
    x = model.src_embed(src) * math.sqrt(16) + model.positions[:4]
    x = torch.nn.functional.layer_norm(
        x, (16,), model.encoder_embed_norm.weight, model.encoder_embed_norm.bias, 1e-5
    )
    for layer in model.encoder_layers:
        x = layer(x, padding_bias(mask))
    expected = model.encoder_norm(x)
    with torch.no_grad():
        assert torch.allclose(model.encode(src, mask), expected, atol=1e-6)
        model.cfg = ModelConfig(**{**model.cfg.to_dict(), "embedding_norm": False})  # the norm is not a no-op
        without = Transformer(model.cfg).eval()
        without.load_state_dict({k: v for k, v in model.state_dict().items() if "embed_norm" not in k})
        assert not torch.allclose(without.encode(src, mask), expected, atol=1e-3)


def test_decode_step_agrees_with_the_teacher_forced_pass():
    model = _model(embedding_norm=True)
    src, tgt = torch.tensor([[5, 6, 7, 3]]), torch.tensor([[2, 9, 11, 12]])
    mask = torch.ones_like(src, dtype=torch.bool)
    with torch.no_grad():
        full = torch.log_softmax(model(src, mask, tgt), dim=-1)[0]
        cross, past = model.cross_kv(model.encode(src, mask)), model.empty_cache(1)
        for t in range(tgt.shape[1]):
            log_probs, past = model.decode_step(
                tgt[:, t : t + 1], torch.tensor([t]), torch.tensor([0]), past, cross, mask
            )
            assert torch.allclose(log_probs[0], full[t], atol=1e-5), t
