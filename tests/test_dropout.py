"""model/layers.py's Dropout: the rate and scale it promises, lane by lane, replayed by the seed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from seq2onnx.model.config import ModelConfig
from seq2onnx.model.layers import Dropout
from seq2onnx.model.transformer import Transformer


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_each_of_the_four_lanes_drops_at_the_rounded_rate_and_keeps_the_expectation(p):
    torch.manual_seed(0)
    n = 1 << 20
    y = Dropout(p).train()(torch.ones(n))
    rate = round(p * 65536) / 65536
    assert abs(rate - p) <= 0.5 / 65536
    # one 64-bit draw makes four elements' masks: a lane whose 16 bits were not uniform (a sign bit that
    # is always 0, a draw of 32 bits) drops at 0 or twice the rate
    lanes = (y.view(-1, 4) == 0).double().mean(0)
    sigma = (rate * (1 - rate) / (n / 4)) ** 0.5
    assert ((lanes - rate).abs() < 6 * sigma).all(), (lanes, rate)
    kept = y[y != 0]
    assert torch.equal(kept, torch.full_like(kept, 1 / (1 - rate)))
    assert abs(y.double().mean().item() - 1) < 6 * sigma / (1 - rate)


def test_the_seed_replays_the_masks_and_the_gradient_is_the_mask():
    x = torch.randn(3, 7, 16, requires_grad=True)
    drop = Dropout(0.25).train()
    torch.manual_seed(5)
    a = drop(x)
    torch.manual_seed(5)
    b = drop(x)
    c = drop(x)
    assert torch.equal(a, b) and not torch.equal(b, c)
    a.sum().backward()
    assert torch.equal(x.grad, (a != 0).float() / (1 - 16384 / 65536))


def test_evaluation_and_zero_return_the_input_itself():
    x = torch.randn(4, 8)
    assert Dropout(0.1).eval()(x) is x
    assert Dropout(0.0).train()(x) is x


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_a_rate_outside_0_1_is_refused_naming_it(p):
    with pytest.raises(ValueError, match=rf"dropout {p} is outside \[0, 1\)"):
        Dropout(p)


def test_every_dropout_of_the_model_is_this_one():
    cfg = ModelConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=2, d_ff=32, dropout=0.1)
    modules = list(Transformer(cfg).modules())
    assert not [m for m in modules if isinstance(m, nn.Dropout)]
    assert sum(isinstance(m, Dropout) for m in modules) > 0
