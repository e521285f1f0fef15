"""Hugging Face Marian and M2M100 directories -> bundles, held to transformers' own output (issue 25).

The models are tiny, built from configs and trained for a few hundred steps in the test
(tests/hf_fixtures.py): no hub, no download. Each bundle is verified against transformers in
float64 by export/hf/verify.py, the code behind `seq2onnx verify MODEL_DIR BUNDLE`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from extras import require

require("transformers", "hf")

import hf_fixtures as F  # noqa: E402
from helpers import cli_here  # noqa: E402
from seq2onnx.commands.main import main  # noqa: E402
from seq2onnx.export.hf.bundle import export_hf_bundle  # noqa: E402
from seq2onnx.export.hf.read import HFImportError  # noqa: E402
from seq2onnx.export.hf.verify import verify_hf  # noqa: E402
from seq2onnx.runtime.translator import Translator  # noqa: E402

SENTENCES = 40


@pytest.fixture(scope="module")
def sentences_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf") / "sentences.txt"
    path.write_text("\n".join(F.test_sentences(SENTENCES)) + "\n", encoding="utf-8")
    return path


def _export(tmp_path_factory, model_dir: Path, **options) -> Path:
    return export_hf_bundle(model_dir, tmp_path_factory.mktemp("bundle") / "b", **options)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One export per model and options for the module (a verify and the Node host's run read the same)."""
    return F.export_cache(tmp_path_factory)


def _failed(report: dict) -> list[str]:
    return [
        f"{c['decoder']} {c['name']}: {c['value']} vs {c['bound']} ({c['detail']})"
        for c in report["checks"]
        if c["judged"] and not c["passed"]
    ]


def _check(report: dict, name: str, decoder: str) -> dict:
    [found] = [c for c in report["checks"] if c["name"] == name and c["decoder"] == decoder]
    return found


@pytest.mark.parametrize(
    "options",
    [
        {"shared_vocab": True, "activation": "swish"},  # OPUS-MT's own shape
        {"shared_vocab": False, "activation": "relu"},  # separate vocabularies and embeddings
    ],
    ids=["shared-swish", "separate-relu"],
)
@pytest.mark.slow
def test_marian_bundle_matches_transformers(exported, sentences_file, options):
    model_dir = F.cached_model("marian", **options)
    bundle = exported(model_dir)
    meta = json.loads((bundle / "bundle.json").read_text())
    assert meta["model"]["activation"] == options["activation"]
    assert meta["model"]["share_vocab"] is options["shared_vocab"]
    assert meta["model"]["logits_bias"] is True and meta["model"]["pre_norm"] is False
    assert meta["special_ids"]["decoder_start"] == meta["special_ids"]["pad"]  # Marian starts from pad
    assert meta["model"]["suppressed_ids"] == [
        meta["special_ids"]["pad"]
    ]  # generation_config's bad_words_ids
    assert meta["model"]["renormalize"] is True  # and its renormalize_logits, as OPUS-MT sets
    report = verify_hf(model_dir, bundle, data=str(sentences_file), sentences=SENTENCES, tensor_sentences=10)
    assert report["passed"], _failed(report)
    for decoder in ("standard", "fused"):
        assert _check(report, "greedy ids identical to generate()", decoder)["value"] == 1.0
        assert _check(report, "beam 4 ids identical to generate()", decoder)["value"] >= 0.995
        assert _check(report, "texts identical to batch_decode", decoder)["value"] == 1.0
        assert _check(report, "decoder log_probs (teacher-forced)", decoder)["value"] < 1e-4
    assert _check(report, "source ids identical to the tokenizer's", "")["value"] == 1.0


@pytest.mark.slow
def test_marian_ids_are_not_sentencepiece_ids(exported):
    """The importer maps pieces through the tokenizer's vocabulary: a bundle that fed SentencePiece's own ids
    would translate garbage, and the map file says so."""
    model_dir = F.cached_model("marian")
    bundle = exported(model_dir)
    source_map = np.frombuffer((bundle / "source.vocab.bin").read_bytes(), dtype="<i4")
    assert (source_map != np.arange(source_map.size)).any()
    t = Translator(bundle, device="cpu")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    text = F.test_sentences(1)[0]
    assert t.prepare_source(text)[0] == tok(text).input_ids


