"""`seq2onnx bench`'s rows: the children's timings and outputs -> tokens/s, latency percentiles,
agreement with the PyTorch reference, CTranslate2's validity and the ratios.

One row per engine, thread setting (bench/settings.py) and configuration. Three views of them:
  rows        the equal-threads rows: every engine at the same threads (report["threads"], one batch
              at a time). Without a sweep these are all the rows.
  sweep_rows  every setting of every engine (only with a sweep).
  best        per engine and configuration, the row of its fastest setting (only with a sweep).

Ratios: "x torch" is tokens/s over the torch row's tokens/s (same search and batch); "x ct2" is
tokens/s over the CTranslate2 row of the same device and precision (torch and fp32 rows against
ct2-*-fp32, int8 against ct2-cpu-int8, fp16 against ct2-cuda-fp16), same search and batch. In `rows`
the peer row is at the same threads; in `best` it is the peer's best row (best against best). With
several rounds (--repeat) a ratio is the median over rounds of the ratio within a round: the engines
of one round run minutes apart at most, the rounds further apart, and a machine's speed drifts.
"""

from __future__ import annotations

import statistics

from seq2onnx.bench.engines import ENGINES
from seq2onnx.bench.settings import Setting


def target_tokens(outputs: list[list[int]], limits: list[int]) -> int:
    """Counts the generated tokens with the end token: a hypothesis shorter than its limit ended with </s>.

    Args:
        outputs: each sentence's target ids, end token excluded.
        limits: each sentence's maximum length.

    Returns:
        The total.
    """
    return sum(min(len(o) + 1, lim) for o, lim in zip(outputs, limits))


def percentile(values: list[float] | None, q: float) -> float | None:
    """Returns the q-th percentile (linear interpolation, numpy's default), None for no values.

    Args:
        values: the measurements, or None.
        q: the percentile, 0 to 100.
    """
    import numpy as np  # here, not at the top: `seq2onnx`'s parser imports this module (row 83)

    return float(np.percentile(values, q)) if values else None


def _setting(res: dict, threads: int | None) -> Setting:
    """The setting a child ran at (results made before the sweep carry none: the equal threads)."""
    return Setting(res.get("intra_threads") or threads or 0, res.get("parallel", 1))


def _row(
    name: str, res: dict, c: dict, n: int, limits: list[int], ref_out: dict, threads: int | None
) -> dict:
    beam, batch = c["beam"], c["batch"]
    setting = _setting(res, threads)
    tokens = target_tokens(c["outputs"], limits)
    ref_same = ref_out.get((beam, 1))  # torch, same search, one sentence at a time
    ref_greedy = ref_out.get((1, 1))
    lat = c["latencies_ms"]
    return {
        "engine": name,
        "kind": ENGINES[name][0],
        "device": ENGINES[name][1],
        "precision": ENGINES[name][2],
        "search": "greedy" if beam == 1 else f"beam{beam}",
        "beam": beam,
        "batch": batch,
        "intra_threads": setting.intra,
        "parallel": setting.parallel,
        "setting": setting.label,
        "seconds": c["seconds"],
        "pass_seconds": c["pass_seconds"],
        "target_tokens": tokens,
        "tokens_per_s": tokens / c["seconds"] if c["seconds"] > 0 else None,
        "sentences_per_s": n / c["seconds"] if c["seconds"] > 0 else None,
        "p50_ms": percentile(lat, 50),
        "p90_ms": percentile(lat, 90),
        "batch_latency_p50_ms": percentile(c["batch_latencies_ms"], 50),
        "peak_rss_mb": res["peak_rss_mb"],
        "rss_after_load_mb": res["rss_after_load_mb"],
        "load_seconds": res["load_seconds"],
        "description": res["description"],
        "agreement": sum(a == b for a, b in zip(c["outputs"], ref_same)) if ref_same else None,
        "agreement_of": n,
        "greedy_agreement": (
            sum(a == b for a, b in zip(c["outputs"], ref_greedy)) if beam == 1 and ref_greedy else None
        ),
        "outputs": c["outputs"],
    }


def _check_ct2(rows: list[dict], n: int) -> dict:
    """CTranslate2 counts only when its fp32 greedy outputs are ours: the proof the conversion is right.
    Marks its rows void otherwise."""
    ct2_check = [r for r in rows if r["engine"] == "ct2-cpu-fp32" and r["beam"] == 1]
    ct2 = {"checked": bool(ct2_check), "valid": None, "reason": None}
    if any(r["kind"] == "ct2" for r in rows):
        bad = [r for r in ct2_check if r["greedy_agreement"] != n]
        if not ct2_check:
            ct2.update(
                valid=False, reason="ct2-cpu-fp32 did not run, so the conversion is unchecked: timings void"
            )
        elif bad:
            worst = min(r["greedy_agreement"] or 0 for r in bad)
            ct2.update(
                valid=False,
                reason="CTranslate2's fp32 greedy outputs equal ours on only "
                f"{worst}/{n} sentences: the conversion is not the same model, its timings are void",
            )
        else:
            ct2.update(
                valid=True, reason=f"CTranslate2's fp32 greedy outputs equal ours on {n}/{n} sentences"
            )
        for r in rows:
            if r["kind"] == "ct2":
                r["void"] = not ct2["valid"]
    return ct2


