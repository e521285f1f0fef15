"""Checkpoints: exact round trips, the last/best links, clear errors, atomic writes, no pickle."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct

import pytest
import torch

from seq2onnx.model import checkpoint
from seq2onnx.model.adam import Adam
from seq2onnx.model.checkpoint import CheckpointError
from seq2onnx.model.config import EOS_ID, ModelConfig
from seq2onnx.model.corpus import generate_pairs
from seq2onnx.model.tokenizer import Tokenizer
from seq2onnx.model.transformer import Transformer


@pytest.fixture(scope="module")
def tokenizers():
    pairs = generate_pairs(300, seed=5)
    return {False: Tokenizer.train(pairs, 60), True: Tokenizer.train(pairs, 60, joint=True)}


def _model(tok: Tokenizer, seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        src_vocab_size=tok.src_vocab_size,
        tgt_vocab_size=tok.tgt_vocab_size,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=2,
        d_ff=32,
        dropout=0.0,
        max_positions=64,
        **kw,
    )
    return Transformer(cfg).eval()


def _logits(model: Transformer, tok: Tokenizer) -> torch.Tensor:
    sources = [tok.encode_source(s) for s in ("the dog sees a cat", "two big horses ran")]
    width = max(map(len, sources))
    src = torch.zeros(2, width, dtype=torch.long)
    for i, s in enumerate(sources):
        src[i, : len(s)] = torch.tensor(s)
    tgt = torch.tensor([[2, 5, 6, 7, 8], [2, 9, 10, 11, 12]])
    with torch.no_grad():
        return model(src, src != 0, tgt)


def _perturb(model: Transformer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("tie, joint", [(True, False), (False, False), (True, True), (False, True)])
def test_round_trip_gives_identical_outputs(tmp_path, tokenizers, tie, joint):
    tok = tokenizers[joint]
    model = _model(tok, seed=1, tie_embeddings=tie, share_vocab=joint)
    _perturb(model, 0)  # not the initialisation a fresh Transformer(cfg) would reproduce
    saved = checkpoint.save(tmp_path / "run", model, tok, {"step": 7})
    assert saved == tmp_path / "run" / "step-00000007"
    loaded, tok2, path = checkpoint.load(tmp_path / "run")
    assert path == saved.resolve()
    assert loaded is not model and not loaded.training
    assert loaded.cfg == model.cfg
    assert torch.equal(_logits(loaded, tok2), _logits(model, tok))
    # Ties survive loading: one tensor, not two copies that happen to be equal.
    assert (loaded.generator.weight is loaded.tgt_embed.weight) == tie
    assert (loaded.src_embed is loaded.tgt_embed) == joint
    assert tok2.source_model == tok.source_model and tok2.target_model == tok.target_model


def test_round_trip_pre_norm(tmp_path, tokenizers):
    tok = tokenizers[False]
    model = _model(tok, seed=2, pre_norm=True, tie_embeddings=False)
    _perturb(model, 1)
    checkpoint.save(tmp_path, model, tok, {"step": 1})
    loaded, _, _ = checkpoint.load(tmp_path / "last")
    assert torch.equal(_logits(loaded, tok), _logits(model, tok))


def test_last_and_best_links(tmp_path, tokenizers):
    tok = tokenizers[False]
    run = tmp_path / "run"
    model = _model(tok, seed=3)
    checkpoint.save(run, model, tok, {"step": 1}, best=True)
    at_1 = _logits(model, tok)
    _perturb(model, 2)
    checkpoint.save(run, model, tok, {"step": 2}, best=False)
    at_2 = _logits(model, tok)
    assert not torch.equal(at_1, at_2)
    assert os.readlink(run / "last") == "step-00000002"  # relative: the run directory can move
    assert os.readlink(run / "best") == "step-00000001"
    assert sorted(p.name for p in run.iterdir()) == ["best", "last", "step-00000001", "step-00000002"]
    best, _, best_path = checkpoint.load(run / "best")
    last, _, last_path = checkpoint.load(run)  # a run directory means its `last`
    assert best_path.name == "step-00000001" and last_path.name == "step-00000002"
    assert torch.equal(_logits(best, tok), at_1)
    assert torch.equal(_logits(last, tok), at_2)
    # A new best: both links move and the two older checkpoints are pruned.
    _perturb(model, 3)
    checkpoint.save(run, model, tok, {"step": 3}, best=True)
    assert os.readlink(run / "last") == os.readlink(run / "best") == "step-00000003"
    assert sorted(p.name for p in run.iterdir()) == ["best", "last", "step-00000003"]
    # The run directory moved elsewhere still loads (links are relative).
    moved = tmp_path / "moved"
    shutil.move(str(run), str(moved))
    again, _, _ = checkpoint.load(moved / "best")
    assert torch.equal(_logits(again, tok), _logits(model, tok))


def test_training_state_and_optimizer_round_trip(tmp_path, tokenizers):
    tok = tokenizers[False]
    model = _model(tok, seed=4)
    opt = Adam(model.parameters(), lr=1e-3)
    model(
        torch.tensor([[5, 6, EOS_ID]]), torch.ones(1, 3, dtype=torch.bool), torch.tensor([[2, 5]])
    ).sum().backward()
    opt.step()
    path = checkpoint.save(tmp_path, model, tok, {"step": 4, "history": [{"step": 4}]}, opt)
    model2 = _model(tok, seed=4)
    opt2 = Adam(model2.parameters(), lr=5.0)
    state = checkpoint.load_training_state(path, opt2)
    assert state["step"] == 4 and state["history"] == [{"step": 4}] and "optimizer" not in state
    sd, sd2 = opt.state_dict(), opt2.state_dict()
    assert sd2["param_groups"][0]["lr"] == 1e-3
    for pid, st in sd["state"].items():
        for key, value in st.items():
            assert torch.equal(sd2["state"][pid][key], value), (pid, key)


@pytest.mark.parametrize("missing", ["model.safetensors", "target.spm.model", "config.json"])
def test_missing_file_is_named(tmp_path, tokenizers, missing):
    tok = tokenizers[False]
    path = checkpoint.save(tmp_path, _model(tok), tok, {"step": 1})
    (path / missing).unlink()
    with pytest.raises(CheckpointError, match=rf"missing {missing.replace('.', r'[.]')}"):
        checkpoint.load(path)
    with pytest.raises(CheckpointError, match=r"not a complete checkpoint"):
        checkpoint.load(tmp_path)  # through `last`


def test_shape_mismatch_names_tensor_and_shapes(tmp_path, tokenizers):
    tok = tokenizers[False]
    path = checkpoint.save(tmp_path, _model(tok), tok, {"step": 1})
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["d_ff"] == 32
    cfg["d_ff"] = 48
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(path)
    msg = str(err.value)
    assert "does not match" in msg
    assert "encoder_layers.0.feed_forward.w_1.weight has shape (32, 16), config.json implies (48, 16)" in msg
    assert "(48,)" in msg  # the bias too


def test_vocab_mismatch_names_tensor_and_shapes(tmp_path, tokenizers):
    tok = tokenizers[False]
    model = _model(tok)
    path = checkpoint.save(tmp_path, model, tok, {"step": 1})
    cfg = json.loads((path / "config.json").read_text())
    v = cfg["tgt_vocab_size"]
    cfg["tgt_vocab_size"] = v + 3
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        CheckpointError,
        match=rf"tgt_embed\.weight has shape \({v}, 16\), config\.json implies \({v + 3}, 16\)",
    ):
        checkpoint.load(path)


def test_tie_mismatch_is_reported(tmp_path, tokenizers):
    tok = tokenizers[False]
    path = checkpoint.save(tmp_path, _model(tok, tie_embeddings=False), tok, {"step": 1})
    cfg = json.loads((path / "config.json").read_text())
    cfg["tie_embeddings"] = True
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"unexpected generator\.weight"):
        checkpoint.load(path)


def test_bad_config_json(tmp_path, tokenizers):
    tok = tokenizers[False]
    path = checkpoint.save(tmp_path, _model(tok), tok, {"step": 1})
    cfg = json.loads((path / "config.json").read_text())
    cfg["n_heads"] = 3  # 16 does not divide by 3
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"not a valid model config: d_model=16 does not divide"):
        checkpoint.load(path)


def test_tokenizer_config_mismatch(tmp_path, tokenizers):
    tok = tokenizers[False]
    path = checkpoint.save(tmp_path, _model(tok), tok, {"step": 1})
    other = Tokenizer.train(generate_pairs(200, seed=9), 40)
    assert other.tgt_vocab_size != tok.tgt_vocab_size
    other.save(path)
    with pytest.raises(CheckpointError, match=r"tokenizer vocabularies"):
        checkpoint.load(path)


def test_damaged_weights(tmp_path, tokenizers):
    tok = tokenizers[False]
    path = checkpoint.save(tmp_path, _model(tok), tok, {"step": 1})
    (path / "model.safetensors").write_bytes(b"\xff" * 20)
    with pytest.raises(CheckpointError, match=r"cannot be read as safetensors"):
        checkpoint.load(path)


def test_not_a_checkpoint(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(
        CheckpointError, match=r"not a complete checkpoint, missing config\.json, model\.safetensors"
    ):
        checkpoint.load(empty)
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    with pytest.raises(CheckpointError, match=r"notes\.txt: is not a directory"):
        checkpoint.load(text)
    with pytest.raises(CheckpointError, match=r"no such checkpoint directory"):
        checkpoint.load(tmp_path / "nowhere")


def test_leftover_tmp_dir_from_killed_write(tmp_path, tokenizers):
    tok = tokenizers[False]
    run = tmp_path / "run"
    model = _model(tok, seed=5)
    checkpoint.save(run, model, tok, {"step": 1})
    expected = _logits(model, tok)
    # What a write killed half-way leaves: a private temporary directory with part of a checkpoint,
    # and a half-made link.
    leftover = run / ".tmp-k1ll3d"
    leftover.mkdir()
    (leftover / "config.json").write_text('{"src_vocab_size": ')
    (leftover / "model.safetensors").write_bytes(b"\x00" * 5)
    os.symlink("step-00000099", run / ".last.tmp-12345")
    loaded, _, path = checkpoint.load(run)
    assert path.name == "step-00000001"
    assert torch.equal(_logits(loaded, tok), expected)
    # The next save cleans the leftovers.
    _perturb(model, 4)
    checkpoint.save(run, model, tok, {"step": 2})
    assert sorted(p.name for p in run.iterdir()) == ["last", "step-00000002"]


def test_failed_write_leaves_last_intact(tmp_path, tokenizers, monkeypatch):
    tok = tokenizers[False]
    run = tmp_path / "run"
    model = _model(tok, seed=6)
    checkpoint.save(run, model, tok, {"step": 1})
    expected = _logits(model, tok)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # a BaseException, like an interrupt in the middle of the write

    monkeypatch.setattr(checkpoint.Tokenizer, "save", killed)
    _perturb(model, 5)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(run, model, tok, {"step": 2})
    assert sorted(p.name for p in run.iterdir()) == ["last", "step-00000001"]
    loaded, _, _ = checkpoint.load(run)
    assert torch.equal(_logits(loaded, tok), expected)


def test_weights_are_safetensors(tmp_path, tokenizers):
    tok = tokenizers[False]
    model = _model(tok, tie_embeddings=True)
    path = checkpoint.save(tmp_path, model, tok, {"step": 1})
    raw = (path / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert 0 < n < len(raw)
    header = json.loads(raw[8 : 8 + n])
    assert header["tgt_embed.weight"]["dtype"] == "F32"
    assert header["tgt_embed.weight"]["shape"] == [tok.tgt_vocab_size, 16]
    assert "generator.weight" not in header  # tied: stored once
    assert not raw.startswith(b"\x80") and b"PK\x03\x04" not in raw[:4]  # no pickle, no zip
    # config.json and train_state.json are plain JSON.
    assert json.loads((path / "config.json").read_text())["d_model"] == 16
    assert json.loads((path / "train_state.json").read_text())["step"] == 1


def test_load_never_unpickles(tmp_path, tokenizers, monkeypatch):
    tok = tokenizers[False]
    model = _model(tok, seed=7, tie_embeddings=False)
    opt = Adam(model.parameters())
    path = checkpoint.save(tmp_path, model, tok, {"step": 1}, opt)

    def forbidden(*args, **kwargs):
        raise AssertionError("checkpoint loading unpickled something")

    for name in ("load", "loads"):
        monkeypatch.setattr(pickle, name, forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(torch.serialization, "load", forbidden)
    loaded, _, _ = checkpoint.load(path)
    checkpoint.load_training_state(path, Adam(loaded.parameters()))
    assert torch.equal(_logits(loaded, tok), _logits(model, tok))


def test_config_too_big_for_memory_is_refused_before_allocating(tmp_path, tokenizers, monkeypatch):
    tok = tokenizers[False]
    path = checkpoint.save(tmp_path, _model(tok), tok, {"step": 1})
    cfg = json.loads((path / "config.json").read_text())
    cfg["d_model"] = 65536  # a typo'd size: 10^11 parameters
    (path / "config.json").write_text(json.dumps(cfg))

    def allocating(*args, **kwargs):
        raise AssertionError("the model was allocated before the size was checked")

    monkeypatch.setattr(checkpoint, "Transformer", allocating)
    with pytest.raises(
        CheckpointError,
        match=r"config\.json: this model has [\d,]+ parameters and needs about "
        r"[\d,.]+ GiB to load, more than this machine's [\d,.]+ GiB.*d_model \(65536\)",
    ):
        checkpoint.load(path)
