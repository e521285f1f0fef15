"""hf_real_sizes.py's report: the numbers summarised over rounds, and report.md's tables."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from hf_sizes_common import BATCH1_SENTENCES, ROWS
from scaffold import md_table

ROW_NAMES = [f"{s} b{b}" for s, _, b in ROWS]


def summarise(rounds: list[dict], names: list[str], table_path: Path, L: int) -> dict:
    """tokens/s per engine and row (median over rounds), identity with transformers, ratios within rounds.

    Args:
        rounds: per round, each engine's result.
        names: the engines.
        table_path: the target vocabulary's id -> token table (CTranslate2 answers in tokens).
        L: the new-token limit (unused; kept for the callers).

    Returns:
        tokens_per_s (medians), identity, ratios (medians of within-round ratios), tokens_per_s_best and
        ratios_best (the fastest round of each engine, and ratios of those).
    """
    rows, best_of = _speeds(rounds, names)
    return {
        "tokens_per_s": rows,
        "identity": _identity(rounds, names, table_path),
        "ratios": _ratios(rounds, names, rows),
        "tokens_per_s_best": best_of,
        "ratios_best": _best_ratios(names, best_of),
    }


def _identity(rounds: list[dict], names: list[str], table_path: Path) -> dict:
    """Per engine and row, "same/total": its first round's outputs equal to transformers' (the torch
    engine's)."""
    table = json.loads(table_path.read_text(encoding="utf-8"))
    to_id = {}
    for i, t in enumerate(table):
        to_id.setdefault(t, i)
    first = rounds[0]
    ref = first.get("torch", {}).get("rows")
    identity = {}
    for e in names:
        res = first.get(e, {})
        if "rows" not in res:
            continue
        for row, r in res["rows"].items():
            outs = r["outputs"]
            if e.startswith("ct2"):
                outs = [[to_id.get(t, -1) for t in o] for o in outs]
            if ref is not None:
                same = sum(a == b for a, b in zip(outs, ref[row]["outputs"]))
                identity.setdefault(e, {})[row] = f"{same}/{len(outs)}"
    return identity


def _rate(result: dict, row: str) -> float:
    """An engine's tokens/s on a row, from one round's result."""
    return result["rows"][row]["tokens"] / result["rows"][row]["seconds"]


def _speeds(rounds: list[dict], names: list[str]) -> tuple[dict, dict]:
    """Per engine and row, the median and the best tokens/s over the rounds."""
    rows, best_of = {}, {}
    for e in names:
        for row in ROW_NAMES:
            vals = [_rate(rd[e], row) for rd in rounds if "rows" in rd.get(e, {})]
            if vals:
                rows.setdefault(e, {})[row] = statistics.median(vals)
                best_of.setdefault(e, {})[row] = max(vals)
    return rows, best_of


def _ratios(rounds: list[dict], names: list[str], rows: dict) -> dict:
    """Per row and variant: the fastest CTranslate2 setting, and our and its speed ratios (medians over rounds
    of the ratios within a round)."""

    def ratio(a: str, b_names: list[str], row: str):
        per = []
        for rd in rounds:
            if "rows" not in rd.get(a, {}):
                continue
            bs = [_rate(rd[b], row) for b in b_names if "rows" in rd.get(b, {})]
            if bs:
                per.append(_rate(rd[a], row) / max(bs))
        return statistics.median(per) if per else None

    ratios = {}
    for row in ROW_NAMES:
        for variant in ("fp32", "int8"):
            ct2 = [n for n in names if n.startswith(f"ct2-{variant}-")]
            best = max((n for n in ct2 if row in rows.get(n, {})), key=lambda n: rows[n][row], default=None)
            ratios.setdefault(row, {})[f"ct2_{variant}_best"] = best
            ratios[row][f"ours_{variant}_vs_ct2"] = ratio(f"ours-{variant}", ct2, row)
            ratios[row][f"ours_{variant}_vs_torch"] = ratio(f"ours-{variant}", ["torch"], row)
            ratios[row][f"ct2_{variant}_vs_torch"] = ratio(best, ["torch"], row) if best else None
    return ratios


def _best_ratios(names: list[str], best_of: dict) -> dict:
    """The ratios of best of rounds: on a machine shared with other work, interference only slows a pass, so
    the fastest pass of each engine is the better estimate of its speed."""
    best_ratios = {}
    for row in ROW_NAMES:
        for variant in ("fp32", "int8"):
            ct2 = [n for n in names if n.startswith(f"ct2-{variant}-") and row in best_of.get(n, {})]
            top = max(ct2, key=lambda n: best_of[n][row], default=None)
            ours = best_of.get(f"ours-{variant}", {}).get(row)
            torch_ = best_of.get("torch", {}).get(row)
            best_ratios.setdefault(row, {})[f"ct2_{variant}_best"] = top
            best_ratios[row][f"ours_{variant}_vs_ct2"] = ours / best_of[top][row] if ours and top else None
            best_ratios[row][f"ours_{variant}_vs_torch"] = ours / torch_ if ours and torch_ else None
            best_ratios[row][f"ct2_{variant}_vs_torch"] = (
                best_of[top][row] / torch_ if top and torch_ else None
            )
    return best_ratios


# ----------------------------------------------------------------------------------------------- report
def fmt(x, spec=".1f", none="—"):
    suffix = "×" if spec.endswith("×") else ""
    return none if x is None else format(x, spec.rstrip("×")) + suffix


def fmt_load(load) -> str:
    return "—" if not load else " ".join(f"{x:.2f}" for x in load)


def markdown(report: dict) -> str:
    """report.md: per model its settings, the exports' time and memory, the speed and identity tables."""
    lines = [
        "# Real sizes: Hugging Face Marian and M2M100 imports against CTranslate2 and PyTorch",
        "",
        f"Machine: {report['machine']}",
        "",
    ]
    for name, m in report["models"].items():
        s = m["size"]
        lines += [
            f"## {name}: d_model {s['d']}, {s['layers']}+{s['layers']} layers, {s['heads']} heads, "
            f"ffn {s['ffn']}, vocabulary {s['vocab']:,}",
            "",
        ]
        lines += _settings(m, s)
        lines += _steps_table(m)
        lines += _speed_tables(m, s)
        lines += _macs(m, s)
        if m.get("errors"):
            lines += ["Failures:", ""] + [f"- {k}: {v}" for k, v in m["errors"].items()] + [""]
    lines += _notes(report)
    return "\n".join(lines)


def _settings(m: dict, s: dict) -> list[str]:
    """What was run: sentences, limits, threads, rounds, load, the code measured, parameters, sources."""
    b = m.get("build", {})
    b1 = min(m.get("batch1_sentences", BATCH1_SENTENCES), m["sentences"])
    lines = [
        f"Started {m['started']}; {m['sentences']} sentences (batch-1 rows: the first {b1}, one at a "
        f"time; b32 rows: batches of up to 32, here {min(32, m['sentences'])} sentences a batch), max "
        f"{m['max_new_tokens']} new tokens, min 0, length penalty 1.0, {m['threads']} threads, "
        f"{m['repeat']} round(s), CTranslate2 intra_threads {m.get('ct2_threads', [m['threads'], 1])}; "
        f"load average at start {fmt_load(m['load_start'])}, at end {fmt_load(m.get('load_end'))}; wall "
        f"{fmt(m.get('wall_s'), '.0f')} s."
    ]
    if m.get("code"):
        changed = m["code"]["changed"]
        lines.append(
            f"Code measured: {m['code']['head']}"
            + (f"; uncommitted changes in {', '.join(changed)}" if changed else "")
            + "."
        )
    if b:
        lines.append(f"Parameters {b['parameters']:,}; SentencePiece trained on {b['spm_trained_on']}.")
    if "source_lengths" in m:
        language = ", the language token" if s["family"] == "m2m100" else ""
        lines.append(
            f"Source length (tokens, with the end token{language}): "
            f"mean {m['source_lengths']['mean']:.1f}, max {m['source_lengths']['max']}."
        )
    lines.append("")
    return lines


def _steps_table(m: dict) -> list[str]:
    """The exports' and the conversion's seconds, memory against the fp32 weights, and output size."""
    w = m.get("weights_bytes")
    if not w:
        return []
    lines = [
        "| step | seconds | peak RSS MB | RSS after imports MB | peak / fp32 weights (goal ≤ 2×) "
        "| output MB |",
        "|---|---|---|---|---|---|",
    ]
    lines.append(f"| fp32 weights (model.safetensors) | | | | | {w / 1e6:.0f} |")
    wheres = []
    for key, r in m.get("steps", {}).items():
        pw = r.get("peak_where") or {}
        if pw.get("where"):
            wheres.append(
                f"- {key}: largest resident set sampled {pw['rss_mb']:.0f} MB in {' > '.join(pw['where'])}"
            )
        if r.get("error", "").startswith("not run"):
            lines.append(f"| {key} | {r['error']} | | | | |")
        elif "error" in r:
            seen = r.get("peak_rss_seen_gb", 0) * 1024
            lines.append(
                f"| {key} | FAILED after {r['wall_s']:.0f} s (peak RSS seen {seen:.0f} MB): "
                f"{r['error'][-400:]} | | | | |"
            )
        else:
            peak = r["peak_rss_mb"] * 2**20
            net = (r["peak_rss_mb"] - r["rss_after_imports_mb"]) * 2**20
            lines.append(
                f"| {key} | {r['seconds']:.1f} | {r['peak_rss_mb']:.0f} | "
                f"{r['rss_after_imports_mb']:.0f} | "
                f"{peak / w:.2f}× ({net / w:.2f}× above the imports) | {r['bytes'] / 1e6:.0f} |"
            )
    lines.append("")
    if m.get("steps_reused_from"):
        lines += [f"Export and conversion measurements reused from {m['steps_reused_from']}.", ""]
    if wheres:
        lines += (
            [
                "Where the exports' memory peaked (sampled every 0.1 s by a Python thread, innermost "
                "frames last; it cannot sample while a C++ call holds the GIL, e.g. torch.onnx's "
                "serialisation, so the parent's peak RSS seen can be higher):",
                "",
            ]
            + wheres
            + [""]
        )
    return lines


def _speed_tables(m: dict, s: dict) -> list[str]:
    """tokens/s per row and engine with the ratios, then each engine's load time, memory and identity."""
    use_best = m.get("repeat", 1) > 1 and "tokens_per_s_best" in m
    tps = m.get("tokens_per_s_best" if use_best else "tokens_per_s", {})
    ratios = m.get("ratios_best" if use_best else "ratios", {})
    if not tps:
        return []
    head = ["row", "PyTorch generate"]
    for v in ("fp32", "int8"):
        head += [f"ours {v}", f"CT2 {v} best", f"ours {v} / CT2 {v}", f"ours {v} / PyTorch"]
    rows = []
    for row in ROW_NAMES:
        ra = ratios[row]
        cells = [row, fmt(tps.get("torch", {}).get(row))]
        for v in ("fp32", "int8"):
            best = ra[f"ct2_{v}_best"]
            cells += [
                fmt(tps.get(f"ours-{v}", {}).get(row)),
                f"{fmt(tps.get(best, {}).get(row))} ({best.split('-', 2)[2] if best else '—'})",
                fmt(ra[f"ours_{v}_vs_ct2"], ".2f×"),
                fmt(ra[f"ours_{v}_vs_torch"], ".2f×"),
            ]
        rows.append(cells)
    lines = md_table(head, rows) + ["", _speed_note(m, s, ratios, use_best), ""]
    head = ["engine", "load s", "RSS after imports MB", "RSS after load MB", "peak RSS MB"]
    head.append("identical to transformers (" + " / ".join(ROW_NAMES) + ")")
    rows = []
    for e, r in m["rounds"][0].items():
        if "error" in r:
            rows.append([e, f"FAILED: {r['error'][:300]}", "", "", "", ""])
            continue
        same = " / ".join(m["identity"].get(e, {}).get(row, "—") for row in ROW_NAMES)
        rss = [f"{r[k]:.0f}" for k in ("rss_after_imports_mb", "rss_after_load_mb", "peak_rss_mb")]
        rows.append([e, f"{r['load_s']:.1f}", *rss, same])
    return lines + md_table(head, rows) + [""]


def _speed_note(m: dict, s: dict, ratios: dict, use_best: bool) -> str:
    """The line under the speed table: what tokens/s counts, which CTranslate2 settings, rounds, ratios."""
    return (
        "tokens/s (generated target tokens incl. the end token"
        f"{' and the forced __fr__' if s['family'] == 'm2m100' else ''}, per second of wall time); "
        "CT2 best: the fastest of the intra_threads settings "
        f"{m.get('ct2_threads', [m['threads'], 1])}{' and t2-mkl' if m.get('ct2_mkl') else ''} "
        "for that row (tN: N threads); "
        + (
            f"each figure is the engine's FASTEST of {m['repeat']} rounds (the machine was shared: "
            "interference only slows a pass) and ratios are ratios of those; report.json also has the "
            "medians and the within-round ratios"
            if use_best
            else "one round"
        )
        + "; CT2 int8 / PyTorch: "
        + ", ".join(f"{row} {fmt(ratios[row]['ct2_int8_vs_torch'], '.2f×')}" for row in ratios)
        + "; CT2 fp32 / PyTorch: "
        + ", ".join(f"{row} {fmt(ratios[row]['ct2_fp32_vs_torch'], '.2f×')}" for row in ratios)
        + (". -mkl: CT2_USE_MKL=1" if m.get("ct2_mkl") else "")
        + "."
    )


def _macs(m: dict, s: dict) -> list[str]:
    """The computed (not measured) multiply-adds of a step: the layers' against the output projection's."""
    mc = m.get("macs")
    if not mc:
        return []
    return [
        f"Computed, not measured: one decoder step at one row is {mc['layers'] / 1e6:.1f}M multiply-adds "
        f"in the {s['layers']} layers (self-attention 4d², cross-attention query and output 2d², "
        f"feed-forward 2·d·ffn each) and {mc['projection'] / 1e6:.1f}M in the output projection (d·V): "
        f"the projection is {100 * mc['share']:.0f}% of a step's multiply-adds (attention over the cache "
        "aside). At one row a step streams every weight matrix once, so its time follows those bytes: "
        f"the projection's {4 * mc['projection'] / 1e6:.0f} MB fp32 against the layers' "
        f"{4 * mc['layers'] / 1e6:.0f} MB.",
        "",
    ]


def _notes(report: dict) -> list[str]:
    """The notes closing report.md, with the outputs of transformers that ran to the length limit."""
    lines = [
        "Notes:",
        "",
        "- transformers' generate runs with the model's forced_eos_token_id (OPUS-MT's "
        "generation_config has 0: </s> forced as the last token at max_length); imported bundles do the "
        "same (decoding.forced_eos), CTranslate2 does not, and random weights run every sentence to "
        "max_length, so CTranslate2's Marian outputs differ from transformers' in that last token.",
        "- Every engine gets the same limit: our max_decoding_length, CTranslate2's max_decoding_length "
        "and transformers' max_length - 1 all count the forced __fr__ and the end token (checked: equal "
        "output lengths).",
        "- Random weights: near-ties in the scores are possible; identity below n/n at fp32 is "
        "reported, not judged. int8 engines legitimately differ.",
        "",
    ]
    full = []
    for name, m in report["models"].items():
        ref = (m.get("rounds") or [{}])[0].get("torch", {}).get("rows", {})
        outs = [o for r in ref.values() for o in r["outputs"]]
        if outs:
            full.append(f"{name} {sum(len(o) == m['max_new_tokens'] for o in outs)}/{len(outs)}")
    if full:
        lines.pop()
        lines += [
            "- Outputs of transformers that ran to the length limit (no end token generated), over all "
            "rows: " + ", ".join(full) + ": the tokens counted are then the limit per sentence, for "
            "every engine alike.",
            "",
        ]
    return lines
