"""scripts/serve_ct2.py, serve_load.py and serve_identity.py (issue 26): CTranslate2 behind the serving front end
decodes as our runtime does, and both scripts run end to end on the tiny bundle with real server processes."""
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
        assert "".join(engine.stream(sentences[0], engine.check({"beam_size": 1}), _module("serve_ct2").Job())) == \
            tr.translate(sentences[0], beam_size=1)
    finally:
        engine.close()


def test_ct2_engine_refuses_what_it_cannot_honour(ct2_model):
    from seq2onnx.runtime.translator import Translator

    engine = _module("serve_ct2").CT2Engine(Translator(tiny_bundle(), device="cpu", intra_threads=1), ct2_model,
                                            inter_threads=1, intra_threads=1)
    try:
        with pytest.raises(ValueError, match="sampling_temperature=0.5: the CTranslate2 engine cannot honour it"):
            engine.check({"sampling_temperature": 0.5})
        with pytest.raises(ValueError, match="return_attention=True"):
            engine.check({"return_attention": True})
        with pytest.raises(ValueError, match="beam_size=0"):
            engine.check({"beam_size": 0})
    finally:
        engine.close()
    with pytest.raises(ValueError, match="model.bin does not exist"):
        _module("serve_ct2").CT2Engine(Translator(tiny_bundle(), device="cpu", intra_threads=1), scratch("no-ct2"))
    other = scratch("other-ct2") / "ct2"
    shutil.copytree(ct2_model, other)
    (other / "seq2onnx-ct2.json").write_text(json.dumps({"source_checkpoint": "step-00000001"}))
    with pytest.raises(ValueError, match="exported from checkpoint step-00000001, the bundle from step-00000300"):
        _module("serve_ct2").CT2Engine(Translator(tiny_bundle(), device="cpu", intra_threads=1), other)


@pytest.mark.parametrize("requests", [None, 12])
def test_load_point_counts_the_window_tokens_latencies_and_errors(requests):
    import asyncio

    import httpx

    calls = []

    async def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        calls.append(body)
        await asyncio.sleep(0.02)
        if len(calls) % 5 == 0:
            return httpx.Response(503, json={"error": "full"})
        return httpx.Response(200, json={"translations": [{"hypotheses": ["x"], "token_ids": [[7, 8, 9]], "scores": None}]})

    p = asyncio.run(_module("serve_load").load_point(
        "http://test/v1/translate", ["a", "b", "c"], 2, 4, warmup=0.1, seconds=0.5, requests=requests, timeout=5,
        transport=httpx.MockTransport(answer)))
    assert {c["texts"][0] for c in calls} == {"a", "b", "c"} and all(c["beam_size"] == 4 for c in calls)
    assert 0.1 <= p["warmup_s"] < 0.3, p  # --warmup, and every client answered once
    if requests is None:  # 2 clients x ~0.02 s a request: ~50 answers in 0.5 s
        assert p["window_s"] == 0.5 and 20 <= p["requests"] <= 55, p
    else:  # exactly `requests` sent after the warm-up; the window ends at the last answer
        assert p["requests"] == 12 and 0.1 < p["window_s"] < 0.5, p
    assert p["errors"] == {"HTTP 503": p["requests"] - p["ok"]} and p["requests"] - p["ok"] >= 2, p
    assert p["sentences_per_s"] == pytest.approx(p["ok"] / p["window_s"])
    assert p["tokens_per_s"] == pytest.approx(3 * p["ok"] / p["window_s"])
    assert 20 <= p["p50_ms"] <= p["p95_ms"] <= p["p99_ms"] < 200, p


