"""export --format ctranslate2: a directory a host runs with ctranslate2 + sentencepiece alone, and
`verify` of it against the PyTorch reference (docs/ctranslate2.md)."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import ENV, REPO, cli_here  # ENV: one OpenMP thread, as CTranslate2 needs here
from tiny import scratch, tiny_run

from seq2onnx.atomic import MARKER
from seq2onnx.export.ctranslate2.convert import DEPLOY_JSON, ct2_available

HAVE_CT2, WHY = ct2_available()
if not HAVE_CT2:
    pytest.skip(WHY, allow_module_level=True)

import torch  # noqa: E402

from seq2onnx.export.bundle import DECODING_DEFAULTS  # noqa: E402
from seq2onnx.export.ctranslate2.convert import build_spec, export_ctranslate2  # noqa: E402
from seq2onnx.export.ctranslate2.verify import TIE, read_recipe, verify_ct2  # noqa: E402
from seq2onnx.export.parity import test_sentences as split_sentences  # noqa: E402
from seq2onnx.model import checkpoint  # noqa: E402
from seq2onnx.model.search import translate_ids  # noqa: E402

CT2_FILES = {
    "model.bin",
    "config.json",
    "source_vocabulary.json",
    "target_vocabulary.json",
    "source.spm.model",
    "target.spm.model",
    DEPLOY_JSON,
    MARKER,
}


def ckpt() -> Path:
    return tiny_run() / "last"


@functools.lru_cache(maxsize=None)
def exported() -> Path:
    """The tiny model's CTranslate2 directory, exported once per process (tests must not change it)."""
    return export_ctranslate2(ckpt(), scratch("ct2") / "model")


def damaged_copy(scale: float) -> Path:
    """A copy of exported() whose model.bin has noise of `scale` added to one decoder feed-forward
    weight (seeded; noise, not a constant, which LayerNorm could cancel)."""
    model, tok, _ = checkpoint.load(ckpt())
    with torch.no_grad():
        weight = model.decoder_layers[0].feed_forward.w_1.weight
        weight.add_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)) * scale)
    spec = build_spec(model, tok)
    spec.validate()
    spec.optimize(quantization=None)
    out = scratch("ct2-damaged") / "model"
    shutil.copytree(exported(), out)
    with tempfile.TemporaryDirectory() as tmp:
        spec.save(tmp)
        shutil.copyfile(Path(tmp) / "model.bin", out / "model.bin")
    return out


def reference(beam_size: int) -> tuple[list[str], list[list[int]]]:
    """The test sentences and the PyTorch reference's ids for them (end token dropped)."""
    model, tok, ckpt_dir = checkpoint.load(ckpt())
    texts = [s for s, _ in split_sentences(ckpt_dir, 50)]
    hyps = translate_ids(
        model, [tok.encode_source(t)[: model.cfg.max_positions] for t in texts], beam_size=beam_size
    )
    eos = model.cfg.eos_id
    return texts, [h[0].tokens[:-1] if h[0].tokens[-1:] == [eos] else h[0].tokens for h in hyps]


