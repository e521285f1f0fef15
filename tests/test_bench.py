"""`seq2onnx bench`: rows for every engine, CUDA rows skipped with a reason, CTranslate2's conversion exact,
ratios against the right peer rows, memory measured per process."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from tiny import scratch, tiny_run

from seq2onnx.bench import (
    engines as bench_engines,
    report as bench_format,
    rows as bench_rows,
    run as bench_run,
)
from seq2onnx.export.ctranslate2 import convert as ct2convert
from seq2onnx.commands.main import main
from seq2onnx.runtime.devices import cuda_usable as _cuda_usable

HAVE_CT2 = ct2convert.ct2_available()[0]
CONFIGS = {("greedy", 1), ("greedy", 32), ("beam4", 1), ("beam4", 32)}


def _rows(report: dict, engine: str) -> list[dict]:
    return [r for r in report["rows"] if r["engine"] == engine]


def _row(report: dict, engine: str, search: str, batch: int) -> dict:
    (row,) = [r for r in _rows(report, engine) if r["search"] == search and r["batch"] == batch]
    return row


@pytest.mark.slow
def test_bench_quick(capsys):
    """One real run, as CI runs it: every engine in its own child process."""
    out = scratch("bench") / "bench.json"
    rc = main(["bench", str(tiny_run() / "last"), "--quick", "--threads", "1", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    report = json.loads(out.read_text())
    n = report["sentences"]
    assert n == bench_run.QUICK_SENTENCES

    _check_engine_rows(report, n)
    _check_skipped_and_ct2(report, n)

    # the machine above the table, then the table
    assert "machine:" in printed and "threads:   1 for every engine" in printed
    assert "engine" in printed and "tokens/s" in printed and "x ct2" in printed
    assert "one sentence at a time" in printed  # the reference beam caveat is stated


def _check_engine_rows(report: dict, n: int) -> None:
    """Every engine's rows: the configurations, the derived figures, the peaks and the agreement."""
    for engine in ("torch", "torch-batched", "onnx-cpu-fp32", "onnx-cpu-int8"):
        rows = _rows(report, engine)
        assert {(r["search"], r["batch"]) for r in rows} == CONFIGS, engine
        for r in rows:
            assert r["target_tokens"] >= n  # every sentence generates at least its end token
            assert r["tokens_per_s"] == pytest.approx(r["target_tokens"] / r["seconds"])
            assert r["sentences_per_s"] == pytest.approx(n / r["seconds"])
            assert 0 < r["rss_after_load_mb"] <= r["peak_rss_mb"]
            if r["batch"] == 1:
                assert 0 < r["p50_ms"] <= r["p90_ms"]
            # x torch: this row's tokens/s over the torch row's of the same search and batch
            torch_row = _row(report, "torch", r["search"], r["batch"])
            assert r["x_torch"] == pytest.approx(r["tokens_per_s"] / torch_row["tokens_per_s"])
    # Each child measures its own peak: the ONNX process never imports torch, so it must stay below
    # the torch process (a peak inherited from the parent, which holds the model, would not).
    assert _rows(report, "onnx-cpu-fp32")[0]["peak_rss_mb"] < _rows(report, "torch")[0]["peak_rss_mb"]
    # The fp32 bundle is the model: its greedy outputs are the reference's.
    for r in _rows(report, "onnx-cpu-fp32") + _rows(report, "torch-batched"):
        if r["search"] == "greedy":
            assert r["agreement"] == n