def merge_rounds(rounds: list[dict]) -> dict:
    """Merges one engine's child results from interleaved rounds (one timed pass per configuration each).

    Args:
        rounds: what engines.run_engine returned in each round, in round order.

    Returns:
        One result: per configuration every round's pass time in round order (`pass_seconds`;
        `seconds` is the median pass), per-sentence and per-batch latencies the median over rounds,
        the outputs of the first round (`outputs_stable`: every round's were the same), the largest
        peak memory.
    """
    first = rounds[0]

    def median_each(values: list[list[float] | None]) -> list[float] | None:
        return None if values[0] is None else [statistics.median(v) for v in zip(*values)]

    configs = []
    for i, c in enumerate(first["configs"]):
        per_round = [r["configs"][i] for r in rounds]
        totals = [x["seconds"] for x in per_round]
        configs.append(
            {
                **c,
                "seconds": sorted(totals)[(len(totals) - 1) // 2],
                "pass_seconds": totals,
                "latencies_ms": median_each([x["latencies_ms"] for x in per_round]),
                "batch_latencies_ms": median_each([x["batch_latencies_ms"] for x in per_round]),
                "outputs_stable": all(x["outputs"] == c["outputs"] for x in per_round),
            }
        )
    return {
        **first,
        "configs": configs,
        "rounds": len(rounds),
        "load_seconds": statistics.median(r["load_seconds"] for r in rounds),
        "rss_after_load_mb": max(r["rss_after_load_mb"] for r in rounds),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in rounds),
    }


def _ratio(r: dict, base: dict) -> float | None:
    """r's tokens/s over base's: the median over rounds of the ratio within a round where both ran in the
    same rounds, else the ratio of the reported (median-pass) speeds."""
    if not (r["tokens_per_s"] and base["tokens_per_s"]):
        return None
    a, b = r["pass_seconds"], base["pass_seconds"]
    if len(a) == len(b) > 1 and all(x > 0 for x in a + b):
        return statistics.median((r["target_tokens"] / x) / (base["target_tokens"] / y) for x, y in zip(a, b))
    return r["tokens_per_s"] / base["tokens_per_s"]


def _add_ratios(rows: list[dict]) -> None:
    by_key = {(r["engine"], r["beam"], r["batch"]): r for r in rows}
    for r in rows:
        base = by_key.get(("torch", r["beam"], r["batch"]))
        r["x_torch"] = _ratio(r, base) if base else None
        precision = "fp32" if r["kind"] == "torch" else r["precision"]
        peer = by_key.get((f"ct2-{r['device']}-{precision}", r["beam"], r["batch"]))
        r["x_ct2_engine"] = peer["engine"] if peer else None
        r["x_ct2"] = _ratio(r, peer) if peer and not peer.get("void") else None


def _best(rows: list[dict]) -> list[dict]:
    """Per engine and configuration, a copy of its fastest row (most tokens/s), with ratios against the
    torch row's best and the CTranslate2 peer's best of the same configuration, and every setting's
    tokens/s."""
    by_key: dict[tuple, list[dict]] = {}
    for r in rows:
        by_key.setdefault((r["engine"], r["beam"], r["batch"]), []).append(r)
    best = []
    for group in by_key.values():
        top = max(group, key=lambda r: r["tokens_per_s"] or 0.0)
        best.append({**top, "settings_tried": {r["setting"]: r["tokens_per_s"] for r in group}})
    _add_ratios(best)
    return best


def fill_rows(report: dict, results: dict, limits: list[int]) -> None:
    """Sets report["rows"] (the equal-threads rows), and with a sweep report["sweep_rows"] and
    report["best"], and report["ct2_check"], from the children's results.

    Args:
        report: the bench report, changed in place; report["sweep"] (a list of settings per engine,
            or absent) says whether the threads were swept, report["threads"] is the equal setting.
        results: any key (the engine name, or (engine, setting key) with a sweep) -> what
            engines.run_engine returned (merged over rounds); each names its engine and setting.
        limits: each sentence's maximum length.
    """
    n = report["sentences"]
    threads = report.get("threads")
    equal = Setting(threads or 0)
    swept = bool(report.get("sweep"))

    def is_equal(res: dict) -> bool:
        return not swept or _setting(res, threads) == equal

    refs = [res for res in results.values() if res["engine"] == "torch"]
    ref = next((res for res in refs if is_equal(res)), refs[0] if refs else None)
    ref_out = {(c["beam"], c["batch"]): c["outputs"] for c in ref["configs"]} if ref else {}
    every = [
        _row(res["engine"], res, c, n, limits, ref_out, threads)
        for res in results.values()
        for c in res["configs"]
    ]
    report["ct2_check"] = _check_ct2(every, n)  # every CTranslate2 setting's outputs must be the model's
    rows = [
        r for r in every if not swept or (r["intra_threads"], r["parallel"]) == (equal.intra, equal.parallel)
    ]
    _add_ratios(rows)
    report["rows"] = rows
    if swept:
        report["sweep_rows"] = every
        report["best"] = _best(every)
