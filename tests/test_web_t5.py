"""The browser host on a T5-family bundle (issue 61): a MADLAD-shaped import translated in headless Chromium.

The page (seq2onnx web) runs the standard decoder graph with onnxruntime-web: the relative position bias,
the RMS norm, the unscaled scores and d_kv ≠ d_model / heads all in WebAssembly. Each target language
typed in the page's field, greedy and beam 4 with its n-best, is held to the Python runtime on the same
bundle: identical token ids and texts, scores within 1e-4. Skips as tests/test_web.py's browser test does.
"""

from __future__ import annotations

import pytest

import hf_t5 as T
from seq2onnx.commands.web import build_site
from seq2onnx.runtime.translator import Translator
from test_web import _BROWSER_SKIP, drive_page

SENTENCES = ["the cat sleeps", "a small dog runs in the garden", "the house is red"]


@pytest.mark.slow
@pytest.mark.skipif(bool(_BROWSER_SKIP), reason=_BROWSER_SKIP)
def test_browser_translates_a_madlad_shaped_bundle_as_python_does(tmp_path):
    from seq2onnx.export.hf.bundle import export_hf_bundle

    bundle = export_hf_bundle(T.cached_t5("madlad", 300, True), tmp_path / "bundle", decoder="standard")
    site = build_site(bundle, tmp_path / "site")
    runs = [
        {"beamSize": beam, "numHypotheses": beam, "targetLang": lang}
        for lang in ("fr", "de")
        for beam in (1, 4)
    ]
    report, _ = drive_page(site, SENTENCES, runs, tmp_path / "page.png")
    assert report["loadStatus"]["state"] == "ready", report["loadStatus"]
    assert report["errors"] == []
    translator = Translator(bundle, device="cpu", intra_threads=1)
    best = {}
    for run in report["runs"]:
        assert run["status"]["state"] == "done", run["status"]
        beam, lang = run["beamSize"], run["targetLang"]
        want = translator.translate_batch(
            SENTENCES, beam_size=beam, num_hypotheses=beam, return_scores=True, target_lang=lang
        )
        for got, expected in zip(run["results"], want, strict=True):
            hyps = got["hypotheses"]
            assert [h["tokens"] for h in hyps] == expected.token_ids, (beam, lang, got["source"])
            assert [h["text"] for h in hyps] == expected.hypotheses, (beam, lang, got["source"])
            for h, score in zip(hyps, expected.scores, strict=True):
                assert abs(h["score"] - score) <= 1e-4, (beam, lang, got["source"], h["score"], score)
        best[lang, beam] = [r["hypotheses"][0]["tokens"] for r in run["results"]]
    assert best["fr", 1] != best["de", 1]  # the field chose the language: the tag the bundle puts first