@pytest.mark.slow
def test_m2m100_forced_target_language(exported, sentences_file):
    model_dir = F.cached_model("m2m100")
    bundle = exported(model_dir)
    meta = json.loads((bundle / "bundle.json").read_text())
    assert (
        meta["model"]["pre_norm"] is True
        and meta["special_ids"]["decoder_start"] == meta["special_ids"]["eos"]
    )
    assert {"fr", "de"} <= set(meta["tokens"]["languages"])
    for lang in ("fr", "de"):
        report = verify_hf(
            model_dir,
            bundle,
            data=str(sentences_file),
            sentences=SENTENCES,
            tensor_sentences=5,
            source_lang="en",
            target_lang=lang,
        )
        assert report["passed"], (lang, _failed(report))
    t = Translator(bundle, device="cpu")
    text = F.test_sentences(3)[2]
    fr, de = (
        t.translate_batch([text], target_lang=lang, beam_size=1, return_scores=True)[0]
        for lang in ("fr", "de")
    )
    assert (
        fr.token_ids[0][0] == meta["tokens"]["languages"]["fr"]
        and de.token_ids[0][0] == meta["tokens"]["languages"]["de"]
    )
    assert fr.hypotheses[0] != de.hypotheses[0]
    # target_prefix gives the same as target_lang, and the forced token adds 0 to the score
    by_prefix = t.translate_batch(
        [text], target_prefix=[[meta["tokens"]["languages"]["fr"]]], beam_size=1, return_scores=True
    )[0]
    assert by_prefix.token_ids == fr.token_ids and by_prefix.scores == pytest.approx(fr.scores)
    with pytest.raises(ValueError, match="'xx' is not a language of this model; choose one of"):
        t.translate_batch([text], target_lang="xx")
    with pytest.raises(ValueError, match="target_prefix has 2 entries for 1 sources"):
        t.translate_batch([text], target_prefix=[[5], [6]])
    with pytest.raises(ValueError, match="or the end token"):
        t.translate_batch([text], target_prefix=[[meta["special_ids"]["eos"]]])


@pytest.mark.slow
def test_int8_bundle_is_judged_by_its_own_bounds(tmp_path_factory, sentences_file):
    model_dir = F.cached_model("marian")
    bundle = _export(tmp_path_factory, model_dir, quantize="int8")
    report = verify_hf(model_dir, bundle, data=str(sentences_file), sentences=SENTENCES, tensor_sentences=5)
    assert report["passed"], _failed(report)
    assert _check(report, "greedy ids identical to generate()", "standard")["value"] >= 0.8
    assert all(not c["judged"] for c in report["checks"] if c["tier"] == "tensor")


@pytest.mark.parametrize(
    "how, words",
    [
        ("unknown_model_type", ["config.json", "model_type 'bart' is not supported", "marian", "m2m_100"]),
        ("missing_weights", ["no weights", "model.safetensors", "save_pretrained"]),
        ("vocab_mismatch", ["config.json", "vocab_size is", "rows", "set vocab_size to"]),
        pytest.param(  # the check reads the tokenizer first: ~3 s
            "tokenizer_mismatch",
            ["source.spm", "not in the tokenizer's vocabulary", "vocab.json"],
            marks=pytest.mark.slow,
        ),
    ],
)
def test_damaged_directory_is_one_line_and_writes_nothing(tmp_path, capsys, how, words):
    """`seq2onnx export` in this process (the command as a child process, with its exit status, is
    test_hf_nllb's, test_hf_mbart's and test_hf_t5's refusals)."""
    broken = tmp_path / "model"
    shutil.copytree(F.cached_model("marian", train_steps=0), broken)
    F.damage(broken, how)
    out = tmp_path / "bundle"
    assert main(["export", str(broken), str(out)]) == 1
    stderr = capsys.readouterr().err
    errors = [line for line in stderr.splitlines() if line.startswith("seq2onnx export: error:")]
    assert len(errors) == 1, stderr
    for word in words:
        assert word in errors[0], errors[0]
    assert "unexpected" not in errors[0] and "Traceback" not in stderr
    assert not out.exists() and not any(p.name.startswith(".bundle") for p in tmp_path.iterdir())


