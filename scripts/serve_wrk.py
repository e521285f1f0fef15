"""Load benchmark of `seq2onnx serve` driven by wrk, an independent HTTP client (issue 36, item 4).

    python scripts/serve_wrk.py BUNDLE --ct2 CT2_DIR --out DIR [--clients 1 8 32 128] [--seconds 15]
    python scripts/hf_real_sizes.py --work W --models marian --prepare-only   # W/out/marian/bundle-fp32, ct2

Each server is its own process on 127.0.0.1 (scaffold.Server: a free port, awaited until it answers,
SIGTERM then SIGKILL), with --threads (T) compute threads in all:
  continuous  seq2onnx serve BUNDLE --batching continuous --intra-threads N, N in --continuous-intra
              (default 1 and T); --continuous-lanes and --continuous-no-solo add settings
  standard-rounds  the same with --rounds standard (continuous batching on decoder.onnx), for the A/B
  request     seq2onnx serve BUNDLE --batching request --workers W --intra-threads T/W, W in --request-workers
  ct2         python scripts/serve_ct2.py BUNDLE CT2 --inter-threads I --intra-threads T/I, I in --ct2-inter
  ceiling     python scripts/serve_ct2.py BUNDLE --echo: the real front end over an engine that tokenises
              and decodes nothing (what the front end alone allows; greedy bodies only)
With --processes P (P > 1), each server is also run as P processes on its port (seq2onnx serve
--processes), the T threads split between them.
The load: wrk (apt-get install wrk), closed loop, C connections, running serve_wrk.lua: each request is one
random sentence of 3-10 words drawn from the bundle's source SentencePiece pieces, beam_size B, and with
--max-length LO HI a max_decoding_length drawn from LO..HI. Per point: a --warmup run of wrk (discarded),
then a --seconds run: requests/s (2xx answers), wrk's p50/p90/p99/max latency, errors, and tokens/s from
the server's /metrics. Each server is reported at its best setting per point (named). After the continuous
server, Translator.translate in this process (--in-process-seconds) for the 1-client comparison.
Writes DIR/results.json, results.md, words.txt (the Lua script's words) and logs/.
"""

from __future__ import annotations

import argparse
import json
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

HERE = Path(__file__).resolve().parent
LUA = HERE / "serve_wrk.lua"
SERVERS = ("continuous", "standard-rounds", "request", "ct2", "ceiling")  # --servers' choices
COLUMNS = ("continuous", "continuous-no-solo", *SERVERS[1:])  # the report's (--continuous-no-solo adds one)
MARKER = "SERVE_WRK "


sys.path.insert(0, str(HERE))  # scaffold, also when a test loads this file by path
import scaffold as sc  # noqa: E402

log = sc.log


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
    """(sentence, max_decoding_length or None) drawn as serve_wrk.lua draws them (for in-process)."""
    rng, joiner = random.Random(seed), "" if sep == "none" else " "
    sentence = lambda: joiner.join(rng.choice(words) for _ in range(rng.randint(3, 10)))  # noqa: E731
    return [(sentence(), rng.randint(*lengths) if lengths else None) for _ in range(n)]


# -- wrk ---------------------------------------------------------------------------------------------


def wrk_command(
    url: str, clients: int, seconds: int, lua_args: list, *, threads: int = 1, timeout: float = 330.0
) -> list[str]:
    opts = f"-t {min(threads, clients)} -c {clients} -d {seconds}s --timeout {int(timeout)}s".split()
    return ["wrk", *opts, "-s", str(LUA), url, "--", *map(str, lua_args)]


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
    latencies = {f"{k}_ms": raw[f"{k}_us"] / 1000 for k in ("mean", "p50", "p90", "p99", "max")}
    figures = dict(duration_s=seconds, requests=raw["requests"], ok=ok, requests_per_s=ok / seconds)
    return {**figures, "errors": errors, **latencies}


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


