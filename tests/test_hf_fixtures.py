"""The tiny Hugging Face checkpoints of tests/hf_fixtures.py are what transformers itself loads and runs.

The importer's tests trust these directories to stand in for OPUS-MT and facebook/m2m100
downloads, so this file checks them against transformers: the files and conventions, that the
tokenizers round-trip, and that the trained models translate and stop.
"""

from __future__ import annotations

import json
import shutil

import pytest

from extras import require
import sentencepiece as spm
import torch

import hf_fixtures as hf

transformers = require("transformers", "hf")

# MarianTokenizer warns on every load when sacremoses (its optional punctuation normaliser) is absent.
pytestmark = pytest.mark.filterwarnings("ignore:Recommended:UserWarning")

N_TEST = 30


def _load(path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(path).eval()
    return tokenizer, model


def _greedy(tokenizer, model, sentences, **options) -> tuple[list[list[int]], list[str]]:
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, num_beams=1, **options)
    return out.tolist(), tokenizer.batch_decode(out, skip_special_tokens=True)


def _eos_fraction(rows: list[list[int]], eos: int) -> float:
    # Position 0 is the decoder start (pad for Marian, which is not eos; eos for M2M100): skip it.
    return sum(eos in row[1:] for row in rows) / len(rows)


def _word_accuracy(outputs: list[str], references: list[str]) -> float:
    scores = []
    for out, ref in zip(outputs, references):
        ref_words = ref.split()
        scores.append(sum(a == b for a, b in zip(out.split(), ref_words)) / len(ref_words))
    return sum(scores) / len(scores)


def test_corpus_is_deterministic_and_test_sentences_are_held_out():
    pairs = hf.parallel_corpus("fr")
    assert pairs == hf.parallel_corpus("fr")
    assert len(pairs) == hf.MARIAN_PAIRS
    assert all(2 <= len(source.split()) <= 10 for source, _ in pairs)
    held = hf.test_sentences(N_TEST)
    assert len(set(held)) == N_TEST
    assert not set(held) & set(hf.source_sentences(max(hf.MARIAN_PAIRS, hf.M2M_SENTENCES)))
    assert hf.translate("the big cat sees a dog", "fr") == "le chat grand voit un chien"
    assert hf.translate("the big cat sees a dog", "de") == "der gross katze ein hund sieht"


@pytest.mark.slow
@pytest.mark.parametrize("shared_vocab", [True, False])
def test_marian_directory_is_what_transformers_writes_and_loads(shared_vocab):
    path = hf.random_model("marian", shared_vocab=shared_vocab)
    expected = {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "source.spm",
        "target.spm",
        "vocab.json",
        "tokenizer_config.json",
    } | ({"target_vocab.json"} if not shared_vocab else set())
    assert {p.name for p in path.iterdir()} == expected

    config = transformers.AutoConfig.from_pretrained(path)
    vocab = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
    assert config.model_type == "marian"
    assert (vocab["</s>"], vocab["<unk>"], vocab["<pad>"]) == (0, 1, len(vocab) - 1)
    assert config.vocab_size == config.decoder_vocab_size == len(vocab)
    assert config.eos_token_id == config.forced_eos_token_id == 0
    assert config.pad_token_id == config.decoder_start_token_id == len(vocab) - 1
    assert config.scale_embedding and config.normalize_before is False and config.static_position_embeddings
    assert config.share_encoder_decoder_embeddings is shared_vocab and config.tie_word_embeddings

    tokenizer, model = _load(path)
    assert isinstance(tokenizer, transformers.MarianTokenizer)
    assert model.final_logits_bias.abs().min() > 0  # an importer that drops it must fail parity
    assert model.get_output_embeddings().weight.shape == (config.decoder_vocab_size, 32)
    generation = model.generation_config
    assert generation.bad_words_ids == [[config.pad_token_id]] and generation.num_beams == 4
    assert generation.decoder_start_token_id == config.pad_token_id and generation.max_length == hf.MAX_LENGTH

    source, target = hf.parallel_corpus("fr")[0]
    encoded = tokenizer(source, text_target=target)
    assert encoded["input_ids"][-1] == 0 and encoded["labels"][-1] == 0
    assert tokenizer.decode(encoded["labels"], skip_special_tokens=True) == target
    if shared_vocab:  # decode maps ids through the target vocabulary only: source ids need a shared one
        assert tokenizer.decode(encoded["input_ids"], skip_special_tokens=True) == source


@pytest.mark.slow
@pytest.mark.parametrize("shared_vocab", [True, False])
def test_marian_ids_are_not_sentencepiece_ids(shared_vocab):
    path = hf.random_model("marian", shared_vocab=shared_vocab)
    tokenizer = transformers.MarianTokenizer.from_pretrained(path)
    processor = spm.SentencePieceProcessor(model_file=str(path / "source.spm"))
    sentence = hf.test_sentences(1)[0]
    marian_ids = tokenizer(sentence)["input_ids"][:-1]  # without </s>
    spm_ids = processor.encode(sentence)
    # Not tokenizer.convert_ids_to_tokens: with separate vocabularies it reads the target one.
    vocab = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
    assert [vocab[piece] for piece in processor.encode(sentence, out_type=str)] == marian_ids
    assert sum(a == b for a, b in zip(marian_ids, spm_ids)) <= len(spm_ids) // 4