def test_import_error_is_raised_before_anything_is_written(tmp_path):
    broken = tmp_path / "model"
    shutil.copytree(F.cached_model("m2m100", train_steps=0), broken)
    F.damage(broken, "unknown_model_type")
    with pytest.raises(HFImportError, match="model_type 'bart'"):
        export_hf_bundle(broken, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_cli_export_translate_and_verify(tmp_path, sentences_file, capsys):
    """The commands as a user types them: export, translate with a target language, verify (exit 0)."""
    model_dir = F.cached_model("m2m100")
    bundle = tmp_path / "bundle"
    cli = [sys.executable, "-m", "seq2onnx.commands"]
    done = cli_here("export", model_dir, bundle, "--decoder", "standard")  # torch's commands in this process
    assert done.returncode == 0, done.stderr
    text = F.test_sentences(1)[0]
    got = {
        lang: subprocess.run(
            [*cli, "translate", str(bundle), "--target-lang", lang, "--beam", "1"],
            input=text + "\n",
            capture_output=True,
            text=True,
            timeout=120,
        )
        for lang in ("fr", "de")
    }
    assert all(r.returncode == 0 for r in got.values()), [r.stderr for r in got.values()]
    assert got["fr"].stdout != got["de"].stdout and got["fr"].stdout.strip()
    # the refusals in this process: their exit status and message are the command's, no child needed
    (tmp_path / "in.txt").write_text(text + "\n", encoding="utf-8")
    assert main(["translate", str(bundle), "--target-lang", "xx", "-i", str(tmp_path / "in.txt")]) == 1
    assert "--target-lang 'xx' is not a language of this model" in capsys.readouterr().err
    verified = cli_here(
        "verify",
        model_dir,
        bundle,
        "--data",
        sentences_file,
        "--quiet",
        "--sentences",
        "10",
        "--tensor-sentences",
        "2",
        "--target-lang",
        "de",
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.rstrip().endswith("PASSED")
    assert main(["verify", str(model_dir), str(bundle)]) == 1
    assert "give --data FILE" in capsys.readouterr().err


@pytest.mark.slow
def test_node_host_agrees_on_imported_bundles(exported, sentences_file):
    """verify-host: the Node host tokenizes through the maps and forces the language as the Python runtime does
    (both drive the standard decoder of the bundles the tests above verified)."""
    from seq2onnx.commands.verify_host import verify_host

    sentences = F.test_sentences(SENTENCES)
    marian = exported(F.cached_model("marian", shared_vocab=False, activation="relu"))
    m2m = exported(F.cached_model("m2m100"))
    for bundle, langs in ((marian, {}), (m2m, {"source_lang": "en", "target_lang": "de"})):
        report = verify_host(bundle, sentences, beam=4, **langs)
        failed = [c for c in report["checks"] if not c["passed"]]
        assert report["passed"], (bundle, failed, report["differences"][:3])


@pytest.mark.slow
def test_browser_translates_an_imported_bundle_as_python_does(tmp_path_factory, tmp_path):
    """One browser run (Chromium, onnxruntime-web) on an imported Marian bundle: the page's texts, ids and scores
    are the Python runtime's."""
    from test_web import _BROWSER_SKIP, drive_page

    if _BROWSER_SKIP:
        pytest.skip(_BROWSER_SKIP)
    from seq2onnx.commands.web import build_site

    bundle = _export(tmp_path_factory, F.cached_model("marian"), decoder="standard")
    site = build_site(bundle, tmp_path / "site")
    sentences = F.test_sentences(6)
    runs = [{"beamSize": 1, "numHypotheses": 1}, {"beamSize": 4, "numHypotheses": 2}]
    report, _ = drive_page(site, sentences, runs, tmp_path / "page.png")
    assert report["errors"] == [] and report["loadStatus"]["state"] == "ready", report
    translator = Translator(bundle, device="cpu", intra_threads=1)
    assert [r["beamSize"] for r in report["runs"]] == [
        1,
        4,
    ]  # both runs came back: the loop below checks each
    for run in report["runs"]:
        want = translator.translate_batch(
            sentences, beam_size=run["beamSize"], num_hypotheses=run["numHypotheses"], return_scores=True
        )
        assert len(run["results"]) == len(want) == len(sentences)
        for got, expected in zip(run["results"], want):
            assert [h["text"] for h in got["hypotheses"]] == expected.hypotheses
            assert [h["tokens"] for h in got["hypotheses"]] == expected.token_ids
            assert all(abs(h["score"] - s) <= 1e-4 for h, s in zip(got["hypotheses"], expected.scores))
