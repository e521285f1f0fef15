"""The session cache (runtime/session_cache.py): onnxruntime's optimized graphs with pre-packed weights, saved
on a first load and used by the next, computing what an uncached Translator computes."""

from __future__ import annotations

import os
import time

import pytest

from seq2onnx.runtime import session_cache
from seq2onnx.runtime.bundle import BundleError
from seq2onnx.runtime.session_cache import SessionCache, entry_key
from seq2onnx.runtime.translator import Translator
from tiny import copy_bundle, scratch

TEXTS = ["the old cat sees two birds", "a dog", "five brave cats near the car"]


def _outputs(t: Translator) -> list:
    greedy = [r.hypotheses for r in t.translate_batch(TEXTS)]
    beam = [(r.hypotheses, r.scores) for r in t.translate_batch(TEXTS, beam_size=3, num_hypotheses=2)]
    return [greedy, beam]


def _entries(root) -> list:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


def test_a_second_load_uses_the_entries_and_computes_the_same(bundle, monkeypatch):
    cache = scratch("cache") / "c"
    want = _outputs(Translator(bundle, device="cpu"))
    first = Translator(bundle, device="cpu", cache_dir=cache)
    made = _entries(cache)
    assert len(made) == 2, made  # the encoder and the decoder driven
    for name in made:
        assert {p.name for p in (cache / name).iterdir()} == {"model.onnx", "model.data"}
    assert _outputs(first) == want

    def no_build(*args, **kwargs):
        raise AssertionError("the entry was made again")

    monkeypatch.setattr(SessionCache, "build", no_build)
    second = Translator(bundle, device="cpu", cache_dir=cache)
    assert _outputs(second) == want
    assert second.decoder_variant == first.decoder_variant
    assert _entries(cache) == made


def test_a_damaged_entry_is_made_again(bundle):
    cache = scratch("cache") / "c"
    Translator(bundle, device="cpu", cache_dir=cache)
    for name in _entries(cache):
        (cache / name / "model.onnx").write_bytes(b"not a graph")
    want = _outputs(Translator(bundle, device="cpu"))
    again = Translator(bundle, device="cpu", cache_dir=cache)
    assert _outputs(again) == want
    for name in _entries(cache):
        assert (cache / name / "model.onnx").stat().st_size > 100


def test_nothing_is_cached_without_hashes_or_from_a_damaged_weights_file(bundle):
    cache = scratch("cache") / "c"
    Translator(bundle, device="cpu", check_hashes=False, cache_dir=cache)
    assert _entries(cache) == []
    damaged = copy_bundle(bundle, "cache-damaged")
    weights = damaged / "weights.bin"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="weights.bin: sha256 differs"):
        Translator(damaged, device="cpu", cache_dir=cache)
    assert _entries(cache) == []


def test_the_key_follows_what_the_saved_graph_depends_on(monkeypatch):
    base = dict(
        graph=b"graph",
        weights_sha256="a" * 64,
        ort_version="1.32.0",
        level="all",
        entries={"session.intra_op.allow_spinning": "1"},
    )
    key = entry_key(**base)
    assert entry_key(**base) == key
    for field, other in (
        ("graph", b"graph2"),
        ("weights_sha256", "b" * 64),
        ("ort_version", "1.31.1"),
        ("level", "extended"),
        ("entries", {"session.qdq_matmulnbits_accuracy_level": "4"}),
    ):
        assert entry_key(**{**base, field: other}) != key, field
    monkeypatch.setattr(session_cache, "cpu_identity", lambda: "another CPU")
    assert entry_key(**base) != key


def test_a_cache_dir_that_is_a_file_is_refused(bundle):
    path = scratch("cache") / "file"
    path.write_text("mine")
    with pytest.raises(ValueError, match="cache_dir=.*is not a directory"):
        Translator(bundle, device="cpu", cache_dir=path)
    assert path.read_text() == "mine"


def test_a_build_removes_what_an_interrupted_build_left_and_nothing_else(bundle):
    cache = scratch("cache") / "c"
    cache.mkdir(parents=True)
    stale = cache / f".{'a' * 32}-x1y2z3"  # an older process died while making this entry
    fresh = cache / f".{'b' * 32}-q7w8e9"  # another process is making this one now
    for path in (stale, fresh):
        path.mkdir()
        (path / "model.data").write_bytes(b"partial")
    mine = cache / ".notes"
    mine.write_text("not the cache's")
    old = time.time() - session_cache.STALE_S - 60
    os.utime(stale, (old, old))
    Translator(bundle, device="cpu", cache_dir=cache)
    assert not stale.exists()
    assert (fresh / "model.data").read_bytes() == b"partial"
    assert mine.read_text() == "not the cache's"
    assert len(_entries(cache)) == 2
