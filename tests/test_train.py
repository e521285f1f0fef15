"""Training runs on the generated corpus: the loss falls, resume continues exactly, runs are
reproducible, and the run directory is protected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seq2onnx.model import checkpoint
from seq2onnx.model.options import TrainError
from seq2onnx.model.train import TrainOptions, train


def _opts(out: Path, **kw) -> TrainOptions:
    base = dict(
        out=str(out),
        generated_pairs=600,
        valid_size=20,
        test_size=20,
        vocab_size=80,
        max_len=40,
        d_model=32,
        n_heads=4,
        layers=1,
        d_ff=64,
        dropout=0.0,
        max_tokens=600,
        warmup=20,
        lr=2.0,
        max_steps=40,
        eval_every=10,
        bleu_sentences=4,
        seed=3,
        device="cpu",
        progress=False,
    )
    base.update(kw)
    return TrainOptions(**base)


def _state(run: Path) -> dict:
    return json.loads((run / "last" / "train_state.json").read_text())


def _weights(run: Path) -> dict[str, torch.Tensor]:
    model, _, _ = checkpoint.load(run)
    return model.state_dict()


def _same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_resume_of_a_finished_run_trains_no_further(tmp_path):
    run = tmp_path / "run"
    train(_opts(run, max_steps=20, eval_every=10))
    before = _weights(run)
    train(_opts(run, max_steps=20, eval_every=10, resume=True))
    assert _state(run)["step"] == 20
    assert _same_weights(_weights(run), before)


@pytest.mark.slow
def test_refuses_to_overwrite_without_force(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("keep me\n")
    with pytest.raises(TrainError, match=r"already holds a run; pass --resume to continue it or --force"):
        train(_opts(run, max_steps=2))
    assert (run / "notes.txt").read_text() == "keep me\n"
    # --force replaces only a run: a folder of the user's is refused, and kept
    with pytest.raises(
        TrainError, match=r"holds files but no run of `seq2onnx train`.*--force replaces only a run"
    ):
        train(_opts(run, max_steps=2, eval_every=2, force=True))
    assert (run / "notes.txt").read_text() == "keep me\n"
    (run / "notes.txt").unlink()
    train(_opts(run, max_steps=2, eval_every=2))
    train(_opts(run, max_steps=2, eval_every=2, force=True))  # a run is replaced with --force
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


@pytest.mark.slow
def test_reproducible_with_the_same_seed(tmp_path):
    a = train(_opts(tmp_path / "a", max_steps=10, eval_every=10))
    b = train(_opts(tmp_path / "b", max_steps=10, eval_every=10))
    c = train(_opts(tmp_path / "c", max_steps=10, eval_every=10, seed=4))
    wa, wb, wc = _weights(a), _weights(b), _weights(c)
    assert _same_weights(wa, wb)
    assert _state(a)["history"][0]["valid_loss"] == _state(b)["history"][0]["valid_loss"]
    assert not _same_weights(wa, wc)  # the seed matters, so the equality above means something


def test_bad_device(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine without a GPU
    with pytest.raises(TrainError, match=r"--device cuda, but torch sees no CUDA device"):
        train(_opts(tmp_path / "run", device="cuda"))


@pytest.mark.slow
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


# -- failing early: an unwritable run directory, a model too big for the machine -------------------


def _no_training(monkeypatch):
    """Makes reading the corpus (the first step of real work) fail loudly, to prove a check came first."""
    import seq2onnx.model.train_setup as train_setup

    def reached(*args, **kwargs):
        raise AssertionError("training started: the check should have failed before reading the corpus")

    monkeypatch.setattr(train_setup, "load_split", reached)


def test_unwritable_run_directory_fails_before_training(tmp_path, monkeypatch):
    _no_training(monkeypatch)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    # A path under a regular file cannot be created, by root either.
    with pytest.raises(
        TrainError, match=r"cannot write checkpoints to .*a-file/run.*choose a writable directory"
    ):
        train(_opts(blocker / "run"))
    with pytest.raises(TrainError, match=r"a-file is a file, not a run directory"):
        train(_opts(blocker))


def test_model_too_big_for_memory_fails_before_allocating(tmp_path, monkeypatch):
    _no_training(monkeypatch)
    with pytest.raises(
        TrainError,
        match=r"would need about [\d,.]+ GiB to train.*this machine has [\d,.]+ GiB"
        r".*smaller --d-model \(now 65536\).*--max-tokens",
    ) as info:
        train(_opts(tmp_path / "run", d_model=65536, n_heads=4))
    assert "parameters x 16 bytes" in str(info.value)
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_memory_estimate_counts_weights_gradients_adam_and_activations():
    from seq2onnx.model.config import ModelConfig, training_memory
    from seq2onnx.model.preflight import check_memory

    cfg = ModelConfig(src_vocab_size=1000, tgt_vocab_size=1000, d_model=256, n_heads=4, d_ff=1024)
    weights, activations = training_memory(cfg, 4096)
    assert weights == 16 * cfg.parameter_count()
    assert activations > 4 * 4096 * 3 * 1000  # at least the logits, their log-softmax and gradient
    assert training_memory(cfg, 8192)[1] > activations  # more tokens per batch, more activations
    check_memory(cfg, 4096, None)  # unknown memory: no check
    check_memory(cfg, 4096, weights + activations)  # exactly enough
    with pytest.raises(TrainError, match=r"--max-tokens \(4096\)"):
        check_memory(cfg, 4096, weights + activations - 1)


# -- progress toward whichever limit ends the run --------------------------------------------------


def test_steps_reachable_counts_toward_the_first_limit():
    from seq2onnx.model.preflight import steps_reachable

    assert steps_reachable(4000, 0, 0, 0.0, 30) == 4000  # nothing measured yet
    assert steps_reachable(4000, 0, 10, 5.0, None) == 4000  # no time limit
    # 2 steps/s for 30 minutes: about 3,600 steps, sooner than --max-steps 4000 ...
    assert steps_reachable(4000, 0, 10, 5.0, 30) == 10 + int(2 * (1800 - 5))
    # ... and at 1 step/s, 1,800: the "3 h 16 min left" came from counting to 4,000.
    assert steps_reachable(4000, 0, 10, 10.0, 30) == 1800
    assert steps_reachable(1000, 0, 10, 5.0, 30) == 1000  # the step limit comes first
    assert steps_reachable(4000, 100, 110, 10.0, 30) == 1900  # resumed at 100: rate of this process only
    assert steps_reachable(4000, 0, 50, 2000.0, 30) == 50  # past the time limit: this is the last step


@pytest.mark.slow
def test_progress_bar_total_follows_the_time_limit(tmp_path, monkeypatch):
    import seq2onnx.model.train as train_module

    bars = []

    class Bar:  # records what tqdm would show
        def __init__(self, total, initial, **kwargs):
            self.total, self.n = total, initial
            bars.append(self)

        def update(self, n):
            self.n += n

        def set_postfix(self, **kwargs):
            pass

        def write(self, text):
            pass

        def close(self):
            pass

    monkeypatch.setattr(train_module, "_Bar", Bar)
    run = train(_opts(tmp_path / "run", max_steps=100000, max_minutes=0.03, eval_every=100000))
    [bar] = bars
    step = _state(run)["step"]
    assert 0 < step < 100000
    assert bar.n == step and bar.total == step  # the bar ends full, at the step the time limit ended


# -- a separate validation file ----------------------------------------------------------------


def _write_tsv(path: Path, pairs: list[tuple[str, str]]) -> Path:
    # target<TAB>source with a byte-order mark and \r\n: the column options and quirks apply to both files
    path.write_bytes(b"\xef\xbb\xbf" + "".join(f"{t}\t{s}\r\n" for s, t in pairs).encode())
    return path


def test_valid_data_file_is_the_validation_split(tmp_path):
    from seq2onnx.export.parity import test_sentences
    from seq2onnx.model.corpus import generate_pairs
    from seq2onnx.model.splits import load_split

    pairs = generate_pairs(600, seed=7)
    data = _write_tsv(tmp_path / "train.tsv", pairs)
    held_out = [p for p in generate_pairs(60, seed=8)][:15]
    valid = _write_tsv(tmp_path / "valid.tsv", held_out + pairs[:5])  # 5 sources also in --data
    opts = _opts(
        tmp_path / "run",
        data=str(data),
        valid_data=str(valid),
        src_col=1,
        tgt_col=0,
        max_steps=4,
        eval_every=4,
    )
    split = load_split(opts)
    assert split.valid == held_out + pairs[:5]
    assert not {s for s, _ in split.valid} & {s for s, _ in split.train}  # never trained on
    without = load_split(_opts(tmp_path / "other", data=str(data), src_col=1, tgt_col=0))
    assert split.test == without.test  # the test split is --data's, with or without --valid-data
    assert split.valid != without.valid

    run = train(opts)
    assert _state(run)["options"]["valid_data"] == str(valid)
    train(_opts(run, max_steps=8, eval_every=4, resume=True))  # not given again: the run remembers it
    state = _state(run)
    assert state["step"] == 8 and state["options"]["valid_data"] == str(valid)
    # verify and evaluate read the test split, which needs --data only
    valid.unlink()
    _, _, ckpt = checkpoint.load(run)
    assert test_sentences(ckpt, 5) == without.test[:5]


def test_missing_valid_data_is_a_clear_error(tmp_path):
    with pytest.raises(TrainError, match=r"--valid-data .*missing\.tsv: no such file"):
        train(_opts(tmp_path / "run", valid_data=str(tmp_path / "missing.tsv")))


def test_cli_passes_valid_data_to_training():
    from seq2onnx.commands.main import build_parser
    from seq2onnx.commands.train import train_options

    args = build_parser().parse_args(["train", "OUT", "--data", "d.tsv", "--valid-data", "v.tsv"])
    opts = train_options(args)
    assert (opts.data, opts.valid_data, opts.out) == ("d.tsv", "v.tsv", "OUT")
    assert train_options(build_parser().parse_args(["train", "OUT"])).valid_data is None
