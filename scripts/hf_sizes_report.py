"""hf_real_sizes.py's report: summary.md's tables from results.json's step records, on the CPU or the GPU."""

from __future__ import annotations

import json
from pathlib import Path

from scaffold import fmt, md_table

REFERENCE = "generate-fp32"  # transformers' generate() in float32 (TF32 off): every row's token ids
# our precision -> CTranslate2's compute type it is held to (CTranslate2 has no int4 on the CPU)
CT2_TYPE = {"fp32": "float32", "int8": "int8", "int4": "int8", "int4t4": "int8", "fp16": "float16"}
SIBLING = {  # fp16 engines and the fp32 sibling each is held to, as agreement of outputs
    "ours-fp16": "ours-fp32",
    "generate-fp16": "generate-fp32",
    "ct2-float16": "ct2-float32",
    "ct2-int8_float16": "ct2-float32",
}


def _table(head: list[str], rows: list[list]) -> list[str]:
    return md_table(head, rows) + [""]


def row_names(settings: dict) -> list[str]:
    """The rows in reading order: greedy, then beam 4, each by batch."""
    return [f"{s} b{b}" for s, _, b in sorted(settings["rows"], key=lambda r: (r[1], r[2]))]


def rate(rec: dict | None, row: str) -> float | None:
    """An engine's tokens/s on a row: the fastest of its rounds (interference only slows a pass)."""
    rates = [r["tokens"] / r["seconds"] for res in _results(rec) if (r := res.get("rows", {}).get(row))]
    return max(rates) if rates else None


def _results(rec: dict | None) -> list[dict]:
    return [x for x in [(rec or {}).get("result") or {}, *(rec or {}).get("rounds", [])] if x]


def outputs(rec: dict | None, row: str, to_id: dict) -> list | None:
    """An engine's outputs on a row (its first round) as id lists (CTranslate2 answers in tokens)."""
    r = ((rec or {}).get("result") or {}).get("rows", {}).get(row)
    if not r:
        return None
    if any(o and isinstance(o[0], str) for o in r["outputs"]):
        return [[to_id.get(t, -1) for t in o] for o in r["outputs"]]
    return r["outputs"]


def same(a: list | None, b: list | None, limit: int | None = None) -> str:
    """ "equal/total" of two engines' outputs on a row. With limit (CTranslate2 against generate()): an output
    cut at the limit also counts as equal to the reference's one token shorter that it begins with, since
    transformers (and ours) force the end token as the last one where the config has forced_eos_token_id
    (OPUS-MT), and CTranslate2 does not."""
    if a is None or b is None:
        return "—"

    def eq(x, y):
        return x == y or (limit is not None and len(x) == limit and len(y) == limit - 1 and x[:-1] == y)

    return f"{sum(eq(x, y) for x, y in zip(a, b))}/{len(a)}"


def ratio(a: float | None, b: float | None, spec: str = ".2f") -> str:
    return "—" if not a or not b else format(a / b, spec) + "×"


def _id_table(steps: dict) -> dict:
    """The target vocabulary's token -> id, from the prepare step's table (CTranslate2 answers in tokens)."""
    path = ((steps.get("prepare") or {}).get("result") or {}).get("table")
    if not path or not Path(path).is_file():
        return {}
    to_id: dict = {}
    for i, t in enumerate(json.loads(Path(path).read_text(encoding="utf-8"))):
        to_id.setdefault(t, i)
    return to_id


def _prep_rows(steps: dict, engines: list[str]) -> list[list]:
    """The preparation steps: seconds, peak RSS (and against the fp32 weights), output size."""
    weights = ((steps.get("build") or {}).get("result") or {}).get("weights_bytes")
    rows = []
    for s, r in steps.items():
        if s in engines or "@" in s:
            continue
        res = r.get("result") or {}
        peak = res.get("peak_rss_mb")
        share = ratio(peak * 2**20, weights) if peak and weights and s != "build" else "—"
        out = res.get("bytes")
        rows.append([s, r["status"], fmt(r.get("seconds"), ".1f"), fmt(peak), share, fmt(out and out / 1e6)])
        rows[-1].append((r.get("error") or "")[-200:])
    return rows


def _engine_rows(steps: dict, engines: list[str]) -> list[list]:
    rows = []
    for e in engines:
        r, res = steps[e], steps[e].get("result") or {}
        gpu = [fmt(res.get(k)) for k in ("gpu_after_load_mb", "gpu_peak_mb")]
        rss = [fmt(res.get(k)) for k in ("rss_after_load_mb", "peak_rss_mb")]
        rows.append([e, r["status"], res.get("ran", "—"), fmt(res.get("load_s"), ".2f"), *rss, *gpu])
        rows[-1].append((r.get("error") or "")[-200:])
    return rows


def _ratio_rows(steps: dict, engines: list[str], rows: list[str]) -> list[list]:
    """Each of our engines against the fastest CTranslate2 setting of its type, and against generate()."""
    out = []
    for e in (e for e in engines if e.startswith("ours-")):
        kind = CT2_TYPE.get(e.split("-")[1])
        ct2 = [c for c in engines if c.split("-")[:2] == ["ct2", kind]]
        cells = []
        for r in rows:
            best = max(ct2, key=lambda c: rate(steps[c], r) or 0, default=None)
            theirs = rate(steps[best], r) if best else None
            cells.append(f"{ratio(rate(steps[e], r), theirs)} ({best[4:] if theirs else '—'})")
        out.append([f"{e} / best ct2-{kind}", *cells])
        if REFERENCE in steps:
            out.append(
                [f"{e} / {REFERENCE}", *(ratio(rate(steps[e], r), rate(steps[REFERENCE], r)) for r in rows)]
            )
    return out


