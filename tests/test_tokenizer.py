"""SentencePiece tokenizers: fixed special ids, round trips, decoding rules, save/load."""

from __future__ import annotations

import pytest

from seq2onnx.model.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from seq2onnx.model.corpus import generate_pairs
from seq2onnx.model.tokenizer import SOURCE_MODEL, TARGET_MODEL, Tokenizer, train_sentencepiece


@pytest.fixture(scope="module")
def pairs():
    return generate_pairs(300, seed=11)


@pytest.fixture(scope="module")
def tok(pairs):
    return Tokenizer.train(pairs, 80)


def test_special_ids_are_fixed(tok):
    for sp in (tok.source, tok.target):
        assert (
            (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
            == (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
            == (0, 1, 2, 3)
        )
        assert sp.id_to_piece(PAD_ID) == "<pad>"
        assert sp.id_to_piece(UNK_ID) == "<unk>"
        assert sp.is_control(BOS_ID) and sp.is_control(EOS_ID)


def test_vocab_sizes(tok):
    assert 10 < tok.src_vocab_size <= 80 and 10 < tok.tgt_vocab_size <= 80
    assert tok.src_vocab_size == tok.source.get_piece_size()


def test_target_round_trip(tok, pairs):
    for _, target in pairs[:100]:
        ids = tok.encode_target(target)
        assert ids and all(i > EOS_ID for i in ids)  # no special token inside a target
        assert tok.decode_target(ids) == target


def test_source_ends_with_eos(tok, pairs):
    for source, _ in pairs[:50]:
        ids = tok.encode_source(source)
        assert ids[-1] == EOS_ID and EOS_ID not in ids[:-1]
        assert ids[:-1] == tok.source.encode(source)
        assert tok.source.decode(ids[:-1]) == source


def test_decode_cuts_at_eos_and_drops_pad_bos(tok, pairs):
    first, second = pairs[0][1], pairs[1][1]
    a, b = tok.encode_target(first), tok.encode_target(second)
    assert tok.decode_target(a + [EOS_ID] + b) == first
    assert tok.decode_target([BOS_ID] + a + [EOS_ID, PAD_ID, PAD_ID]) == first
    assert tok.decode_target(a[:2] + [PAD_ID] + a[2:]) == first
    assert tok.decode_target([EOS_ID] + a) == ""
    assert tok.decode_target([]) == ""


def test_unknown_characters_map_to_unk(tok):
    ids = tok.encode_target("lo toma \u00e9\u00e9")
    assert UNK_ID in ids


def test_save_load_round_trip(tmp_path, tok, pairs):
    tok.save(tmp_path)
    assert (tmp_path / SOURCE_MODEL).read_bytes() == tok.source_model
    assert (tmp_path / TARGET_MODEL).read_bytes() == tok.target_model
    loaded = Tokenizer.load(tmp_path)
    assert (loaded.src_vocab_size, loaded.tgt_vocab_size) == (tok.src_vocab_size, tok.tgt_vocab_size)
    for s, t in pairs[:50]:
        assert loaded.encode_source(s) == tok.encode_source(s)
        assert loaded.encode_target(t) == tok.encode_target(t)


def test_training_is_deterministic(pairs, tok):
    again = Tokenizer.train(pairs, 80)
    assert again.source_model == tok.source_model and again.target_model == tok.target_model


def test_separate_vocabularies_differ(tok, pairs):
    # Source (English) and target (Lirish) models are trained on different sides.
    source_text = pairs[0][0]
    assert tok.source.encode(source_text, out_type=str) != tok.target.encode(source_text, out_type=str)


def test_joint_vocab(pairs):
    joint = Tokenizer.train(pairs, 100, joint=True)
    assert joint.src_vocab_size == joint.tgt_vocab_size
    assert joint.source_model == joint.target_model
    s, t = pairs[3]
    assert joint.encode_source(t)[:-1] == joint.encode_target(t)
    assert joint.decode_target(joint.encode_target(s)) == s
    assert joint.decode_target(joint.encode_target(t)) == t


def test_small_corpus_gives_smaller_vocab_without_error():
    small = Tokenizer.train(generate_pairs(20, seed=1), 5000)
    assert small.src_vocab_size < 5000
    assert small.source.pad_id() == PAD_ID and small.target.eos_id() == EOS_ID


def test_empty_text_raises():
    with pytest.raises(ValueError, match=r"no text to train a SentencePiece model on"):
        train_sentencepiece([], 50)
    with pytest.raises(ValueError, match=r"no text to train"):
        train_sentencepiece(["", ""], 50)
    with pytest.raises(ValueError, match=r"no text to train"):
        Tokenizer.train([], 50)
