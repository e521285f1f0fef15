"""`seq2onnx bench`'s report as text: the machine, the tables of rows, the notes and skipped engines.

With a thread sweep three tables: each engine at its best setting per row (the headline, ratios best
against best), every setting's tokens/s and peak memory, and every engine at the same threads.
Without one, the equal-threads table alone.
"""

from __future__ import annotations

from seq2onnx.bench.engines import ENGINES, TORCH_BEAM_NOTE


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def format_machine(report: dict) -> str:
    """Formats the lines above the table: machine, threads, versions, load, model, sentences.

    Args:
        report: the bench report.

    Returns:
        The lines, joined.
    """
    m = report["machine"]
    v = m["versions"]
    cores = f"{m['logical_cores']} logical cores"
    if m.get("physical_cores"):
        cores += f", {m['physical_cores']} physical"
    if m.get("usable_cores") and m["usable_cores"] != m["logical_cores"]:
        cores += f", {m['usable_cores']} usable by this process"
    cfg = report["model"]
    if report.get("sweep"):
        tried = sorted({label for labels in report["sweep"].values() for label in labels}, key=_setting_order)
        threads = (
            f"swept: every engine at {', '.join(tried)} (N x 1 thread: N batches at once, CTranslate2 "
            "inter_threads=N; seq2onnx one Translator shared by N threads; not for torch); the "
            f"equal-threads table is every engine at {report['threads']}"
        )
    else:
        threads = (
            f"{report['threads']} for every engine (torch.set_num_threads, onnxruntime "
            f"intra_op_num_threads, ctranslate2 intra_threads; inter_threads=1)"
        )
    lines = [
        f"machine:   {m['cpu']} ({cores}; {m['memory_gb']} GB), {m['os']}, Python {m['python']}",
        f"threads:   {threads}",
        f"versions:  torch {v['torch']}, onnxruntime {v['onnxruntime']}, ctranslate2 "
        f"{v['ctranslate2'] or '(not installed)'}, numpy {v['numpy']}",
        f"load avg:  {m['load_average_at_start']} at start (other processes on the CPU make timings noisy)",
        f"model:     {report['checkpoint']}: d_model {cfg['d_model']}, "
        f"{cfg['n_encoder_layers']}+{cfg['n_decoder_layers']} layers, {cfg['n_heads']} heads, d_ff "
        f"{cfg['d_ff']}, vocab {cfg['src_vocab_size']}/{cfg['tgt_vocab_size']}, "
        f"{'pre' if cfg['pre_norm'] else 'post'}-LN",
        f"sentences: {report['sentences']} from the {report['sentences_source']}, "
        f"{report['mean_source_tokens']:.1f} source tokens on average; the same sentences and batches for "
        f"every engine; max length {report['max_length']}",
    ]
    return "\n".join(lines)


def _setting_order(label: str) -> tuple[int, int]:
    """Sorts setting labels ("2 threads", "2 x 1 thread"): one batch at a time first, then by threads."""
    words = label.split()
    return (0, int(words[0])) if words[1] != "x" else (1, int(words[0]))


def _lines(head: list[str], rows: list[list[str]], groups: list[str], left: set[str]) -> list[str]:
    """Aligns a table: the columns named in `left` left, the others right; a blank line between groups."""
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]

    def line(cells):
        return "  ".join(c.ljust(w) if h in left else c.rjust(w) for h, c, w in zip(head, cells, widths))

    out = [line(head), line(["-" * w for w in widths])]
    prev = None
    for group, cells in zip(groups, rows):
        if prev is not None and group != prev:
            out.append("")
        prev = group
        out.append(line(cells))
    return out


