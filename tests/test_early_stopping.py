"""Imported bundles stop beam search as generate() does (issue 35): generation_config's early_stopping.

transformers' _beam_search (generation/utils.py) keeps a sentence running after K hypotheses have finished
unless early_stopping is True: with False (its default, and OPUS-MT's, which leave the field out) while the
best live beam's score / len^alpha, len the tokens generated so far, beats the worst finished one
(_check_early_stop_heuristic); with "never" the same, len being the max length when alpha > 0. The export
records it as decoding.beam_convention "transformers" / "transformers_heuristic" / "transformers_never", and
both hosts follow it (runtime/search.py, js/src/search.js; the hand-made cases are spec/cases/search.json's).

Here the tiny trained Marian fixture (tests/hf_fixtures.py builds it from a config, no model hub; its
generation_config.json has no early_stopping) is exported and held to generate() at beam 4 with 4
hypotheses, under each early_stopping and several length penalties; the other conventions are shown to
differ on the same sentences (the test can fail).
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
from seq2onnx.runtime.translator import Translator  # noqa: E402

SENTENCES = 200
BEAM = 4
EARLY_STOPPING = {"transformers": True, "transformers_heuristic": False, "transformers_never": "never"}


@pytest.fixture(scope="module")
def marian(tmp_path_factory) -> tuple[Path, Path]:
    """(the Marian fixture's directory, its bundle)."""
    root = tmp_path_factory.mktemp("early")
    model_dir = root / "model"
    shutil.copytree(F.cached_model("marian"), model_dir)
    generation = json.loads((model_dir / "generation_config.json").read_text(encoding="utf-8"))
    assert "early_stopping" not in generation
    return model_dir, export_hf_bundle(model_dir, root / "bundle", decoder="standard")


def _strip(row: list[int], pad: int, eos: int) -> list[int]:
    row = row[1:]
    while row and row[-1] == pad:
        row.pop()
    return row[:-1] if row and row[-1] == eos else row


def _generate(model_dir: Path, sources: list[str], **options) -> list[list[list[int]]]:
    """generate()'s BEAM hypotheses per sentence, as token_ids (no start, no end token)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    hf = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir)).eval()
    assert hf.generation_config.early_stopping in (None, False)  # OPUS-MT's: absent, which is False
    rows: list[list[int]] = []
    for i in range(0, len(sources), 50):
        batch = tok(sources[i : i + 50], return_tensors="pt", padding=True)
        with torch.no_grad():
            rows += hf.generate(**batch, num_beams=BEAM, num_return_sequences=BEAM, **options).tolist()
    return [
        [_strip(rows[BEAM * i + j], tok.pad_token_id, tok.eos_token_id) for j in range(BEAM)]
        for i in range(len(sources))
    ]


def _decode(bundle: Path, sources: list[str], **options) -> dict[str, list]:
    """Per beam_convention, the bundle's BEAM hypotheses per sentence (token_ids)."""
    meta = json.loads((bundle / "bundle.json").read_text())
    got = {}
    try:
        for convention in EARLY_STOPPING:
            meta["decoding"]["beam_convention"] = convention
            (bundle / "bundle.json").write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
            translator = Translator(bundle, device="cpu")
            results = translator.translate_batch(sources, beam_size=BEAM, num_hypotheses=BEAM, **options)
            got[convention] = [r.token_ids for r in results]
    finally:
        meta["decoding"]["beam_convention"] = "transformers_heuristic"
        (bundle / "bundle.json").write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
    return got


def _agreement(got: dict[str, list], want) -> dict[str, tuple[int, int]]:
    """Per beam_convention, (sentences whose n-best ids equal `want`'s, those whose best does)."""
    return {
        convention: (sum(g == w for g, w in zip(rows, want)), sum(g[0] == w[0] for g, w in zip(rows, want)))
        for convention, rows in got.items()
    }


@pytest.mark.slow
def test_the_model_s_own_generate_is_the_bundle_s(marian):
    """The export records early_stopping False as transformers_heuristic; with the bundle's defaults (beam 4,
    length penalty 1, max length 63 + start) every sentence's 4 hypotheses are generate()'s own, with the
    model's generation config as it is. The old rule (stop at K finished) differs on some best hypotheses
    and more n-best."""
    model_dir, bundle = marian
    decoding = json.loads((bundle / "bundle.json").read_text())["decoding"]
    assert decoding["beam_convention"] == "transformers_heuristic" and decoding["beam_size"] == BEAM
    sources = F.test_sentences(SENTENCES)
    want = _generate(model_dir, sources)
    agree = _agreement(_decode(bundle, sources), want)
    assert agree["transformers_heuristic"] == (SENTENCES, SENTENCES), agree
    assert agree["transformers"][1] < SENTENCES and agree["transformers"][0] < agree["transformers"][1], agree


@pytest.mark.slow
@pytest.mark.parametrize("length_penalty", [2.0, -0.5])
def test_each_early_stopping_is_its_convention_s(marian, length_penalty):
    """generate(early_stopping=x, length_penalty=a) is the bundle's search under x's convention, and only
    under it ("never" judges at the max length when a > 0, so it differs from the heuristic there; at
    a <= 0 they are one rule)."""
    model_dir, bundle = marian
    sources = F.test_sentences(SENTENCES)
    got = _decode(bundle, sources, length_penalty=length_penalty)  # each convention's, decoded once
    for convention, early_stopping in EARLY_STOPPING.items():
        want = _generate(model_dir, sources, early_stopping=early_stopping, length_penalty=length_penalty)
        agree = _agreement(got, want)
        assert agree[convention] == (SENTENCES, SENTENCES), (convention, agree)
        for other, counts in agree.items():
            pair = {convention, other}
            same_rule = pair == {"transformers_heuristic", "transformers_never"} and length_penalty <= 0
            if other != convention and not same_rule:
                assert counts[0] < SENTENCES, (convention, other, agree)


@pytest.mark.slow
def test_node_host_stops_as_the_python_runtime(marian):
    from seq2onnx.commands.verify_host import verify_host

    _, bundle = marian
    report = verify_host(bundle, F.test_sentences(60), beam=BEAM)
    assert report["passed"], ([c for c in report["checks"] if not c["passed"]], report["differences"][:3])


def test_early_stopping_names_the_convention():
    config = {"eos_token_id": 0}
    values = {
        "absent": {},
        "true": {"early_stopping": True},
        "false": {"early_stopping": False},
        "never": {"early_stopping": "never"},
    }
    convention = {
        key: decoding_defaults(generation, config, 512)["beam_convention"]
        for key, generation in values.items()
    }
    assert convention == {
        "absent": "transformers_heuristic",
        "true": "transformers",
        "false": "transformers_heuristic",
        "never": "transformers_never",
    }
    assert decoding_defaults({}, {**config, "early_stopping": True}, 512)["beam_convention"] == "transformers"
    with pytest.raises(HFImportError, match="early_stopping 'sometimes' is not one of true, false"):
        decoding_defaults({"early_stopping": "sometimes"}, config, 512)


def test_conventions_are_the_spec_s_and_early_stopping_covers_them():
    from seq2onnx.runtime.beam import beam_search
    from seq2onnx.runtime.search import BEAM_CONVENTIONS, EARLY_STOPPING as RUNTIME
    from seq2onnx.runtime.spec import SPEC

    assert list(BEAM_CONVENTIONS) == list(RUNTIME) == SPEC["beam_conventions"]
    assert RUNTIME == {"fairseq": True, **EARLY_STOPPING}
    names = {
        case.get("convention", "fairseq")
        for case in json.loads(
            (Path(__file__).resolve().parents[1] / "spec" / "cases" / "search.json").read_text()
        )["cases"]
        if case["search"] == "beam"
    }
    assert names == set(BEAM_CONVENTIONS)  # a shared case for every convention
    with pytest.raises(
        ValueError, match="convention='hf'; choose one of fairseq, transformers, transformers_heur"
    ):
        beam_search(lambda *a: None, 1, beam_size=2, start_id=0, eos_id=1, max_lengths=[3], convention="hf")
