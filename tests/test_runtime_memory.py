"""What a loaded Translator holds (docs/optimisation-notes.md, rows 19-20): no second copy of any graph's
bytes beside its session, and while the sessions are made only the bytes of the graphs not yet loaded."""

from __future__ import annotations

import onnxruntime
import pytest

from seq2onnx.runtime import bundle as names, sessions, translator as translator_module
from seq2onnx.runtime.bundle import read_bundle
from seq2onnx.runtime.translator import Translator
from tiny import tiny_bundle

TEXTS = ["the old cat sees two birds", "a dog", "five brave cats"]
GRAPHS = {"encoder", *names.DECODER_LABELS.values()}


def _keeps_model_bytes() -> bool:
    """Whether this onnxruntime's InferenceSession keeps the bytes it was made from (its `_model_bytes`)."""
    from onnx import TensorProto, helper

    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [value],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    return (
        getattr(onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"]), "_model_bytes", None)
        is data
    )


def test_cpu_sessions_keep_no_copy_of_their_graph():
    if not _keeps_model_bytes():
        pytest.skip("this onnxruntime keeps no copy of a session's model bytes")
    t = Translator(tiny_bundle(), device="cpu")
    for session in (t.encoder, t.decoder, t.graphs.standard_decoder):
        assert session._model_bytes is None
    assert t.bundle.data == {}  # and the bundle's bytes went with the load
    results = t.translate_batch(TEXTS, beam_size=2, return_attention=True)
    assert all(r.hypotheses and r.attention for r in results)


def test_each_graphs_bytes_go_once_its_session_is_made(monkeypatch):
    """A bundle the Translator reads itself: each session is made while only the graphs not yet loaded are
    held. A Bundle passed in is the caller's: its bytes stay."""
    read: list = []
    seen: list[set] = []

    def reading(*args, **kwargs):
        read.append(read_bundle(*args, **kwargs))
        return read[-1]

    class Recording(onnxruntime.InferenceSession):
        def __init__(self, data, *args, **kwargs):
            seen.append({k for k in read[-1].data if k in GRAPHS})
            super().__init__(data, *args, **kwargs)

    monkeypatch.setattr(translator_module, "read_bundle", reading)
    monkeypatch.setattr(sessions.ort, "InferenceSession", Recording)
    # A bundle of large weights: the fused decoder first (runtime/sessions.py says why), then the encoder;
    # the standard decoder (its graph small: its tensors are in the weights file) waits until asked for.
    monkeypatch.setattr(sessions, "BESIDE_MAX_BYTES", 0)
    t = Translator(tiny_bundle(), device="cpu")
    assert t.decoder_variant == "fused"
    assert seen == [GRAPHS, GRAPHS - {names.DECODER_LABELS["fused"]}]
    assert t.translate(TEXTS[0])
    assert t.graphs.standard_decoder is not None
    assert seen[2:] == [GRAPHS - {"encoder", names.DECODER_LABELS["fused"]}]

    # a small one makes the two at once (which starts first is the threads'), and holds neither after
    seen.clear()
    monkeypatch.undo()
    monkeypatch.setattr(translator_module, "read_bundle", reading)
    monkeypatch.setattr(sessions.ort, "InferenceSession", Recording)
    t = Translator(tiny_bundle(), device="cpu")
    assert len(seen) == 2 and seen[0] == GRAPHS
    assert set(read[-1].data) & GRAPHS == GRAPHS - {"encoder", names.DECODER_LABELS["fused"]}

    bundle = read_bundle(tiny_bundle())
    seen.clear()
    read.append(bundle)
    Translator(bundle, device="cpu")
    assert seen == [GRAPHS] * 2 and GRAPHS <= set(bundle.data)
