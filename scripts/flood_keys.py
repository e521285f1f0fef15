"""Per-key fairness under wrk (issue 59): does a key flooding at 10x its limit hurt the other keys' p99?

    python scripts/flood_keys.py BUNDLE [--seconds 10] [--rounds 3] [--clients 64] [--flooders 16] [--out DIR]

Starts `seq2onnx serve BUNDLE --languages en:fr --api-keys FILE` (FILE: three ordinary keys and one
"flooder" key limited to --flood-limit requests per minute and 4 in flight), then runs wrk (apt-get install
wrk) on DeepL's /v2/translate (scripts/flood_keys.lua), after a discarded warm-up, --rounds rounds of three
runs, the flooder's limit switched between them by rewriting the file and SIGHUP (one server throughout,
and the three modes of a round under about the same load from the machine's other work):
  alone      the ordinary keys only: --clients - --flooders connections, closed loop (and the flooder's
             pacing aimed at /health, so that the client side is loaded alike);
  flood      the same, plus --flooders connections of the flooder key paced at 10x its limit;
  unlimited  the same flood, with the flooder's limits lifted (what the keys prevent).
Prints a Markdown table (requests/s and p50/p99 of the ordinary keys; the flooder's requests and 429s) and
writes DIR/flood.json. On a shared machine the figures are noisy: compare runs of one invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import scaffold as sc  # noqa: E402  (scripts/ is this script's folder)

KEYS = {
    "a": "ordinary-key-a-0123456789",
    "b": "ordinary-key-b-0123456789",
    "c": "ordinary-key-c-0123456789",
    "flood": "flooder-key-0123456789",
}


def keys_file(directory: Path, flood_limit: int) -> Path:
    """The keys file: the ordinary keys unbounded in practice, the flooder at flood_limit per minute and 4 in
    flight (both lifted for the unlimited run)."""
    from seq2onnx.serve.keys import line_for

    path = directory / "keys.txt"
    lines = [line_for(n, k, in_flight=64, per_minute=10**6) for n, k in KEYS.items() if n != "flood"]
    lines.append(
        line_for("flood", KEYS["flood"], in_flight=4 if flood_limit < 10**6 else 64, per_minute=flood_limit)
    )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def wrk(
    url: str, keys: list[str], clients: int, seconds: float, delay_ms: int, path: str = "/v2/translate"
) -> subprocess.Popen:
    get = ["get"] if path == "/health" else []
    return subprocess.Popen(
        [
            "wrk",
            "-t",
            "1",
            "-c",
            str(clients),
            "-d",
            f"{max(1, round(seconds))}s",
            "--timeout",
            "30s",
            "-s",
            str(HERE / "flood_keys.lua"),
            url + path,
            "--",
            ",".join(keys),
            str(delay_ms),
            *get,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def result(proc: subprocess.Popen) -> dict:
    out = proc.communicate()[0]
    found = re.search(r"^FLOOD (\{.*\})$", out, re.M)
    if not found:
        raise RuntimeError(f"wrk printed no FLOOD line:\n{out}")
    return json.loads(found.group(1))


def run(url: str, args, flood: bool) -> dict:
    """One point: the ordinary keys' wrk (and the flooder's, paced at 10x its limit)."""
    ordinary = [KEYS[n] for n in "abc"]
    # 10x the limit, spread over the flooder's connections: each waits this long between requests
    delay_ms = int(args.flooders * 60_000 / (10 * args.flood_limit))
    procs = [wrk(url, ordinary, args.clients - args.flooders, args.seconds, 0)]
    # alone: the same pacing on /health, so that both runs load the client side alike
    procs.append(
        wrk(
            url,
            [KEYS["flood"]],
            args.flooders,
            args.seconds,
            delay_ms,
            "/v2/translate" if flood else "/health",
        )
    )
    figures = [result(p) for p in procs]
    return {"ordinary": figures[0], "flooder": figures[1] if flood else None}


def rate(flooder: dict | None, limit: int) -> str:
    """The flooder's achieved request rate as a multiple of the --flood-limit it was paced at 10x of."""
    return "-" if flooder is None else f"{flooder['requests'] / flooder['seconds'] / (limit / 60):.1f}x"


MODES = (("alone", False, None), ("flood", True, None), ("unlimited", True, 10**6))


def rounds(args, out: Path) -> list[dict]:
    """--rounds rounds of the three modes on one server, the flooder's limit switched by SIGHUP (the keys
    file rewritten): each round's modes run under about the same load from the machine's other work."""
    keys = keys_file(out, args.flood_limit)
    argv = sc.serve_argv(args.bundle, "--languages", "en:fr", "--api-keys", keys, "--max-queue", 1024)
    results = []
    with sc.Server(argv, out / "server.log", probe=None, start_timeout=120) as server:
        url, proc = server.url.removesuffix(sc.PATH), server.proc
        result(wrk(url, [KEYS["a"]], args.clients - args.flooders, args.warmup, 0))
        for _ in range(args.rounds):
            row = {}
            for name, flood, limit in MODES:
                keys_file(out, limit or args.flood_limit)
                proc.send_signal(signal.SIGHUP)
                time.sleep(0.5)
                row[name] = run(url, args, flood)
            results.append(row)
    return results


def table(results: list[dict], limit: int) -> str:
    """The Markdown table: one line per round and mode; p99 / alone is against the same round's alone."""
    head = [
        "round",
        "run",
        "ordinary req/s",
        "ordinary p50 ms",
        "ordinary p99 ms",
        "p99 / alone (same round)",
        "flooder requests",
        "flooder non-2xx (429)",
        "flooder rate / limit",
    ]
    rows = []
    for i, row in enumerate(results, 1):
        base = row["alone"]["ordinary"]["p99"]
        for name, _, _ in MODES:
            o, f = row[name]["ordinary"], row[name]["flooder"]
            ordinary = [
                f"{o['requests'] / o['seconds']:.1f}",
                f"{o['p50'] / 1000:.1f}",
                f"{o['p99'] / 1000:.1f}",
            ]
            flooder = [f["requests"], f["non_2xx"]] if f else ["-", "-"]
            rows.append([i, name, *ordinary, f"{o['p99'] / base:.2f}", *flooder, rate(f, limit)])
    return "\n".join(sc.md_table(head, rows))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=float, default=3)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--flooders", type=int, default=16)
    p.add_argument("--flood-limit", type=int, default=600, help="the flooder key's requests per minute")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="flood-keys-"))
    out.mkdir(parents=True, exist_ok=True)
    results = rounds(args, out)
    (out / "flood.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(table(results, args.flood_limit))
    print(f"(written to {out / 'flood.json'}; noisy on a shared machine)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
