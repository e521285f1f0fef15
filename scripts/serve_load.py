"""Load benchmark of `seq2onnx serve` (issue 26, item 4): continuous batching against per-request batching and
CTranslate2, all three behind the same HTTP front end (serve/app.py), each a real server process on 127.0.0.1.

    python scripts/serve_load.py BUNDLE CT2_MODEL_DIR --out DIR [--clients 1 8 32 128] [--seconds 20]

Servers, each given --threads compute threads in all (default 2: the cores of the project's machine):
  (a) continuous  `seq2onnx serve BUNDLE --batching continuous --intra-threads T`
  (b) request     `seq2onnx serve BUNDLE --batching request --workers W --intra-threads T/W`, W = 1 and T
  (c) ct2         `python scripts/serve_ct2.py BUNDLE CT2_MODEL_DIR --inter-threads I --intra-threads T/I`,
  I = 1 and T
(b) and (c) are reported at their best setting per point, named. The load generator (one asyncio process,
scripts/raw_http.py's keep-alive client, on the same cores) runs C closed-loop clients, each sending one
sentence per request and the next once answered (load_point says how the window is measured). Right after (a),
Translator.translate in this process (1 caller, no HTTP), against (a) at 1 client. Writes DIR/results.json,
results.md, plot.png and logs/ (each server's output).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import platform
import signal
import sys
import time
import urllib.parse
from pathlib import Path


from seq2onnx.atomic import write_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scaffold import (  # noqa: E402  (scripts/ is this script's folder)
    DEFAULT_DATA, HERE, Server, beam_label, log, percentiles, prepare_out, read_sentences, terminate,
)

ENGINES = ("continuous", "request", "ct2")
LETTER = {"continuous": "(a)", "request": "(b)", "ct2": "(c)"}


def server_commands(
    bundle: Path, ct2_model: Path | None, threads: int, engines, timeout: float = 300.0
) -> list[tuple[str, str, list[str]]]:
    """Returns (engine, setting, argv without --port) for each server to measure, `threads` compute threads
    each.

    Every server runs on the CPU with the front end's request timeout `timeout` (seconds).
    """
    serve = [
        sys.executable,
        "-m",
        "seq2onnx.commands",
        "serve",
        str(bundle),
        "--device",
        "cpu",
        "--timeout",
        str(timeout),
    ]
    out = []
    if "continuous" in engines:
        out.append(
            (
                "continuous",
                f"intra {threads}",
                serve + ["--batching", "continuous", "--intra-threads", str(threads)],
            )
        )
    splits = sorted({1, threads})
    for engine, outer in (("request", "--workers"), ("ct2", "--inter-threads")):
        if engine not in engines:
            continue
        for k in splits:
            base = (
                serve + ["--batching", "request"]
                if engine == "request"
                else [
                    sys.executable,
                    str(HERE / "serve_ct2.py"),
                    str(bundle),
                    str(ct2_model),
                    "--timeout",
                    str(timeout),
                ]
            )
            name = "workers" if engine == "request" else "inter"
            out.append(
                (
                    engine,
                    f"{name} {k} x intra {threads // k}",
                    base + [outer, str(k), "--intra-threads", str(threads // k)],
                )
            )
    return out


async def load_point(
    url: str,
    sentences: list[str],
    clients: int,
    beam: int,
    *,
    warmup: float,
    seconds: float,
    requests: int | None,
    timeout: float,
    transport=None,
) -> dict:
    """C closed-loop clients, one sentence per request: the figures of the measured window.

    The warm-up lasts `warmup` seconds and until every client has had an answer (at 128 clients the first
    answers may take longer than any fixed warm-up); the window starts there. Duration mode (requests None):
    the requests answered in [start, start + seconds] count; request mode: the first `requests` sent from the
    start, to the last answer. transport: an httpx transport instead of the network (tests); else
    raw_http.py's light client.
    """
    import httpx

    # raw_http.py beside this file, however it was loaded
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from raw_http import Connection, HTTPError

    order, measured = itertools.count(), itertools.count()
    records = []  # (sent, done, tokens or None, error or None)
    t0 = time.perf_counter()
    answered: set[int] = set()
    window = {"start": float("inf")}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    parts = urllib.parse.urlsplit(url)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport) as client:

        async def post(connection, payload):  # (status, JSON): one keep-alive connection per client
            if transport is not None:
                r = await client.post(url, json=payload)
                return r.status_code, r.json() if r.status_code == 200 else None
            return await connection.post_json(parts.path, payload, timeout)

        async def one_client(me: int):
            connection = Connection(parts.hostname, parts.port)
            while True:
                sent, start = time.perf_counter(), window["start"]
                if (
                    sent >= start + seconds
                    if requests is None
                    else sent >= start and next(measured) >= requests
                ):
                    return
                text = sentences[next(order) % len(sentences)]
                tokens = error = None
                try:
                    status, answer = await post(connection, {"texts": [text], "beam_size": beam})
                    if status == 200:
                        tokens = len(answer["translations"][0]["token_ids"][0])
                    else:
                        error = f"HTTP {status}"
                except (httpx.HTTPError, HTTPError, asyncio.TimeoutError) as e:
                    error = type(e).__name__
                done = time.perf_counter()
                records.append((sent, done, tokens, error))
                answered.add(me)
                if window["start"] == float("inf") and len(answered) == clients and done >= t0 + warmup:
                    window["start"] = done

        await asyncio.gather(*(one_client(i) for i in range(clients)))
    start = window["start"]
    if requests is None:
        length = seconds
        counted = [r for r in records if start <= r[1] <= start + seconds]
    else:
        counted = [r for r in records if r[0] >= start]
        length = max((r[1] for r in counted), default=start) - start
    ok = [r for r in counted if r[3] is None]
    errors = dict(collections.Counter(r[3] for r in counted if r[3] is not None))
    length = max(length, 1e-9)
    return {
        "clients": clients,
        "beam": beam,
        "warmup_s": start - t0,
        "window_s": length,
        "requests": len(counted),
        "ok": len(ok),
        "errors": errors,
        "sentences_per_s": len(ok) / length,
        "tokens_per_s": sum(r[2] for r in ok) / length,
        **percentiles([r[1] - r[0] for r in ok]),
    }


def in_process(bundle: Path, sentences: list[str], beams, seconds: float, threads: int) -> dict:
    """Translator.translate one sentence at a time in this process (no HTTP): latency percentiles per beam."""
    from seq2onnx.runtime.translator import Translator

    tr = Translator(bundle, device="cpu", intra_threads=threads)
    out = {}
    for beam in beams:
        for text in sentences[:5]:  # warm-up
            tr.translate(text, beam_size=beam)
        times, end = [], time.perf_counter() + seconds
        for text in itertools.cycle(sentences):
            t = time.perf_counter()
            tr.translate(text, beam_size=beam)
            times.append(time.perf_counter() - t)
            if time.perf_counter() >= end:
                break
        out[beam_label(beam)] = {"sentences": len(times), **percentiles(times)}
        log(
            f"in-process {beam_label(beam)}: p50 {out[beam_label(beam)]['p50_ms']:.1f} ms over {len(times)} "
            "sentences"
        )
    return out


def best_rows(points: list[dict]) -> dict:
    """(engine, beam, clients) -> the point of that engine's setting with the most sentences/s."""
    best: dict = {}
    for p in sorted(points, key=lambda p: p["sentences_per_s"]):  # the fastest last: it stays
        best[(p["engine"], p["beam"], p["clients"])] = p
    return best