def _run(script: str, *args, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_serve_load_runs_the_three_servers_and_writes_its_report(ct2_model, data):
    out = scratch("serve-load") / "out"
    r = _run("serve_load.py", tiny_bundle(), ct2_model, "--out", out, "--clients", 1, 2, "--requests", 4, "--warmup", 0.2,
             "--data", data, "--src-col", 1, "--sentences", 8, "--in-process-seconds", 0.5)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 compute threads in all per server" in r.stderr
    report = json.loads((out / "results.json").read_text())
    settings = {(p["engine"], p["setting"]) for p in report["points"]}
    assert settings == {("continuous", "intra 2"), ("request", "workers 1 x intra 2"), ("request", "workers 2 x intra 1"),
                        ("ct2", "inter 1 x intra 2"), ("ct2", "inter 2 x intra 1")}
    assert len(report["points"]) == 5 * 2 * 2  # servers x beams x clients
    for p in report["points"]:
        assert p["errors"] == {} and p["ok"] == p["requests"] == 4, p
        assert p["sentences_per_s"] > 0 and p["tokens_per_s"] > 0, p
        assert 0 < p["p50_ms"] <= p["p95_ms"] <= p["p99_ms"], p
    assert {p["clients"] for p in report["points"]} == {1, 2} and {p["beam"] for p in report["points"]} == {1, 4}
    assert all(report["in_process"][b]["p50_ms"] > 0 for b in ("greedy", "beam4"))
    md = (out / "results.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| (")]
    best = [line for line in rows if line.count("|") > 15]  # the headline table: engine x clients
    assert [line.split("|")[1].strip() for line in best] == ["(a) continuous"] * 2 + ["(b) request"] * 2 + ["(c) ct2"] * 2
    for line in best:  # (a)/row ratios are positive numbers; (a)'s own are 1.00
        ratios = line.split("|")[-4:-2]
        assert all(float(x) > 0 for x in ratios), line
    assert all(x.strip() == "1.00" for x in best[0].split("|")[-4:-2])
    assert "In-process `Translator.translate`" in md
    if importlib.util.find_spec("matplotlib"):
        assert report["plot"] == "plot.png" and (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "matplotlib" in report["plot"]
    assert sorted(p.name for p in (out / "logs").iterdir()) == sorted(
        f"{e}-{s.replace(' ', '')}.log" for e, s in settings)
    # an existing non-empty --out is refused before any server starts
    r = _run("serve_load.py", tiny_bundle(), ct2_model, "--out", out, "--data", data, "--src-col", 1, "--sentences", 8,
             timeout=60)
    assert r.returncode == 2 and "exists and is not empty: choose another --out or pass --force" in r.stderr


@pytest.mark.slow
def test_serve_identity_counts_and_lists_differences(data, sentences):
    out = scratch("serve-identity") / "out"
    r = _run("serve_identity.py", tiny_bundle(), "--out", out, "--sentences", 8, "--clients", 2, "--data", data,
             "--src-col", 1)
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
    served = [{"hypotheses": ["a b"], "token_ids": [[5, 6]], "scores": [-1.5]},
              {"hypotheses": ["c"], "token_ids": [[7]], "scores": [-0.5]}, {"error": "HTTP 503: full"}]
    alone = [TranslationResult(["a b"], [[5, 6]], [-1.5]), TranslationResult(["d"], [[8]], [-0.25]),
             TranslationResult(["e"], [[9]], [-2.0])]
    result = identity.compare(["s0", "s1", "s2"], served, alone)
    assert result["total"] == 3 and result["identical"] == 1 and len(result["errors"]) == 1
    assert result["differences"] == [{"index": 1, "source": "s1",
                                      "served": {"hypothesis": "c", "token_ids": [7], "score": -0.5},
                                      "alone": {"hypothesis": "d", "token_ids": [8], "score": -0.25}}]
    text = identity.as_text({"batching": "continuous", "sentences": 3, "clients": 2, "results": {"greedy": result}})
    assert "greedy: 1/3 identical, 1 differ, 1 failed requests" in text
    assert "[greedy #1] s1\n  served: 'c' score -0.5\n  alone:  'd' score -0.25" in text
    assert "[greedy #2] request failed: HTTP 503: full" in text
