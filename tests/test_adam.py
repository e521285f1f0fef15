"""model/adam.py: torch.optim.Adam's steps bit for bit, its state_dict both ways, without torch._dynamo."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from seq2onnx.model.adam import Adam

BETAS, EPS = (0.9, 0.98), 1e-9


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    model.add_module("unused", torch.nn.Linear(8, 8))  # never in the graph: no gradient, no state
    return model


def _steps(model: torch.nn.Module, optimizer, first: int, last: int) -> None:
    """Steps first..last-1 on fixed batches, the learning rate changed each step as the trainer does."""
    for step in range(first, last):
        generator = torch.Generator().manual_seed(step)
        ids = torch.randint(11, (4, 5), generator=generator)
        optimizer.param_groups[0]["lr"] = 0.01 * (1 + step % 3)
        optimizer.zero_grad()  # torch's default too: set to None
        model[2](model[1](model[0](ids))).square().mean().backward()
        optimizer.step()


def _same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), f"{name} differs by up to {(x - y).abs().max().item():.2e}"


@pytest.mark.slow
def test_steps_are_torch_adams_bit_for_bit():
    ours, theirs = _model(), _model()
    _steps(ours, Adam(ours.parameters(), betas=BETAS, eps=EPS), 0, 12)
    _steps(theirs, torch.optim.Adam(theirs.parameters(), lr=0.0, betas=BETAS, eps=EPS), 0, 12)
    _same(ours, theirs)
    assert not torch.equal(ours[1].weight, _model()[1].weight)  # it did train


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["torch to ours", "ours to torch"])
def test_state_dict_moves_between_the_two_and_training_continues_identically(direction):
    make = {
        "ours": lambda m: Adam(m.parameters(), betas=BETAS, eps=EPS),
        "torch": lambda m: torch.optim.Adam(m.parameters(), lr=0.0, betas=BETAS, eps=EPS),
    }
    first, second = direction.split(" to ")
    reference, resumed = _model(), _model()
    optimizer = make[first](reference)
    _steps(reference, optimizer, 0, 6)
    resumed.load_state_dict(reference.state_dict())
    saved = copy.deepcopy(optimizer.state_dict())  # as a checkpoint holds it: not the live tensors
    assert sorted(saved["state"]) == [0, 1, 2, 3, 4]  # the unused layer's 2 tensors have no state
    assert {"step", "exp_avg", "exp_avg_sq"} == set(saved["state"][0])
    moved = make[second](resumed)
    moved.load_state_dict(saved)
    _steps(reference, optimizer, 6, 12)
    _steps(resumed, moved, 6, 12)
    _same(resumed, reference)


def test_a_state_for_another_model_or_other_settings_is_refused():
    model = _model()
    other = Adam(model.parameters()).state_dict()  # torch.optim.Adam's layout (the test above holds it)
    other["param_groups"][0]["weight_decay"] = 0.1
    with pytest.raises(ValueError, match=r"saved with \{'weight_decay': 0.1\}"):
        Adam(model.parameters()).load_state_dict(other)
    with pytest.raises(ValueError, match=r"holds 7 parameters in 1 group\(s\); this model has 4"):
        Adam(list(model.parameters())[:4]).load_state_dict(Adam(model.parameters()).state_dict())


@pytest.mark.slow
def test_training_steps_leave_torch_dynamo_unimported():
    """The reason the class exists: torch.optim's first call imports torch._dynamo (2.7 s of CPU)."""
    code = (
        "import sys, torch; from seq2onnx.model.adam import Adam\n"
        "m = torch.nn.Linear(3, 3); o = Adam(m.parameters(), lr=0.1)\n"
        "o.zero_grad(); m(torch.ones(2, 3)).sum().backward(); o.step(); o.load_state_dict(o.state_dict())\n"
        "print(sorted(k for k in sys.modules if k.startswith('torch._dynamo')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
