"""Fuzzed text through the runtime's text entry points: no crash, a defined output or a clear error."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seq2onnx.runtime.translator import TranslationResult, Translator
from tiny import tiny_bundle

# Every code point, surrogates and control characters included.
ANY_CHAR = st.characters(codec=None, exclude_categories=())
SPECIAL = st.sampled_from(["\x00", "\u0301", "\u202e", "\u200f", "🙂", "👩‍👩‍👧", "\ud800", "\udfff", "\t", "\r\n", "\ufeff",
                           "漢字", "مرحبا", "שלום", "\u0000\u0000", " "])
TEXT = st.lists(st.one_of(st.text(ANY_CHAR, max_size=40), SPECIAL), min_size=1, max_size=4).map("".join)
CASES = 150


@pytest.fixture(scope="module")
def translator() -> Translator:
    return Translator(tiny_bundle(), device="cpu")


def _check(result: TranslationResult, n: int = 1) -> None:
    assert isinstance(result, TranslationResult)
    assert len(result.hypotheses) == n and all(isinstance(h, str) for h in result.hypotheses)
    # the output is valid text: it can be written as UTF-8
    for h in result.hypotheses:
        h.encode("utf-8")


@settings(max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(TEXT, min_size=1, max_size=5))
def test_translate_batch_fuzzed(translator, texts):
    results = translator.translate_batch(texts, beam_size=2, max_decoding_length=8, truncate=True)
    assert len(results) == len(texts)
    for text, r in zip(texts, results):
        _check(r)
        if not text.strip():
            assert r.hypotheses == [""]


@settings(max_examples=CASES // 3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT)
def test_translate_and_stream_fuzzed(translator, text):
    greedy = translator.translate(text, beam_size=1, max_decoding_length=8, truncate=True) if len(text) < 100 else None
    pieces = list(translator.generate_tokens(text, max_decoding_length=8)) if len(text) < 100 else []
    if greedy is not None:
        assert isinstance(greedy, str)
        assert all(isinstance(p, str) for p in pieces)


def test_huge_string_is_a_clear_error_or_truncated(translator):
    huge = "the big dog " * 20_000
    with pytest.raises(ValueError, match="positions.*truncate=True"):
        translator.translate_batch([huge])
    (r,) = translator.translate_batch([huge], beam_size=1, max_decoding_length=5, truncate=True)
    _check(r)


@pytest.mark.parametrize("item", [None, 3, 2.5, b"bytes", ["a", "b"], {"text": "x"}, np.array([1.5])])
def test_non_text_items_are_type_errors(translator, item):
    with pytest.raises(TypeError, match="source 1"):
        translator.translate_batch(["a cat", item])
