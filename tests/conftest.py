"""Fixtures shared by the test files: tiny random models, and the tiny trained bundle with a Translator.

tests/tiny.py builds the tiny trained runs and bundles once per test session (cached on disk);
these fixtures hand them to the tests.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from seq2onnx.model.config import ModelConfig
from seq2onnx.model.transformer import Transformer
from tiny import tiny_bundle

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


@pytest.fixture(scope="session")
def bundle() -> Path:
    """The tiny trained model's fp32 bundle (both decoders), shared read-only: copy it to edit it."""
    return tiny_bundle()


@pytest.fixture(scope="module")
def translator(bundle):
    """A Translator of the tiny bundle on the CPU, one per test module."""
    from seq2onnx.runtime.translator import Translator

    return Translator(bundle, device="cpu")


# In CI (CI=true, as .ci/run runs) the JavaScript host must be tested: a test that would skip for a
# missing node or js/node_modules fails instead, so that a CI machine without them cannot pass.
_JS_SKIPS = ("node is not installed", "js/node_modules is missing")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if any(s in reason for s in _JS_SKIPS):
            report.outcome = "failed"
            report.longrepr = f"CI requires the JavaScript host, but: {reason}"
