"""`seq2onnx verify MODEL_DIR BUNDLE` on the cases issue 35 (item 4) found: a multi-target Marian with
`--target-lang` (the transformers side lacked the >>fra<< token: a broadcast error), and long runs
that printed nothing for minutes (now chunked, a progress line per chunk).
"""

from __future__ import annotations

import pytest

from extras import require

require("transformers", "hf")

import hf_fixtures as F  # noqa: E402
import hf_marian_multi as M  # noqa: E402
from seq2onnx.export.hf.bundle import export_hf_bundle  # noqa: E402
from seq2onnx.export.hf.reference import CHUNK  # noqa: E402
from seq2onnx.export.hf.verify import verify_hf  # noqa: E402
from seq2onnx.runtime.translator import Translator  # noqa: E402


@pytest.mark.slow
def test_multi_target_marian_verifies_with_target_lang(tmp_path, capsys):
    model_dir = M.cached_marian_multi()
    bundle = export_hf_bundle(model_dir, tmp_path / "bundle", decoder="standard")
    t = Translator(bundle, device="cpu")
    assert t.bundle.meta["tokens"]["target_lang_in"] == "source_prefix"
    text = F.test_sentences(1)[0]
    fr, de = (
        t.translate_batch([text], target_lang=code, beam_size=1)[0].hypotheses[0] for code in ("fra", "deu")
    )
    assert fr != de, fr  # the language token reaches the encoder
    data = tmp_path / "sentences.txt"
    data.write_text("\n".join(F.test_sentences(30)) + "\n", encoding="utf-8")
    for code in ("fra", "deu"):  # the command in this process (a child would import torch again)
        report = F.verify_command(capsys, model_dir, bundle, data, "--target-lang", code)
        for check in (*F.TOKEN_CHECKS[:3], "encoder K/V"):
            [row] = [line for line in report.splitlines() if check in line]
            assert " ok " in row, row
        assert "30/30 sentences" in report


@pytest.mark.slow
def test_long_verify_reports_progress_per_chunk(tmp_path):
    """Every CHUNK sentences of each long phase says how far it is (the command prints them at most every 2 s)."""
    model_dir = F.cached_model("marian")
    bundle = export_hf_bundle(model_dir, tmp_path / "bundle", decoder="standard")
    n = 2 * CHUNK + 6
    data = tmp_path / "sentences.txt"
    data.write_text("\n".join(F.test_sentences(n)) + "\n", encoding="utf-8")
    lines: list[str] = []
    report = verify_hf(model_dir, bundle, data=str(data), sentences=n, tensor_sentences=1, log=lines.append)
    assert report["passed"] and report["sentences"] == n
    for phase in (
        "transformers' greedy generate",
        "transformers' beam-4 generate",
        "the bundle's greedy search (standard decoder)",
        "the bundle's beam-4 search (standard decoder)",
    ):
        counts = [line.rsplit(", ", 1)[1] for line in lines if phase in line]
        assert counts == [f"{i}/{n} sentences" for i in range(0, n, CHUNK)], (phase, lines)