def format_table(report: dict, key: str = "rows") -> str:
    """Formats a table of rows: one line per row, engines separated by a blank line.

    VOID marks CTranslate2 rows that do not count.

    Args:
        report: the bench report.
        key: "rows" (the equal-threads rows) or "best" (each engine's best setting per configuration,
            with a column naming the setting).

    Returns:
        The table.
    """
    setting = key == "best"
    head = [
        "engine",
        "search",
        "batch",
        *(["setting"] if setting else []),
        "tokens/s",
        "sent/s",
        "p50 ms",
        "p90 ms",
        "peak RSS MB",
        "x torch",
        "x ct2",
        "agree",
    ]
    rows = []
    for r in report[key]:
        agree = "-" if r["agreement"] is None else f"{r['agreement']}/{r['agreement_of']}"
        rows.append(
            [
                r["engine"] + (" (VOID)" if r.get("void") else ""),
                r["search"],
                str(r["batch"]),
                *([r["setting"]] if setting else []),
                _f(r["tokens_per_s"], ".0f"),
                _f(r["sentences_per_s"], ".1f"),
                _f(r["p50_ms"], ".1f"),
                _f(r["p90_ms"], ".1f"),
                _f(r["peak_rss_mb"], ".0f"),
                _f(r["x_torch"], ".2f"),
                _f(r["x_ct2"], ".2f"),
                agree,
            ]
        )
    return "\n".join(_lines(head, rows, [r["engine"] for r in report[key]], {"engine", "search", "setting"}))


def format_settings(report: dict) -> str:
    """Formats the sweep: one line per engine and setting, tokens/s per configuration (* the engine's best
    in that configuration) and the process's peak RSS.

    Args:
        report: a bench report with a sweep (report["sweep_rows"]).

    Returns:
        The table.
    """
    configs = [(c["search"], c["batch"]) for c in report["configs"]]
    best = {(r["engine"], r["search"], r["batch"]): r["setting"] for r in report["best"]}
    cells: dict[tuple, dict] = {}
    for r in report["sweep_rows"]:
        cell = cells.setdefault((r["engine"], r["setting"]), {"rss": r["peak_rss_mb"]})
        cell[(r["search"], r["batch"])] = r
    head = ["engine", "setting", *(f"{s} b{b}" for s, b in configs), "peak RSS MB"]
    order = sorted(cells, key=lambda k: (list(ENGINES).index(k[0]), _setting_order(k[1])))
    rows = []
    for engine, label in order:
        got = cells[(engine, label)]
        marked = [
            _f(got[c]["tokens_per_s"], ".0f") + ("*" if best.get((engine, *c)) == label else " ")
            if c in got
            else "-"
            for c in configs
        ]
        rows.append([engine, label, *marked, _f(got["rss"], ".0f")])
    return "\n".join(_lines(head, rows, [k[0] for k in order], {"engine", "setting"}))


def format_report(report: dict) -> str:
    """Formats the whole printed report: machine, table, how to read it, CTranslate2's check, skipped engines.

    Args:
        report: the bench report (bench/run.py's run_bench).

    Returns:
        The text.
    """
    parts = [format_machine(report), ""]
    each = "every engine at every setting" if report.get("sweep") else "every engine"
    rounds = (
        f"; {report['repeat']} rounds, each running {each} once: tokens/s is the median pass, "
        "a ratio the median over rounds of the ratio within a round"
        if report.get("repeat", 1) > 1
        else ""
    )
    if report.get("sweep"):
        parts += [
            "each engine at its best setting per row (best against best):",
            format_table(report, "best"),
            "",
            "every setting, tokens/s (* the engine's best in that column):",
            format_settings(report),
            "",
            f"every engine at {report['threads']} thread{'s' if report['threads'] > 1 else ''}, one "
            "batch at a time (equal threads):",
            format_table(report),
            "",
        ]
        parts.append(
            "agree: outputs (best hypothesis) equal to torch's at batch 1 with the same search; x "
            "torch / x ct2: tokens/s ratios against the torch row and the CTranslate2 row of the "
            "same device and precision (same search, same batch): in the first table each engine's "
            "best against the other's best, in the last the rows at equal threads; p50/p90 are "
            "empty for N x 1 settings (batches overlap: only a pass's wall time is measured)" + rounds
        )
    else:
        parts += [format_table(report), ""]
        parts.append(
            "agree: outputs (best hypothesis) equal to torch's at batch 1 with the same search; "
            "x torch / x ct2: tokens/s ratios against the torch row and the CTranslate2 row of the "
            "same device and precision (same search, same batch)" + rounds
        )
    parts.append("note: " + TORCH_BEAM_NOTE)
    ct2 = report.get("ct2_check")
    if ct2 and ct2.get("reason"):
        parts.append(("ctranslate2: " if ct2["valid"] else "ctranslate2: VOID: ") + ct2["reason"])
    for s in report["skipped"]:
        parts.append(f"skipped {s['engine']}: {s['reason']}")
    return "\n".join(parts)
