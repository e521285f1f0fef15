"""The hand-written Transformer: positions, masks, padding, and the cached decode step."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from seq2onnx.model.config import BOS_ID, EOS_ID, PAD_ID, ModelConfig
from seq2onnx.model.transformer import sinusoid_table


def _src_batch(gen: torch.Generator, lengths: list[int], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded random sources ending with EOS: (B, S) ids and (B, S) mask."""
    width = max(lengths)
    src = torch.full((len(lengths), width), PAD_ID, dtype=torch.long)
    for row, n in enumerate(lengths):
        src[row, : n - 1] = torch.randint(4, vocab, (n - 1,), generator=gen)
        src[row, n - 1] = EOS_ID
    return src, src != PAD_ID


def _tgt_batch(gen: torch.Generator, rows: int, length: int, vocab: int) -> torch.Tensor:
    tgt = torch.randint(4, vocab, (rows, length), generator=gen)
    tgt[:, 0] = BOS_ID
    return tgt


# ---------------------------------------------------------------------------------------------
# Sinusoidal positions


def test_sinusoid_table_matches_formula():
    d = 16
    table = sinusoid_table(50, d)
    assert table.shape == (50, d) and table.dtype == torch.float32
    # Position 0: sin(0) = 0 at even dims, cos(0) = 1 at odd dims.
    assert torch.equal(table[0, 0::2], torch.zeros(d // 2))
    assert torch.equal(table[0, 1::2], torch.ones(d // 2))
    for pos, k in [(1, 0), (3, 1), (7, 2), (17, 5), (49, 7)]:
        omega = 1.0 / 10000 ** (2 * k / d)
        assert table[pos, 2 * k].item() == pytest.approx(math.sin(pos * omega), abs=1e-6)
        assert table[pos, 2 * k + 1].item() == pytest.approx(math.cos(pos * omega), abs=1e-6)
    # k = 0 has omega 1: PE[pos, 0] = sin(pos), PE[pos, 1] = cos(pos).
    assert table[2, 0].item() == pytest.approx(math.sin(2.0), abs=1e-6)
    assert table[2, 1].item() == pytest.approx(math.cos(2.0), abs=1e-6)
    # The last pair turns slowest: omega_7 = 10000^(-14/16).
    assert table[10, 14].item() == pytest.approx(math.sin(10 * 10000 ** (-14 / 16)), abs=1e-6)


def test_model_uses_the_sinusoid_table(make_model):
    model = make_model(d_model=16, max_positions=40)
    assert torch.equal(model.positions, sinusoid_table(40, 16))
    # Positions are not saved in the state dict (they are recomputed from the config).
    assert "positions" not in model.state_dict()


# ---------------------------------------------------------------------------------------------
# Masks and padding


@pytest.mark.parametrize("pre_norm", [False, True])
def test_causal_mask(make_model, pre_norm):
    model = make_model(seed=1, pre_norm=pre_norm)
    gen = torch.Generator().manual_seed(0)
    src, mask = _src_batch(gen, [6, 4], model.cfg.src_vocab_size)
    tgt = _tgt_batch(gen, 2, 7, model.cfg.tgt_vocab_size)
    j = 4
    changed = tgt.clone()
    changed[:, j] = torch.where(tgt[:, j] == 5, 6, 5)
    with torch.no_grad():
        a, b = model(src, mask, tgt), model(src, mask, changed)
    # Positions before j cannot see token j.
    assert torch.allclose(a[:, :j], b[:, :j], atol=1e-6, rtol=0)
    # Position j sees its own input token, and later ones see it too.
    assert (a[:, j] - b[:, j]).abs().max().item() > 1e-3
    assert (a[:, j + 1 :] - b[:, j + 1 :]).abs().max().item() > 1e-3


@pytest.mark.parametrize("pre_norm", [False, True])
def test_padding_invariance(make_model, pre_norm):
    model = make_model(seed=2, pre_norm=pre_norm)
    gen = torch.Generator().manual_seed(1)
    src, mask = _src_batch(gen, [5, 9], model.cfg.src_vocab_size)  # row 0 padded by 4
    tgt = _tgt_batch(gen, 2, 6, model.cfg.tgt_vocab_size)
    alone_src, alone_mask = src[:1, :5], mask[:1, :5]
    assert not mask[0].all()  # the batch really pads row 0
    with torch.no_grad():
        memory_batch = model.encode(src, mask)
        memory_alone = model.encode(alone_src, alone_mask)
        logits_batch = model(src, mask, tgt)
        logits_alone = model(alone_src, alone_mask, tgt[:1])
    assert torch.allclose(memory_batch[0, :5], memory_alone[0], atol=1e-5, rtol=0)
    assert torch.allclose(logits_batch[0], logits_alone[0], atol=1e-5, rtol=0)
    # And padding is not simply ignored by accident: the padded source changes row 0 when unmasked.
    with torch.no_grad():
        unmasked = model(src, torch.ones_like(mask), tgt)
    assert (unmasked[0] - logits_alone[0]).abs().max().item() > 1e-4


# ---------------------------------------------------------------------------------------------
# The cached decode step


CONFIGS = [
    dict(pre_norm=False, tie_embeddings=True),
    dict(pre_norm=False, tie_embeddings=False),
    dict(pre_norm=True, tie_embeddings=True),
    dict(pre_norm=True, tie_embeddings=False),
    dict(pre_norm=True, tie_embeddings=True, share_vocab=True, src_vocab_size=30, tgt_vocab_size=30),
]


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_decode_step_equals_teacher_forcing(make_model, overrides):
    model = make_model(seed=3, **overrides)
    if overrides["tie_embeddings"]:
        assert model.generator.weight is model.tgt_embed.weight
    else:
        assert model.generator.weight is not model.tgt_embed.weight
    gen = torch.Generator().manual_seed(2)
    src, mask = _src_batch(gen, [7, 3, 5], model.cfg.src_vocab_size)
    tgt = _tgt_batch(gen, 3, 6, model.cfg.tgt_vocab_size)
    with torch.no_grad():
        expected = F.log_softmax(model(src, mask, tgt), dim=-1)  # (B, T, V)
        cross = model.cross_kv(model.encode(src, mask))
        past = model.empty_cache(3)
        rows = torch.arange(3)
        for t in range(tgt.shape[1]):
            log_probs, past = model.decode_step(tgt[:, t : t + 1], torch.tensor([t]), rows, past, cross, mask)
            assert log_probs.shape == (3, model.cfg.tgt_vocab_size) and log_probs.dtype == torch.float32
            assert (log_probs - expected[:, t]).abs().max().item() <= 1e-5, t
            assert len(past) == model.cfg.n_decoder_layers
            assert past[0][0].shape == (3, model.cfg.n_heads, t + 1, model.cfg.head_dim)


def test_empty_cache_shapes(make_model):
    model = make_model(n_decoder_layers=2, n_heads=2, d_model=16)
    cache = model.empty_cache(5)
    assert len(cache) == 2
    for k, v in cache:
        assert k.shape == v.shape == (5, 2, 0, 8)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_decode_step_beam_reordering(make_model, pre_norm):
    """Rows continue arbitrary rows of their own sentence; each equals its history run alone."""
    model = make_model(seed=4, pre_norm=pre_norm)
    vocab = model.cfg.tgt_vocab_size
    b, k, steps = 2, 3, 5
    gen = torch.Generator().manual_seed(3)
    src, mask = _src_batch(gen, [6, 4], model.cfg.src_vocab_size)
    with torch.no_grad():
        cross = model.cross_kv(model.encode(src, mask))
        past = model.empty_cache(b)
        histories = [[BOS_ID] for _ in range(b)]  # row -> its decoder inputs so far
        owners = list(range(b))  # row -> sentence
        tokens = torch.full((b, 1), BOS_ID)
        cache_indices = torch.arange(b)
        for t in range(steps):
            log_probs, past = model.decode_step(tokens, torch.tensor([t]), cache_indices, past, cross, mask)
            for r, hist in enumerate(histories):
                s = owners[r]
                n = int(mask[s].sum())
                full = model(src[s : s + 1, :n], mask[s : s + 1, :n], torch.tensor([hist]))
                ref = F.log_softmax(full[0, -1], dim=-1)
                assert (log_probs[r] - ref).abs().max().item() <= 1e-5, (t, r)
            # Next step: K rows per sentence, each continuing a row of the same sentence, in an
            # order that reverses (t=1), duplicates one row three times (t=2) and rotates (t=3).
            prev_rows = {s: [r for r, o in enumerate(owners) if o == s] for s in range(b)}
            new_idx, new_hist, new_owner, new_tok = [], [], [], []
            for s in range(b):
                for j in range(k):
                    choice = prev_rows[s][((t + 1) * (j + 1)) % len(prev_rows[s])]
                    token = int(torch.randint(4, vocab, (1,), generator=gen))
                    new_idx.append(choice)
                    new_hist.append(histories[choice] + [token])
                    new_owner.append(s)
                    new_tok.append(token)
            if t == 1:
                assert new_idx == [2, 1, 0, 5, 4, 3]  # reversed within each sentence
            cache_indices = torch.tensor(new_idx)
            tokens = torch.tensor(new_tok)[:, None]
            histories, owners = new_hist, new_owner


def test_cross_attention_grouping_equals_expanded_cross(make_model):
    """R = B x beams rows against B cross entries == R rows against cross keys copied per row."""
    model = make_model(seed=5)
    b, k = 3, 2
    gen = torch.Generator().manual_seed(4)
    src, mask = _src_batch(gen, [5, 8, 3], model.cfg.src_vocab_size)
    with torch.no_grad():
        cross = model.cross_kv(model.encode(src, mask))
        cross_rows = [(kk.repeat_interleave(k, 0), vv.repeat_interleave(k, 0)) for kk, vv in cross]
        mask_rows = mask.repeat_interleave(k, 0)
        r = b * k
        past_g, past_e = model.empty_cache(r), model.empty_cache(r)
        rows = torch.arange(r)
        for t in range(4):
            tokens = torch.randint(4, model.cfg.tgt_vocab_size, (r, 1), generator=gen)
            if t == 0:
                tokens[:] = BOS_ID
            lp_g, past_g = model.decode_step(tokens, torch.tensor([t]), rows, past_g, cross, mask)
            lp_e, past_e = model.decode_step(tokens, torch.tensor([t]), rows, past_e, cross_rows, mask_rows)
            assert (lp_g - lp_e).abs().max().item() <= 1e-5
        # Sentences differ, so rows of different sentences differ (the grouping is not a no-op).
        assert (lp_g[0] - lp_g[k]).abs().max().item() > 1e-4


# ---------------------------------------------------------------------------------------------
# Config


def test_config_d_model_must_divide_by_heads():
    with pytest.raises(ValueError, match=r"d_model=30 does not divide by n_heads=4"):
        ModelConfig(src_vocab_size=40, tgt_vocab_size=40, d_model=30, n_heads=4)


def test_config_share_vocab_needs_equal_sizes():
    with pytest.raises(ValueError, match=r"share_vocab needs equal vocabularies, got 40 and 30"):
        ModelConfig(src_vocab_size=40, tgt_vocab_size=30, d_model=16, n_heads=2, share_vocab=True)


def test_config_special_ids_inside_vocabulary():
    with pytest.raises(ValueError, match=r"eos_id=50 is outside the vocabulary"):
        ModelConfig(src_vocab_size=40, tgt_vocab_size=40, d_model=16, n_heads=2, eos_id=50)


def test_config_json_round_trip(tmp_path):
    cfg = ModelConfig(
        src_vocab_size=41,
        tgt_vocab_size=37,
        d_model=24,
        n_heads=3,
        n_encoder_layers=1,
        n_decoder_layers=2,
        d_ff=48,
        dropout=0.25,
        max_positions=77,
        pre_norm=True,
        tie_embeddings=False,
        layer_norm_eps=1e-6,
    )
    path = tmp_path / "config.json"
    cfg.save(path)
    data = json.loads(path.read_text())
    assert data["d_ff"] == 48 and data["pre_norm"] is True and data["layer_norm_eps"] == 1e-6
    loaded = ModelConfig.load(path)
    assert loaded == cfg
    assert loaded != ModelConfig(src_vocab_size=41, tgt_vocab_size=37, d_model=24, n_heads=3)


def test_config_unknown_field(tmp_path):
    data = ModelConfig(src_vocab_size=40, tgt_vocab_size=40, d_model=16, n_heads=2).to_dict()
    data["rotary"] = True
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"unknown fields \['rotary'\]"):
        ModelConfig.load(path)


def test_share_vocab_shares_embeddings(make_model):
    model = make_model(src_vocab_size=30, tgt_vocab_size=30, share_vocab=True, tie_embeddings=False)
    assert model.src_embed is model.tgt_embed
    assert model.generator.weight is not model.tgt_embed.weight
    assert torch.equal(model.src_embed.weight[PAD_ID], torch.zeros(model.cfg.d_model))


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_config_parameter_count_equals_the_model(make_model, overrides):
    """The count the memory checks use before allocating is the allocated model's, ties counted once."""
    model = make_model(**overrides, n_encoder_layers=1, n_decoder_layers=3)
    assert model.cfg.parameter_count() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("scaled", [True, False])
def test_attention_is_pytorch_s_scaled_dot_product_attention(scaled):
    """The paper's attention (softmax(QK^T / sqrt(d_k) + mask) V; T5: no sqrt) against PyTorch's own
    scaled_dot_product_attention, with a causal mask and with padding: the export and the hosts reproduce
    model/, so this is where the formula itself is held to an independent one."""
    from seq2onnx.model.blocks import MultiHeadAttention

    cfg = ModelConfig(
        src_vocab_size=10,
        tgt_vocab_size=10,
        d_model=16,
        n_heads=2,
        d_ff=32,
        dropout=0.0,
        attention_scale=scaled,
    )
    attention = MultiHeadAttention(cfg).eval()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 8) for _ in range(3))
    causal = torch.triu(torch.full((5, 5), float("-inf")), diagonal=1)
    padding = torch.zeros(2, 1, 1, 5)
    padding[1, ..., 3:] = float("-inf")
    for bias in (None, causal, padding):
        got = attention.attention(q, k, v, bias)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=None if scaled else 1.0)
        # assert_close's float32 tolerances; assert_close itself imports torch.distributed (~2 s) the first time
        assert torch.allclose(got, want, rtol=1.3e-6, atol=1e-5), (got - want).abs().max()
