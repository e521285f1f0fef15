"""Imported bundles stop as generate() stops (issue 35, item 3): forced_eos_token_id.

OPUS-MT's generation config forces </s> at the last allowed position (forced_eos_token_id = 0). The
Marian fixture (tests/hf_fixtures.py) carries it; a copy whose max_length is 5 makes most sentences
reach the limit, so the forced end token decides them. `verify` holds the bundle to generate() with
that max_length, the Node host is held to the Python runtime, and the same bundle without
decoding.forced_eos is shown to differ (the test can fail).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from extras import require

require("transformers", "hf")

import hf_fixtures as F  # noqa: E402
from seq2onnx.export.hf.bundle import decoding_defaults, export_hf_bundle  # noqa: E402
from seq2onnx.export.hf.read import HFImportError  # noqa: E402
from seq2onnx.export.hf.verify import verify_hf  # noqa: E402
from seq2onnx.runtime.translator import Translator  # noqa: E402

SENTENCES = 24
MAX_LENGTH = 5  # generation_config's max_length: the start token and 4 generated tokens


@pytest.fixture(scope="module")
def short_marian(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(model directory with max_length 5, its bundle, the sentences file)."""
    root = tmp_path_factory.mktemp("forced")
    model_dir = root / "model"
    shutil.copytree(F.cached_model("marian"), model_dir)
    path = model_dir / "generation_config.json"
    generation = json.loads(path.read_text(encoding="utf-8"))
    assert generation["forced_eos_token_id"] == 0  # as OPUS-MT ships it
    path.write_text(json.dumps({**generation, "max_length": MAX_LENGTH}), encoding="utf-8")
    bundle = export_hf_bundle(model_dir, root / "bundle", decoder="standard")
    data = root / "sentences.txt"
    data.write_text("\n".join(F.test_sentences(SENTENCES)) + "\n", encoding="utf-8")
    return model_dir, bundle, data


def _token_checks(report: dict) -> dict:
    return {c["name"]: c for c in report["checks"] if c["tier"] == "tokens" and c["decoder"]}


@pytest.mark.slow
def test_forced_eos_is_recorded_and_matches_generate(short_marian):
    model_dir, bundle, data = short_marian
    decoding = json.loads((bundle / "bundle.json").read_text())["decoding"]
    assert decoding["forced_eos"] is True and decoding["max_length_b"] == MAX_LENGTH - 1
    t = Translator(bundle, device="cpu")
    results = t.translate_batch(F.test_sentences(SENTENCES), beam_size=1)
    eos = t.eos_id
    # the limit decides most sentences: 3 tokens, then the forced end (token_ids leave it out)
    reached = [r for r in results if len(r.token_ids[0]) == MAX_LENGTH - 2]
    assert len(reached) >= SENTENCES // 2, [r.token_ids[0] for r in results]
    report = verify_hf(model_dir, bundle, data=str(data), sentences=SENTENCES, tensor_sentences=2)
    checks = _token_checks(report)
    assert report["passed"], [c for c in report["checks"] if not c["passed"]]
    assert checks["greedy ids identical to generate()"]["value"] == 1.0
    assert checks["beam 4 ids identical to generate()"]["value"] == 1.0
    assert eos == 0


@pytest.mark.slow
def test_without_forced_eos_the_bundle_differs(short_marian, tmp_path):
    """The control: the same bundle told nothing of forced_eos stops without </s> and generate() disagrees."""
    model_dir, bundle, data = short_marian
    plain = tmp_path / "plain"
    shutil.copytree(bundle, plain)
    meta = json.loads((plain / "bundle.json").read_text())
    del meta["decoding"]["forced_eos"]
    (plain / "bundle.json").write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
    report = verify_hf(model_dir, plain, data=str(data), sentences=SENTENCES, tensor_sentences=0)
    assert not report["passed"]
    assert _token_checks(report)["greedy ids identical to generate()"]["value"] < 0.75


@pytest.mark.slow
def test_node_host_forces_the_end_token_too(short_marian):
    from seq2onnx.commands.verify_host import verify_host

    _, bundle, _ = short_marian
    report = verify_host(bundle, F.test_sentences(SENTENCES), beam=4)
    assert report["passed"], ([c for c in report["checks"] if not c["passed"]], report["differences"][:3])