def _check_skipped_and_ct2(report: dict, n: int) -> None:
    """The engines skipped with their reasons, and the CTranslate2 rows with their ratios."""
    skipped = {s["engine"]: s["reason"] for s in report["skipped"]}
    if not _cuda_usable()[0]:
        for engine in ("onnx-cuda-fp32", "onnx-cuda-fp16"):
            assert skipped.get(engine), f"{engine} should be skipped with a reason"
            assert not _rows(report, engine)

    if HAVE_CT2:
        assert report["ct2_check"]["valid"] is True, report["ct2_check"]
        for r in _rows(report, "ct2-cpu-fp32"):
            assert r["tokens_per_s"] > 0
            if r["search"] == "greedy":
                assert r["agreement"] == n  # the conversion is the same model
        assert _rows(report, "ct2-cpu-int8")
        # x ct2: against the CTranslate2 row of the same precision (fp32 and torch: fp32; int8: int8)
        for engine, peer in (
            ("onnx-cpu-fp32", "ct2-cpu-fp32"),
            ("torch", "ct2-cpu-fp32"),
            ("onnx-cpu-int8", "ct2-cpu-int8"),
        ):
            for r in _rows(report, engine):
                p = _row(report, peer, r["search"], r["batch"])
                assert r["x_ct2_engine"] == peer
                assert r["x_ct2"] == pytest.approx(r["tokens_per_s"] / p["tokens_per_s"])
    else:
        assert skipped["ct2-cpu-fp32"] == ct2convert.CT2_MISSING


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_CT2, reason="ctranslate2 not installed")
def test_ct2_conversion_pre_norm():
    """Pre-LN adds the stacks' final norms: CTranslate2 must still decode exactly as we do."""
    report = bench_run.run_bench(
        tiny_run(pre_norm=True) / "last", quick=True, threads=1, engines=["ct2-cpu-fp32"], log=lambda m: None
    )
    assert report["ct2_check"]["valid"] is True, report["ct2_check"]
    for r in _rows(report, "ct2-cpu-fp32"):
        if r["search"] == "greedy":
            assert r["agreement"] == report["sentences"]


@pytest.mark.slow
def test_ct2_missing_is_skipped_with_the_install_hint(monkeypatch):
    monkeypatch.setattr(ct2convert, "ct2_available", lambda: (False, ct2convert.CT2_MISSING))
    report = bench_run.run_bench(
        tiny_run() / "last",
        sentences=4,
        threads=1,
        engines=["ct2-cpu-fp32", "ct2-cpu-int8"],
        log=lambda m: None,
    )
    skipped = {s["engine"]: s["reason"] for s in report["skipped"]}
    assert (
        skipped["ct2-cpu-fp32"]
        == skipped["ct2-cpu-int8"]
        == "ctranslate2 not installed: pip install 'seq2onnx[bench]'"
    )
    assert {r["engine"] for r in report["rows"]} == {"torch"}
    assert "ctranslate2 not installed" in bench_format.format_report(report)


def test_counting_helpers():
    # a hypothesis shorter than its limit ended with </s>, which counts; one at the limit did not
    assert bench_rows.target_tokens([[5, 6], [5, 6, 7]], [10, 3]) == 3 + 3
    assert bench_rows.percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert bench_rows.percentile([4.0, 1.0, 3.0, 2.0], 90) == pytest.approx(
        3.7
    )  # 3 + 0.7 x (4 - 3), any order
    assert bench_rows.percentile([5.0], 90) == 5.0
    assert bench_rows.percentile([], 50) is None and bench_rows.percentile(None, 50) is None


