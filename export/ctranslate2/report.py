"""verify-ct2's report in words: the checks as a table, and the first differing sentences side by side."""

from __future__ import annotations

from seq2onnx.export.ctranslate2.convert import DEPLOY_JSON
from seq2onnx.export.ctranslate2.verify import SHOWN


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _side_line(label: str, side: dict) -> str:
    return (
        f"    {label:<12} {side['length']:>4} {side['torch_score']:>10.4f} {side['torch_normalized']:>8.4f} "
        f"{_num(side['ct2_score'], '.4f'):>10} {_num(side['ct2_normalized'], '.4f'):>8}  {side['text']!r}"
    )


def format_ct2_report(report: dict) -> str:
    """Formats verify_ct2's report as a table in the look of parity.format_report.

    The checks with bound and result, the measurements (no bound: they decide nothing), then each
    difference with both scores (SHOWN per search).

    Args:
        report: what verify_ct2 returned.

    Returns:
        The text, ending with PASSED or FAILED.
    """
    lines = _head(report) + _checks(report) + _differences(report)
    lines.append("PASSED" if report["passed"] else "FAILED: see the checks marked FAIL")
    return "\n".join(lines)


def _head(report: dict) -> list[str]:
    """What was compared, under which convention, and how the recipe departs from it."""
    o = report["options"]
    rule = o["max_decoding_length"]
    alpha = o["length_penalty"]
    lines = [
        f"verify {report['model_dir']} against {report['checkpoint']}",
        f"{report['engine']} ({report['device']}, compute_type {report['compute_type']}) driven by "
        f"{DEPLOY_JSON}, "
        f"{report['sentences']} test sentences; the convention: length_penalty {alpha:g}, "
        "min_decoding_length "
        f"{o['min_decoding_length']}, max_decoding_length min({rule['a']:g} x source pieces + {rule['b']}, "
        f"{rule['max']}) per sentence",
    ]
    if report.get("recipe_changes"):
        lines.append(
            f"{DEPLOY_JSON} departs from the convention (PyTorch keeps to it): "
            + "; ".join(report["recipe_changes"])
        )
    return lines


def _checks(report: dict) -> list[str]:
    """The checks' table, then the measurements."""
    lines = [
        f"{'tier':<7} {'search':<8} {'check':<42} {'value':>10} {'bound':>10}  result",
    ]
    for c in report["checks"]:
        lines.append(
            f"{c['tier']:<7} {c['search']:<8} {c['name']:<42} {c['value']:>10.1%} "
            f"{'>= ' + format(c['bound'], '.1%'):>10}  "
            f"{'ok' if c['passed'] else 'FAIL'}  {c['detail']}"
        )
    lines.append("measurements (not checks):")
    for m in report["measurements"]:
        value = f"{m['value']:.2e}" if m["tier"] == "score" else f"{m['value']:.2f}"
        lines.append(f"{m['tier']:<7} {m['search']:<8} {m['name']:<42} {value:>10}  {m['detail']}")
    return lines


def _differences(report: dict) -> list[str]:
    """The differing sentences, SHOWN per search, each with both engines' scores of both hypotheses."""
    diffs = report["differences"]
    if not diffs:
        return []
    alpha = report["options"]["length_penalty"]
    lines = [
        f"differences ({len(diffs)}): both hypotheses scored by both engines (teacher forcing; score = "
        "sum "
        f"of log-probabilities with </s>); gap = torch's - ct2's hypothesis, score/len^{alpha:g} under "
        f"PyTorch (> 0: PyTorch's scores higher); near-tie: the engines' log-probabilities agree within "
        f"{report['tie']:g} and the deciding gap (greedy: of the first differing tokens; beam: of the "
        f"hypotheses) is <= {report['tie']:g}"
    ]
    shown: dict[str, int] = {}
    for d in diffs:
        shown[d["search"]] = shown.get(d["search"], 0) + 1
        if shown[d["search"]] <= SHOWN:
            lines += _difference(d, alpha)
    for search, n in shown.items():
        if n > SHOWN:
            lines.append(f"  ... {n - SHOWN} more {search} differences (all of them in --json)")
    return lines


def _difference(d: dict, alpha: float) -> list[str]:
    """One differing sentence: where it first differs, its source, both hypotheses under both engines."""
    f = d["first_difference"]
    where = (
        ""
        if f is None
        else (
            f"; first differs at token {f['position']}: torch {f['torch_piece']!r}, ct2 "
            f"{f['ct2_piece']!r}, "
            f"log-probability gap {f['torch_gap']:.1e} under PyTorch, "
            f"{_num(f.get('ct2_gap'), '.1e')} under CTranslate2"
        )
    )
    return [
        f"  {d['search']} sentence {d['index']}: gap {d['gap']:.1e} ({d['kind']}){where}",
        f"    source {d['source']!r}",
        f"    {'hypothesis':<12} {'len':>4} {'torch score':>10} {'/len^' + format(alpha, 'g'):>8} "
        f"{'ct2 score':>10} {'/len^' + format(alpha, 'g'):>8}  text",
        _side_line("torch's", d["torch"]),
        _side_line("ct2's", d["ct2"]),
    ]