@pytest.mark.slow
def test_m2m100_directory_is_what_transformers_writes_and_loads():
    path = hf.random_model("m2m100")
    assert {p.name for p in path.iterdir()} == {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "vocab.json",
        "sentencepiece.bpe.model",
        "tokenizer_config.json",
        "added_tokens.json",
    }
    config = transformers.AutoConfig.from_pretrained(path)
    vocab = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
    assert config.model_type == "m2m_100"
    assert [vocab[t] for t in ("<s>", "<pad>", "</s>", "<unk>")] == [0, 1, 2, 3]
    assert (config.bos_token_id, config.pad_token_id, config.eos_token_id, config.decoder_start_token_id) == (
        0,
        1,
        2,
        2,
    )
    assert config.vocab_size == len(vocab) + 100 + hf.M2M_MADEUP_WORDS

    tokenizer, model = _load(path)
    assert isinstance(tokenizer, transformers.M2M100Tokenizer)
    assert len(tokenizer) == len(vocab) + 100
    assert model.get_input_embeddings().weight.shape == (config.vocab_size, 32)
    assert tokenizer.get_lang_id("en") == len(vocab) + 18  # "en" is the 19th of the 100 codes
    sentence = hf.test_sentences(1)[0]
    ids = tokenizer(sentence)["input_ids"]
    assert ids[0] == tokenizer.get_lang_id("en") and ids[-1] == 2
    assert tokenizer.decode(ids, skip_special_tokens=True) == sentence
    processor = spm.SentencePieceProcessor(model_file=str(path / "sentencepiece.bpe.model"))
    assert ids[1:-1] != processor.encode(sentence)
    assert model.generation_config.num_beams == 5 and model.generation_config.decoder_start_token_id == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    "options", [{}, {"shared_vocab": False, "activation": "relu"}], ids=["shared-swish", "separate-relu"]
)
def test_trained_marian_translates_and_stops(options):
    tokenizer, model = _load(hf.cached_model("marian", **options))
    sentences = hf.test_sentences(N_TEST)
    rows, texts = _greedy(tokenizer, model, sentences)
    assert _eos_fraction(rows, model.config.eos_token_id) >= 0.9
    assert _word_accuracy(texts, [hf.translate(s, "fr") for s in sentences]) >= 0.5


@pytest.mark.slow
def test_trained_m2m100_follows_the_forced_language():
    tokenizer, model = _load(hf.cached_model("m2m100"))
    sentences = hf.test_sentences(N_TEST)
    outputs = {}
    for lang in hf.LANGUAGES:
        lang_id = tokenizer.get_lang_id(lang)
        rows, texts = _greedy(tokenizer, model, sentences, forced_bos_token_id=lang_id)
        assert all(row[:2] == [2, lang_id] for row in rows)  # decoder start </s>, then the language
        assert _eos_fraction(rows, 2) >= 0.9
        assert _word_accuracy(texts, [hf.translate(s, lang) for s in sentences]) >= 0.5
        lexicon = set(hf.WORD_MAPS[lang].values())
        words = [w for text in texts for w in text.split()]
        assert sum(w in lexicon for w in words) >= 0.8 * len(words)
        outputs[lang] = texts
    assert sum(fr != de for fr, de in zip(outputs["fr"], outputs["de"])) >= 0.9 * N_TEST


def test_cached_model_fills_in_defaults_and_builds_once():
    assert hf.cached_model("marian", train_steps=0) is hf.random_model("marian", seed=0, shared_vocab=True)
    with pytest.raises(ValueError, match="unknown model kind 'bart'"):
        hf.cached_model("bart")
    with pytest.raises(TypeError):
        hf.cached_model("m2m100", shared_vocab=False)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["marian", "m2m100"])
def test_damage_breaks_each_thing_it_names(kind, tmp_path):
    for how in hf.DAMAGES:
        path = shutil.copytree(hf.random_model(kind), tmp_path / how)
        damaged = hf.damage(path, how)
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        if how == "unknown_model_type":
            assert damaged.name == "config.json" and config["model_type"] == "bart"
        elif how == "missing_weights":
            assert damaged.name == "model.safetensors" and not damaged.exists()
            with pytest.raises(OSError):
                transformers.AutoModelForSeq2SeqLM.from_pretrained(path)
        elif how == "vocab_mismatch":
            original = json.loads((hf.random_model(kind) / "config.json").read_text(encoding="utf-8"))
            assert damaged.name == "config.json" and config["vocab_size"] == original["vocab_size"] + 7
        else:
            vocab = json.loads(damaged.read_text(encoding="utf-8"))
            pieces = set(
                hf.spm_pieces(path / ("source.spm" if kind == "marian" else "sentencepiece.bpe.model"))
            )
            original = json.loads((hf.random_model(kind) / "vocab.json").read_text(encoding="utf-8"))
            assert damaged.name == "vocab.json" and len(vocab) == len(original) - 5
            assert "\u2581qzx0" in vocab and "\u2581qzx0" not in pieces
    with pytest.raises(ValueError, match="unknown damage"):
        hf.damage(tmp_path, "burnt")
