"""`seq2onnx serve BUNDLE`: the bundle's Translator over HTTP (serve/app.py under uvicorn, serve/server.py).

Torch-free: it needs the runtime and the serve extra (pip install 'seq2onnx[serve,cpu]'). FastAPI, uvicorn and
the engines are imported when the command runs, so `seq2onnx --help` works without them. docs/serving.md.
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import os
import sys
from pathlib import Path

from seq2onnx.commands import serve_dropin
from seq2onnx.errors import CommandError
from seq2onnx.serve.memory import MAX_ROWS

BATCHING = ("continuous", "request")
# --processes auto: one process per core up to this bundle size on disk (each process holds its own copy); the
# models measured to gain (docs/serving.md) are 3 and 28 MB; above, one process with a thread per core.
AUTO_PROCESSES_MAX_MB = 64
# (option, default, what it bounds): each an int >= 1; the front end answers 413 or 503 beyond it
LIMITS = (
    ("--max-queue", 256, "requests accepted and not yet answered; beyond: 503 with Retry-After"),
    ("--max-texts", 64, "texts per request; beyond: 413"),
    ("--max-chars", 10000, "characters per request, all texts together; beyond: 413"),
    ("--max-body-bytes", 1 << 20, "request body bytes; beyond: 413"),
    (
        "--max-rows",
        MAX_ROWS,
        "decoder rows one request holds at once (texts decoded together x beam_size, or x "
        "num_hypotheses when sampling); beyond: 422",
    ),
    (
        "--max-rows-in-flight",
        None,
        "decoder rows of every request being answered, all together (texts x "
        "beams, or x samples); beyond, a request waits in line (first come, first "
        "served) within --timeout. Default: 512, less where this machine's memory is short (serve/memory.py "
        "rows_in_flight_default), at least --max-rows",
    ),
    ("--max-connections", 512, "open connections (each one file descriptor); beyond: 503 and closed at once"),
    ("--max-header-bytes", 65536, "bytes of a request's line and headers; beyond: 431, connection closed"),
)


def add(subparsers) -> None:
    """Registers `seq2onnx serve` on the CLI's subparsers."""
    p = subparsers.add_parser(
        "serve",
        help="serve a bundle over HTTP: batch and streaming translation, health, Prometheus metrics",
        description="Serve BUNDLE over HTTP (FastAPI under uvicorn): POST /v1/translate (texts and "
        "translate_batch's options as JSON), POST /v1/translate/stream (one text, NDJSON "
        "pieces), GET /health, /ready, /metrics, and the API's page at /docs. Prints one line "
        "once listening. SIGTERM or Ctrl-C drains: new requests are refused, those in flight are "
        "answered (for at most --drain-seconds), then it exits 0. Needs pip install "
        "'seq2onnx[serve,cpu]'; docs/serving.md explains every endpoint.",
    )
    p.add_argument("bundle", metavar="BUNDLE", help="a bundle made by `seq2onnx export`")
    _add_listen_flags(p)
    _add_scheduling_flags(p)
    _add_process_flags(p)
    _add_engine_flags(p)
    _add_limit_flags(p)
    _add_timeout_flags(p)
    serve_dropin.add_arguments(p)
    p.set_defaults(func=run)


def _add_listen_flags(p) -> None:
    """Where it listens: --host and --port."""
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=8000,
        help="the port to listen on (default 8000; 0 picks a free one and prints it)",
    )


def _add_scheduling_flags(p) -> None:
    """How requests are decoded together: --batching, --rounds, --lanes, --no-solo."""
    p.add_argument(
        "--batching",
        choices=BATCHING,
        default="continuous",
        help="continuous (the default): one scheduler decodes the sentences of every request "
        "together, joining at each step (serve/batcher.py); request: each request decoded as "
        "its own batch, --workers at a time",
    )
    p.add_argument(
        "--rounds",
        choices=("auto", "fused", "standard"),
        default="auto",
        help="--batching continuous only: the graph its rounds run. auto (the default): the fused "
        "decoder's, one in-place cache for every row (runtime/fused_rounds.py), where the "
        "bundle's fused decoder runs here and takes row_start; else decoder.onnx's. fused: "
        "refuse to start otherwise; standard: decoder.onnx's (runtime/standard_rounds.py)",
    )
    p.add_argument(
        "--lanes",
        type=int,
        default=1,
        help="--batching continuous only: schedulers over the same sessions, each running its own "
        "rounds (default 1); a request joins the one with the fewest rows in flight. With "
        "--intra-threads 1, N lanes keep N cores busy, one lane's Python running while "
        "another's decoder step does (docs/serving.md)",
    )
    p.add_argument(
        "--no-solo",
        dest="solo",
        action="store_false",
        help="--batching continuous only: hand every search to a lane. By default a search of at "
        "most 32 rows (sentences x beams) that finds nothing else decoding is decoded alone "
        "on its own thread by translate_batch's code, one at a time, sparing a lone client "
        "the hand-offs to a scheduler and back (docs/serving.md); requests arriving "
        "meanwhile join the lanes",
    )