def _cell(p) -> str:
    if p is None:
        return "—"
    return f"{p['requests_per_s']:.1f} / {p['p99_ms']:.0f}" + (f" ({p['setting']})" if p["setting"] else "")


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
            at = {s: best.get((s, greedy if s == "ceiling" else beam, c)) for s in COLUMNS}
            cells = [_cell(at[s]) for s in servers]
            ratios = [_ratio(at["continuous"], at[s]) for s in ("ct2", "request", "ceiling")]
            out.append(f"| {c} | " + " | ".join(cells + ratios) + " |")
        out.append("")
    for label, figures in report.get("in_process", {}).items():
        cont = best.get(("continuous", 1 if label == "greedy" else int(label[4:]), 1))
        if cont:
            out.append(
                f"- in-process `Translator.translate` {label}: p50 {figures['p50_ms']:.1f} ms; continuous at "
                f"1 client p50 {cont['p50_ms']:.1f} ms ({cont['p50_ms'] / figures['p50_ms']:.2f}x)"
            )
    head = "server setting beam clients req/s tok/s p50_ms p90_ms p99_ms max_ms requests errors".split()
    rows = [
        [p["server"], p["setting"] or "—", p["beam"], p["clients"], f"{p['requests_per_s']:.1f}"]
        + [f"{p[k]:.{d}f}" for k, d in (("tokens_per_s", 0), ("p50_ms", 1), ("p90_ms", 1), ("p99_ms", 1))]
        + [f"{p['max_ms']:.0f}", p["requests"], p["errors"] or 0]
        for p in report["points"]
    ]
    out += ["", "Every point:", "", *sc.md_table(head, rows)]
    return "\n".join(out) + "\n"


# -- the run -----------------------------------------------------------------------------------------


