"""Fuzzed text through the runtime's text entry points: a real translation (non-empty for non-blank
text, ids that detokenise to it, the same alone as in a batch, streamed pieces that join to it) or
a clear error."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seq2onnx.runtime.translator import TranslationResult, Translator

# Every code point, surrogates and control characters included.
ANY_CHAR = st.characters(codec=None, exclude_categories=())
SPECIAL = st.sampled_from(
    [
        "\x00",
        "\u0301",
        "\u202e",
        "\u200f",
        "🙂",
        "👩‍👩‍👧",
        "\ud800",
        "\udfff",
        "\t",
        "\r\n",
        "\ufeff",
        "漢字",
        "مرحبا",
        "שלום",
        "\u0000\u0000",
        " ",
    ]
)
TEXT = st.lists(st.one_of(st.text(ANY_CHAR, max_size=40), SPECIAL), min_size=1, max_size=4).map("".join)
CASES = 150


def _check(translator: Translator, result: TranslationResult, text: str, max_length: int, n: int = 1) -> None:
    """The result is a real translation of `text`, not merely of the right types."""
    assert isinstance(result, TranslationResult)
    assert len(result.hypotheses) == len(result.token_ids) == n
    for hypothesis, ids in zip(result.hypotheses, result.token_ids):
        assert isinstance(hypothesis, str)
        hypothesis.encode("utf-8")  # valid text: it can be written as UTF-8
        if not text.strip():
            assert hypothesis == "" and ids == []
            continue
        # a non-blank text gives a non-empty hypothesis, within the length asked for, whose ids
        # (target vocabulary, no end token) detokenise to it
        assert ids and hypothesis.strip()
        assert len(ids) <= max_length and translator.eos_id not in ids
        assert all(0 <= i < translator.tgt_vocab for i in ids)
        assert translator.target_tokenizer.decode(ids) == hypothesis


@pytest.mark.slow
@settings(max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(TEXT, min_size=1, max_size=5))
def test_translate_batch_fuzzed(translator, texts):
    results = translator.translate_batch(texts, beam_size=2, max_decoding_length=8, truncate=True)
    assert len(results) == len(texts)
    for text, r in zip(texts, results):
        _check(translator, r, text, 8)
    # each result is the one the same text gets alone (the batch's padding changes nothing)
    for text, r in zip(texts[:2], results):
        [alone] = translator.translate_batch([text], beam_size=2, max_decoding_length=8, truncate=True)
        assert alone.token_ids == r.token_ids


@settings(max_examples=CASES // 3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT)
def test_translate_and_stream_fuzzed(translator, text):
    greedy = translator.translate(text, beam_size=1, max_decoding_length=8, truncate=True)
    pieces = list(translator.generate_tokens(text, max_decoding_length=8, truncate=True))
    assert "".join(pieces) == greedy  # text increments that join to the translation, spaces and all
    assert all(isinstance(p, str) and p for p in pieces)
    if text.strip():
        assert greedy.strip()


def test_huge_string_is_a_clear_error_or_truncated(translator):
    huge = "the big dog " * 20_000
    with pytest.raises(ValueError, match="positions.*truncate=True"):
        translator.translate_batch([huge])
    (r,) = translator.translate_batch([huge], beam_size=1, max_decoding_length=5, truncate=True)
    _check(translator, r, huge, 5)
    cut, _ = translator.prepare_source(huge, truncate=True)
    assert translator.translate_batch([cut], beam_size=1, max_decoding_length=5)[0].token_ids == r.token_ids


@pytest.mark.parametrize("item", [None, 3, 2.5, b"bytes", ["a", "b"], {"text": "x"}, np.array([1.5])])
def test_non_text_items_are_type_errors(translator, item):
    with pytest.raises(TypeError, match="source 1"):
        translator.translate_batch(["a cat", item])
