"""The PyTorch Transformer: positions, masks, padding, decode_step against the full forward,
config, tokenizer and checkpoints."""
from __future__ import annotations

import json
import math
import pickle

import pytest
import torch

from seq2onnx.model import checkpoint
from seq2onnx.model.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ModelConfig
from seq2onnx.model.corpus import generate_pairs
from seq2onnx.model.tokenizer import Tokenizer
from seq2onnx.model.transformer import Transformer, sinusoid_table

torch.set_num_threads(1)


def tiny_model(pre_norm=False, tie=True, seed=0, **kw) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(src_vocab_size=40, tgt_vocab_size=50, d_model=32, n_heads=4, n_encoder_layers=2,
                      n_decoder_layers=2, d_ff=64, dropout=0.0, max_positions=64, pre_norm=pre_norm,
                      tie_embeddings=tie, **kw)
    return Transformer(cfg).eval()


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 40, (3, 7), generator=g)
    src[1, 5:] = PAD_ID
    src[2, 3:] = PAD_ID
    tgt = torch.randint(4, 50, (3, 6), generator=g)
    tgt[:, 0] = BOS_ID
    return src, src != PAD_ID, tgt


def test_sinusoid_table_follows_the_formula():
    table = sinusoid_table(50, 16)
    for pos, k in [(0, 0), (3, 1), (17, 5), (49, 7)]:
        omega = 1 / 10000 ** (2 * k / 16)
        assert table[pos, 2 * k].item() == pytest.approx(math.sin(pos * omega), abs=1e-6)
        assert table[pos, 2 * k + 1].item() == pytest.approx(math.cos(pos * omega), abs=1e-6)


def test_causal_mask_hides_later_target_tokens():
    model = tiny_model()
    src, mask, tgt = batch()
    changed = tgt.clone()
    changed[:, 4] = (changed[:, 4] + 7) % 46 + 4
    with torch.no_grad():
        a, b = model(src, mask, tgt), model(src, mask, changed)
    assert torch.allclose(a[:, :4], b[:, :4], atol=0, rtol=0)  # earlier positions: identical
    assert not torch.allclose(a[:, 4], b[:, 4])  # the changed position itself does change


def test_padding_invariance():
    model = tiny_model()
    src, mask, tgt = batch()
    with torch.no_grad():
        padded = model(src, mask, tgt)
        alone = model(src[2:3, :3], mask[2:3, :3], tgt[2:3])
        memory_padded = model.encode(src, mask)[2, :3]
        memory_alone = model.encode(src[2:3, :3], mask[2:3, :3])[0]
    assert torch.allclose(padded[2], alone[0], atol=1e-5)
    assert torch.allclose(memory_padded, memory_alone, atol=1e-5)


@pytest.mark.parametrize("pre_norm", [False, True])
@pytest.mark.parametrize("tie", [True, False])
def test_decode_step_equals_full_forward(pre_norm, tie):
    model = tiny_model(pre_norm=pre_norm, tie=tie)
    src, mask, tgt = batch()
    with torch.no_grad():
        full = torch.log_softmax(model(src, mask, tgt), dim=-1)
        cross = model.cross_kv(model.encode(src, mask))
        past = model.empty_cache(3)
        rows = torch.arange(3)
        worst = 0.0
        for t in range(tgt.shape[1]):
            log_probs, past = model.decode_step(tgt[:, t : t + 1], torch.tensor([t]), rows, past, cross, mask)
            worst = max(worst, (log_probs - full[:, t]).abs().max().item())
    assert worst <= 1e-5


def test_decode_step_with_beams_and_reordering_equals_separate_histories():
    """Rows grouped by sentence (2 beams each), reordered by cache_indices, equal each row's own history."""
    model = tiny_model()
    src, mask, _ = batch()
    histories = [[BOS_ID, 5, 9], [BOS_ID, 5, 11], [BOS_ID, 8, 9], [BOS_ID, 8, 8], [BOS_ID, 6, 7], [BOS_ID, 12, 7]]
    with torch.no_grad():
        cross = model.cross_kv(model.encode(src, mask))
        # step 0: one row per sentence; step 1: rows 2s and 2s+1 continue sentence s; step 2: swap beams
        lp0, past = model.decode_step(torch.full((3, 1), BOS_ID), torch.tensor([0]), torch.arange(3),
                                      model.empty_cache(3), cross, mask)
        t1 = torch.tensor([[h[1]] for h in histories])
        lp1, past = model.decode_step(t1, torch.tensor([1]), torch.tensor([0, 0, 1, 1, 2, 2]), past, cross, mask)
        order = torch.tensor([1, 0, 3, 2, 5, 4])
        t2 = torch.tensor([[histories[i][2]] for i in order.tolist()])
        lp2, _ = model.decode_step(t2, torch.tensor([2]), order, past, cross, mask)
        for row, source_row in enumerate(order.tolist()):
            s = source_row // 2
            h = histories[source_row]
            full = torch.log_softmax(model(src[s : s + 1], mask[s : s + 1], torch.tensor([h])), dim=-1)
            assert torch.allclose(lp2[row], full[0, 2], atol=1e-5), row


