"""Token identity of `seq2onnx serve` under load (issue 26, item 2): does a sentence decoded in a shared batch
get the very tokens it gets decoded alone?

    python scripts/serve_identity.py BUNDLE --out DIR [--sentences 1000] [--clients 32]
        [--batching continuous]

N real sentences (Tatoeba, column --src-col) are sent by C concurrent clients, one sentence per request, to a
`seq2onnx serve BUNDLE --batching continuous` process on 127.0.0.1, greedy and beam 4 with return_scores;
the server is stopped, then each sentence is translated alone in this process
(Translator.translate_batch([sentence]), same options) and the token ids compared. Prints identical/total
per search and, for each difference, both hypotheses and both scores; writes DIR/identity.json and
DIR/identity.txt (the same text). Progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scaffold as sc  # noqa: E402  (scripts/ is this script's folder)


async def send_all(url: str, sentences: list[str], clients: int, beam: int, timeout: float) -> list[dict]:
    """Every sentence once, `clients` requests in flight; the answers (or {"error": ...}) in sentence
    order."""
    import httpx

    answers: list[dict] = [{} for _ in sentences]
    order = itertools.count()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def one_client():
            while (i := next(order)) < len(sentences):
                try:
                    body = {"texts": [sentences[i]], "beam_size": beam, "return_scores": True}
                    r = await client.post(url, json=body)
                    answers[i] = (
                        r.json()["translations"][0]
                        if r.status_code == 200
                        else {"error": f"HTTP {r.status_code}: {r.text[:200]}"}
                    )
                except httpx.HTTPError as e:
                    answers[i] = {"error": f"{type(e).__name__}: {e}"}

        await asyncio.gather(*(one_client() for _ in range(clients)))
    return answers


def compare(sentences: list[str], served: list[dict], alone: list) -> dict:
    """Counts identical token ids (every hypothesis) and lists each difference with both answers."""
    differences, errors = [], []
    for i, (text, s, a) in enumerate(zip(sentences, served, alone)):
        if "error" in s:
            errors.append({"index": i, "source": text, "error": s["error"]})
        elif s["token_ids"] != a.token_ids:
            got = dict(
                hypothesis=s["hypotheses"][0],
                token_ids=s["token_ids"][0],
                score=(s.get("scores") or [None])[0],
            )
            want = dict(hypothesis=a.hypotheses[0], token_ids=a.token_ids[0], score=float(a.scores[0]))
            differences.append({"index": i, "source": text, "served": got, "alone": want})
    identical = len(sentences) - len(differences) - len(errors)
    return {"total": len(sentences), "identical": identical, "errors": errors, "differences": differences}


def as_text(report: dict) -> str:
    lanes, processes = report.get("lanes", 1), report.get("processes", 1)
    lines = [
        f"token identity of `seq2onnx serve --batching {report['batching']} --lanes {lanes} "
        f"--processes {processes}`: "
        f"{report['sentences']} sentences, {report['clients']} concurrent clients, one sentence per "
        "request, against Translator.translate_batch([sentence]) alone in-process"
    ]
    for label, r in report["results"].items():
        lines.append(
            f"{label}: {r['identical']}/{r['total']} identical, {len(r['differences'])} differ, "
            f"{len(r['errors'])} failed requests"
        )
    for label, r in report["results"].items():
        for d in r["differences"]:
            lines += [
                f"\n[{label} #{d['index']}] {d['source']}",
                f"  served: {d['served']['hypothesis']!r} score {d['served']['score']}",
                f"  alone:  {d['alone']['hypothesis']!r} score {d['alone']['score']}",
            ]
        for e in r["errors"][:20]:
            lines.append(f"\n[{label} #{e['index']}] request failed: {e['error']}")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = sc.parser(__doc__)
    p.add_argument("bundle", type=Path, help="the bundle served and translated in process")
    sc.add_out(p)
    sc.add_sentences(p, 1000)
    p.add_argument("--clients", type=int, default=32, help="concurrent clients (default 32)")
    p.add_argument("--beams", type=int, nargs="+", default=[1, 4], help="beam sizes checked (default 1 4)")
    p.add_argument(
        "--batching",
        default="continuous",
        choices=("continuous", "request"),
        help="the server's batching (default continuous)",
    )
    p.add_argument(
        "--intra-threads", type=int, default=2, help="the server's onnxruntime threads (default 2)"
    )
    p.add_argument("--lanes", type=int, default=1, help="the server's --lanes, with continuous (default 1)")
    p.add_argument("--processes", type=int, default=1, help="the server's --processes (default 1)")
    sc.add_timeouts(p, request=600.0)
    return p


def main(argv: list[str] | None = None) -> int:
    """Sends, translates alone, compares, writes.

    Returns:
        0; 1 when a request failed; 2 for a bad argument (the message on stderr).
    """
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, sc.terminate)
    sentences: list[str] = []

    def check():
        if args.sentences < 1 or args.clients < 1:
            raise ValueError(f"--sentences {args.sentences}, --clients {args.clients}: each must be >= 1")
        sentences.extend(sc.read_sentences(args.data, args.src_col, args.sentences, args.seed))
        sc.prepare_out(args.out, args.force)

    if code := sc.checked("serve_identity", check):
        return code
    options = ["--batching", args.batching, "--intra-threads", args.intra_threads, "--lanes", args.lanes]
    options += ["--processes", args.processes, "--timeout", args.request_timeout]
    cmd = sc.serve_argv(args.bundle, *options)
    served = {}
    sc.log(f"starting {' '.join(cmd[2:])}")
    with sc.Server(cmd, args.out / "logs" / "server.log", sentences[0], args.start_timeout) as server:
        for beam in args.beams:
            t = time.perf_counter()
            served[beam] = asyncio.run(
                send_all(server.url, sentences, args.clients, beam, args.request_timeout)
            )
            sc.log(f"{sc.beam_label(beam)}: {len(sentences)} served in {time.perf_counter() - t:.1f} s")
    from seq2onnx.runtime.translator import Translator

    tr = Translator(args.bundle, device="cpu", intra_threads=args.intra_threads)
    setting = dict(
        bundle=str(args.bundle), batching=args.batching, lanes=args.lanes, processes=args.processes
    )
    load = dict(sentences=len(sentences), clients=args.clients, data=str(args.data), src_col=args.src_col)
    report = {**setting, **load, "results": {}}
    for beam in args.beams:
        t = time.perf_counter()
        alone = [tr.translate_batch([s], beam_size=beam, return_scores=True)[0] for s in sentences]
        sc.log(f"{sc.beam_label(beam)}: {len(sentences)} translated alone in {time.perf_counter() - t:.1f} s")
        report["results"][sc.beam_label(beam)] = compare(sentences, served[beam], alone)
    text = as_text(report)
    sc.write_report(args.out, "identity", report, text, ".txt")
    print(text)
    return 1 if any(r["errors"] for r in report["results"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