def _add_process_flags(p) -> None:
    """Processes and threads: --processes, --liveness-seconds, --workers."""
    p.add_argument(
        "--processes",
        type=_processes,
        default="auto",
        help="server processes on the one port, each loading its own copy of the bundle with its "
        "own engine, threads and GIL. One process's Python (front end, planning, scheduler) "
        "runs on one core at a time, so on small models N processes of one intra-op thread "
        "serve more, at N times the memory. Default auto: one per core (each with "
        "--intra-threads 1) for continuous batching on the CPU of a bundle up to "
        f"{AUTO_PROCESSES_MAX_MB} MB, else 1 (docs/serving.md: 1.4-1.8x the requests/s of one "
        "process under wrk on the 0.7M and 7M-parameter models, 2 cores). The kernel hands each "
        "new connection to one of them; the limits below apply per process; /metrics sums all "
        "of them; a process that dies is replaced",
    )
    p.add_argument(
        "--liveness-seconds",
        type=float,
        default=30.0,
        help="--processes > 1 only: a process whose event loop sends the parent no heartbeat for "
        "this long (stopped, hung) is logged, killed and replaced (default 30)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=2,
        help="--batching request only: requests decoded at once, each on a thread of its own (default 2)",
    )


def _add_engine_flags(p) -> None:
    """The sessions: --intra-threads, --device, --cache-dir."""
    p.add_argument(
        "--intra-threads",
        type=int,
        default=0,
        help="onnxruntime threads inside each operator (default 0: OMP_NUM_THREADS where set, else "
        "onnxruntime's, one per core)",
    )
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where to run the graphs (default auto: CUDA where onnxruntime can run it, else the CPU)",
    )
    p.add_argument(
        "--cache-dir",
        default=None,
        metavar="DIR",
        help="on the CPU, keep onnxruntime's optimized graphs with their weights packed for "
        "this machine in DIR, so that later starts skip optimizing and packing (about 2.8x "
        "the bundle on disk; runtime/session_cache.py; default: none)",
    )


def _add_limit_flags(p) -> None:
    """The limits of LIMITS, each an int >= 1."""
    for option, default, text in LIMITS:
        p.add_argument(
            option,
            type=int,
            default=default,
            help=f"at most this many {text}" + ("" if default is None else f" (default {default})"),
        )


def _add_timeout_flags(p) -> None:
    """Time limits: --timeout, --read-timeout, --send-timeout, --keep-alive, --drain-seconds."""
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds from a request's arrival to its answer; beyond: 504 and its job is "
        "cancelled (default 60)",
    )
    p.add_argument(
        "--read-timeout",
        type=float,
        default=10.0,
        help="seconds a request's line and headers may take to arrive (from the connection's "
        "start, or a later request's first byte), and again its body after them; beyond: 408 "
        "and the connection closed (default 10; separate from --timeout)",
    )
    p.add_argument(
        "--send-timeout",
        type=float,
        default=30.0,
        help="seconds a connection whose client reads none of its answers (the server's writes to "
        "it paused: its buffers full) is kept; beyond: dropped (default 30)",
    )
    p.add_argument(
        "--keep-alive",
        type=float,
        default=5.0,
        help="seconds an idle connection is kept open after an answer (default 5)",
    )
    p.add_argument(
        "--drain-seconds",
        type=float,
        default=25.0,
        help="after SIGTERM, seconds the requests in flight get to finish before they are "
        "cancelled (default 25: below Kubernetes' default grace period of 30 s, so that the "
        "engine closes before SIGKILL)",
    )


def _processes(value: str) -> int | str:
    """--processes: "auto" or an int (_check refuses one below 1)."""
    try:
        return value if value == "auto" else int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: give auto or an int >= 1") from None


def auto_processes(args, cores: int | None = None, cuda: bool | None = None) -> tuple[int, str]:
    """What --processes auto means for these options: (processes, why).

    One process per core, each with one intra-op thread, where that was measured to serve most: continuous
    batching on the CPU of a small bundle (below AUTO_PROCESSES_MAX_MB on disk, as each process holds its own
    copy), with --lanes and --intra-threads left to their defaults. Else one process.
    """
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        size = sum(f.stat().st_size for f in Path(args.bundle).iterdir() if f.is_file())
    except OSError:  # the load names what is wrong with the bundle
        return 1, "the bundle could not be read"
    if args.batching != "continuous" or args.lanes != 1 or args.intra_threads not in (0, 1):
        return 1, "--batching request, --lanes or --intra-threads above 1 given"
    if size > AUTO_PROCESSES_MAX_MB << 20:
        return 1, f"the bundle is {size / (1 << 20):.0f} MB, above {AUTO_PROCESSES_MAX_MB} MB"
    if cuda is None and args.device == "auto":
        from seq2onnx.runtime.devices import cuda_usable  # here: onnxruntime's import only when it decides

        cuda = cuda_usable()[0]
    if args.device == "cuda" or args.device == "auto" and cuda:
        return 1, "the graphs run on CUDA"
    if cores < 2:
        return 1, "one core"
    return cores, f"one per core, each with --intra-threads 1, for a {size / (1 << 20):.1f} MB bundle"


