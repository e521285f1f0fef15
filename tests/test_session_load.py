"""How a Translator makes its sessions: a small bundle's encoder beside its decoder (runtime/sessions.py
BESIDE_MAX_BYTES), a large one's one after the other, and failures named from either thread."""

from __future__ import annotations

import threading

import onnxruntime as ort
import pytest

from seq2onnx.runtime import sessions as sessions_module
from seq2onnx.runtime.bundle import BundleError
from seq2onnx.runtime.translator import Translator
from tiny import copy_bundle, tiny_bundle


@pytest.fixture
def threads_making(monkeypatch):
    """The names of the threads each onnxruntime session of this test was made in."""
    names: list[str] = []
    real = ort.InferenceSession

    class Recording(real):
        def __init__(self, *args, **kwargs):
            names.append(threading.current_thread().name)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", Recording)
    return names


def _unrunnable(bundle, name: str) -> None:
    """Gives a graph of `bundle` an operator onnxruntime does not have, a name of the same length in the
    same bytes (no onnx needed: this file runs in the runtime-only run): a graph that parses, and that
    onnxruntime refuses when it makes the session."""
    path = bundle / name
    raw = path.read_bytes()
    op_type = b"\x22\x06Gather"  # NodeProto.op_type (field 4, length 6)
    assert op_type in raw, name
    path.write_bytes(raw.replace(op_type, b"\x22\x06Gathex", 1))


def _load_threads_alive() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("seq2onnx-load-")]


def test_a_small_bundle_makes_its_encoder_beside_its_decoder(threads_making, monkeypatch):
    limit = sessions_module.BESIDE_MAX_BYTES
    monkeypatch.setattr(sessions_module, "BESIDE_MAX_BYTES", 0)
    one_after_the_other = Translator(tiny_bundle(), device="cpu")
    monkeypatch.setattr(sessions_module, "BESIDE_MAX_BYTES", limit)
    threads_making.clear()
    translator = Translator(tiny_bundle(), device="cpu")
    assert "seq2onnx-load-encoder" in threads_making
    assert threads_making.count(threading.current_thread().name) >= 1  # the decoder, in the caller's
    texts = ["the small teacher found 15 sad children", "a black dog ate five brave cats"]
    for beam_size in (1, 4):  # the sessions made either way translate alike
        a = translator.translate_batch(texts, beam_size=beam_size, return_scores=True)
        b = one_after_the_other.translate_batch(texts, beam_size=beam_size, return_scores=True)
        assert [r.hypotheses for r in a] == [r.hypotheses for r in b] and a[0].hypotheses[0]
        assert [s for r in a for s in r.scores] == pytest.approx([s for r in b for s in r.scores], abs=1e-5)
    assert _load_threads_alive() == []


def test_a_large_bundle_makes_its_sessions_one_after_the_other(threads_making, monkeypatch):
    # above the limit the decoder's table, mapped while it is packed, must not meet the encoder's weights
    monkeypatch.setattr(sessions_module, "BESIDE_MAX_BYTES", 0)
    Translator(tiny_bundle(), device="cpu")
    assert threads_making and set(threads_making) == {threading.current_thread().name}


def test_an_encoder_onnxruntime_cannot_load_is_named_from_its_thread(threads_making):
    damaged = copy_bundle(tiny_bundle(), "encoder-garbage")
    _unrunnable(damaged, "encoder.onnx")
    with pytest.raises(
        BundleError, match=r"encoder\.onnx: onnxruntime cannot load this graph.*files\.encoder"
    ):
        Translator(damaged, device="cpu", check_hashes=False)
    assert "seq2onnx-load-encoder" in threads_making
    assert _load_threads_alive() == []


def test_a_decoder_that_fails_waits_for_the_encoders_thread(threads_making):
    damaged = copy_bundle(tiny_bundle(), "decoders-garbage")
    for name in ("decoder.onnx", "decoder_fused.onnx"):
        _unrunnable(damaged, name)
    with pytest.raises(BundleError, match=r"decoder(_fused)?\.onnx: onnxruntime cannot load this graph"):
        Translator(damaged, device="cpu", check_hashes=False)
    assert "seq2onnx-load-encoder" in threads_making
    assert _load_threads_alive() == []  # no session goes on being made after the error


def test_the_tokenizers_load_while_the_sessions_are_made(monkeypatch):
    # onnxruntime lets go of the GIL while it packs weights: a thread loads the tokenizers meanwhile
    making = threading.Event()
    real = ort.InferenceSession

    class Signalling(real):
        def __init__(self, *args, **kwargs):
            making.set()
            super().__init__(*args, **kwargs)

    from seq2onnx.runtime import translator as translator_module

    real_load = translator_module.load_tokenizers
    seen = []

    def load_tokenizers(bundle):
        seen.append(making.wait(timeout=20))  # made one after the other, no session starts meanwhile
        return real_load(bundle)

    bundle = tiny_bundle()  # made (and loaded) first, if this is its first use
    monkeypatch.setattr(ort, "InferenceSession", Signalling)
    monkeypatch.setattr(translator_module, "load_tokenizers", load_tokenizers)
    translator = Translator(bundle, device="cpu")
    assert seen == [True]
    assert translator.translate("a black dog ate five brave cats")


def test_intra_threads_zero_follows_omp_num_threads_where_it_is_a_positive_int(monkeypatch):
    import os

    from seq2onnx.runtime.session_tuning import SessionTuning

    def threads(intra: int) -> int:
        return sessions_module.session_options(SessionTuning(), intra, "decoder").intra_op_num_threads

    cores = os.cpu_count() or 1
    cases = {"1": 1, " 1 ": 1, "999": cores, "0": 0, "-2": 0, "two": 0, "4,2": 0, "": 0}
    for value, want in cases.items():
        monkeypatch.setenv("OMP_NUM_THREADS", value)
        assert (threads(0), threads(cores)) == (want, cores), value  # an explicit count wins
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert threads(0) == 0  # onnxruntime's own default: one per core
    # the sessions `seq2onnx verify` makes for itself too (their pool threads spun at ~half a core each)
    from seq2onnx.runtime.bundle import read_bundle

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    session = sessions_module.graph_session(read_bundle(tiny_bundle()), "encoder", ["CPUExecutionProvider"])
    assert session.get_session_options().intra_op_num_threads == 1
