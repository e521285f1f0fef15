"""`seq2onnx web`: the static site it writes, and the page translating in a real browser.

The browser test serves the site with `python -m http.server` on 127.0.0.1, drives headless
Chromium with puppeteer-core (js/tools/drive-page.mjs, through seq2onnx.commands.browser_host, which
`seq2onnx verify-host --host browser` runs too): types the sentences, translates with beam 1
and beam 4 (n-best of 4), reads the n-best back from the DOM and compares it with the Python
runtime on the same bundle: identical texts and token ids, scores within 1e-4, and no request
leaving the local server. It needs Debian's `chromium`, Node.js and `npm ci --prefix js`; without
them it skips with one line. The site tests need only `npm ci --prefix js` (the files to copy).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from seq2onnx.model.corpus import generate_pairs
from seq2onnx.errors import CommandError
from seq2onnx.runtime.translator import Translator
from seq2onnx.commands.browser_host import browser_skip_reason, drive_page  # noqa: F401 (other tests' import)
from seq2onnx.commands.web import add as add_web, build_site
from tiny import tiny_bundle

ROOT = Path(__file__).resolve().parents[1]
JS = ROOT / "js"
STANDARD_FILES = {"encoder", "decoder", "source_tokenizer", "target_tokenizer", "weights"}
# Generated sentences and two the corpus never has (accents: unknown pieces for the tiny model).
SENTENCES = [src for src, _ in generate_pairs(6, seed=5)] + ["Ünïcödé façade", "the cat dances in the box"]

_NO_MODULES = "js/node_modules is missing: run `npm ci --prefix js` to build and test the web site"
needs_modules = pytest.mark.skipif(not (JS / "node_modules" / "onnxruntime-web").is_dir(), reason=_NO_MODULES)
_BROWSER_SKIP = browser_skip_reason(JS)


@pytest.fixture(scope="module")
def bundle() -> Path:
    return tiny_bundle()


@pytest.fixture(scope="module")
def site(bundle, tmp_path_factory) -> Path:
    if not (JS / "node_modules" / "onnxruntime-web").is_dir():
        pytest.skip(_NO_MODULES)
    return build_site(bundle, tmp_path_factory.mktemp("web") / "site")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@needs_modules
def test_site_holds_the_page_host_wasm_and_standard_graphs(site, bundle):
    meta = json.loads((site / "bundle" / "bundle.json").read_text())
    original = json.loads((bundle / "bundle.json").read_text())
    # only what a browser runs: a fused decoder (com.microsoft kernels) stays out
    assert set(meta["files"]) == STANDARD_FILES
    assert set(meta["graphs"]) == {"encoder", "decoder"}
    assert meta["model"] == original["model"] and meta["decoding"] == original["decoding"]
    for key, entry in meta["files"].items():
        assert entry == original["files"][key]
        assert _sha256(site / "bundle" / entry["path"]) == entry["sha256"], key
    assert not list(site.rglob("*fused*"))
    assert not (site / "host" / "platform-node.js").exists() and not (site / "host" / "index.js").exists()
    # the host's names and limits: host/spec.js fetches ../spec/bundle.json, the repository's spec as it is
    assert (site / "host" / "spec.js").read_bytes() == (JS / "src" / "spec.js").read_bytes()
    assert (site / "spec" / "bundle.json").read_bytes() == (ROOT / "spec" / "bundle.json").read_bytes()
    assert (site / "ort" / "ort-wasm-simd-threaded.wasm").stat().st_size > 1_000_000


@needs_modules
def test_import_map_names_local_files_only(site):
    page = (site / "index.html").read_text()
    imports = json.loads(re.search(r'<script type="importmap">(.*?)</script>', page, re.S).group(1))[
        "imports"
    ]
    assert set(imports) == {"onnxruntime-web", "@sctg/sentencepiece-js", "fs", "buffer"}
    for name, target in imports.items():
        assert target.startswith("./") and (site / target).is_file(), (name, target)
    for path in [site / "index.html", site / "app.js", *(site / "host").iterdir()]:
        assert not re.search(r"https?://", path.read_text().replace("http://127.0.0.1", "")), path


@needs_modules
def test_existing_out_is_refused_without_force_and_replaced_with_it(bundle, tmp_path):
    out = tmp_path / "site"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    with pytest.raises(CommandError, match="exists; choose another OUT or pass --force"):
        build_site(bundle, out)
    assert (out / "stale.txt").exists()
    # --force replaces only what seq2onnx wrote: a folder of the user's is refused, and kept
    with pytest.raises(CommandError, match="non-empty directory that seq2onnx did not write"):
        build_site(bundle, out, force=True)
    assert (out / "stale.txt").read_text() == "old"
    (out / "stale.txt").unlink()
    build_site(bundle, out, force=True)  # an empty folder may be replaced
    (out / "stale.txt").write_text("old")  # a site of ours, with something added
    build_site(bundle, out, force=True)
    assert not (out / "stale.txt").exists() and (out / "index.html").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["site"]  # no temporary folder left beside it


@needs_modules
def test_out_that_would_replace_the_bundle_is_refused(bundle, tmp_path):
    copy = shutil.copytree(bundle, tmp_path / "bundle")
    for out in (copy, tmp_path, copy / "site"):
        with pytest.raises(CommandError, match="overlaps the bundle"):
            build_site(copy, out, force=True)
    assert (copy / "bundle.json").is_file()


def test_missing_node_modules_names_npm_ci(bundle, tmp_path):
    js = tmp_path / "js"
    shutil.copytree(JS / "src", js / "src")
    shutil.copytree(JS / "web", js / "web")
    shutil.copyfile(JS / "package.json", js / "package.json")
    with pytest.raises(CommandError, match=r"missing; install the JS dependencies first: npm ci --prefix"):
        build_site(bundle, tmp_path / "site", js_dir=js)
    assert not (tmp_path / "site").exists()
    with pytest.raises(CommandError, match="no JS host there"):
        build_site(bundle, tmp_path / "site", js_dir=tmp_path)
    (js / "src" / "spec.js").unlink()  # a host older than the spec it must read
    with pytest.raises(CommandError, match=r"the JS host lacks src/spec\.js; point it at the js/ folder"):
        build_site(bundle, tmp_path / "site", js_dir=js)
    assert not (tmp_path / "site").exists()


@needs_modules
def test_command_writes_the_site_and_says_how_to_serve_it(bundle, tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="seq2onnx")
    add_web(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["web", str(bundle), str(tmp_path / "site")])
    assert args.func(args) == 0
    assert "python -m http.server -d" in capsys.readouterr().out
    assert (tmp_path / "site" / "bundle" / "decoder.onnx").is_file()


@pytest.mark.slow
@pytest.mark.skipif(bool(_BROWSER_SKIP), reason=_BROWSER_SKIP)
def test_browser_translations_match_the_python_runtime(site, bundle, tmp_path):
    runs = [{"beamSize": 1, "numHypotheses": 1}, {"beamSize": 4, "numHypotheses": 4}]
    screenshot = tmp_path / "page.png"
    report, url = drive_page(site, SENTENCES, runs, screenshot)
    assert report["loadStatus"]["state"] == "ready", report["loadStatus"]
    assert report["errors"] == []
    assert report["requests"] and all(r.startswith(url) for r in report["requests"]), report["requests"]
    translator = Translator(bundle, device="cpu", intra_threads=1)
    for run in report["runs"]:
        beam, n = run["beamSize"], run["numHypotheses"]
        assert run["status"]["state"] == "done", run["status"]
        expected = translator.translate_batch(
            SENTENCES, beam_size=beam, num_hypotheses=n, return_scores=True, return_attention=True
        )
        assert [r["source"] for r in run["results"]] == SENTENCES
        # the heatmaps: each source's best hypothesis, the Python runtime's attention within 1e-4
        assert [a["index"] for a in run["attention"]] == list(range(len(SENTENCES)))
        for text, drawn, want in zip(SENTENCES, run["attention"], expected):
            pieces = translator.source_tokenizer.encode(
                text, out_type=str
            )  # unknown pieces as typed, not <unk>
            assert drawn["sourcePieces"] == [p or "·" for p in pieces] + ["</s>"]
            assert drawn["rows"] == len(want.token_ids[0])
            np.testing.assert_allclose(
                np.array(drawn["weights"]).reshape(want.attention[0].shape), want.attention[0], atol=1e-4
            )
        for got, want in zip(run["results"], expected):
            hyps = got["hypotheses"]
            assert [h["text"] for h in hyps] == want.hypotheses, (beam, got["source"])
            assert [h["tokens"] for h in hyps] == want.token_ids, (beam, got["source"])
            for h, score in zip(hyps, want.scores):
                assert abs(h["score"] - score) <= 1e-4, (beam, got["source"], h["score"], score)
                assert h["shown"] == f"{h['score']:.4f}"
    assert [r["beamSize"] for r in report["runs"]] == [1, 4]
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")


def test_the_site_carries_every_module_the_browser_host_imports():
    """Each relative import of the host files the site carries is one of them: a module added to js/src and
    imported by the translator but left out of HOST_FILES would leave the page loading for ever."""
    import re

    from seq2onnx.commands.web import HOST_FILES

    for name in HOST_FILES:
        text = (JS / "src" / name).read_text(encoding="utf-8")
        imported = set(re.findall(r"""(?:from|import)\s*\(?\s*["']\./([\w.-]+\.js)["']""", text))
        assert imported <= set(HOST_FILES), (name, sorted(imported - set(HOST_FILES)))


@pytest.mark.slow
@pytest.mark.skipif(bool(_BROWSER_SKIP), reason=_BROWSER_SKIP)
def test_a_multilingual_model_gets_language_fields_that_choose_the_target(tmp_path):
    """An NLLB bundle's page shows source and target language fields; the target typed there is the one
    translated into, as the Python runtime's target_lang (the tiny bundle's page shows none: above)."""
    import hf_nllb as N

    from seq2onnx.export.hf.bundle import export_hf_bundle

    bundle = export_hf_bundle(N.cached_nllb(with_spm=True), tmp_path / "bundle", decoder="standard")
    site = build_site(bundle, tmp_path / "site")
    sentences = SENTENCES[:3]
    runs = [{"beamSize": 1, "numHypotheses": 1, "targetLang": code} for code in ("fra_Latn", "deu_Latn")]
    report, _ = drive_page(site, sentences, runs, tmp_path / "page.png")
    assert report["loadStatus"]["state"] == "ready", report["loadStatus"]
    assert report["languageFields"] == 2 and report["errors"] == []
    translator = Translator(bundle, device="cpu", intra_threads=1)
    got = {}
    for run in report["runs"]:
        assert run["status"]["state"] == "done", run["status"]
        want = translator.translate_batch(sentences, beam_size=1, target_lang=run["targetLang"])
        got[run["targetLang"]] = [r["hypotheses"][0]["tokens"] for r in run["results"]]
        assert got[run["targetLang"]] == [w.token_ids[0] for w in want]
    assert got["fra_Latn"] != got["deu_Latn"]  # the field chose the language