@pytest.mark.slow
def test_export_writes_the_directory_and_refuses_to_overwrite_without_force():
    out = scratch("ct2-cli") / "model"
    r = cli_here("export", "--format", "ctranslate2", str(ckpt()), str(out))
    assert r.returncode == 0, r.stderr
    assert {p.name for p in out.iterdir()} == CT2_FILES
    # nothing left beside it: no temporary directory, no lock
    assert [p.name for p in out.parent.iterdir()] == ["model"]
    config = json.loads((out / "config.json").read_text())
    assert (
        config["decoder_start_token"] == "<s>"
        and config["eos_token"] == "</s>"
        and config["add_source_eos"] is False
    )
    recipe = json.loads((out / DEPLOY_JSON).read_text())
    cfg = json.loads((ckpt() / "config.json").read_text())
    assert recipe["source"]["append"] == ["</s>"] and recipe["target"]["target_prefix"] is None
    assert recipe["translate_batch"] == {
        "beam_size": DECODING_DEFAULTS["beam_size"],
        "length_penalty": DECODING_DEFAULTS["length_penalty"],
        "min_decoding_length": DECODING_DEFAULTS["min_length"],
        "max_input_length": cfg["max_positions"],
    }
    assert recipe["max_decoding_length"]["a"] == DECODING_DEFAULTS["max_length_a"]
    assert recipe["max_decoding_length"]["max"] == cfg["max_positions"]
    for name in ("source.spm.model", "target.spm.model"):
        assert (out / name).read_bytes() == (ckpt().resolve() / name).read_bytes()

    before = (out / "model.bin").stat().st_mtime_ns
    r = cli_here("export", "--format", "ctranslate2", str(ckpt()), str(out))
    assert r.returncode == 1 and "already exists; pass --force" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert (out / "model.bin").stat().st_mtime_ns == before

    (out / "stale").write_text("from before")
    r = cli_here("export", "--format", "ctranslate2", str(ckpt()), str(out), "--force")
    assert r.returncode == 0, r.stderr
    assert {p.name for p in out.iterdir()} == CT2_FILES  # replaced whole, not merged


@pytest.mark.slow
def test_onnx_options_are_refused_for_ctranslate2():
    out = scratch("ct2-opts") / "model"
    r = cli_here(
        "export",
        "--format",
        "ctranslate2",
        str(ckpt()),
        str(out),
        "--dtype",
        "float16",
        "--decoder",
        "standard",
    )
    assert r.returncode == 1
    line = r.stderr.strip()
    assert "--dtype, --decoder apply to ONNX bundles only" in line and "compute_type" in line, line
    assert not out.exists()


DEPLOY_GREEDY = """
import json, sys
import ctranslate2, sentencepiece as spm

model_dir, texts = sys.argv[1], json.load(sys.stdin)
recipe = json.load(open(f"{model_dir}/seq2onnx-ct2.json"))
source = spm.SentencePieceProcessor(model_file=f"{model_dir}/{recipe['source']['tokenizer']}")
target = spm.SentencePieceProcessor(model_file=f"{model_dir}/{recipe['target']['tokenizer']}")
translator = ctranslate2.Translator(model_dir, device="cpu", compute_type="float32")
rule, options = recipe["max_decoding_length"], recipe["translate_batch"]
ids = []
for text in texts:
    pieces = source.encode(text, out_type=str) + recipe["source"]["append"]
    limit = min(int(rule["a"] * min(len(pieces), options["max_input_length"])) + rule["b"], rule["max"])
    result = translator.translate_batch([pieces], max_decoding_length=limit, **{**options, "beam_size": 1})[0]
    ids.append([target.piece_to_id(p) for p in result.hypotheses[0]])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "seq2onnx", "onnxruntime"))
print(json.dumps({"ids": ids, "heavy": heavy}))
"""


