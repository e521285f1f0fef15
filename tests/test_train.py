"""Training runs on the generated corpus: the loss falls, resume continues exactly, runs are
reproducible, and the run directory is protected."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seq2onnx.model import checkpoint
from seq2onnx.model.train import TrainError, TrainOptions, train


def _opts(out: Path, **kw) -> TrainOptions:
    base = dict(out=str(out), generated_pairs=600, valid_size=20, test_size=20, vocab_size=80, max_len=40,
                d_model=32, n_heads=4, layers=1, d_ff=64, dropout=0.0, max_tokens=600, warmup=20, lr=2.0,
                max_steps=40, eval_every=10, bleu_sentences=4, seed=3, device="cpu", progress=False)
    base.update(kw)
    return TrainOptions(**base)


def _state(run: Path) -> dict:
    return json.loads((run / "last" / "train_state.json").read_text())


def _weights(run: Path) -> dict[str, torch.Tensor]:
    model, _, _ = checkpoint.load(run)
    return model.state_dict()


def _same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_training_lowers_the_loss(tmp_path):
    run = train(_opts(tmp_path / "run", max_steps=40, eval_every=10))
    state = _state(run)
    assert state["step"] == 40
    history = state["history"]
    assert [h["step"] for h in history] == [10, 20, 30, 40]
    valid = [h["valid_loss"] for h in history]
    # Untrained, the loss is about ln(V) = ln(80) = 4.4 nats per token.
    assert valid == sorted(valid, reverse=True), valid  # falls at every evaluation
    assert valid[-1] < valid[0] - 0.3, valid
    assert valid[-1] < 3.2
    assert state["best_valid_loss"] == pytest.approx(valid[-1])
    assert (run / "best").resolve() == (run / "last").resolve() == (run / "step-00000040").resolve()
    assert state["options"]["max_steps"] == 40
    # The checkpoint is a usable model on its own.
    model, tok, _ = checkpoint.load(run)
    assert model.cfg.d_model == 32 and model.cfg.n_encoder_layers == 1 and model.cfg.dropout == 0.0
    assert model.cfg.src_vocab_size == tok.src_vocab_size


def test_resume_continues_exactly(tmp_path):
    """20 steps + resume to 30 == 30 steps at once, bit for bit (dropout 0, CPU).

    The optimizer's moments, the epoch and the position in the epoch are restored; the 20->30
    stretch crosses an epoch boundary (about 24 batches per epoch here).
    """
    resumed = tmp_path / "resumed"
    train(_opts(resumed, max_steps=20, eval_every=10))
    assert _state(resumed)["step"] == 20
    # Shape options given at resume are ignored: data, split and model come from the run.
    train(_opts(resumed, max_steps=30, eval_every=10, resume=True, d_model=64, seed=99))
    state = _state(resumed)
    assert state["step"] == 30
    assert state["epoch"] >= 1
    assert [h["step"] for h in state["history"]] == [10, 20, 30]
    assert state["options"]["d_model"] == 32 and state["options"]["seed"] == 3
    assert state["options"]["max_steps"] == 30

    straight = tmp_path / "straight"
    train(_opts(straight, max_steps=30, eval_every=10))
    other = _state(straight)
    assert (other["epoch"], other["batch_in_epoch"]) == (state["epoch"], state["batch_in_epoch"])
    assert [h["valid_loss"] for h in other["history"]] == [h["valid_loss"] for h in state["history"]]
    assert _same_weights(_weights(resumed), _weights(straight))


def test_resume_of_a_finished_run_trains_no_further(tmp_path):
    run = tmp_path / "run"
    train(_opts(run, max_steps=20, eval_every=10))
    before = _weights(run)
    train(_opts(run, max_steps=20, eval_every=10, resume=True))
    assert _state(run)["step"] == 20
    assert _same_weights(_weights(run), before)


def test_refuses_to_overwrite_without_force(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("keep me\n")
    with pytest.raises(TrainError, match=r"already holds a run; pass --resume to continue it or --force"):
        train(_opts(run, max_steps=2))
    assert (run / "notes.txt").read_text() == "keep me\n"
    train(_opts(run, max_steps=2, eval_every=2, force=True))
    assert not (run / "notes.txt").exists()
    assert _state(run)["step"] == 2
    # A second run into the same directory is refused too.
    with pytest.raises(TrainError, match=r"--force"):
        train(_opts(run, max_steps=2))


def test_empty_existing_directory_is_fine(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    train(_opts(run, max_steps=1, eval_every=1))
    assert _state(run)["step"] == 1


def test_resume_without_checkpoint(tmp_path):
    with pytest.raises(TrainError, match=r"--resume: .* has no checkpoint"):
        train(_opts(tmp_path / "nothing", resume=True))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TrainError, match=r"has no checkpoint"):
        train(_opts(empty, resume=True))


def test_reproducible_with_the_same_seed(tmp_path):
    a = train(_opts(tmp_path / "a", max_steps=10, eval_every=10))
    b = train(_opts(tmp_path / "b", max_steps=10, eval_every=10))
    c = train(_opts(tmp_path / "c", max_steps=10, eval_every=10, seed=4))
    wa, wb, wc = _weights(a), _weights(b), _weights(c)
    assert _same_weights(wa, wb)
    assert _state(a)["history"][0]["valid_loss"] == _state(b)["history"][0]["valid_loss"]
    assert not _same_weights(wa, wc)  # the seed matters, so the equality above means something


def test_bad_device(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(TrainError, match=r"--device cuda, but torch sees no CUDA device"):
        train(_opts(tmp_path / "run", device="cuda"))


def test_several_runs_in_one_process_have_identical_weights(tmp_path):
    # a set-ordered initialisation once made every few runs in one process differ
    runs = [_weights(_trained(tmp_path / name)) for name in "abcd"]
    assert all(_same_weights(other, runs[0]) for other in runs[1:])


def _trained(run: Path) -> Path:
    train(_opts(run, max_steps=3, eval_every=3))
    return run


def test_missing_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(TrainError, match="no such file"):
        train(_opts(tmp_path / "run", data=str(tmp_path / "missing.tsv")))
