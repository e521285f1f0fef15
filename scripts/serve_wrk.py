"""Load benchmark of `seq2onnx serve` driven by wrk, an independent HTTP client (issue 36, item 4).

    python scripts/serve_wrk.py BUNDLE --ct2 CT2_DIR --out DIR [--clients 1 8 32 128] [--seconds 15]
    python scripts/serve_wrk.py marian WORK     # an OPUS-MT-size Marian: WORK/bundle, WORK/ct2
    python scripts/serve_wrk.py stub BUNDLE --port P  # the ceiling's server alone (the benchmark starts
    it)

Each server is its own process on 127.0.0.1 (serve_load.py's Server: a free port, awaited until it
answers, SIGTERM then SIGKILL), with --threads (T) compute threads in all:
  continuous  seq2onnx serve BUNDLE --batching continuous --intra-threads N (the default batching; its
              rounds on the fused decoder where the bundle has one: serve/fused_rounds.py), N in
              --continuous-intra (default 1 and T)
  standard-rounds  the same with --rounds standard: continuous batching on decoder.onnx
              (serve/standard_rounds.py), for the A/B of the two
  request     seq2onnx serve BUNDLE --batching request --workers W --intra-threads T/W,
              W in --request-workers
  ct2         python scripts/serve_ct2.py BUNDLE CT2 --inter-threads I --intra-threads T/I,
              I in --ct2-inter
  ceiling     python scripts/serve_wrk.py stub BUNDLE: serve/app.py's create_app with seq2onnx
              serve's defaults under serve/server.py's serve() (the same uvicorn configuration); its
              engine (EchoEngine) answers each text with itself and its source ids: tokenised, never
              decoded. What the front end alone allows.
With --processes P (P > 1), each server is also run as P processes on its port (seq2onnx serve
--processes: each its own model and GIL), the T threads split between them: continuous intra T/P,
request workers T/P x intra 1, ct2 inter T/P x intra 1, the ceiling P processes of the stub.
The load: wrk (apt-get install wrk), closed loop, C connections (one wrk thread by default: the
machine is shared), running serve_wrk.lua: each request is one random sentence of 3-10 words drawn
from the bundle's source SentencePiece pieces, beam_size B, and with --max-length LO HI a
max_decoding_length drawn from LO..HI. Per point: a --warmup run of wrk (discarded), then a --seconds
run whose figures count: requests/s (2xx answers), wrk's p50/p90/p99/max latency, errors, and
tokens/s from the server's /metrics (seq2onnx_generated_tokens_total). The ceiling runs greedy bodies
only (its engine ignores the beam). Each server is reported at its best setting per point (named).
serve_load.py's own client is kept as a cross-check (--cross-check). Writes DIR/results.json,
results.md, words.txt (the Lua script's words) and logs/ (each server's output).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from seq2onnx.atomic import write_file
from seq2onnx.runtime.translator import TranslationResult
from seq2onnx.serve.engine import Engine, Job

HERE = Path(__file__).resolve().parent
LUA = HERE / "serve_wrk.lua"
SERVERS = ("continuous", "standard-rounds", "request", "ct2", "ceiling")  # --servers' choices
COLUMNS = ("continuous", "continuous-no-solo", *SERVERS[1:])  # the report's (--continuous-no-solo adds one)
MARKER = "SERVE_WRK "


def _sibling(name: str):
    """A benchmark module beside this file (scaffold, serve_load, hf_real_sizes), however this file was
    loaded."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    return __import__(name)


def log(message: str) -> None:
    _sibling("scaffold").log(message)


# -- the ceiling: the real front end over an engine that decodes nothing ---------------------------


class EchoEngine(Engine):
    """Answers each text with itself (every hypothesis) and its source ids without the end token, at once.

    It tokenises as the real engines do (Translator.prepare_source) and checks options with Engine.check, so
    a request costs what the front end, JSON and tokenisation cost: the ceiling of any engine behind it.
    """

    batching = "echo"

    def submit(self, texts: list[str], options) -> Job:
        job = Job()
        try:
            out = []
            for text in texts:
                ids, _ = self.translator.prepare_source(text, truncate=options.truncate)
                ids, n = [int(i) for i in ids[:-1]], options.num_hypotheses
                out.append(
                    TranslationResult([text] * n, [ids] * n, [0.0] * n if options.return_scores else None)
                )
            job.future.set_result(out)
        except Exception as e:  # the front end answers it (422 or 500)
            job.future.set_exception(e)
        return job

    def stream(self, text: str, options, job: Job):
        yield text


