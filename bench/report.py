"""`seq2onnx bench`'s report as text: the machine, the table of rows, the notes and skipped engines."""
from __future__ import annotations

from seq2onnx.bench.engines import TORCH_BEAM_NOTE


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
    lines = [
        f"machine:   {m['cpu']} ({cores}; {m['memory_gb']} GB), {m['os']}, Python {m['python']}",
        f"threads:   {report['threads']} for every engine (torch.set_num_threads, onnxruntime intra_op_num_threads, "
        f"ctranslate2 intra_threads; inter_threads=1)",
        f"versions:  torch {v['torch']}, onnxruntime {v['onnxruntime']}, ctranslate2 {v['ctranslate2'] or '(not installed)'}, "
        f"numpy {v['numpy']}",
        f"load avg:  {m['load_average_at_start']} at start (other processes on the CPU make timings noisy)",
        f"model:     {report['checkpoint']}: d_model {cfg['d_model']}, {cfg['n_encoder_layers']}+{cfg['n_decoder_layers']} layers, "
        f"{cfg['n_heads']} heads, d_ff {cfg['d_ff']}, vocab {cfg['src_vocab_size']}/{cfg['tgt_vocab_size']}, "
        f"{'pre' if cfg['pre_norm'] else 'post'}-LN",
        f"sentences: {report['sentences']} from the {report['sentences_source']}, {report['mean_source_tokens']:.1f} "
        f"source tokens on average; the same sentences and batches for every engine; max length {report['max_length']}",
    ]
    return "\n".join(lines)


def format_table(report: dict) -> str:
    """Formats the table: one line per row, engines separated by a blank line.

    VOID marks CTranslate2 rows that do not count.

    Args:
        report: the bench report.

    Returns:
        The table.
    """
    head = ["engine", "search", "batch", "tokens/s", "sent/s", "p50 ms", "p90 ms", "peak RSS MB", "x torch", "x ct2",
            "agree"]
    rows = []
    for r in report["rows"]:
        agree = "-" if r["agreement"] is None else f"{r['agreement']}/{r['agreement_of']}"
        rows.append([r["engine"] + (" (VOID)" if r.get("void") else ""), r["search"], str(r["batch"]),
                     _f(r["tokens_per_s"], ".0f"), _f(r["sentences_per_s"], ".1f"), _f(r["p50_ms"], ".1f"),
                     _f(r["p90_ms"], ".1f"), _f(r["peak_rss_mb"], ".0f"), _f(r["x_torch"], ".2f"),
                     _f(r["x_ct2"], ".2f"), agree])
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]

    def line(cells):
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    out = [line(head), line(["-" * w for w in widths])]
    prev = None
    for r, cells in zip(report["rows"], rows):
        if prev is not None and r["engine"] != prev:
            out.append("")
        prev = r["engine"]
        out.append(line(cells))
    return "\n".join(out)


def format_report(report: dict) -> str:
    """Formats the whole printed report: machine, table, how to read it, CTranslate2's check, skipped engines.

    Args:
        report: the bench report (bench/run.py's run_bench).

    Returns:
        The text.
    """
    parts = [format_machine(report), "", format_table(report), ""]
    parts.append("agree: outputs (best hypothesis) equal to torch's at batch 1 with the same search; "
                 "x torch / x ct2: tokens/s ratios against the torch row and the CTranslate2 row of the same "
                 "device and precision (same search, same batch)"
                 + (f"; {report['repeat']} rounds, each running every engine once: tokens/s is the median pass, "
                    "a ratio the median over rounds of the ratio within a round" if report.get("repeat", 1) > 1 else ""))
    parts.append("note: " + TORCH_BEAM_NOTE)
    ct2 = report.get("ct2_check")
    if ct2 and ct2.get("reason"):
        parts.append(("ctranslate2: " if ct2["valid"] else "ctranslate2: VOID: ") + ct2["reason"])
    for s in report["skipped"]:
        parts.append(f"skipped {s['engine']}: {s['reason']}")
    return "\n".join(parts)