def _fmt(x, digits=1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def markdown(report: dict) -> str:
    """The report as markdown: each engine at its best setting per point, then every setting."""
    best = best_rows(report["points"])
    beams, clients = report["beams"], report["clients"]
    engines = [e for e in ENGINES if any(k[0] == e for k in best)]
    head = ["engine", "clients"]
    for b in beams:
        head += [
            f"{beam_label(b)} sent/s",
            f"{beam_label(b)} tok/s",
            f"{beam_label(b)} p50 ms",
            f"{beam_label(b)} p99 ms",
            f"{beam_label(b)} setting",
        ]
    head += [f"(a)/row {beam_label(b)}" for b in beams] + ["errors"]
    lines = [
        f"# Serving load benchmark ({report['started']})",
        "",
        report["threads_note"],
        "",
        f"Bundle `{report['bundle']}`, CTranslate2 model `{report['ct2_model']}`; {report['sentences']} "
        "sentences "
        f"from `{report['data']}` column {report['src_col']}; {report['mode']}. sent/s: requests answered "
        "(one "
        "sentence each) per second; tok/s: generated target tokens (token_ids, end token excluded) per "
        "second; "
        "(a)/row: (a)'s sent/s over this row's, the (a)/(b) and (a)/(c) ratios.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for e in engines:
        for c in clients:
            row, errors = [f"{LETTER[e]} {e}", str(c)], 0
            for b in beams:
                p = best.get((e, b, c))
                if p is None:
                    row += ["—"] * 5
                    continue
                row += [
                    _fmt(p["sentences_per_s"]),
                    _fmt(p["tokens_per_s"], 0),
                    _fmt(p["p50_ms"]),
                    _fmt(p["p99_ms"]),
                    p["setting"],
                ]
                errors += sum(p["errors"].values())
            for b in beams:
                a, p = best.get(("continuous", b, c)), best.get((e, b, c))
                row.append(
                    f"{a['sentences_per_s'] / p['sentences_per_s']:.2f}"
                    if a and p and p["sentences_per_s"]
                    else "—"
                )
            lines.append("| " + " | ".join(row + [str(errors)]) + " |")
    inproc, one = report.get("in_process"), [b for b in beams if ("continuous", b, 1) in best]
    if inproc and one:
        lines += ["", "In-process `Translator.translate` (1 caller, no HTTP) against (a) at 1 client:", ""]
        for b in one:
            a, ip = best[("continuous", b, 1)], inproc[beam_label(b)]
            lines.append(
                f"- {beam_label(b)}: in-process p50 {_fmt(ip['p50_ms'])} ms, (a) p50 {_fmt(a['p50_ms'])} ms "
                f"({a['p50_ms'] - ip['p50_ms']:+.1f} ms: HTTP, JSON, the front end and the engine's "
                "scheduling)"
            )
    lines += [
        "",
        "Every setting:",
        "",
        "| engine | setting | clients | beam | sent/s | tok/s | p50 ms | p95 ms | p99 ms | "
        "requests | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in report["points"]:
        lines.append(
            f"| {LETTER[p['engine']]} {p['engine']} | {p['setting']} | {p['clients']} | "
            f"{beam_label(p['beam'])} | "
            f"{_fmt(p['sentences_per_s'])} | {_fmt(p['tokens_per_s'], 0)} | {_fmt(p['p50_ms'])} | "
            f"{_fmt(p['p95_ms'])} | {_fmt(p['p99_ms'])} | {p['requests']} | {p['errors'] or 0} |"
        )
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> str | None:
    """Throughput and p99 against clients, one panel per beam; returns why no plot was drawn, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: pip install matplotlib"
    best, beams = best_rows(report["points"]), report["beams"]
    engines = sorted({k[0] for k in best}, key=ENGINES.index)
    fig, axes = plt.subplots(2, len(beams), figsize=(5.5 * len(beams), 8), squeeze=False)
    for col, b in enumerate(beams):
        for e in engines:
            pts = sorted((c, best[(e, b, c)]) for c in report["clients"] if (e, b, c) in best)
            xs = [c for c, _ in pts]
            axes[0][col].plot(
                xs, [p["sentences_per_s"] for _, p in pts], marker="o", label=f"{LETTER[e]} {e}"
            )
            axes[1][col].plot(
                xs, [p["p99_ms"] or float("nan") for _, p in pts], marker="o", label=f"{LETTER[e]} {e}"
            )
        for row, ylabel in enumerate(("sentences / s", "p99 latency (ms)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set(
                xticks=report["clients"],
                xticklabels=[str(c) for c in report["clients"]],
                xlabel="concurrent clients",
                ylabel=ylabel,
                title=f"{beam_label(b)}: {ylabel}",
            )
            ax.grid(True, alpha=0.3)
            ax.legend()
        axes[1][col].set_yscale("log")
    fig.suptitle(report["threads_note"], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle", type=Path, help="the bundle served by (a) and (b) (made by seq2onnx export)")
    p.add_argument(
        "ct2_model", type=Path, help="the CTranslate2 model of the bundle's checkpoint (see serve_ct2.py)"
    )
    p.add_argument(
        "--out", type=Path, required=True, help="output directory (refused when not empty, unless --force)"
    )
    p.add_argument("--force", action="store_true", help="write into a non-empty --out")
    p.add_argument(
        "--clients",
        type=int,
        nargs="+",
        default=[1, 8, 32, 128],
        help="concurrent clients of each point, each waiting for its answer (default 1 8 32 128)",
    )
    p.add_argument(
        "--beams", type=int, nargs="+", default=[1, 4], help="beam sizes measured (default 1 4; 1 is greedy)"
    )
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds per point (default 20)")
    p.add_argument(
        "--requests", type=int, default=None, help="instead of --seconds: requests measured per point"
    )
    p.add_argument(
        "--warmup", type=float, default=5.0, help="seconds of load before each point's window (default 5)"
    )
    p.add_argument(
        "--data", type=Path, default=DEFAULT_DATA, help="TSV of sentences (default: Tatoeba cmn.txt)"
    )
    p.add_argument("--src-col", type=int, default=1, help="its column of source texts (default 1: Chinese)")
    p.add_argument(
        "--sentences", type=int, default=2000, help="distinct sentences cycled through (default 2000)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the sentences' order (default 0)")
    p.add_argument("--threads", type=int, default=2, help="compute threads per server in all (default 2)")
    p.add_argument(
        "--engines",
        nargs="+",
        choices=ENGINES,
        default=list(ENGINES),
        help="servers measured (default all three)",
    )
    p.add_argument(
        "--in-process-seconds", type=float, default=20.0, help="0 skips the in-process measurement"
    )
    p.add_argument(
        "--start-timeout",
        type=float,
        default=180.0,
        help="seconds a server may take to answer its first request (default 180)",
    )
    p.add_argument("--server-timeout", type=float, default=300.0, help="each server's --timeout (seconds)")
    p.add_argument("--request-timeout", type=float, default=330.0, help="the client's timeout (seconds)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Runs every server at every point; writes the results.

    Returns:
        0; 1 when a point had errors; 2 for a bad argument (the message on stderr).
    """
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, terminate)
    try:
        if (
            min(args.clients) < 1
            or args.threads < 1
            or args.seconds <= 0
            or (args.requests is not None and args.requests < 1)
        ):
            raise ValueError(
                f"--clients {args.clients}, --threads {args.threads}, --seconds {args.seconds}, --requests "
                f"{args.requests}: each must be >= 1 (--seconds > 0)"
            )
        if "ct2" in args.engines and not (args.ct2_model / "model.bin").is_file():
            raise ValueError(
                f"{args.ct2_model / 'model.bin'} does not exist: give the CTranslate2 model "
                "(seq2onnx export CKPT DIR --format ctranslate2), or leave ct2 out of --engines"
            )
        sentences = read_sentences(args.data, args.src_col, args.sentences, args.seed)
        prepare_out(args.out, args.force)
    except ValueError as e:
        print(f"serve_load: {e}", file=sys.stderr)
        return 2
    mode = (
        f"closed loop, {args.warmup:g} s warm-up then "
        f"{f'{args.seconds:g} s' if args.requests is None else f'{args.requests} requests'} measured per "
        "point"
    )
    note = (
        f"{args.threads} compute threads in all per server (workers/inter threads x intra threads); this "
        "machine "
        f"has {os.cpu_count()} cores, shared by the server and the load generator (one asyncio process, "
        "scripts/raw_http.py)."
    )
    log(note)
    report = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "threads_note": note,
        "bundle": str(args.bundle),
        "ct2_model": str(args.ct2_model),
        "data": str(args.data),
        "src_col": args.src_col,
        "sentences": len(sentences),
        "clients": args.clients,
        "beams": args.beams,
        "mode": mode,
        "threads": args.threads,
        "machine": {
            "cores": os.cpu_count(),
            "load_average": os.getloadavg(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "servers": [],
        "points": [],
    }
    for engine, setting, cmd in server_commands(
        args.bundle, args.ct2_model, args.threads, args.engines, args.server_timeout
    ):
        name = f"{engine}-{setting.replace(' ', '')}"
        log(f"starting {LETTER[engine]} {engine} ({setting})")
        t = time.perf_counter()
        with Server(cmd, args.out / "logs" / f"{name}.log", sentences[0], args.start_timeout) as server:
            report["servers"].append(
                {"engine": engine, "setting": setting, "command": cmd, "start_s": time.perf_counter() - t}
            )
            for beam in args.beams:
                for clients in args.clients:
                    p = asyncio.run(
                        load_point(
                            server.url,
                            sentences,
                            clients,
                            beam,
                            warmup=args.warmup,
                            seconds=args.seconds,
                            requests=args.requests,
                            timeout=args.request_timeout,
                        )
                    )
                    report["points"].append({"engine": engine, "setting": setting, **p})
                    log(
                        f"{engine} {setting} {beam_label(beam)} {clients} clients: "
                        f"{p['sentences_per_s']:.1f} sent/s, "
                        f"p50 {_fmt(p['p50_ms'])} ms, p99 {_fmt(p['p99_ms'])} ms, errors {p['errors'] or 0}"
                    )
                    # died under load: its errors would fill every later point
                    if server.proc.poll() is not None:
                        raise RuntimeError(
                            f"{engine} ({setting}) exited with code {server.proc.returncode} under load:"
                            f"\n{server.log_tail()}"
                        )
        # right after (a): the machine's drift is least
        if engine == "continuous" and args.in_process_seconds > 0:
            report["in_process"] = in_process(
                args.bundle, sentences, args.beams, args.in_process_seconds, args.threads
            )
    why = plot(report, args.out / "plot.png")
    report["plot"] = why or "plot.png"
    write_file(args.out / "results.json", json.dumps(report, indent=2) + "\n")
    write_file(args.out / "results.md", markdown(report))
    print(markdown(report))
    log(f"wrote {args.out}/results.json, results.md, {'plot.png' if not why else f'no plot ({why})'}")
    return 1 if any(p["errors"] for p in report["points"]) else 0


if __name__ == "__main__":
    sys.exit(main())