def servers(args) -> list[tuple[str, str, list[str]]]:
    """(server, setting, argv without --port) of every server to measure."""
    want, T, one = set(args.servers), args.threads, ("--processes", 1)  # one: serve's default is auto
    cont = sc.serve_argv(args.bundle, "--timeout", args.server_timeout, "--batching", "continuous", *one)
    out = []
    if "standard-rounds" in want:  # continuous batching on decoder.onnx
        out.append(("standard-rounds", "", cont + ["--intra-threads", str(T), "--rounds", "standard"]))
    for intra in args.continuous_intra or sorted({1, T}) if "continuous" in want else ():
        out.append(("continuous", f"intra {intra}", cont + ["--intra-threads", str(intra)]))
        if args.continuous_no_solo:  # every search in the scheduler's rounds: a column of its own
            out.append(("continuous-no-solo", f"intra {intra}", out[-1][2] + ["--no-solo"]))
    for lanes in (n for n in args.continuous_lanes if n > 1 and "continuous" in want):  # the threads split
        argv = cont + ["--intra-threads", str(max(1, T // lanes)), "--lanes", str(lanes)]
        out.append(("continuous", f"lanes {lanes} x intra {max(1, T // lanes)}", argv))
    request = sc.serve_argv(args.bundle, "--timeout", args.server_timeout, "--batching", "request", *one)
    ct2 = [sys.executable, str(HERE / "serve_ct2.py"), str(args.bundle), str(args.ct2), "--timeout"]
    for k in sorted({1, T}):  # W and I must be 1 or T
        if "request" in want and k in args.request_workers:
            argv = request + ["--workers", str(k), "--intra-threads", str(T // k)]
            out.append(("request", f"workers {k} x intra {T // k}", argv))
        if "ct2" in want and args.ct2 and k in args.ct2_inter:
            argv = ct2 + [str(args.server_timeout), "--inter-threads", str(k), "--intra-threads", str(T // k)]
            out.append(("ct2", f"inter {k} x intra {T // k}", argv))
    if "ceiling" in want:
        out.append(("ceiling", "", [sys.executable, str(HERE / "serve_ct2.py"), str(args.bundle), "--echo"]))
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
        label = sc.beam_label(beam)
        out[label] = {"sentences": len(times), "p50_ms": 1000 * sorted(times)[len(times) // 2]}
        log(f"in-process {label}: p50 {out[label]['p50_ms']:.1f} ms over {len(times)} sentences")
    return out


def measure(args, report: dict, lua: list, requests: list) -> None:
    for name, setting, argv in servers(args):
        log(f"starting {name} {setting}".rstrip())
        logfile = args.out / "logs" / f"{name}-{setting.replace(' ', '')}.log"
        with sc.Server(argv, logfile, requests[0][0], args.start_timeout) as server:
            report["servers"].append({"server": name, "setting": setting, "command": argv})
            for beam in [min(args.beams)] if name == "ceiling" else args.beams:
                for clients in args.clients:
                    p = {"server": name, "setting": setting, **point(server.url, clients, beam, lua, args)}
                    report["points"].append(p)
                    log(
                        f"{name} {setting} beam {beam} {clients} clients: {p['requests_per_s']:.1f} req/s, "
                        f"p50 {p['p50_ms']:.1f} ms, p99 {p['p99_ms']:.1f} ms, errors {p['errors'] or 0}"
                    )
        if name == "continuous" and args.in_process_seconds > 0 and "in_process" not in report:
            report["in_process"] = in_process(args, requests)


def build_parser() -> argparse.ArgumentParser:
    p = sc.parser(__doc__)
    p.add_argument("bundle", type=Path, help="the bundle served (seq2onnx export's)")
    p.add_argument("--ct2", type=Path, help="the CTranslate2 model of the bundle's checkpoint (else no ct2)")
    sc.add_out(p)
    p.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS), help="(default all)")
    p.add_argument(
        "--clients", type=int, nargs="+", default=[1, 8, 32, 128], help="wrk connections per point"
    )
    p.add_argument(
        "--beams", type=int, nargs="+", default=[1, 4], help="beam sizes (default 1 4; 1 is greedy)"
    )
    p.add_argument("--seconds", type=int, default=15, help="measured seconds per point, whole (default 15)")
    p.add_argument("--warmup", type=int, default=4, help="seconds of discarded load before each point (4)")
    lengths = "each request's max_decoding_length drawn from LO..HI (default: the bundle's rule)"
    p.add_argument("--max-length", type=int, nargs=2, metavar=("LO", "HI"), help=lengths)
    p.add_argument("--threads", type=int, default=2, help="compute threads per server in all (default 2)")
    p.add_argument("--request-workers", type=int, nargs="+", default=[1, 2], help="--workers W tried (1 2)")
    p.add_argument(
        "--continuous-intra", type=int, nargs="+", help="--intra-threads N tried (default 1 and T)"
    )
    no_solo = "also each --continuous-intra with serve --no-solo (optimisation-notes row 51)"
    p.add_argument("--continuous-no-solo", action="store_true", help=no_solo)
    lanes = "continuous with serve --lanes L and intra T/L too, each L > 1 (default 1: none)"
    p.add_argument("--continuous-lanes", type=int, nargs="+", default=[1], help=lanes)
    processes = "each server also as P processes on its port, each P > 1, the threads split (default 1: none)"
    p.add_argument("--processes", type=int, nargs="+", default=[1], help=processes)
    p.add_argument("--ct2-inter", type=int, nargs="+", default=[1, 2], help="--inter-threads I tried (1 2)")
    p.add_argument(
        "--wrk-threads", type=int, default=1, help="wrk's threads (default 1; at most the clients)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random sentences (default 0)")
    in_proc = "seconds of in-process translate per beam after the continuous server (default 10; 0: none)"
    p.add_argument("--in-process-seconds", type=float, default=10.0, help=in_proc)
    sc.add_timeouts(p, request=330.0)
    p.add_argument("--server-timeout", type=float, default=300.0, help="each server's --timeout (seconds)")
    return p


def _check(args) -> None:
    """Raises ValueError for a bad argument or a missing wrk."""
    if shutil.which("wrk") is None:
        raise ValueError("wrk is not installed: apt-get install wrk (Debian, Ubuntu)")
    if min(args.clients) < 1 or args.seconds < 1 or args.warmup < 0 or args.threads < 1:
        raise ValueError("--clients, --seconds and --threads must be >= 1, --warmup >= 0")
    args.continuous_intra = sorted(set(args.continuous_intra or (1, args.threads)))
    for name in ("continuous_intra", "continuous_lanes"):
        if not all(1 <= n <= args.threads for n in getattr(args, name)):
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: each must be 1..--threads")
    if min(args.processes) < 1:
        raise ValueError(f"--processes {args.processes}: each must be >= 1")
    sc.prepare_out(args.out, args.force)


def main(argv: list[str] | None = None) -> int:
    """Returns 0; 1 when a point had errors; 2 for a bad argument or a missing wrk (the message on stderr)."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, sc.terminate)  # unwinds: the servers are stopped
    words: list = []
    if code := sc.checked("serve_wrk", lambda: (_check(args), words.extend(source_words(args.bundle)))):
        return code
    (words, sep) = words
    write_words(words, args.out / "words.txt")
    lua = [args.out / "words.txt", sep, *(args.max_length or (0, 0)), args.seed]
    requests = sample_requests(words, sep, 2000, args.seed, args.max_length)
    wrk_version = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.splitlines()[:1]
    note = (
        f"{args.threads} compute threads per server; {os.cpu_count()} cores shared with wrk "
        f"({args.wrk_threads} thread); load at start {', '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"{len(words)} words (sep {sep}); max_decoding_length {args.max_length or 'the bundle rule'}; "
        f"{args.warmup} s warm-up, {args.seconds} s measured per point; {' '.join(wrk_version)}; "
        "ceiling: greedy bodies."
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
    }
    try:
        measure(args, report, lua, requests)
    finally:
        report["load_end"] = os.getloadavg()
        sc.write_report(args.out, "results", report, markdown(report))
    print(markdown(report))
    return 1 if any(p["errors"] for p in report["points"]) else 0


if __name__ == "__main__":
    sys.exit(main())