def stub_main(argv: list[str]) -> int:
    """`serve_wrk.py stub BUNDLE --port P`: the ceiling's server, as `seq2onnx serve` builds its own."""
    p = argparse.ArgumentParser(
        prog="serve_wrk.py stub",
        description="Serve EchoEngine behind serve/app.py "
        "with seq2onnx serve's defaults (create_app, serve) until SIGTERM.",
    )
    p.add_argument("bundle", type=Path, help="the bundle whose tokenizer and option checks are used")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (0: a free one, named in the printed line)")
    p.add_argument("--processes", type=int, default=1, help="server processes on the port (seq2onnx serve's)")
    args = p.parse_args(argv)
    from seq2onnx.serve.processes import serve_processes
    from seq2onnx.serve.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s seq2onnx serve: %(message)s")
    if args.processes > 1:
        return serve_processes(functools.partial(stub_app, args.bundle), args.processes, host=args.host,
                               port=args.port)
    return serve(stub_app(args.bundle), host=args.host, port=args.port)


def stub_app(bundle: Path):
    """The ceiling's app: create_app over EchoEngine (the bundle's tokenizer and checks, no decoding)."""
    from seq2onnx.runtime.translator import Translator
    from seq2onnx.serve.app import create_app

    return create_app(EchoEngine(Translator(bundle, device="cpu", intra_threads=1)))


# -- the requests ------------------------------------------------------------------------------------


def source_words(bundle: Path) -> tuple[list[str], str]:
    """Words for random sentences from the bundle's source SentencePiece model, and their separator.

    Alphabetic pieces only (no digits, punctuation or filler pieces). When most word-initial pieces (those
    beginning with U+2581) are CJK: every CJK piece, joined without spaces ("none"); else the non-CJK
    word-initial pieces, joined by spaces ("space").
    """
    import sentencepiece as spm

    path = bundle / "source.spm.model"
    if not path.is_file():
        raise ValueError(f"{path} does not exist: give a bundle made by seq2onnx export")
    sp = spm.SentencePieceProcessor(model_file=str(path))
    initial, inner = set(), set()
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
            continue
        piece = sp.id_to_piece(i)
        word = piece.lstrip("\u2581")
        if word.isalpha():
            (initial if piece.startswith("\u2581") else inner).add(word)
    cjk = {w for w in initial | inner if w[0] >= "\u2e80"}  # CJK and later scripts: written without spaces
    if len(initial & cjk) > len(initial) / 2:
        return sorted(cjk), "none"
    initial -= cjk
    if len(initial) < 20:
        raise ValueError(f"{path} has {len(initial)} word-initial alphabetic pieces: too few for sentences")
    return sorted(initial), "space"


def write_words(words: list[str], path: Path) -> None:
    """One word per line, escaped for a JSON string (the Lua script pastes them between quotes)."""
    write_file(path, "".join(json.dumps(w, ensure_ascii=False)[1:-1] + "\n" for w in words))


def sample_requests(words: list[str], sep: str, n: int, seed: int, lengths) -> list[tuple[str, int | None]]:
    """(sentence, max_decoding_length or None) drawn as serve_wrk.lua draws them (in-process, cross-check)."""
    rng, joiner = random.Random(seed), "" if sep == "none" else " "
    return [
        (
            joiner.join(rng.choice(words) for _ in range(rng.randint(3, 10))),
            rng.randint(*lengths) if lengths else None,
        )
        for _ in range(n)
    ]


# -- wrk ---------------------------------------------------------------------------------------------