def test_forced_eos_other_than_the_end_token_is_refused():
    config = {"eos_token_id": 0}
    assert decoding_defaults({"forced_eos_token_id": 0}, config, 512)["forced_eos"] is True
    assert "forced_eos" not in decoding_defaults({}, config, 512)
    with pytest.raises(HFImportError, match="forced_eos_token_id 7 is not the end token 0"):
        decoding_defaults({"forced_eos_token_id": 7}, config, 512)


def _strip(row: list[int], pad: int, eos: int) -> list[int]:
    row = row[1:]
    while row and row[-1] == pad:
        row.pop()
    return row[:-1] if row and row[-1] == eos else row


@pytest.mark.slow
def test_n_best_is_generate_s(tmp_path):
    """Issue 35 item 2: beam 5 x 3 hypotheses identical to generate(num_return_sequences=3) under the bundle's
    beam_convention "transformers"; the same bundle under our own convention differs on some sentences (the
    finished hypotheses, not the best: a later, better-normalised one displaces one finished earlier)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import hf_nllb as N

    model_dir = N.cached_nllb(with_spm=True)
    bundle = export_hf_bundle(model_dir, tmp_path / "bundle", decoder="standard")
    meta = json.loads((bundle / "bundle.json").read_text())
    assert meta["decoding"]["beam_convention"] == "transformers"
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    hf = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir)).eval()
    sources = F.test_sentences(200)
    forced = tok.convert_tokens_to_ids("fra_Latn")
    rows: list[list[int]] = []
    for i in range(0, len(sources), 50):
        batch = tok(sources[i : i + 50], return_tensors="pt", padding=True)
        with torch.no_grad():
            rows += hf.generate(
                **batch,
                num_beams=5,
                num_return_sequences=3,
                early_stopping=True,
                length_penalty=1.0,
                forced_bos_token_id=forced,
                max_length=F.MAX_LENGTH,
            ).tolist()
    want = [
        [_strip(rows[3 * i + j], tok.pad_token_id, tok.eos_token_id) for j in range(3)]
        for i in range(len(sources))
    ]
    agree = {}
    for convention in ("transformers", "fairseq"):
        meta["decoding"]["beam_convention"] = convention
        (bundle / "bundle.json").write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
        got = Translator(bundle, device="cpu").translate_batch(
            sources,
            beam_size=5,
            num_hypotheses=3,
            length_penalty=1.0,
            max_decoding_length=F.MAX_LENGTH - 1,
            source_lang="eng_Latn",
            target_lang="fra_Latn",
        )
        agree[convention] = (
            sum(g.token_ids == w for g, w in zip(got, want)),
            sum(g.token_ids[0] == w[0] for g, w in zip(got, want)),
        )
    assert agree["transformers"] == (len(sources), len(sources)), agree
    assert agree["fairseq"][1] == len(sources) and agree["fairseq"][0] < len(sources), agree


@pytest.mark.slow
def test_node_host_n_best_follows_the_bundle_s_convention(tmp_path):
    from seq2onnx.commands.verify_host import verify_host

    import hf_nllb as N

    bundle = export_hf_bundle(N.cached_nllb(with_spm=True), tmp_path / "bundle", decoder="standard")
    assert json.loads((bundle / "bundle.json").read_text())["decoding"]["beam_convention"] == "transformers"
    report = verify_host(bundle, F.test_sentences(60), beam=5, source_lang="eng_Latn", target_lang="fra_Latn")
    assert report["passed"], ([c for c in report["checks"] if not c["passed"]], report["differences"][:3])


def test_beam_conventions_are_the_spec_s():
    from seq2onnx.runtime.beam import beam_search
    from seq2onnx.runtime.search import BEAM_CONVENTIONS
    from seq2onnx.runtime.spec import SPEC

    assert (
        list(BEAM_CONVENTIONS)
        == SPEC["beam_conventions"]
        == ["fairseq", "transformers", "transformers_heuristic", "transformers_never"]
    )  # tests/test_early_stopping.py
    with pytest.raises(ValueError, match="convention='hf'; choose one of fairseq, transformers"):
        beam_search(lambda *a: None, 1, beam_size=2, start_id=0, eos_id=1, max_lengths=[3], convention="hf")
