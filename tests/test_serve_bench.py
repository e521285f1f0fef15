"""scripts/serve_ct2.py and serve_identity.py (issue 26): CTranslate2 behind the serving front end decodes as our
runtime does, and serve_identity runs end to end on the tiny bundle with a real server process."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiny import scratch, tiny_bundle, tiny_run
from extras import require

require("ctranslate2", "bench")
require("httpx", "bench")
require("fastapi", "serve")

BENCHMARKS = Path(__file__).resolve().parents[1] / "scripts"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_bench", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ct2_model() -> Path:
    """The tiny run's CTranslate2 model, converted as `seq2onnx bench` converts it."""
    from seq2onnx.export.ctranslate2.convert import convert_checkpoint

    return convert_checkpoint(tiny_run() / "last", scratch("ct2") / "ct2")


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    from seq2onnx.export.parity import test_sentences

    return [src for src, _ in test_sentences(tiny_run() / "last", 8)]


@pytest.fixture(scope="module")
def data(sentences) -> Path:
    """A Tatoeba-shaped TSV (target, source, attribution): the source in column 1, as in cmn.txt."""
    path = scratch("serve-data") / "pairs.txt"
    path.write_text("".join(f"t{i}\t{s}\tattribution\n" for i, s in enumerate(sentences)), encoding="utf-8")
    return path


@pytest.mark.parametrize("beam", [1, 4])
def test_ct2_engine_gives_the_runtimes_tokens_and_scores(ct2_model, sentences, beam):
    from seq2onnx.runtime.translator import Translator

    tr = Translator(tiny_bundle(), device="cpu", intra_threads=1)
    engine = _module("serve_ct2").CT2Engine(tr, ct2_model, inter_threads=1, intra_threads=1)
    try:
        options = engine.check({"beam_size": beam, "return_scores": True})
        got = engine.submit(sentences + [""], options).future.result(timeout=60)
        want = tr.translate_batch(sentences + [""], beam_size=beam, return_scores=True)
        assert [g.token_ids for g in got] == [w.token_ids for w in want]
        assert [g.hypotheses for g in got] == [w.hypotheses for w in want]
        for g, w in zip(got, want):
            assert g.scores == pytest.approx(w.scores, abs=1e-3)
        assert engine.load() == {"active_requests": 0, "active_sentences": 0, "active_rows": 0}
        assert "".join(
            engine.stream(sentences[0], engine.check({"beam_size": 1}), _module("serve_ct2").Job())
        ) == tr.translate(sentences[0], beam_size=1)
    finally:
        engine.close()


def test_ct2_engine_refuses_what_it_cannot_honour(ct2_model):
    from seq2onnx.runtime.translator import Translator

    engine = _module("serve_ct2").CT2Engine(
        Translator(tiny_bundle(), device="cpu", intra_threads=1), ct2_model, inter_threads=1, intra_threads=1
    )
    try:
        with pytest.raises(
            ValueError, match="sampling_temperature=0.5: the CTranslate2 engine cannot honour it"
        ):
            engine.check({"sampling_temperature": 0.5})
        with pytest.raises(ValueError, match="return_attention=True"):
            engine.check({"return_attention": True})
        with pytest.raises(ValueError, match="beam_size=0"):
            engine.check({"beam_size": 0})
    finally:
        engine.close()
    with pytest.raises(ValueError, match="model.bin does not exist"):
        _module("serve_ct2").CT2Engine(
            Translator(tiny_bundle(), device="cpu", intra_threads=1), scratch("no-ct2")
        )
    other = scratch("other-ct2") / "ct2"
    shutil.copytree(ct2_model, other)
    (other / "seq2onnx-ct2.json").write_text(json.dumps({"source_checkpoint": "step-00000001"}))
    with pytest.raises(
        ValueError, match="exported from checkpoint step-00000001, the bundle from step-00000300"
    ):
        _module("serve_ct2").CT2Engine(Translator(tiny_bundle(), device="cpu", intra_threads=1), other)


def test_ct2_server_without_a_model_asks_for_one_or_echo(capsys):
    assert _module("serve_ct2").main([str(tiny_bundle()), "--port", "0"]) == 2
    assert (
        "give CT2_MODEL_DIR (seq2onnx export CKPT DIR --format ctranslate2), or --echo"
        in capsys.readouterr().err
    )


def _run(script: str, *args, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_scripts_refuse_a_non_empty_out_before_any_server_starts(data, capsys):
    out = scratch("serve-identity-full") / "out"
    out.mkdir(parents=True)
    (out / "kept.txt").write_text("mine")
    argv = [str(tiny_bundle()), "--out", str(out), "--data", str(data), "--src-col", "1", "--sentences", "8"]
    assert _module("serve_identity").main(argv) == 2
    assert "exists and is not empty: choose another --out or pass --force" in capsys.readouterr().err
    assert (out / "kept.txt").read_text() == "mine" and not (out / "logs").exists()


@pytest.mark.slow
def test_serve_identity_counts_and_lists_differences(data, sentences):
    out = scratch("serve-identity") / "out"
    r = _run(
        "serve_identity.py",
        tiny_bundle(),
        "--out",
        out,
        "--sentences",
        8,
        "--clients",
        2,
        "--data",
        data,
        "--src-col",
        1,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "identity.json").read_text())
    assert set(report["results"]) == {"greedy", "beam4"}
    for label, res in report["results"].items():
        assert res["total"] == 8 and res["errors"] == []
        assert res["identical"] + len(res["differences"]) == 8
        assert f"{label}: {res['identical']}/8 identical" in r.stdout
        for d in res["differences"]:
            assert d["source"] in sentences and d["served"]["token_ids"] != d["alone"]["token_ids"]
            assert isinstance(d["served"]["score"], float) and isinstance(d["alone"]["score"], float)
    assert r.stdout == (out / "identity.txt").read_text() + "\n"


def test_identity_report_shows_both_answers_of_each_difference():
    from seq2onnx.runtime.translator import TranslationResult

    identity = _module("serve_identity")
    served = [
        {"hypotheses": ["a b"], "token_ids": [[5, 6]], "scores": [-1.5]},
        {"hypotheses": ["c"], "token_ids": [[7]], "scores": [-0.5]},
        {"error": "HTTP 503: full"},
    ]
    alone = [
        TranslationResult(["a b"], [[5, 6]], [-1.5]),
        TranslationResult(["d"], [[8]], [-0.25]),
        TranslationResult(["e"], [[9]], [-2.0]),
    ]
    result = identity.compare(["s0", "s1", "s2"], served, alone)
    assert result["total"] == 3 and result["identical"] == 1 and len(result["errors"]) == 1
    assert result["differences"] == [
        {
            "index": 1,
            "source": "s1",
            "served": {"hypothesis": "c", "token_ids": [7], "score": -0.5},
            "alone": {"hypothesis": "d", "token_ids": [8], "score": -0.25},
        }
    ]
    text = identity.as_text(
        {"batching": "continuous", "sentences": 3, "clients": 2, "results": {"greedy": result}}
    )
    assert "greedy: 1/3 identical, 1 differ, 1 failed requests" in text
    assert "[greedy #1] s1\n  served: 'c' score -0.5\n  alone:  'd' score -0.25" in text
    assert "[greedy #2] request failed: HTTP 503: full" in text
