"""The report of `seq2onnx verify-host`: its rows (one host's tokens and searches against the
other's, with the first differences of each check) and the report as a table.
"""

from __future__ import annotations

import json

SHOWN_DIFFERENCES = 5  # per check


def check_row(name: str, value: str, bound: str, passed: bool, detail: str = "") -> dict:
    return {"name": name, "value": value, "bound": bound, "passed": bool(passed), "detail": detail}


def _cut(text: str, n: int = 50) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def compare_search(
    label: str, sources: list[str], python, node: list[dict], differences: list, host: str = "node"
) -> tuple[dict, dict, float, int]:
    """Rows for one search: ids identical per sentence (every hypothesis), texts identical, and the
    largest score difference over hypotheses whose ids agree. `host` names the other side in
    `differences`."""
    same_ids = same_text = hyps = compared = 0
    worst = 0.0
    shown = 0
    for i, (p, n) in enumerate(zip(python, node)):
        missing = abs(len(p.token_ids) - len(n["token_ids"]))  # hypotheses one side lacks
        ids_equal = [a == b for a, b in zip(p.token_ids, n["token_ids"])] + [False] * missing
        same_ids += all(ids_equal)
        hyps += len(p.hypotheses)
        same_text += sum(a == b for a, b in zip(p.hypotheses, n["hypotheses"]))
        for k, equal in enumerate(ids_equal):
            if equal:
                compared += 1
                worst = max(worst, abs(p.scores[k] - n["scores"][k]))
        if not all(ids_equal) and shown < SHOWN_DIFFERENCES:
            k = ids_equal.index(False)
            differences.append(
                {
                    "check": label,
                    "sentence": i,
                    "source": sources[i],
                    "hypothesis": k,
                    "python": {
                        "ids": p.token_ids[k] if k < len(p.token_ids) else None,
                        "score": p.scores[k] if k < len(p.scores) else None,
                    },
                    host: {
                        "ids": n["token_ids"][k] if k < len(n["token_ids"]) else None,
                        "score": n["scores"][k] if k < len(n["scores"]) else None,
                    },
                }
            )
            shown += 1
    total = len(python)
    ids_row = check_row(
        f"{label} token ids identical",
        f"{same_ids}/{total}",
        "all",
        same_ids == total,
        "sentences whose every hypothesis has the same ids",
    )
    text_row = check_row(
        f"{label} translations identical",
        f"{same_text}/{hyps}",
        "all",
        same_text == hyps,
        "detokenised hypotheses",
    )
    return ids_row, text_row, worst, compared


def _note(differences: list, label: str, i: int, text: str, python: dict, host: str, got: dict) -> None:
    """Records sentence `i`'s difference in a check, the first SHOWN_DIFFERENCES of each check only."""
    if sum(d["check"] == label for d in differences) < SHOWN_DIFFERENCES:
        differences.append({"check": label, "sentence": i, "source": text, "python": python, host: got})


def compare_tokens(label: str, texts: list[str], tokenizer, node: list[dict], differences: list) -> dict:
    same = 0
    for i, (text, n) in enumerate(zip(texts, node)):
        ids = tokenizer.encode(text)
        if n["ids"] == ids and n["decoded"] == tokenizer.decode(ids):
            same += 1
        else:
            python = {"ids": ids, "decoded": tokenizer.decode(ids)}
            _note(differences, label, i, text, python, "node", {"ids": n["ids"], "decoded": n["decoded"]})
    return check_row(
        f"{label} ids identical",
        f"{same}/{len(texts)}",
        "all",
        same == len(texts),
        "ids and detokenised text",
    )


def compare_pieces(
    label: str, texts: list[str], tokenizer, pieces: list[list[str]], differences: list
) -> dict:
    """The row of the source pieces the page shows (its heatmaps' columns, an empty piece as "·",
    then "</s>") against the Python tokenizer's pieces of each text."""
    same = 0
    for i, (text, got) in enumerate(zip(texts, pieces, strict=True)):
        want = [p or "·" for p in tokenizer.encode(text, out_type=str)] + ["</s>"]
        if got == want:
            same += 1
        else:
            _note(differences, label, i, text, {"pieces": want}, "browser", {"pieces": got})
    return check_row(
        f"{label} pieces identical",
        f"{same}/{len(texts)}",
        "all",
        same == len(texts),
        "the page's heatmap columns",
    )


def host_label(host: str, runner: dict) -> str:
    """How the report names the other host: its versions."""
    if host == "browser":
        return (
            f"the browser host ({runner['chromium_version']}, headless, onnxruntime-web "
            f"{runner['onnxruntime_web']}, WebAssembly; the page of `seq2onnx web`)"
        )
    return f"the Node host ({runner['node_version']}, onnxruntime-node {runner['onnxruntime_node']})"


def _header(report: dict, source: str) -> list[str]:
    if report["host"] == "browser":
        threads = f"Python {report['threads']} thread(s), the page WebAssembly as onnxruntime-web sets it"
    else:
        threads = f"{report['threads']} thread(s) each"
    return [
        f"verify-host {report['bundle']}: {report['host_label']} against the Python runtime "
        f"(onnxruntime {report['onnxruntime']})",
        f"{report['decoder']} decoder on both, CPU, {threads}; "
        + (f"max length {report['max_length']}; " if report.get("max_length") else "")
        + f"{source or str(report['sentences']) + ' sentences'}; {report['empty']} empty, "
        f"{report['truncated']} cut to max_positions",
    ]


def format_report(report: dict, source: str = "") -> str:
    """Returns verify_host's report as a table.

    One row per check with its value, bound and result; then each difference with both hosts' ids
    and scores; then the speed of each host (a measurement, not a check); then PASSED or FAILED.

    Args:
        report: what verify_host returned.
        source: where the sentences came from (read_sentences); "": their count.
    """
    lines = [*_header(report, source), f"{'check':<44} {'value':>11} {'bound':>7}  result"]
    for c in report["checks"]:
        lines.append(
            f"{c['name']:<44} {c['value']:>11} {c['bound']:>7}  {'ok' if c['passed'] else 'FAIL'}  "
            f"{c['detail']}"
        )
    if report["differences"]:
        lines.append(
            "differences (first of each check; scores are sums of log-probabilities, end token included):"
        )
        for d in report["differences"]:
            hypothesis = f", hypothesis {d['hypothesis']}" if "hypothesis" in d else ""
            where = f"  {d['check']}, sentence {d['sentence']}{hypothesis}"
            lines.append(f"{where}: {_cut(d['source'])!r}")
            for side in ("python", report["host"]):
                values = d[side]
                shown = ", ".join(
                    f"{k} {_cut(json.dumps(v, ensure_ascii=False), 80)}" for k, v in values.items()
                )
                lines.append(f"    {side:<6} {shown}")
    lines.append(
        "speed (a measurement, not a check): target tokens per second inside translate calls, "
        "bundle load excluded"
        + ("; the page's from the click to its results drawn" if report["host"] == "browser" else "")
    )
    for label, s in report["speed"].items():
        rate = lambda tokens, seconds: f"{tokens / seconds:,.0f}" if seconds else "-"  # noqa: E731
        lines.append(
            f"  {label:<8} python {rate(s['python_tokens'], s['python_s']):>8} tok/s "
            f"({s['python_s']:.2f} s)   {report['host']} {rate(s['host_tokens'], s['host_s']):>8} tok/s "
            f"({s['host_s'] or 0:.2f} s)"
        )
    lines.append(f"wall time {report['wall_s']:.1f} s")
    lines.append("PASSED" if report["passed"] else "FAILED: see the rows marked FAIL")
    return "\n".join(lines)
