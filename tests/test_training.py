"""Training: the loss goes down, runs are reproducible, existing runs are not overwritten."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from model.train import TrainError, TrainOptions, train

torch.set_num_threads(1)


def options(out, **kw) -> TrainOptions:
    base = dict(out=str(out), generated_pairs=800, valid_size=30, test_size=30, vocab_size=70, max_len=30,
                d_model=32, n_heads=4, layers=1, d_ff=64, dropout=0.0, max_tokens=600, warmup=30, lr=2.0,
                max_steps=60, eval_every=20, bleu_sentences=5, seed=11, device="cpu", progress=False)
    return TrainOptions(**{**base, **kw})


def history(out):
    return json.loads((out / "last" / "train_state.json").read_text())["history"]


def test_training_lowers_the_loss(tmp_path):
    train(options(tmp_path / "run"))
    losses = [h["valid_loss"] for h in history(tmp_path / "run")]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2] and losses[2] < losses[0] - 0.2, losses


def test_same_seed_same_weights(tmp_path):
    # several runs in one process: a set-ordered initialisation once made every few runs differ
    runs = []
    for name in "abcd":
        train(options(tmp_path / name, max_steps=3, eval_every=3))
        runs.append(load_file(str(tmp_path / name / "last" / "model.safetensors")))
    for other in runs[1:]:
        assert other.keys() == runs[0].keys() and all(torch.equal(other[k], runs[0][k]) for k in other)


def test_existing_run_needs_resume_or_force(tmp_path):
    train(options(tmp_path / "run", max_steps=4, eval_every=4))
    with pytest.raises(TrainError, match="--force"):
        train(options(tmp_path / "run", max_steps=4, eval_every=4))
    with pytest.raises(TrainError, match="no checkpoint"):
        train(options(tmp_path / "other", resume=True))
    train(options(tmp_path / "run", max_steps=8, eval_every=4, resume=True))
    assert [h["step"] for h in history(tmp_path / "run")] == [4, 8]
    train(options(tmp_path / "run", max_steps=4, eval_every=4, force=True))
    assert [h["step"] for h in history(tmp_path / "run")] == [4]


def test_missing_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(TrainError, match="no such file"):
        train(options(tmp_path / "run", data=str(tmp_path / "missing.tsv")))