def _check(args) -> None:
    """Raises CommandError for an option out of its range (before the bundle is loaded)."""
    if not 0 <= args.port <= 65535:
        raise CommandError(f"--port {args.port}: give 1..65535, or 0 for a free port")
    if args.processes != "auto" and args.processes < 1:
        raise CommandError(f"--processes {args.processes}: give an int >= 1 (server processes on the port)")
    if args.lanes < 1:
        raise CommandError(f"--lanes {args.lanes}: give an int >= 1 (schedulers over the same sessions)")
    if args.workers < 1:
        raise CommandError(f"--workers {args.workers}: give an int >= 1 (requests decoded at once)")
    for option, _, _ in LIMITS:
        value = getattr(args, option[2:].replace("-", "_"))
        if value is not None and value < 1:  # None: the default comes later (_resolve_defaults)
            raise CommandError(f"{option} {value}: give an int >= 1")
    for option in ("--timeout", "--read-timeout", "--keep-alive", "--liveness-seconds", "--send-timeout"):
        value = getattr(args, option[2:].replace("-", "_"))
        if not 0 < value < math.inf:
            raise CommandError(f"{option} {value}: give a number of seconds > 0")
    if args.max_rows_in_flight is not None and args.max_rows_in_flight < args.max_rows:
        raise CommandError(
            f"--max-rows-in-flight {args.max_rows_in_flight} is below --max-rows "
            f"{args.max_rows}: a request of that many rows could never be answered; give at "
            "least --max-rows"
        )
    if not 0 <= args.drain_seconds < math.inf:
        raise CommandError(f"--drain-seconds {args.drain_seconds}: give a number of seconds >= 0")
    serve_dropin.check(args)


def _engine(args, translator):
    if args.batching == "request":
        from seq2onnx.serve.engine import RequestEngine

        return RequestEngine(translator, workers=args.workers, max_rows=args.max_rows)
    from seq2onnx.runtime.rounds import NoServingDecoder
    from seq2onnx.serve.batcher import ContinuousEngine

    try:
        return ContinuousEngine(
            translator, max_rows=args.max_rows, decoder=args.rounds, lanes=args.lanes, solo=args.solo
        )
    except (NoServingDecoder, ValueError) as e:  # ValueError: --rounds fused where it cannot run
        raise CommandError(str(e)) from None


def _resolve_defaults(args) -> None:
    """Once the options are checked: --processes auto becomes a number (auto_processes), said on stderr,
    several processes getting one thread each; then --max-rows-in-flight's default, shared among them."""
    if args.processes == "auto":
        args.processes, why = auto_processes(args)
        print(f"seq2onnx serve: --processes auto: {args.processes} ({why})", file=sys.stderr, flush=True)
        if args.processes > 1:
            args.intra_threads = 1
    if args.max_rows_in_flight is None:
        from seq2onnx.serve.memory import rows_in_flight_default

        args.max_rows_in_flight = rows_in_flight_default(args.max_rows, args.processes)


def run(args) -> int:
    """`seq2onnx serve`: loads the bundle, starts the engine and serves until SIGTERM or Ctrl-C."""
    _check(args)
    _resolve_defaults(args)
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise CommandError(
            f"`seq2onnx serve` needs {e.name}, which this install lacks: pip install "
            "'seq2onnx[serve,cpu]' (or 'seq2onnx[serve,gpu]' on a CUDA machine)"
        ) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s seq2onnx serve: %(message)s")
    options = dict(
        host=args.host,
        port=args.port,
        drain_s=args.drain_seconds,
        max_connections=args.max_connections,
        read_timeout_s=args.read_timeout,
        max_header_bytes=args.max_header_bytes,
        keep_alive_s=args.keep_alive,
        send_timeout_s=args.send_timeout,
    )
    if args.processes > 1:
        from seq2onnx.serve.processes import serve_processes

        return serve_processes(
            functools.partial(make_app, args), args.processes, liveness_s=args.liveness_seconds, **options
        )
    from seq2onnx.serve.server import serve

    return serve(make_app(args), **options)


def make_app(args):
    """The app `seq2onnx serve` serves: the bundle's Translator, the engine of --batching, the front end.
    Called once per process (serve/processes.py calls it in each of --processes)."""
    from seq2onnx.runtime.translator import Translator
    from seq2onnx.serve.app import create_app

    translator = Translator(
        args.bundle, device=args.device, intra_threads=args.intra_threads, cache_dir=args.cache_dir
    )
    engine = _engine(args, translator)
    try:
        app = create_app(
            engine,
            max_queue=args.max_queue,
            max_texts=args.max_texts,
            max_chars=args.max_chars,
            max_body_bytes=args.max_body_bytes,
            timeout_s=args.timeout,
            read_timeout_s=args.read_timeout,
            max_rows_in_flight=args.max_rows_in_flight,
        )
        serve_dropin.mount(app, args, functools.partial(_engine, args))  # DeepL, LibreTranslate, keys
        return app
    except BaseException:
        engine.close()
        raise
