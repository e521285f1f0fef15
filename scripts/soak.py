"""Memory over a long run: a `seq2onnx serve` process under many clients (issue 37, item 8; issue 60).

    python scripts/soak.py BUNDLE [--clients 64] [--minutes 10] [--every 10] [--mix heavy] --out DIR

A real server on 127.0.0.1 (`seq2onnx serve BUNDLE --batching continuous`) and --clients closed-loop clients
(raw_http.py) of mixed requests (greedy, beam 4 with 2-best and scores, sampling with a seed, 1-8 texts of
1-40 words, some with a max_decoding_length; or --mix heavy: issue 60's), for --minutes, after --warmup
seconds of one client of the same mix (the reference reading). Every --every seconds it samples the
server's resident set (VmRSS), open descriptors and the p99 latency of that window; then the clients stop
and the idle server is sampled for --idle seconds. Writes DIR/soak.json and DIR/soak.png (serve_soak()
names the figures). The in-process mode (one Translator, no server) is `git show 6c5edd9:scripts/soak.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
import scaffold as sc  # noqa: E402


POOL = 2000


def sentences(n: int) -> list[str]:
    """Varied inputs without torch: the generated corpus's sources (model/corpus.py is stdlib-only)."""
    from seq2onnx.model.corpus import generate_pairs

    pool = [s for s, _ in generate_pairs(POOL, seed=99)]
    return [pool[i % len(pool)] for i in range(n)]


def proc_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def mixed_request(rng, pool: list[str]) -> dict:
    """One of the mixed requests (the module docstring): texts of the pool and options drawn at random."""
    texts = [
        " ".join(rng.choice(pool).split()[: rng.randint(1, 40)]) for _ in range(rng.choice((1, 1, 2, 4, 8)))
    ]
    kind = rng.random()
    if kind < 0.4:
        body = {"texts": texts, "beam_size": 1}
    elif kind < 0.7:
        body = {"texts": texts, "beam_size": 4, "num_hypotheses": 2, "return_scores": True}
    elif kind < 0.9:
        body = {"texts": texts, "sampling_temperature": 0.8, "sampling_topk": 10, "seed": rng.randint(0, 999)}
    else:
        body = {"texts": texts, "beam_size": 2, "max_decoding_length": rng.randint(5, 60)}
    return body


def heavy_request(rng, pool: list[str]) -> dict:
    """One of issue 60's heavy requests: 8-32 texts, beam 4 with the 4-best and scores, or 8 samples."""
    texts = [" ".join(rng.choice(pool).split()[: rng.randint(3, 40)]) for _ in range(rng.randint(8, 32))]
    if rng.random() < 0.5:
        return {"texts": texts, "beam_size": 4, "num_hypotheses": 4, "return_scores": True}
    return {"texts": texts, "sampling_temperature": 0.8, "num_hypotheses": 8, "seed": rng.randint(0, 999)}


async def _clients(
    host: str, port: int, n: int, seconds: float, pool: list[str], done: list, errors: list, mix=None
) -> None:
    """n closed-loop clients for `seconds`; a 503 (its Retry-After: 1 s) is retried with the same body, as
    a client should, and counted in `errors` as "retried 503"; `done` gets (time, latency, status)."""
    import random

    from raw_http import Connection, HTTPError

    stop, mix = time.monotonic() + seconds, mix or mixed_request

    async def client(i: int) -> None:
        rng, conn = random.Random(i), Connection(host, port)
        while time.monotonic() < stop:
            body, start = mix(rng, pool), time.monotonic()
            try:
                while (status := (await conn.post_json("/v1/translate", body, timeout=120))[0]) == 503:
                    errors.append((time.monotonic(), "retried 503"))
                    await asyncio.sleep(1.0)
            except (HTTPError, asyncio.TimeoutError) as e:
                errors.append((time.monotonic(), type(e).__name__))
                continue
            done.append((time.monotonic(), time.monotonic() - start, status))
        conn.close()

    await asyncio.gather(*(client(i) for i in range(n)))


def sample(pid: int, t: float, window: list, load: bool) -> dict:
    """The server's RSS and descriptors now, and the answers of the window (time, latency, status)."""
    latencies = sorted(lat for _, lat, _ in window)
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None
    figures = {"t_s": round(t, 1), "rss_mb": round(sc.rss_mb(pid), 1), "fds": proc_fds(pid)}
    answered = {"answered": len(window), "non_200": sum(st != 200 for *_, st in window)}
    return figures | {"p99_s": None if p99 is None else round(p99, 3), **answered, "load": load}


