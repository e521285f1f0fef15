"""`seq2onnx bench`: rows for every engine, CUDA rows skipped with a reason, CTranslate2's conversion exact."""
from __future__ import annotations

import json

import pytest
from tiny import scratch, tiny_run

from seq2onnx.export import benchcli, ct2convert
from seq2onnx.runtime.cli import main
from seq2onnx.runtime.translator import _cuda_usable

HAVE_CT2 = ct2convert.ct2_available()[0]
CONFIGS = {("greedy", 1), ("greedy", 32), ("beam4", 1), ("beam4", 32)}


def _rows(report: dict, engine: str) -> list[dict]:
    return [r for r in report["rows"] if r["engine"] == engine]


def test_bench_quick(capsys):
    out = scratch("bench") / "bench.json"
    rc = main(["bench", str(tiny_run() / "last"), "--quick", "--threads", "1", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    report = json.loads(out.read_text())
    n = report["sentences"]
    assert n == benchcli.QUICK_SENTENCES

    for engine in ("torch", "torch-batched", "onnx-cpu-fp32", "onnx-cpu-int8"):
        rows = _rows(report, engine)
        assert {(r["search"], r["batch"]) for r in rows} == CONFIGS, engine
        for r in rows:
            assert r["tokens_per_s"] > 0 and r["sentences_per_s"] > 0 and r["peak_rss_mb"] > 0
            assert r["target_tokens"] >= n  # every sentence generates at least its end token
            if r["batch"] == 1:
                assert 0 < r["p50_ms"] <= r["p90_ms"]
    # The fp32 bundle is the model: its greedy outputs are the reference's.
    for r in _rows(report, "onnx-cpu-fp32") + _rows(report, "torch-batched"):
        if r["search"] == "greedy":
            assert r["agreement"] == n
    assert all(r["x_torch"] == pytest.approx(1.0) for r in _rows(report, "torch"))

    skipped = {s["engine"]: s["reason"] for s in report["skipped"]}
    if not _cuda_usable()[0]:
        for engine in ("onnx-cuda-fp32", "onnx-cuda-fp16"):
            assert skipped.get(engine), f"{engine} should be skipped with a reason"
            assert not _rows(report, engine)

    if HAVE_CT2:
        assert report["ct2_check"]["valid"] is True, report["ct2_check"]
        for r in _rows(report, "ct2-cpu-fp32"):
            assert r["tokens_per_s"] > 0
            assert r["x_ct2"] == pytest.approx(1.0)
            if r["search"] == "greedy":
                assert r["agreement"] == n  # the conversion is the same model
        assert _rows(report, "ct2-cpu-int8")
        assert all(r["x_ct2"] is not None for r in _rows(report, "onnx-cpu-fp32"))
    else:
        assert skipped["ct2-cpu-fp32"] == ct2convert.CT2_MISSING

    # the machine above the table, then the table
    assert "machine:" in printed and "threads:   1 for every engine" in printed
    assert "engine" in printed and "tokens/s" in printed and "x ct2" in printed
    assert "one sentence at a time" in printed  # the reference beam caveat is stated


@pytest.mark.skipif(not HAVE_CT2, reason="ctranslate2 not installed")
def test_ct2_conversion_pre_norm():
    """Pre-LN adds the stacks' final norms: CTranslate2 must still decode exactly as we do."""
    report = benchcli.run_bench(tiny_run(pre_norm=True) / "last", quick=True, threads=1,
                                engines=["ct2-cpu-fp32"], log=lambda m: None)
    assert report["ct2_check"]["valid"] is True, report["ct2_check"]
    for r in _rows(report, "ct2-cpu-fp32"):
        if r["search"] == "greedy":
            assert r["agreement"] == report["sentences"]


def test_ct2_missing_is_skipped_with_the_install_hint(monkeypatch):
    monkeypatch.setattr(ct2convert, "ct2_available", lambda: (False, ct2convert.CT2_MISSING))
    report = benchcli.run_bench(tiny_run() / "last", sentences=4, threads=1,
                                engines=["ct2-cpu-fp32", "ct2-cpu-int8"], log=lambda m: None)
    skipped = {s["engine"]: s["reason"] for s in report["skipped"]}
    assert skipped["ct2-cpu-fp32"] == skipped["ct2-cpu-int8"] == "ctranslate2 not installed: pip install 'seq2onnx[bench]'"
    assert {r["engine"] for r in report["rows"]} == {"torch"}
    assert "ctranslate2 not installed" in benchcli.format_report(report)


def test_counting_helpers():
    # a hypothesis shorter than its limit ended with </s>, which counts; one at the limit did not
    assert benchcli._target_tokens([[5, 6], [5, 6, 7]], [10, 3]) == 3 + 3
    assert benchcli._percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert benchcli._percentile([5.0], 90) == 5.0


def _fake(engine: str, outputs: list[list[int]], seconds: float = 1.0) -> dict:
    return {"engine": engine, "description": engine, "load_seconds": 0.1, "rss_after_load_mb": 10.0,
            "peak_rss_mb": 20.0, "configs": [
                {"beam": b, "batch": bs, "seconds": seconds, "pass_seconds": [seconds], "outputs": outputs,
                 "latencies_ms": [seconds * 1000 / len(outputs)] * len(outputs) if bs == 1 else None,
                 "batch_latencies_ms": None if bs == 1 else [seconds * 1000]}
                for b, bs in benchcli.CONFIGS]}


def test_ct2_disagreement_voids_its_timings():
    ref = [[5, 6], [7]]
    report = {"sentences": 2, "skipped": []}
    benchcli._fill_rows(report, {"torch": _fake("torch", ref, 2.0), "onnx-cpu-fp32": _fake("onnx-cpu-fp32", ref),
                                 "ct2-cpu-fp32": _fake("ct2-cpu-fp32", [[5, 6], [8]], 0.5)}, [10, 10])
    assert report["ct2_check"]["valid"] is False and "1/2" in report["ct2_check"]["reason"]
    ct2_rows = [r for r in report["rows"] if r["engine"] == "ct2-cpu-fp32"]
    assert ct2_rows and all(r["void"] for r in ct2_rows)
    onnx = [r for r in report["rows"] if r["engine"] == "onnx-cpu-fp32"]
    assert all(r["x_ct2"] is None for r in onnx)  # no ratio against a void peer
    assert all(r["x_torch"] == pytest.approx(2.0) for r in onnx)
    assert "VOID" in benchcli.format_table(report)