@pytest.mark.slow
def test_peak_memory_is_the_childs_own():
    """A child of a process holding 300 MB reports its own small peak (ru_maxrss would report the parent's)."""
    held = np.ones(300 * 2**20 // 8)  # written, so resident
    code = "from seq2onnx.bench.engines import peak_rss_mb, rss_mb; now = rss_mb(); print(now, peak_rss_mb())"
    now, peak = map(
        float,
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split(),
    )
    assert 0 < now <= peak < 150, (peak, now)
    now = bench_engines.rss_mb()
    assert bench_engines.peak_rss_mb() >= now >= held.nbytes / 2**20


# -- rows and ratios from hand-made results, with expectations computed here from the inputs --------

LIMITS = [10, 3, 10, 10]
OUTPUTS = {  # engine -> best hypothesis per sentence (end token excluded)
    "torch": [[5, 6], [7], [8, 9, 10], [11]],
    "onnx-cpu-fp32": [[5, 6], [7], [8, 9, 10], [11]],
    "onnx-cpu-int8": [[5, 6, 9], [7, 8, 9], [8], [11]],
    "ct2-cpu-fp32": [[5, 6], [7], [8, 9, 10], [11]],
    "ct2-cpu-int8": [[5], [7], [8, 9], [11, 12]],
}
BASE_SECONDS = {
    "torch": 2.0,
    "onnx-cpu-fp32": 1.0,
    "onnx-cpu-int8": 0.7,
    "ct2-cpu-fp32": 0.8,
    "ct2-cpu-int8": 0.3,
}
CONFIG_FACTOR = {(1, 1): 1.0, (1, 32): 0.25, (4, 1): 3.0, (4, 32): 1.1}
LATENCIES_MS = [10.0, 40.0, 20.0, 30.0]


def _seconds(engine: str, beam: int, batch: int) -> float:
    # engine and configuration both change the time, and not in proportion across engines
    return (
        BASE_SECONDS[engine]
        * CONFIG_FACTOR[(beam, batch)]
        * (1.3 if engine == "torch" and beam == 4 else 1.0)
    )


def _fake(engine: str, outputs: list[list[int]], seconds=None) -> dict:
    configs = []
    for b, bs in bench_run.CONFIGS:
        s = _seconds(engine, b, bs) if seconds is None else seconds
        configs.append(
            {
                "beam": b,
                "batch": bs,
                "seconds": s,
                "pass_seconds": [s],
                "outputs": outputs,
                "latencies_ms": LATENCIES_MS if bs == 1 else None,
                "batch_latencies_ms": None if bs == 1 else [s * 1000],
            }
        )
    return {
        "engine": engine,
        "description": engine,
        "load_seconds": 0.1,
        "rss_after_load_mb": 10.0,
        "peak_rss_mb": 20.0 + len(engine),
        "configs": configs,
    }


def _tokens(engine: str) -> int:
    return sum(min(len(o) + 1, lim) for o, lim in zip(OUTPUTS[engine], LIMITS))


def _hand_made_report() -> dict:
    report = {"sentences": len(LIMITS), "skipped": []}
    bench_rows.fill_rows(report, {e: _fake(e, o) for e, o in OUTPUTS.items()}, LIMITS)
    return report


def test_rows_ratios_against_the_right_peers():
    report = _hand_made_report()
    assert report["ct2_check"]["valid"] is True
    assert (
        _tokens("torch") == 3 + 2 + 4 + 2 and _tokens("onnx-cpu-int8") == 4 + 3 + 2 + 2
    )  # the 3-token limit cuts
    peer_of = {
        "torch": "ct2-cpu-fp32",
        "onnx-cpu-fp32": "ct2-cpu-fp32",
        "onnx-cpu-int8": "ct2-cpu-int8",
        "ct2-cpu-fp32": "ct2-cpu-fp32",
        "ct2-cpu-int8": "ct2-cpu-int8",
    }
    assert len(report["rows"]) == len(OUTPUTS) * len(bench_run.CONFIGS)
    for r in report["rows"]:
        e, beam, batch = r["engine"], r["beam"], r["batch"]
        speed = {x: _tokens(x) / _seconds(x, beam, batch) for x in OUTPUTS}
        assert r["target_tokens"] == _tokens(e)
        assert r["tokens_per_s"] == pytest.approx(speed[e])
        assert r["x_torch"] == pytest.approx(speed[e] / speed["torch"])
        assert r["x_ct2_engine"] == peer_of[e]
        assert r["x_ct2"] == pytest.approx(speed[e] / speed[peer_of[e]])
        assert r["peak_rss_mb"] == 20.0 + len(e)
        if batch == 1:
            assert r["p50_ms"] == pytest.approx(25.0) and r["p90_ms"] == pytest.approx(37.0)
        else:
            assert r["p50_ms"] is None and r["batch_latency_p50_ms"] == pytest.approx(
                _seconds(e, beam, batch) * 1000
            )
    int8 = _row(report, "onnx-cpu-int8", "greedy", 1)
    assert int8["agreement"] == 1 and int8["greedy_agreement"] == 1  # only the last sentence equals torch's
    assert int8["x_ct2"] != pytest.approx(
        int8["tokens_per_s"] / _row(report, "ct2-cpu-fp32", "greedy", 1)["tokens_per_s"]
    )


def test_format_table_prints_each_rows_numbers():
    report = _hand_made_report()
    table = bench_format.format_table(report).splitlines()
    head = table[0].split()
    assert head[:3] == ["engine", "search", "batch"]
    for r in report["rows"]:
        (line,) = [t for t in table if t.split()[:3] == [r["engine"], r["search"], str(r["batch"])]]
        cells = line.split()
        speed = _tokens(r["engine"]) / _seconds(r["engine"], r["beam"], r["batch"])
        assert cells[3] == f"{speed:.0f}"
        assert cells[-3] == f"{r['x_torch']:.2f}" and cells[-2] == f"{r['x_ct2']:.2f}"
        agree = sum(a == b for a, b in zip(OUTPUTS[r["engine"]], OUTPUTS["torch"]))
        assert cells[-1] == f"{agree}/4"
        if r["batch"] == 1:
            assert cells[5:7] == ["25.0", "37.0"]
        else:
            assert cells[5:7] == ["-", "-"]
    int8 = [t for t in table if t.startswith("onnx-cpu-int8") and t.split()[1:3] == ["beam4", "32"]][
        0
    ].split()
    speed = {e: _tokens(e) / _seconds(e, 4, 32) for e in OUTPUTS}
    assert int8[-3] == f"{speed['onnx-cpu-int8'] / speed['torch']:.2f}"
    assert int8[-2] == f"{speed['onnx-cpu-int8'] / speed['ct2-cpu-int8']:.2f}"


def test_ct2_disagreement_voids_its_timings():
    ref = [[5, 6], [7]]
    report = {"sentences": 2, "skipped": []}
    bench_rows.fill_rows(
        report,
        {
            "torch": _fake("torch", ref, 2.0),
            "onnx-cpu-fp32": _fake("onnx-cpu-fp32", ref, 1.0),
            "ct2-cpu-fp32": _fake("ct2-cpu-fp32", [[5, 6], [8]], 0.5),
        },
        [10, 10],
    )
    assert report["ct2_check"]["valid"] is False and "1/2" in report["ct2_check"]["reason"]
    ct2_rows = [r for r in report["rows"] if r["engine"] == "ct2-cpu-fp32"]
    assert ct2_rows and all(r["void"] for r in ct2_rows)
    onnx = [r for r in report["rows"] if r["engine"] == "onnx-cpu-fp32"]
    assert all(r["x_ct2"] is None for r in onnx)  # no ratio against a void peer
    assert all(r["x_torch"] == pytest.approx(2.0) for r in onnx)
    assert "VOID" in bench_format.format_table(report)


def _rounds(engine: str, outputs: list[list[int]], speeds: list[float]) -> list[dict]:
    """An engine's results over rounds in which the machine ran at `speeds` (1 = normal)."""
    out = []
    for i, speed in enumerate(speeds):
        r = _fake(engine, outputs)
        r["peak_rss_mb"] += i
        for c in r["configs"]:
            c["seconds"] = c["seconds"] / speed
            c["pass_seconds"] = [c["seconds"]]
            c["latencies_ms"] = [x / speed for x in c["latencies_ms"]] if c["latencies_ms"] else None
        out.append(r)
    return out


def test_merge_rounds_keeps_every_pass_and_medians():
    merged = bench_rows.merge_rounds(_rounds("onnx-cpu-fp32", OUTPUTS["onnx-cpu-fp32"], [1.0, 0.5, 2.0]))
    assert merged["rounds"] == 3 and merged["peak_rss_mb"] == 20.0 + len("onnx-cpu-fp32") + 2
    for c in merged["configs"]:
        base = _seconds("onnx-cpu-fp32", c["beam"], c["batch"])
        assert c["pass_seconds"] == pytest.approx([base, base * 2, base / 2])  # in round order
        assert c["seconds"] == pytest.approx(base)  # the median pass
        assert c["outputs_stable"] is True
        if c["batch"] == 1:
            assert c["latencies_ms"] == pytest.approx(LATENCIES_MS)  # per sentence, the median over rounds
    changed = _rounds("onnx-cpu-fp32", OUTPUTS["onnx-cpu-fp32"], [1.0, 1.0])
    changed[1]["configs"][0]["outputs"] = [[9, 9]] * len(LIMITS)
    assert bench_rows.merge_rounds(changed)["configs"][0]["outputs_stable"] is False


def test_ratios_are_taken_within_rounds():
    """The machine's speed changes between rounds (and once within round 2): the median of the ratios
    within rounds is the steady machine's ratio here, the ratio of the median passes is 3x off."""
    speeds = {"torch": [1.0, 1.0, 1.0], "onnx-cpu-fp32": [1.0, 3.0, 3.0], "ct2-cpu-fp32": [1.0, 1.0, 3.0]}
    results = {e: bench_rows.merge_rounds(_rounds(e, OUTPUTS[e], s)) for e, s in speeds.items()}
    report = {"sentences": len(LIMITS), "skipped": []}
    bench_rows.fill_rows(report, results, LIMITS)
    for r in report["rows"]:
        if r["engine"] != "onnx-cpu-fp32":
            continue
        steady = {x: _tokens(x) / _seconds(x, r["beam"], r["batch"]) for x in speeds}
        per_round = [
            steady["onnx-cpu-fp32"] * a / (steady["ct2-cpu-fp32"] * b)
            for a, b in zip(speeds["onnx-cpu-fp32"], speeds["ct2-cpu-fp32"])
        ]
        assert r["x_ct2"] == pytest.approx(float(np.median(per_round)))
        assert r["x_ct2"] == pytest.approx(steady["onnx-cpu-fp32"] / steady["ct2-cpu-fp32"])
        assert r["x_ct2"] != pytest.approx(
            r["tokens_per_s"] / _row(report, "ct2-cpu-fp32", r["search"], r["batch"])["tokens_per_s"]
        )


@pytest.mark.slow
def test_bench_rounds_interleave_engines(capsys):
    """--repeat 2: two rounds, each running every engine once; every row keeps both passes."""
    out = scratch("bench-rounds") / "bench.json"
    rc = main(
        [
            "bench",
            str(tiny_run() / "last"),
            "--sentences",
            "4",
            "--threads",
            "1",
            "--engines",
            "onnx-cpu-fp32",
            "--repeat",
            "2",
            "--json",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    printed = captured.out
    assert rc == 0, printed
    assert "round 1/2: running torch" in captured.err and "round 2/2: running onnx-cpu-fp32" in captured.err
    assert "2 rounds, each running every engine once" in printed
    report = json.loads(out.read_text())
    for r in _rows(report, "onnx-cpu-fp32") + _rows(report, "torch"):
        assert len(r["pass_seconds"]) == 2 and r["seconds"] == min(
            r["pass_seconds"]
        )  # median of 2: the lower
    for r in _rows(report, "onnx-cpu-fp32"):
        torch_row = _row(report, "torch", r["search"], r["batch"])
        within = [
            (r["target_tokens"] / a) / (torch_row["target_tokens"] / b)
            for a, b in zip(r["pass_seconds"], torch_row["pass_seconds"])
        ]
        assert r["x_torch"] == pytest.approx(float(np.median(within)))


# -- the thread sweep: every engine at each setting, the best per row, best against best ---------------


def test_sweep_settings():
    from seq2onnx.bench.settings import Setting, intra_counts, sweep_settings

    assert intra_counts(1) == [1] and intra_counts(2) == [1, 2] and intra_counts(6) == [1, 2, 4, 6]
    assert intra_counts(8) == [1, 2, 4, 8]
    assert sweep_settings("ct2", "cpu", 2) == [Setting(1), Setting(2), Setting(1, 2)]
    assert sweep_settings("onnx", "cpu", 4) == [Setting(1), Setting(2), Setting(4), Setting(1, 4)]
    assert sweep_settings("torch", "cpu", 2) == [Setting(1), Setting(2)]  # the reference has no parallel mode
    assert sweep_settings("onnx", "cpu", 1) == [Setting(1)]
    assert sweep_settings("ct2", "cuda", 4) == [Setting(4)]
    assert [s.label for s in sweep_settings("ct2", "cpu", 2)] == ["1 thread", "2 threads", "2 x 1 thread"]
    assert Setting(1, 2).key == "2x1" and Setting(2).key == "2"


SWEEP_SPEED = {  # engine -> {setting: speed factor}: which setting is fastest differs by engine and configuration
    "torch": {(1, 1): 1.0, (2, 1): 1.5},
    "onnx-cpu-int8": {(1, 1): 1.0, (2, 1): 1.2, (1, 2): 1.6},
    "ct2-cpu-fp32": {(1, 1): 1.0, (2, 1): 1.8, (1, 2): 1.1},
    "ct2-cpu-int8": {(1, 1): 2.0, (2, 1): 0.2, (1, 2): 1.5},
}
BEAM4_B32_SLOW = {
    ("onnx-cpu-int8", (1, 2)): 0.5
}  # in one configuration that engine's parallel setting is slow


def _sweep_speed(engine: str, setting: tuple, beam: int, batch: int) -> float:
    factor = SWEEP_SPEED[engine][setting]
    return factor * (BEAM4_B32_SLOW.get((engine, setting), 1.0) if (beam, batch) == (4, 32) else 1.0)


def _sweep_report() -> dict:
    results = {}
    for engine, settings in SWEEP_SPEED.items():
        for intra, parallel in settings:
            fake = _fake(engine, OUTPUTS[engine])
            fake.update(
                intra_threads=intra, parallel=parallel, peak_rss_mb=20.0 + len(engine) + intra + 10 * parallel
            )
            for c in fake["configs"]:
                c["seconds"] /= _sweep_speed(engine, (intra, parallel), c["beam"], c["batch"])
                c["pass_seconds"] = [c["seconds"]]
            results[(engine, intra, parallel)] = fake
    report = {
        "sentences": len(LIMITS),
        "skipped": [],
        "threads": 2,
        "repeat": 1,
        "sweep": {e: [] for e in SWEEP_SPEED},
        "configs": [
            {"search": "greedy" if b == 1 else f"beam{b}", "beam": b, "batch": bs}
            for b, bs in bench_run.CONFIGS
        ],
    }
    bench_rows.fill_rows(report, results, LIMITS)
    return report


def test_sweep_best_rows_are_best_against_best():
    report = _sweep_report()
    assert report["ct2_check"]["valid"] is True
    assert len(report["sweep_rows"]) == sum(map(len, SWEEP_SPEED.values())) * len(bench_run.CONFIGS)
    peer_of = {
        "torch": "ct2-cpu-fp32",
        "onnx-cpu-int8": "ct2-cpu-int8",
        "ct2-cpu-fp32": "ct2-cpu-fp32",
        "ct2-cpu-int8": "ct2-cpu-int8",
    }
    assert len(report["best"]) == len(SWEEP_SPEED) * len(bench_run.CONFIGS)

    def best_of(engine, beam, batch):
        speeds = {
            s: _tokens(engine) / _seconds(engine, beam, batch) * _sweep_speed(engine, s, beam, batch)
            for s in SWEEP_SPEED[engine]
        }
        top = max(speeds, key=speeds.get)
        return top, speeds[top]

    for r in report["best"]:
        e, beam, batch = r["engine"], r["beam"], r["batch"]
        (intra, parallel), speed = best_of(e, beam, batch)
        assert (r["intra_threads"], r["parallel"]) == (intra, parallel), (e, beam, batch)
        assert r["tokens_per_s"] == pytest.approx(speed)
        assert r["peak_rss_mb"] == 20.0 + len(e) + intra + 10 * parallel  # the best setting's own process
        assert r["x_torch"] == pytest.approx(speed / best_of("torch", beam, batch)[1])
        assert r["x_ct2_engine"] == peer_of[e]
        assert r["x_ct2"] == pytest.approx(speed / best_of(peer_of[e], beam, batch)[1])
        assert len(r["settings_tried"]) == len(SWEEP_SPEED[e])
    # the choice differs by configuration: int8's parallel setting wins except at beam 4 batch 32
    int8 = {(r["beam"], r["batch"]): r["setting"] for r in report["best"] if r["engine"] == "onnx-cpu-int8"}
    assert int8 == {
        (1, 1): "2 x 1 thread",
        (1, 32): "2 x 1 thread",
        (4, 1): "2 x 1 thread",
        (4, 32): "2 threads",
    }

    # the equal-threads rows: every engine at 2 threads, one batch at a time, ratios at equal threads
    assert {(r["engine"], r["intra_threads"], r["parallel"]) for r in report["rows"]} == {
        (e, 2, 1) for e in SWEEP_SPEED
    }
    for r in report["rows"]:
        speed = {
            x: _tokens(x)
            / _seconds(x, r["beam"], r["batch"])
            * _sweep_speed(x, (2, 1), r["beam"], r["batch"])
            for x in SWEEP_SPEED
        }
        assert r["x_ct2"] == pytest.approx(speed[r["engine"]] / speed[peer_of[r["engine"]]])


def test_sweep_report_prints_the_three_tables():
    report = _sweep_report()
    report.update(
        machine={
            "cpu": "cpu",
            "logical_cores": 2,
            "physical_cores": 2,
            "usable_cores": 2,
            "memory_gb": 1,
            "os": "os",
            "python": "3",
            "load_average_at_start": None,
            "versions": {"torch": "t", "ctranslate2": "c", "onnxruntime": "o", "numpy": "n"},
        },
        checkpoint="ckpt",
        sentences_source="corpus",
        mean_source_tokens=3.0,
        max_length="m",
        model={
            "d_model": 8,
            "n_encoder_layers": 1,
            "n_decoder_layers": 1,
            "n_heads": 2,
            "d_ff": 16,
            "src_vocab_size": 10,
            "tgt_vocab_size": 10,
            "pre_norm": False,
        },
        sweep={
            e: [
                f"{i} thread{'s' if i > 1 else ''}" if p == 1 else f"{p} x {i} thread"
                for i, p in SWEEP_SPEED[e]
            ]
            for e in SWEEP_SPEED
        },
    )
    text = bench_format.format_report(report)
    assert text.index("best setting per row") < text.index("every setting") < text.index("equal threads")
    best = bench_format.format_table(report, "best").splitlines()
    assert best[0].split()[:4] == ["engine", "search", "batch", "setting"]
    for r in report["best"]:
        (line,) = [
            t
            for t in best
            if t.startswith(r["engine"] + " ") and t.split()[1:3] == [r["search"], str(r["batch"])]
        ]
        assert (
            f"  {r['setting']}  " in line
            and f"{r['tokens_per_s']:.0f}" in line
            and f"{r['x_ct2']:.2f}" in line
        )
    every = bench_format.format_settings(report).splitlines()
    for r in report["sweep_rows"]:
        (line,) = [t for t in every if t.startswith(r["engine"] + " ") and f"  {r['setting']}  " in t]
        column = [c["search"] + str(c["batch"]) for c in report["configs"]].index(
            r["search"] + str(r["batch"])
        )
        cell = line.split(r["setting"])[1].split()[column]
        is_best = any(
            b["engine"] == r["engine"]
            and b["beam"] == r["beam"]
            and b["batch"] == r["batch"]
            and b["setting"] == r["setting"]
            for b in report["best"]
        )
        assert cell == f"{r['tokens_per_s']:.0f}" + ("*" if is_best else "")
        assert line.split()[-1] == f"{r['peak_rss_mb']:.0f}"


@pytest.mark.slow
def test_bench_sweep_runs_every_setting(capsys):
    """The default: every engine at each thread setting in its own child; the N x 1 settings' outputs
    are the one-thread settings' (the batches overlap, the answers come back in order)."""
    out = scratch("bench-sweep") / "bench.json"
    engines = "onnx-cpu-fp32,ct2-cpu-fp32" if HAVE_CT2 else "onnx-cpu-fp32"
    rc = main(
        [
            "bench",
            str(tiny_run() / "last"),
            "--sentences",
            "4",
            "--max-threads",
            "2",
            "--engines",
            engines,
            "--json",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.out
    report = json.loads(out.read_text())
    cores = min(2, bench_run.usable_cores())
    from seq2onnx.bench.settings import sweep_settings

    for engine in ["torch", *engines.split(",")]:
        want = {(s.intra, s.parallel) for s in sweep_settings(bench_engines.ENGINES[engine][0], "cpu", cores)}
        rows = [r for r in report["sweep_rows"] if r["engine"] == engine]
        assert {(r["intra_threads"], r["parallel"]) for r in rows} == want, engine
        assert len(rows) == len(want) * len(CONFIGS)
        for r in rows:
            if r["search"] == "greedy":
                assert r["agreement"] == report["sentences"], (engine, r["setting"])
            if r["parallel"] > 1:
                assert r["p50_ms"] is None and r["tokens_per_s"] > 0
        assert len({r["peak_rss_mb"] for r in rows}) >= 1
        best = [r for r in report["best"] if r["engine"] == engine]
        assert {(r["search"], r["batch"]) for r in best} == CONFIGS
        for b in best:
            same = [r for r in rows if r["search"] == b["search"] and r["batch"] == b["batch"]]
            assert b["tokens_per_s"] == max(r["tokens_per_s"] for r in same)
    assert {(r["engine"], r["intra_threads"], r["parallel"]) for r in report["rows"]} == {
        (e, cores, 1) for e in ["torch", *engines.split(",")]
    }
    assert "running onnx-cpu-fp32 (1 thread)" in captured.err
    printed = captured.out
    assert "best setting per row" in printed and "every setting" in printed and "equal threads" in printed
    assert "threads:   swept" in printed


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--threads", "1", "--max-threads", "2"],
            "--threads N runs every engine at N threads only; --max-threads caps",
        ),
        (["--max-threads", "-1"], "--max-threads -1: give 0 (all cores) or more"),
    ],
)
def test_bench_thread_options_are_checked(capsys, args, message):
    rc = main(["bench", str(tiny_run() / "last"), *args])
    assert rc != 0 and message in capsys.readouterr().err