def serve_soak(args) -> int:
    """Runs the soak (the module docstring); writes DIR/soak.json and DIR/soak.png.

    The figures: rss_after_warmup_mb (at the end of the one-client warm-up), rss_peak_mb,
    rss_end_mb (the last sample under load), rss_idle_mb (after --idle seconds without clients), and
    rss_idle_over_warmup, the ratio the issue bounds at 1.5; fds at the same points; p99 per window.
    """
    import threading

    from seq2onnx.atomic import write_file

    out, pool = args.out, sentences(POOL)
    limits = ("--batching", args.batching, "--max-queue", 4 * args.clients, "--max-texts", 64)
    argv = sc.serve_argv(args.bundle, "--processes", 1, *limits, *args.server_args)  # RSS: one pid
    done, errors, samples = [], [], []
    with sc.Server(argv, out / "logs" / "server.log", probe=pool[0]) as server:
        pid, port = server.proc.pid, server.port
        warm_done, warm_errors = [], []
        mix = heavy_request if args.mix == "heavy" else mixed_request
        asyncio.run(_clients("127.0.0.1", port, 1, args.warmup, pool, warm_done, warm_errors, mix))
        warm = sample(pid, 0.0, warm_done, False) | {"p99_s": None}
        print("warm-up:", json.dumps(warm), flush=True)
        t0 = time.monotonic()
        load = threading.Thread(
            target=lambda: asyncio.run(
                _clients("127.0.0.1", port, args.clients, args.minutes * 60, pool, done, errors, mix)
            ),
            daemon=True,
        )
        load.start()
        seen = 0
        while load.is_alive() or time.monotonic() - t0 < args.minutes * 60 + args.idle:
            time.sleep(args.every)
            now, window = time.monotonic(), done[seen:]
            seen += len(window)
            samples.append(sample(pid, now - t0, window, load.is_alive()))
            print(json.dumps(samples[-1]), flush=True)
            if not load.is_alive() and now - t0 >= args.minutes * 60 + args.idle:
                break
        metrics = __import__("httpx").get(server.url.replace("/v1/translate", "/metrics"), timeout=10).text
    under = [x for x in samples if x["load"]]
    idle = samples[-1]
    report = {
        "bundle": args.bundle,
        "batching": args.batching,
        "clients": args.clients,
        "minutes": args.minutes,
        "every_s": args.every,
        "requests": len(done),
        "non_200": sum(st != 200 for *_, st in done),
        "mix": args.mix,
        "retried_503": sum(kind == "retried 503" for _, kind in errors),
        "client_errors": sum(kind != "retried 503" for _, kind in errors),
        "rss_after_warmup_mb": warm["rss_mb"],
        "warmup_s": args.warmup,
        "warmup_requests": len(warm_done),
        "rss_first_sample_mb": under[0]["rss_mb"],
        "rss_peak_mb": max(x["rss_mb"] for x in samples),
        "rss_end_mb": under[-1]["rss_mb"],
        "rss_idle_mb": idle["rss_mb"],
        "rss_idle_over_warmup": round(idle["rss_mb"] / warm["rss_mb"], 3),
        "rss_end_over_warmup": round(under[-1]["rss_mb"] / warm["rss_mb"], 3),
        "fds_after_warmup": warm["fds"],
        "fds_peak": max(x["fds"] for x in samples),
        "fds_idle": idle["fds"],
        "p99_s_max": max((x["p99_s"] for x in under if x["p99_s"] is not None), default=None),
        "p99_s_median": statistics.median([x["p99_s"] for x in under if x["p99_s"] is not None] or [0]),
        "memory_metrics": [
            line
            for line in metrics.splitlines()
            if line.startswith(("process_resident", "process_open_fds", "seq2onnx_round_cache"))
        ],
        "samples": samples,
    }
    write_file(out / "soak.json", json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=2))
    plot_soak(report, out / "soak.png")
    return 0


def plot_soak(report: dict, path: Path) -> None:
    """RSS, open descriptors and p99 latency against time, one panel each; the idle tail shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    t = [x["t_s"] / 60 for x in samples]
    fig, axes = plt.subplots(3, 1, figsize=(8, 7.5), sharex=True)
    for ax, key, label in zip(
        axes,
        ("rss_mb", "fds", "p99_s"),
        ("resident set (MB)", "open descriptors", "p99 latency (s), per window"),
    ):
        ax.plot(t, [x[key] for x in samples], marker=".")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ends = [x["t_s"] / 60 for x in samples if not x["load"]]
        if ends:
            ax.axvspan(ends[0] - report["every_s"] / 60, ends[-1], color="grey", alpha=0.15)
    axes[0].scatter(
        [0], [report["rss_after_warmup_mb"]], color="green", zorder=3, label="after the 1-client warm-up"
    )
    axes[1].scatter([0], [report["fds_after_warmup"]], color="green", zorder=3)
    axes[0].axhline(
        report["rss_after_warmup_mb"] * 1.5, color="red", ls="--", lw=1, label="1.5 x after warm-up"
    )
    axes[0].legend(loc="lower right")
    axes[0].set_title(
        f"seq2onnx serve --batching {report['batching']}: {report['clients']} clients of mixed requests, "
        f"{report['minutes']:g} min, then idle (shaded)",
        fontsize=9,
    )
    axes[-1].set_xlabel("minutes")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)  # written whole or not at all


def main() -> int:
    p = sc.parser(__doc__)
    p.add_argument("bundle")
    sc.add_out(p, "soak.json, soak.png, logs/server.log")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    p.add_argument("--warmup", type=float, default=30.0, help="seconds of one client before the reference")
    p.add_argument("--idle", type=float, default=30.0, help="seconds sampled without clients at the end")
    p.add_argument("--batching", default="continuous")
    heavy = "heavy: issue 60's 8-32 texts at beam 4 with the 4-best, or 8 samples"
    p.add_argument("--mix", choices=("mixed", "heavy"), default="mixed", help=heavy)
    more = "more `seq2onnx serve` options"
    p.add_argument("--server-args", nargs=argparse.REMAINDER, default=[], help=more)
    args = p.parse_args()
    return sc.checked("soak", lambda: sc.prepare_out(args.out, args.force)) or serve_soak(args)


if __name__ == "__main__":
    sys.exit(main())