def wrk_command(
    url: str, clients: int, seconds: int, lua_args: list, *, threads: int = 1, timeout: float = 330.0
) -> list[str]:
    return [
        "wrk",
        "-t",
        str(min(threads, clients)),
        "-c",
        str(clients),
        "-d",
        f"{seconds}s",
        "--timeout",
        f"{int(timeout)}s",
        "-s",
        str(LUA),
        url,
        "--",
        *map(str, lua_args),
    ]


def parse_wrk(stdout: str) -> dict:
    """The figures of serve_wrk.lua's done() line (latencies in ms; requests/s of 2xx answers).

    Raises:
        ValueError: no such line (wrk failed: its output is in the message).
    """
    line = next((x for x in stdout.splitlines() if x.startswith(MARKER)), None)
    if line is None:
        raise ValueError(f"wrk printed no '{MARKER.strip()}' line:\n{stdout[-2000:]}")
    raw = json.loads(line[len(MARKER) :])
    seconds = max(raw["duration_us"] / 1e6, 1e-9)
    errors = {k: raw[k] for k in ("connect", "read", "write", "status", "timeout") if raw[k]}
    ok = raw["requests"] - raw["status"]
    return {
        "duration_s": seconds,
        "requests": raw["requests"],
        "ok": ok,
        "requests_per_s": ok / seconds,
        "errors": errors,
        **{f"{k}_ms": raw[f"{k}_us"] / 1000 for k in ("mean", "p50", "p90", "p99", "max")},
    }


def run_wrk(command: list[str], seconds: float) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 120)
    return {**parse_wrk(done.stdout + done.stderr), "wrk_output": done.stdout}


def generated_tokens(url: str) -> float:
    """seq2onnx_generated_tokens_total of the server's /metrics (url: its /v1/translate)."""
    with urllib.request.urlopen(url.replace("/v1/translate", "/metrics"), timeout=30) as r:
        found = re.search(r"^seq2onnx_generated_tokens_total ([0-9.e+]+)$", r.read().decode(), re.M)
    return float(found.group(1)) if found else float("nan")


def point(url: str, clients: int, beam: int, lua: list, args) -> dict:
    """One wrk measurement: a warm-up run, then the measured run, with the tokens generated in between."""
    lua_args = [*lua[:2], beam, *lua[2:]]
    kw = dict(threads=args.wrk_threads, timeout=args.request_timeout)
    if args.warmup > 0:
        run_wrk(wrk_command(url, clients, args.warmup, lua_args, **kw), args.warmup)
    before = generated_tokens(url)
    command = wrk_command(url, clients, args.seconds, lua_args, **kw)
    figures = run_wrk(command, args.seconds)
    figures["tokens_per_s"] = (generated_tokens(url) - before) / figures["duration_s"]
    return {"clients": clients, "beam": beam, "command": " ".join(command), **figures}


# -- the report --------------------------------------------------------------------------------------


def best_points(points: list[dict]) -> dict:
    """(server, beam, clients) -> the point of that server's setting with the most requests/s."""
    best: dict = {}
    for p in sorted(points, key=lambda p: p["requests_per_s"]):
        best[(p["server"], p["beam"], p["clients"])] = p
    return best


def _ratio(a, b) -> str:
    return f"{a['requests_per_s'] / b['requests_per_s']:.2f}" if a and b and b["requests_per_s"] else "—"