@pytest.mark.slow
def test_a_fresh_translator_with_only_sentencepiece_gives_pytorch_greedy_ids():
    texts, want = reference(beam_size=1)
    # -I: no script directory, PYTHONPATH or user site on the path; the repo is not the cwd either
    r = subprocess.run(
        [sys.executable, "-I", "-c", DEPLOY_GREEDY, str(exported())],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tempfile.gettempdir(),
        env=ENV,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["heavy"] == []
    assert got["ids"] == want
    assert len({len(w) for w in want}) > 1  # outputs of several lengths: the end token was found


def docs_snippet() -> str:
    text = (REPO / "docs" / "ctranslate2.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1, (
        "docs/ctranslate2.md should hold exactly one python block: the deployment snippet"
    )
    assert 'model_dir = "ct2/mine"' in blocks[0]
    return blocks[0]


@pytest.mark.slow
def test_the_docs_snippet_translates_as_pytorch_beam_search():
    texts, want = reference(beam_size=DECODING_DEFAULTS["beam_size"])
    _, tok, _ = checkpoint.load(ckpt())
    snippet = docs_snippet().replace('"ct2/mine"', repr(str(exported())))
    r = subprocess.run(
        [sys.executable, "-I", "-c", snippet],
        input="".join(t + "\n" for t in texts),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tempfile.gettempdir(),
        env=ENV,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [tok.decode_target(w) for w in want]


@pytest.mark.slow
def test_verify_passes_for_the_exported_model(tmp_path):
    report_path = tmp_path / "report.json"
    r = cli_here("verify", str(ckpt()), str(exported()), "--json", str(report_path))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "PASSED" and "FAIL" not in r.stdout
    rows = {tuple(line.split()[:2]): line for line in lines if line.startswith("tokens ")}
    assert set(rows) == {("tokens", "greedy"), ("tokens", "beam")}
    assert ">= 100.0%" in rows["tokens", "greedy"] and ">= 99.5%" in rows["tokens", "beam"]
    report = json.loads(report_path.read_text())
    assert report["format"] == "ctranslate2" and report["sentences"] == 50 and report["recipe_changes"] == []
    assert [(c["search"], c["value"], c["bound"]) for c in report["checks"]] == [
        ("greedy", 1.0, 1.0),
        ("beam 4", 1.0, 0.995),
    ]
    assert report["differences"] == []
    scores = [m for m in report["measurements"] if m["tier"] == "score"]
    assert len(scores) == 2 and all(m["value"] < 1e-4 for m in scores)  # same weights: float noise only


@pytest.mark.slow
def test_verify_fails_on_a_perturbed_weight_and_shows_both_scores(tmp_path):
    report_path = tmp_path / "report.json"
    r = cli_here("verify", str(ckpt()), str(damaged_copy(0.2)), "--json", str(report_path))
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1].startswith("FAILED") and "FAIL " in r.stdout
    report = json.loads(report_path.read_text())
    assert not report["passed"] and not report["checks"][0]["passed"]  # greedy
    diffs = report["differences"]
    assert diffs
    for d in diffs:
        assert d["torch"]["tokens"] != d["ct2"]["tokens"]
        for side in ("torch", "ct2"):
            assert d[side]["torch_score"] == pytest.approx(sum(d[side]["torch_log_probs"]))
    # the diagnosis: on the same tokens the engines disagree, which no near-tie explains
    assert any(d["engine_disagreement"] > TIE and "compute differently" in d["kind"] for d in diffs)
    first = diffs[0]
    assert f"{first['search']} sentence {first['index']}: gap" in r.stdout
    assert (
        f"{first['torch']['torch_score']:.4f}" in r.stdout
        and f"{first['ct2']['torch_score']:.4f}" in r.stdout
    )


@pytest.mark.slow
def test_verify_names_a_recipe_that_departs_from_the_convention():
    """length_penalty 0 in the recipe: CTranslate2 ranks by raw score (and stops early); PyTorch keeps
    the convention's 1.0. Same weights, so every difference is a search difference, not a near-tie."""
    out = scratch("ct2-recipe") / "model"
    shutil.copytree(exported(), out)
    recipe = json.loads((out / DEPLOY_JSON).read_text())
    recipe["translate_batch"]["length_penalty"] = 0.0
    (out / DEPLOY_JSON).write_text(json.dumps(recipe))
    report = verify_ct2(ckpt(), out, sentences=50)
    assert report["recipe_changes"] == ["translate_batch.length_penalty 0.0 (the convention: 1.0)"]
    greedy, beam = report["checks"]
    assert greedy["passed"] and not beam["passed"]  # greedy ignores the length penalty
    assert report["differences"] and all(d["search"] == "beam 4" for d in report["differences"])
    for d in report["differences"]:
        assert d["engine_disagreement"] <= TIE, d
    assert any(d["kind"].startswith("NOT a near-tie; same log-probabilities") for d in report["differences"])


def test_verify_of_a_ctranslate2_directory_without_the_recipe_says_how_to_fix_it():
    out = scratch("ct2-norecipe") / "model"
    shutil.copytree(exported(), out)
    (out / DEPLOY_JSON).unlink()
    with pytest.raises(ValueError, match="export --format ctranslate2"):
        read_recipe(out)
