"""runtime/u8s8_probe.py: the int8 products' kernel asked whether it saturates, and the option that makes it exact.

onnxruntime's u8 x s8 kernel on x86 without VNNI saturates (pairs of products summed in 16 bits);
its `session.x64quantprecision` option rewrites int8 weights as uint8 for the exact u8 x u8 kernel.
On a CPU with VNNI (this project's development machine) both paths are exact, so they must agree
to the bit; on one without, the probe must say so and the runtime's options must carry the entry.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tiny import tiny_bundle

from seq2onnx.model.corpus import generate_pairs
from seq2onnx.runtime import sessions, u8s8_probe
from seq2onnx.runtime.session_tuning import SessionTuning
from seq2onnx.runtime.translator import Translator

TEXTS = [s for s, _ in generate_pairs(24, seed=778)]


def _run_probe(entries: dict) -> np.ndarray:
    options = ort.SessionOptions()
    for key, value in entries.items():
        options.add_session_config_entry(key, value)
    session = ort.InferenceSession(u8s8_probe.probe_model(), options, providers=["CPUExecutionProvider"])
    return session.run(
        None, {"a": np.array([[255] * 64, [0] * 64, list(range(64)), [1, 254] * 32], np.uint8)}
    )[0]


def test_the_probe_is_a_valid_onnx_graph_whose_exact_path_gives_the_integer_product():
    proto = onnx.load_from_string(u8s8_probe.probe_model())
    onnx.checker.check_model(proto, full_check=True)
    assert [n.op_type for n in proto.graph.node] == ["MatMulInteger"]
    a = np.array([[255] * 64, [0] * 64, list(range(64)), [1, 254] * 32], np.int64)
    want = a @ np.full((64, 16), 127, np.int64)
    assert want[0, 0] == 64 * 255 * 127 > 2 * 32767  # pairs of these products overflow 16 bits
    assert np.array_equal(_run_probe({u8s8_probe.PRECISION_KEY: "1"}), want)  # the exact u8 x u8 path
    default = _run_probe({})
    assert np.array_equal(default, want) != u8s8_probe.u8s8_saturates(
        ort
    )  # the probe tells which this CPU is


@pytest.mark.parametrize("saturates", [False, True])
def test_the_runtime_sets_the_precision_option_exactly_where_the_kernel_saturates(monkeypatch, saturates):
    monkeypatch.setattr(
        sessions, "precision_entries", lambda _: {u8s8_probe.PRECISION_KEY: "1"} if saturates else {}
    )
    options = sessions.session_options(SessionTuning(), 1, "decoder", quantized=True)
    if saturates:
        assert options.get_session_config_entry(u8s8_probe.PRECISION_KEY) == "1"
    else:
        with pytest.raises(Exception, match=u8s8_probe.PRECISION_KEY):  # onnxruntime: an entry never set
            options.get_session_config_entry(u8s8_probe.PRECISION_KEY)


def test_a_float_bundle_runs_no_probe_and_its_sessions_carry_no_precision_entry(monkeypatch):
    """Only int8 graphs have integer products to make exact: a float32 load never asks (nor pays for the
    probe's session), an int8 load does."""
    asked = []

    def saturates(ort_module):
        asked.append(ort_module)
        return {u8s8_probe.PRECISION_KEY: "1"}

    monkeypatch.setattr(sessions, "precision_entries", saturates)
    fp32 = Translator(tiny_bundle(), device="cpu")
    assert asked == []
    for session in (fp32.encoder, fp32.decoder):
        with pytest.raises(Exception, match=u8s8_probe.PRECISION_KEY):  # onnxruntime: an entry never set
            session.get_session_options().get_session_config_entry(u8s8_probe.PRECISION_KEY)
    assert Translator(tiny_bundle(quantize="int8"), device="cpu").translate(TEXTS[0])
    assert asked  # (the answer then flips the int8 weights: runtime/exact_int8.py)


@pytest.mark.parametrize("beam", [1, 4])
def test_an_int8_bundle_translates_alike_through_either_kernel(monkeypatch, beam):
    """The u8 x u8 rewrite (what a CPU without VNNI runs) gives the same tokens as this CPU's own path."""
    bundle = tiny_bundle(quantize="int8")
    default = Translator(bundle, device="cpu")
    monkeypatch.setattr(sessions, "precision_entries", lambda _: {u8s8_probe.PRECISION_KEY: "1"})
    exact = Translator(bundle, device="cpu")
    got = [r.token_ids[0] for r in exact.translate_batch(TEXTS, beam_size=beam)]
    assert got == [r.token_ids[0] for r in default.translate_batch(TEXTS, beam_size=beam)]
    assert len({tuple(t) for t in got}) > len(TEXTS) // 2  # real translations


@pytest.mark.parametrize("optimization", ["basic", "none"])
def test_an_int8_bundle_below_extended_optimisation_is_refused_where_the_kernel_saturates(
    monkeypatch, optimization
):
    """onnxruntime's exact rewrite is an extended-level optimisation: without it the products would saturate."""
    bundle = tiny_bundle(quantize="int8")
    if not u8s8_probe.u8s8_saturates(ort):  # a CPU whose own kernel is exact loads it at any level
        Translator(bundle, device="cpu", _tuning=SessionTuning(optimization=optimization))
    monkeypatch.setattr(sessions, "precision_entries", lambda _: {u8s8_probe.PRECISION_KEY: "1"})
    with pytest.raises(
        ValueError,
        match=f"optimization='{optimization}' with an int8 bundle on this CPU.*'extended' or 'all'",
    ):
        Translator(bundle, device="cpu", _tuning=SessionTuning(optimization=optimization))
    Translator(
        tiny_bundle(), device="cpu", _tuning=SessionTuning(optimization=optimization)
    )  # float32: any level
    assert Translator(bundle, device="cpu", _tuning=SessionTuning(optimization="extended")).translate(
        TEXTS[0]
    )


def test_a_probe_that_cannot_run_asks_for_the_exact_kernel(monkeypatch):
    class Broken:  # an onnxruntime whose sessions fail, as a build without MatMulInteger would
        SessionOptions = ort.SessionOptions

        class InferenceSession:
            def __init__(self, *args, **kwargs):
                raise RuntimeError("NOT_IMPLEMENTED: MatMulInteger")

    assert u8s8_probe.u8s8_saturates(Broken()) is True
    assert u8s8_probe.precision_entries(Broken()) == {u8s8_probe.PRECISION_KEY: "1"}


def test_threads_asking_at_once_run_one_probe():
    # a Translator makes its encoder's and decoder's sessions in two threads, each asking for the entries
    import threading
    import time

    made: list[int] = []

    class Slow:  # an onnxruntime whose probe session takes a while to make
        SessionOptions = ort.SessionOptions

        class InferenceSession(ort.InferenceSession):
            def __init__(self, *args, **kwargs):
                made.append(1)
                time.sleep(0.2)
                super().__init__(*args, **kwargs)

    slow = Slow()
    answers: list[bool] = []
    threads = [
        threading.Thread(target=lambda: answers.append(u8s8_probe.u8s8_saturates(slow))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert made == [1] and len(answers) == 2 and answers[0] == answers[1] == u8s8_probe.u8s8_saturates(ort)