def markdown(report: dict) -> str:
    best = best_points(report["points"])
    servers = [s for s in COLUMNS if any(k[0] == s for k in best)]
    greedy = min(report["beams"])
    out = [f"# seq2onnx serve under wrk ({report['started']})", "", report["note"], ""]
    for beam in report["beams"]:
        label = "greedy" if beam == 1 else f"beam {beam}"
        out += [
            f"## {label}: requests/s / p99 ms (setting)",
            "",
            "| clients | " + " | ".join(servers) + " | cont/ct2 | cont/request | cont/ceiling |",
            "|---|" + "---|" * (len(servers) + 3),
        ]
        for c in report["clients"]:
            cells = []
            for s in servers:
                p = best.get((s, greedy if s == "ceiling" else beam, c))
                cells.append(
                    "—"
                    if p is None
                    else f"{p['requests_per_s']:.1f} / {p['p99_ms']:.0f}"
                    + (f" ({p['setting']})" if p["setting"] else "")
                )
            cont = best.get(("continuous", beam, c))
            ratios = [
                _ratio(cont, best.get((s, greedy if s == "ceiling" else beam, c)))
                for s in ("ct2", "request", "ceiling")
            ]
            out.append(f"| {c} | " + " | ".join(cells + ratios) + " |")
        out.append("")
    for label, figures in report.get("in_process", {}).items():
        cont = best.get(("continuous", 1 if label == "greedy" else int(label[4:]), 1))
        if cont:
            out.append(
                f"- in-process `Translator.translate` {label}: p50 {figures['p50_ms']:.1f} ms; continuous at "
                f"1 client p50 {cont['p50_ms']:.1f} ms ({cont['p50_ms'] / figures['p50_ms']:.2f}x)"
            )
    for x in report.get("cross_check", []):
        w = best.get(("continuous", x["beam"], x["clients"]))
        out.append(
            f"- cross-check, serve_load.py's client on continuous, {x['clients']} clients beam {x['beam']}: "
            f"{x['sentences_per_s']:.1f} req/s, p99 {x['p99_ms']:.0f} ms (wrk: "
            + (f"{w['requests_per_s']:.1f} req/s, p99 {w['p99_ms']:.0f} ms)" if w else "not measured)")
        )
    out += [
        "",
        "Every point:",
        "",
        "| server | setting | beam | clients | req/s | tok/s | p50 ms | p90 ms | p99 ms | "
        "max ms | requests | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in report["points"]:
        out.append(
            f"| {p['server']} | {p['setting'] or '—'} | {p['beam']} | {p['clients']} | "
            f"{p['requests_per_s']:.1f}"
            f" | {p['tokens_per_s']:.0f} | {p['p50_ms']:.1f} | {p['p90_ms']:.1f} | {p['p99_ms']:.1f} | "
            f"{p['max_ms']:.0f} | {p['requests']} | {p['errors'] or 0} |"
        )
    return "\n".join(out) + "\n"


# -- the run -----------------------------------------------------------------------------------------


def servers(args) -> list[tuple[str, str, list[str]]]:
    """(server, setting, argv without --port) of every server to measure."""
    wanted = [s for s in args.servers if s not in ("ceiling", "standard-rounds") and (s != "ct2" or args.ct2)]
    if "standard-rounds" in args.servers:
        wanted.append("continuous")
    out = []
    for name, setting, argv in _sibling("serve_load").server_commands(
        args.bundle, args.ct2, args.threads, wanted, args.server_timeout
    ):
        k = int(setting.split()[1]) if name != "continuous" else 0
        if name == "continuous" and "standard-rounds" in args.servers:  # continuous batching on decoder.onnx
            out.append(("standard-rounds", "", argv + ["--rounds", "standard"]))
            if "continuous" not in args.servers:
                continue
        if name == "continuous":  # each intra-op thread count asked for (its setting names it)
            at = argv.index("--intra-threads") + 1
            for intra in args.continuous_intra:
                out.append((name, f"intra {intra}", argv[:at] + [str(intra)] + argv[at + 1 :]))
                if args.continuous_no_solo:  # the same with every search in the scheduler's rounds
                    out.append(
                        (
                            "continuous-no-solo",  # a column of its own: the continuous column stays solo's
                            f"intra {intra}",
                            argv[:at] + [str(intra)] + argv[at + 1 :] + ["--no-solo"],
                        )
                    )
            for lanes in (n for n in args.continuous_lanes if n > 1):  # N schedulers, the threads split
                intra = max(1, args.threads // lanes)
                setting = f"lanes {lanes} x intra {intra}"
                lane_argv = argv[:at] + [str(intra)] + argv[at + 1 :] + ["--lanes", str(lanes)]
                out.append((name, setting, lane_argv))
        elif k in (args.request_workers if name == "request" else args.ct2_inter):
            out.append((name, setting, argv))
    if "ceiling" in args.servers:
        out.append(("ceiling", "", [sys.executable, str(Path(__file__).resolve()), "stub", str(args.bundle)]))
    return out + _multi_process(args, out)


def _with(argv: list[str], option: str, value) -> list[str]:
    """argv with `option value` set (replaced where present, else appended)."""
    if option in argv:
        at = argv.index(option) + 1
        return argv[:at] + [str(value)] + argv[at + 1 :]
    return argv + [option, str(value)]


def _multi_process(args, single: list) -> list[tuple[str, str, list[str]]]:
    """Each server of `single` again as P processes for each P > 1 of --processes, the threads split."""
    first = {}
    for name, _, argv in single:
        first.setdefault(name, argv)
    out = []
    for n in (p for p in args.processes if p > 1):
        per = max(1, args.threads // n)
        for name, argv in first.items():
            if name in ("continuous", "standard-rounds"):
                argv, setting = _with(argv, "--intra-threads", per), f"{n} processes x intra {per}"
                argv = [a for a in argv if a != "--no-solo"] if name == "continuous" else argv
            elif name == "request":
                argv = _with(_with(argv, "--workers", per), "--intra-threads", 1)
                setting = f"{n} processes x workers {per} x intra 1"
            elif name == "ct2":
                argv = _with(_with(argv, "--inter-threads", per), "--intra-threads", 1)
                setting = f"{n} processes x inter {per} x intra 1"
            elif name == "ceiling":
                setting = f"{n} processes"
            else:
                continue
            out.append((name, setting, _with(argv, "--processes", n)))
    return out


def in_process(args, requests: list) -> dict:
    """Translator.translate one sentence at a time in this process (no HTTP), per beam: latency p50."""
    from seq2onnx.runtime.translator import Translator

    tr, out = Translator(args.bundle, device="cpu", intra_threads=args.threads), {}
    for beam in args.beams:
        for text, length in requests[:5]:
            tr.translate(text, beam_size=beam, max_decoding_length=length)
        times, end, i = [], time.perf_counter() + args.in_process_seconds, 0
        while time.perf_counter() < end:
            text, length = requests[i % len(requests)]
            t = time.perf_counter()
            tr.translate(text, beam_size=beam, max_decoding_length=length)
            times.append(time.perf_counter() - t)
            i += 1
        label = _sibling("scaffold").beam_label(beam)
        out[label] = {"sentences": len(times), "p50_ms": 1000 * sorted(times)[len(times) // 2]}
        log(f"in-process {label}: p50 {out[label]['p50_ms']:.1f} ms over {len(times)} sentences")
    return out


def measure(args, report: dict, lua: list, requests: list) -> None:
    sl = _sibling("serve_load")
    for name, setting, argv in servers(args):
        log(f"starting {name} {setting}".rstrip())
        logfile = args.out / "logs" / f"{name}-{setting.replace(' ', '')}.log"
        with _sibling("scaffold").Server(argv, logfile, requests[0][0], args.start_timeout) as server:
            report["servers"].append({"server": name, "setting": setting, "command": argv})
            for beam in [min(args.beams)] if name == "ceiling" else args.beams:
                for clients in args.clients:
                    p = {"server": name, "setting": setting, **point(server.url, clients, beam, lua, args)}
                    report["points"].append(p)
                    log(
                        f"{name} {setting} beam {beam} {clients} clients: {p['requests_per_s']:.1f} req/s, "
                        f"p50 "
                        f"{p['p50_ms']:.1f} ms, p99 {p['p99_ms']:.1f} ms, errors {p['errors'] or 0}"
                    )
            if name == "continuous":
                for clients in args.cross_check:
                    x = asyncio.run(
                        sl.load_point(
                            server.url,
                            [t for t, _ in requests],
                            clients,
                            min(args.beams),
                            warmup=args.warmup,
                            seconds=args.seconds,
                            requests=None,
                            timeout=args.request_timeout,
                        )
                    )
                    report["cross_check"].append(x)
                    log(
                        f"cross-check (serve_load.py's client) {clients} clients: "
                        f"{x['sentences_per_s']:.1f} req/s"
                    )
        if name == "continuous" and args.in_process_seconds > 0:
            report["in_process"] = in_process(args, requests)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "bundle", type=Path, help="the bundle served (seq2onnx export's, or `marian WORK`'s WORK/bundle)"
    )
    p.add_argument(
        "--ct2", type=Path, help="the CTranslate2 model of the bundle's checkpoint (without it: no ct2)"
    )
    p.add_argument(
        "--out", type=Path, required=True, help="output directory (refused when not empty, unless --force)"
    )
    p.add_argument("--force", action="store_true", help="write into a non-empty --out")
    p.add_argument(
        "--servers", nargs="+", choices=SERVERS, default=list(SERVERS), help="servers measured (default all)"
    )
    p.add_argument(
        "--clients",
        type=int,
        nargs="+",
        default=[1, 8, 32, 128],
        help="wrk connections per point, each sending its next request once answered (default 1 8 32 128)",
    )
    p.add_argument(
        "--beams", type=int, nargs="+", default=[1, 4], help="beam sizes (default 1 4; 1 is greedy)"
    )
    p.add_argument("--seconds", type=int, default=15, help="measured seconds per point, whole (default 15)")
    p.add_argument(
        "--warmup", type=int, default=4, help="seconds of discarded load before each point (default 4)"
    )
    p.add_argument(
        "--max-length",
        type=int,
        nargs=2,
        metavar=("LO", "HI"),
        help="each request's "
        "max_decoding_length drawn uniformly from LO..HI (default: left out, the bundle's rule)",
    )
    p.add_argument("--threads", type=int, default=2, help="compute threads per server in all (default 2)")
    p.add_argument(
        "--request-workers",
        type=int,
        nargs="+",
        default=[1, 2],
        help="request settings tried: --workers W with intra T/W (default 1 2; W must be 1 or T)",
    )
    p.add_argument(
        "--continuous-intra",
        type=int,
        nargs="+",
        default=None,
        help="continuous settings tried: --intra-threads N (default 1 and T: at small models the second core "
        "serves the front end better than the products)",
    )
    p.add_argument(
        "--continuous-no-solo",
        action="store_true",
        help="also measure each --continuous-intra setting with seq2onnx serve --no-solo (every search in "
        "the scheduler's rounds, none decoded alone), reported as server continuous-no-solo: the A/B of "
        "docs/optimisation-notes.md row 51",
    )
    p.add_argument(
        "--continuous-lanes",
        type=int,
        nargs="+",
        default=[1],
        help="continuous settings tried besides: --lanes L with intra T/L, for each L > 1 (default 1: none; "
        "seq2onnx serve --lanes: L schedulers over the same sessions)",
    )
    p.add_argument(
        "--processes",
        type=int,
        nargs="+",
        default=[1],
        help="each server also run as P processes on its port for each P > 1, the threads split (default 1: "
        "none; seq2onnx serve --processes)",
    )
    p.add_argument(
        "--ct2-inter",
        type=int,
        nargs="+",
        default=[1, 2],
        help="ct2 settings tried: --inter-threads I with intra T/I (default 1 2; I must be 1 or T)",
    )
    p.add_argument(
        "--wrk-threads", type=int, default=1, help="wrk's threads (default 1; at most the clients)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random sentences (default 0)")
    p.add_argument(
        "--in-process-seconds",
        type=float,
        default=10.0,
        help="seconds of in-process translate per beam "
        "after the continuous server, for its 1-client p50 (default 10; 0 skips it)",
    )
    p.add_argument(
        "--cross-check",
        type=int,
        nargs="*",
        default=[],
        metavar="C",
        help="clients at which "
        "serve_load.py's own client also loads the continuous server, greedy (default none)",
    )
    p.add_argument(
        "--start-timeout", type=float, default=180.0, help="seconds a server may take to answer first"
    )
    p.add_argument("--server-timeout", type=float, default=300.0, help="each server's --timeout (seconds)")
    p.add_argument("--request-timeout", type=float, default=330.0, help="wrk's --timeout (seconds)")
    return p


def build_marian(work: Path) -> int:
    """`serve_wrk.py marian WORK`: hf_real_sizes.py's OPUS-MT-size Marian (random weights) in WORK/model, its
    fp32 bundle in WORK/bundle and CTranslate2 model in WORK/ct2; steps already done are skipped."""
    hf = _sibling("hf_real_sizes")
    model, steps = work / "model", []
    if not (model / "model.safetensors").is_file():
        steps.append(("build", {"job": "build", "size": hf.SIZES["marian"], "out": str(model)}))
    if not (work / "bundle" / "bundle.json").is_file():
        steps.append(
            (
                "export",
                {"job": "export", "model_dir": str(model), "out": str(work / "bundle"), "quantize": None},
            )
        )
    if not (work / "ct2" / "model.bin").is_file():
        steps.append(
            ("ct2_convert", {"job": "ct2_convert", "model_dir": str(model), "out": str(work / "ct2")})
        )
    for name, spec in steps:
        log(f"marian: {name}")
        result = hf.run_job(spec, work, f"marian-{name}", 3600.0)
        if "error" in result:
            print(f"serve_wrk: {name} failed: {result['error']}", file=sys.stderr)
            return 1
    print(f"bundle {work / 'bundle'}\nct2 {work / 'ct2'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Returns 0; 1 when a point had errors; 2 for a bad argument or a missing wrk (the message on stderr)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["stub"]:
        return stub_main(argv[1:])
    if argv[:1] == ["marian"] and len(argv) == 2:
        return build_marian(Path(argv[1]))
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _sibling("scaffold").terminate)  # unwinds: the servers are stopped
    try:
        if shutil.which("wrk") is None:
            raise ValueError("wrk is not installed: apt-get install wrk (Debian, Ubuntu)")
        if min(args.clients) < 1 or args.seconds < 1 or args.warmup < 0 or args.threads < 1:
            raise ValueError("--clients, --seconds and --threads must be >= 1, --warmup >= 0")
        args.continuous_intra = sorted(set(args.continuous_intra or (1, args.threads)))
        if not all(1 <= n <= args.threads for n in args.continuous_intra):
            raise ValueError(
                f"--continuous-intra {args.continuous_intra}: each must be 1..--threads ({args.threads})"
            )
        if min(args.processes) < 1:
            raise ValueError(f"--processes {args.processes}: each must be >= 1")
        if not all(1 <= n <= args.threads for n in args.continuous_lanes):
            raise ValueError(
                f"--continuous-lanes {args.continuous_lanes}: each must be 1..--threads ({args.threads})"
            )
        words, sep = source_words(args.bundle)
        _sibling("scaffold").prepare_out(args.out, args.force)
    except ValueError as e:
        print(f"serve_wrk: {e}", file=sys.stderr)
        return 2
    write_words(words, args.out / "words.txt")
    lengths = args.max_length or (0, 0)
    lua = [args.out / "words.txt", sep, *lengths, args.seed]
    requests = sample_requests(words, sep, 2000, args.seed, args.max_length)
    wrk_version = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.splitlines()[:1]
    note = (
        f"{args.threads} compute threads per server; {os.cpu_count()} cores shared with wrk "
        f"({args.wrk_threads} thread); load average at start "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; {len(words)} words "
        f"(sep {sep}); max_decoding_length {args.max_length or 'the bundle rule'}; {args.warmup} s warm-up, "
        f"{args.seconds} s measured per point; {' '.join(wrk_version)}; ceiling: greedy bodies."
    )
    log(note)
    report = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "note": note,
        "bundle": str(args.bundle),
        "ct2": str(args.ct2),
        "clients": args.clients,
        "beams": args.beams,
        "argv": argv,
        "load_start": os.getloadavg(),
        "servers": [],
        "points": [],
        "cross_check": [],
    }
    try:
        measure(args, report, lua, requests)
    finally:
        report["load_end"] = os.getloadavg()
        write_file(args.out / "results.json", json.dumps(report, indent=2) + "\n")
        write_file(args.out / "results.md", markdown(report))
    print(markdown(report))
    return 1 if any(p["errors"] for p in report["points"]) else 0


if __name__ == "__main__":
    sys.exit(main())