def test_config_validation_and_json_round_trip(tmp_path):
    with pytest.raises(ValueError, match="n_heads"):
        ModelConfig(src_vocab_size=10, tgt_vocab_size=10, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="share_vocab"):
        ModelConfig(src_vocab_size=10, tgt_vocab_size=12, share_vocab=True)
    cfg = tiny_model(pre_norm=True).cfg
    cfg.save(tmp_path / "config.json")
    assert ModelConfig.load(tmp_path / "config.json") == cfg
    data = json.loads((tmp_path / "config.json").read_text())
    data["rotary"] = True
    with pytest.raises(ValueError, match="unknown fields"):
        ModelConfig.from_dict(data)


def test_tokenizer_round_trip_and_special_ids(tmp_path):
    pairs = generate_pairs(400, seed=2)
    tok = Tokenizer.train(pairs, vocab_size=80)
    assert (tok.target.pad_id(), tok.target.unk_id(), tok.target.bos_id(), tok.target.eos_id()) == (
        PAD_ID, UNK_ID, BOS_ID, EOS_ID)
    src, tgt = pairs[7]
    assert tok.encode_source(src)[-1] == EOS_ID
    ids = tok.encode_target(tgt)
    assert tok.decode_target(ids + [EOS_ID, 9, 9]) == tgt  # cut at the end token
    assert tok.decode_target([BOS_ID] + ids) == tgt
    tok.save(tmp_path)
    again = Tokenizer.load(tmp_path)
    assert again.encode_target(tgt) == ids and again.encode_source(src) == tok.encode_source(src)
    joint = Tokenizer.train(pairs, vocab_size=80, joint=True)
    assert joint.src_vocab_size == joint.tgt_vocab_size
    with pytest.raises(ValueError, match="empty"):
        Tokenizer.train([("", "")], vocab_size=50)


def _save_tiny(run_dir, tie=True):
    model = tiny_model(tie=tie)
    pairs = generate_pairs(300, seed=1)
    tok = Tokenizer.train(pairs, vocab_size=60)
    cfg = ModelConfig(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size, d_model=32, n_heads=4,
                      n_encoder_layers=1, n_decoder_layers=1, d_ff=64, dropout=0.0, tie_embeddings=tie)
    torch.manual_seed(3)
    model = Transformer(cfg).eval()
    return model, tok, checkpoint.save(run_dir, model, tok, {"step": 7}, best=True)


@pytest.mark.parametrize("tie", [True, False])
def test_checkpoint_round_trip_gives_identical_outputs(tmp_path, tie):
    model, tok, path = _save_tiny(tmp_path / "run", tie=tie)
    loaded, _, resolved = checkpoint.load(tmp_path / "run")  # a run directory resolves to `last`
    assert resolved == path.resolve() and (tmp_path / "run" / "best").resolve() == path.resolve()
    src = torch.tensor([[5, 6, 7, EOS_ID]])
    tgt = torch.tensor([[BOS_ID, 5, 9]])
    with torch.no_grad():
        assert torch.equal(model(src, src != 0, tgt), loaded(src, src != 0, tgt))
    if tie:
        assert loaded.generator.weight is loaded.tgt_embed.weight


def test_checkpoint_errors_name_the_problem(tmp_path, monkeypatch):
    _, _, path = _save_tiny(tmp_path / "run")
    with pytest.raises(checkpoint.CheckpointError, match="no such checkpoint"):
        checkpoint.load(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(checkpoint.CheckpointError, match="not a directory"):
        checkpoint.load(tmp_path / "notes.txt")
    cfg = json.loads((path / "config.json").read_text())
    cfg["d_ff"] = 48
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(checkpoint.CheckpointError, match=r"w_1.weight has shape \(64, 32\), config.json implies \(48, 32\)"):
        checkpoint.load(path)
    (path / "model.safetensors").unlink()
    with pytest.raises(checkpoint.CheckpointError, match="missing model.safetensors"):
        checkpoint.load(path)


def test_loading_never_unpickles(tmp_path, monkeypatch):
    _, _, path = _save_tiny(tmp_path / "run")
    header = (path / "model.safetensors").read_bytes()
    n = int.from_bytes(header[:8], "little")
    json.loads(header[8 : 8 + n])  # a safetensors header: JSON, no pickle
    def refuse(*a, **k):
        raise AssertionError("unpickling attempted")
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    checkpoint.load(path)


def test_leftover_temporary_directories_are_cleaned(tmp_path):
    model, tok, _ = _save_tiny(tmp_path / "run")
    leftover = tmp_path / "run" / ".tmp-killed"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"half")
    checkpoint.save(tmp_path / "run", model, tok, {"step": 8})
    assert not leftover.exists()
    assert checkpoint.load(tmp_path / "run")[2].name == "step-00000008"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["best", "last", "step-00000007", "step-00000008"]
