"""Shared helpers for the PyTorch-side tests: tiny random models, built in the test session."""
from __future__ import annotations

import pytest
import torch

from seq2onnx.model.config import ModelConfig
from seq2onnx.model.transformer import Transformer

# Tiny models run fastest on one thread; on a shared 2-core machine more threads thrash.
torch.set_num_threads(1)


def _tiny_model(seed: int = 0, **overrides) -> Transformer:
    fields = dict(src_vocab_size=40, tgt_vocab_size=30, d_model=16, n_heads=2, n_encoder_layers=2,
                  n_decoder_layers=2, d_ff=32, dropout=0.0, max_positions=64)
    fields.update(overrides)
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**fields)).eval()


@pytest.fixture
def make_model():
    """Factory: make_model(seed=0, **ModelConfig overrides) -> a random Transformer in eval mode."""
    return _tiny_model
