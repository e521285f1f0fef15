"""The exporter's memory (issue 34, export peak): the import runs no output projection, the model is let go
before its tensors are stored, and the bundle's check makes its sessions unpacked."""

from __future__ import annotations

import gc

import pytest

from extras import require

require("transformers", "hf")

import hf_fixtures as F  # noqa: E402
from seq2onnx.export import bundle as export_bundle_module  # noqa: E402
from seq2onnx.export.hf import bundle as hf_bundle_module  # noqa: E402
from seq2onnx.export.hf import read as hf_read  # noqa: E402
from seq2onnx.model.transformer import Transformer  # noqa: E402
from seq2onnx.runtime import sessions as sessions_module  # noqa: E402
from seq2onnx.runtime import translator as translator_module  # noqa: E402
from seq2onnx.runtime.session_tuning import SessionTuning  # noqa: E402
from seq2onnx.runtime.translator import Translator  # noqa: E402
from tiny import tiny_bundle, tiny_run  # noqa: E402

TEXTS = ["the small teacher found 15 sad children", "a black dog ate five brave cats"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["marian", "m2m100"])
def test_the_import_runs_no_output_projection(kind, monkeypatch):
    # n rows of logits over the whole vocabulary were the OPUS-MT-size import's peak (240 MB)
    projected: list = []
    real_load = hf_read.load_hf

    def load(model_dir):
        hf = real_load(model_dir)
        hf.get_output_embeddings().register_forward_hook(lambda *args: projected.append(1))
        return hf

    monkeypatch.setattr(hf_read, "load_hf", load)
    imported = hf_read.import_hf(F.random_model(kind))
    assert projected == []
    assert imported.model.positions.abs().sum() > 0  # the tables were read all the same


def _live_transformers() -> int:
    gc.collect()
    return sum(isinstance(o, Transformer) for o in gc.get_objects())


@pytest.mark.parametrize("which", ["checkpoint", "hf"])
@pytest.mark.slow
def test_the_model_is_let_go_before_the_int8_rewrite_and_the_store(which, tmp_path, monkeypatch):
    seen: dict[str, int] = {}
    real_store, real_quantize = export_bundle_module.store_graphs, export_bundle_module.quantize_graphs

    def store(*args, **kwargs):
        seen["store"] = _live_transformers()
        return real_store(*args, **kwargs)

    def quantize(*args, **kwargs):
        seen["int8"] = _live_transformers()
        return real_quantize(*args, **kwargs)

    monkeypatch.setattr(export_bundle_module, "store_graphs", store)
    monkeypatch.setattr(export_bundle_module, "quantize_graphs", quantize)
    before = _live_transformers()
    if which == "checkpoint":
        export_bundle_module.export_bundle(tiny_run(), tmp_path / "bundle", quantize="int8")
    else:
        hf_bundle_module.export_hf_bundle(F.random_model("marian"), tmp_path / "bundle", quantize="int8")
    # no Transformer of this export alive while the tables are quantized and the weights file is written
    assert seen == {"int8": before, "store": before}
    assert Translator(tmp_path / "bundle", device="cpu").translate(TEXTS[0])


@pytest.mark.slow
def test_the_bundles_check_makes_unpacked_sessions(tmp_path, monkeypatch):
    tunings: list[SessionTuning] = []
    real = translator_module.Translator

    class Recording(real):
        def __init__(self, *args, _tuning=None, **kwargs):
            tunings.append(_tuning)
            super().__init__(*args, _tuning=_tuning, **kwargs)

    monkeypatch.setattr(translator_module, "Translator", Recording)
    export_bundle_module.export_bundle(tiny_run(), tmp_path / "bundle")
    assert tunings and all(t is not None and t.prepack is False for t in tunings)
    assert {t.decoder for t in tunings} == {"standard", "fused"}


@pytest.mark.slow
def test_unpacked_sessions_translate_as_packed_ones():
    packed = Translator(tiny_bundle(), device="cpu")
    unpacked = Translator(tiny_bundle(), device="cpu", _tuning=SessionTuning(prepack=False))
    assert (
        unpacked.encoder.get_session_options().get_session_config_entry("session.disable_prepacking") == "1"
    )
    assert "session.disable_prepacking" not in sessions_module.session_entries(SessionTuning(), "decoder")
    for beam_size in (1, 4):
        a = packed.translate_batch(TEXTS, beam_size=beam_size, num_hypotheses=beam_size, return_scores=True)
        b = unpacked.translate_batch(TEXTS, beam_size=beam_size, num_hypotheses=beam_size, return_scores=True)
        assert [r.hypotheses for r in a] == [r.hypotheses for r in b] and a[0].hypotheses[0]
        scores = [s for r in a for s in r.scores]
        assert len(scores) == len(TEXTS) * beam_size
        assert scores == pytest.approx([s for r in b for s in r.scores], abs=1e-4)