def model_section(model: str, steps: dict, settings: dict) -> list[str]:
    """One model's tables: preparation, engines, tokens/s, ratios, ids, fp16 agreement, GPU goals."""
    rows = row_names(settings)
    engines = [e for e in settings["engines"] if e in steps]
    lines = [f"## {model}", ""]
    build = (steps.get("build") or {}).get("result") or {}
    if build.get("parameters"):
        lines += [
            f"{build['parameters']:,} parameters (random); SentencePiece: {build.get('spm_trained_on')}.",
            "",
        ]
    head = ["step", "status", "seconds", "peak RSS MB", "peak / fp32 weights", "MB out", "error"]
    lines += _table(head, _prep_rows(steps, engines))
    head = ["engine", "status", "ran", "load s", "RSS after load MB", "peak RSS MB", "GPU MB after load"]
    lines += ["### Engines", ""] + _table([*head, "GPU MB peak", "error"], _engine_rows(steps, engines))
    speeds = [[e, *(fmt(rate(steps[e], r), ",.1f") for r in rows)] for e in engines]
    lines += ["### tokens/s (the fastest round)", ""] + _table(["engine", *rows], speeds)
    lines += ["### Ratios", ""] + _table(["ours", *rows], _ratio_rows(steps, engines, rows))
    to_id = _id_table(steps)
    out = {e: {r: outputs(steps[e], r, to_id) for r in rows} for e in engines}
    ref, limit = out.get(REFERENCE, {}), settings["max_new_tokens"]
    ids = [
        [e, *(same(out[e][r], ref.get(r), limit if e.startswith("ct2") else None) for r in rows)]
        for e in engines
        if e != REFERENCE
    ]
    lines += [f"### Token ids equal to {REFERENCE}", ""] + _table(["engine", *rows], ids)
    agree = [
        [f"{e} = {s}", *(same(out[e][r], out[s][r]) for r in rows)]
        for e, s in SIBLING.items()
        if e in out and s in out
    ]
    if agree:
        lines += ["### fp16 against fp32 (same engine), outputs equal", ""] + _table(["pair", *rows], agree)
    if settings["device"] == "cuda":
        lines += ["### Goals", ""] + goals(steps, rows, out)
    return lines


def goals(steps: dict, rows: list[str], out: dict) -> list[str]:
    """Issue 57's goals on this model, each row's ratio as measured in this run."""

    def tok(e, r):
        return rate(steps.get(e), r)

    def gpu(e):
        return ((steps.get(e) or {}).get("result") or {}).get("gpu_peak_mb")

    batches = sorted({int(r.split(" b")[1]) for r in rows})
    mid = [r for r in rows if r.endswith(f" b{batches[len(batches) // 2]}")]  # batch 32 on the GPU
    fp16 = "ours fp16 / CTranslate2 float16"
    table = [[f"{fp16}, {r}", ratio(tok("ours-fp16", r), tok("ct2-float16", r)), "≥ 1.0×"] for r in rows]
    table += [
        [f"ours fp16 / generate() fp16, {r}", ratio(tok("ours-fp16", r), tok("generate-fp16", r)), "≥ 3×"]
        for r in mid
    ]
    table += [
        [f"ours fp16 / ours fp32, {r}", ratio(tok("ours-fp16", r), tok("ours-fp32", r)), "≥ 1.5×"]
        for r in mid
    ]
    table += [
        [f"GPU peak, {fp16}", ratio(gpu("ours-fp16"), gpu("ct2-float16")), "≤ 1.2×"],
        ["GPU peak, ours fp32 / CTranslate2 float32", ratio(gpu("ours-fp32"), gpu("ct2-float32")), "≤ 1.2×"],
    ]
    fp32 = [same(out.get("ours-fp32", {}).get(r), out.get(REFERENCE, {}).get(r)) for r in rows]
    table.append(["ours fp32 token ids = generate() fp32, every row", ", ".join(fp32), "all"])
    greedy = [
        same(out.get("ours-fp16", {}).get(r), out.get("ours-fp32", {}).get(r))
        for r in rows
        if r.startswith("greedy")
    ]
    trained = (
        "ours fp16 = ours fp32, greedy rows (random weights: the 99% goal is on the trained recipe model)"
    )
    return _table(["goal", "measured", "wanted"], table + [[trained, ", ".join(greedy), "≥ 99%"]])


def markdown(report: dict) -> str:
    """summary.md: the environment, the settings, then each model's tables."""
    env, s = report["env"], report["settings"]
    budget = "no budget" if s.get("budget_s") is None else f"of {s['budget_s']:.0f}"
    lines = [
        f"# Real sizes on the {s['device']}: {fmt(report.get('seconds'), '.0f')} s {budget}",
        "",
        "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()),
        "",
        f"Settings: {s['sentences']} sentences (batch-1 rows: the first {s['batch1']}, one at a time), at "
        f"most {s['max_new_tokens']} new tokens, min 0, length penalty 1.0, {s.get('threads', 1)} threads, "
        f"{s.get('repeat', 1)} round(s); rows, in order, {', '.join(f'{r[0]} b{r[2]}' for r in s['rows'])}; "
        "tokens/s = generated tokens (end token and forced language token included) / seconds, after one "
        "warm-up batch per row; GPU MB = the device's used memory (NVML) less what was used before the "
        "engine's process started, its CUDA context included. ct2-TYPE-tN: N intra threads.",
        "",
        f"Command: `{s['command']}`",
        "",
    ]
    for model, steps in report["steps"].items():
        lines += model_section(model, steps, s)
    return "\n".join(lines)
