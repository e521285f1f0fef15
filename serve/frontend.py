"""What an app of serve/app.py's create_app shares between its endpoints, its middleware and serve/server.py:
the engine, the queue's depth, the drain flag, and the Prometheus metrics (summed over the processes of
`--processes`)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily

from seq2onnx.serve.checks import json_checked
from seq2onnx.serve.engine import Engine

TRANSLATE, STREAM = "/v1/translate", "/v1/translate/stream"
# metric labels; others: "other"
ENDPOINTS = (TRANSLATE, STREAM, "/health", "/ready", "/metrics", "/docs", "/openapi.json")
# set by serve/processes.py for its processes: prometheus_client's multiprocess mode, /metrics sums them all
SHARED_METRICS = "PROMETHEUS_MULTIPROC_DIR"
SHARED_REFRESH_S = 1.0  # how often a process writes its gauges (queue depth, load) for the others' scrapes
LOAD_KEYS = ("active_requests", "active_sentences", "active_rows")  # the engine's load(), one gauge each
# A body larger than this is screened (UTF-8, JSON, the text limits) on the front end's screening thread, not
# on the event loop: parsing a megabyte of JSON costs 10-35 ms of CPU, and 16 clients sending such bodies held
# the loop (/health at p50 1.1 s, issue 60 item 7). Smaller ones take well under a millisecond: inline.
SCREEN_INLINE_BYTES = 64 << 10


class _EngineCounters:
    """The engine's own counts as Prometheus counters, read at each scrape (the engine knows no metrics)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    SOLO = (
        "seq2onnx_searches_decoded_alone",
        "searches decoded alone on their request's thread since the start: nothing else was decoding "
        "(--batching continuous without --no-solo)",
    )

    def collect(self):
        yield CounterMetricFamily(*self.SOLO, value=self.engine.solo_searches)


class Frontend:
    """What an app of create_app shares between its endpoints and serve/server.py (app.state.frontend).

    Attributes:
        engine: the Engine served; inflight: requests accepted and not yet answered (the queue's depth);
            draining: set by drain(), then /ready and new POSTs answer 503.
    """

    def __init__(
        self,
        engine: Engine,
        max_queue: int,
        max_texts: int,
        max_chars: int,
        max_body_bytes: int,
        timeout_s: float,
        registry: CollectorRegistry,
        read_timeout_s: float = 10.0,
    ):
        self.engine, self.max_queue, self.max_texts, self.max_chars = engine, max_queue, max_texts, max_chars
        self.max_body_bytes, self.timeout_s, self.registry = max_body_bytes, timeout_s, registry
        self.read_timeout_s = read_timeout_s
        self.inflight, self.draining, r = 0, False, registry
        # POST paths admitted to the queue (body limits, deadline), and /metrics' endpoint labels: the drop-in
        # APIs (serve/dropin.py) add theirs
        self.admitted, self.endpoints = {TRANSLATE, STREAM}, set(ENDPOINTS)
        self.too_slow = (
            f"no answer within {timeout_s:g} s (--timeout); the job was cancelled: send fewer "
            "or shorter texts, or raise --timeout"
        )
        self.requests = Counter(
            "seq2onnx_requests",
            "HTTP requests answered, by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "seq2onnx_request_seconds",
            "time from arrival to the answer's last byte, by endpoint",
            ["endpoint"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.texts = Counter("seq2onnx_texts", "texts translated (a stream counts one)", registry=r)
        self.tokens = Counter(
            "seq2onnx_generated_tokens",
            "target tokens returned (every hypothesis; a stream's pieces); tokens/s = rate()",
            registry=r,
        )
        self.cancelled = Counter(
            "seq2onnx_cancelled_jobs",
            "jobs cancelled by the front end, by reason (disconnect, timeout, shutdown)",
            ["reason"],
            registry=r,
        )
        self.shared = bool(os.environ.get(SHARED_METRICS))
        self._gauges(engine, r)
        info = Gauge(
            "seq2onnx_engine_info", "the engine served", ["batching"], registry=r, multiprocess_mode="max"
        )
        info.labels(engine.batching).set(1)
        if self.shared:  # one exposition summing every process's files, this one's included
            self.exposed = CollectorRegistry()
            multiprocess.MultiProcessCollector(self.exposed)
            threading.Thread(target=self._refresh_forever, daemon=True, name="metrics-refresh").start()
        else:
            self.exposed = r
            ProcessCollector(registry=r)  # process_resident_memory_bytes, process_open_fds: what bounds watch

    def _gauges(self, engine: Engine, r: CollectorRegistry) -> None:
        """The queue's depth, the engine's load and its own counts. One process: read at each scrape. Several
        (serve/processes.py): each process writes its values (refresh()), and a scrape sums the live ones."""
        self.loads = {
            "queue_depth": Gauge(
                "seq2onnx_queue_depth",
                "requests accepted and not yet answered (at most --max-queue in each process)",
                registry=r,
                multiprocess_mode="livesum",
            )
        }
        for key in LOAD_KEYS:
            self.loads[key] = Gauge(
                f"seq2onnx_{key}",
                f"{key.replace('_', ' ')} being decoded now (the engine's load())",
                registry=r,
                multiprocess_mode="livesum",
            )
        if not self.shared:
            self.loads["queue_depth"].set_function(lambda: self.inflight)
            for key in LOAD_KEYS:
                self.loads[key].set_function(lambda key=key: engine.load()[key])
            r.register(_EngineCounters(engine))
            return
        self.solo = Counter(*_EngineCounters.SOLO, registry=r)
        self._solo_seen = 0
        self._refreshing = threading.Lock()  # the refresh thread and a scrape: each solo search counted once

    def refresh(self) -> None:
        """Writes this process's gauges and counts for the shared metrics (several processes only)."""
        with self._refreshing:
            load = self.engine.load()
            self.loads["queue_depth"].set(self.inflight)
            for key in LOAD_KEYS:
                self.loads[key].set(load[key])
            solo = self.engine.solo_searches
            self.solo.inc(solo - self._solo_seen)
            self._solo_seen = solo

    def _refresh_forever(self) -> None:
        while True:
            time.sleep(SHARED_REFRESH_S)
            self.refresh()

    def metrics(self) -> bytes:
        """The Prometheus text of /metrics (every process's sums when several serve)."""
        if self.shared:
            self.refresh()
        return generate_latest(self.exposed)

    def over_limit(self, texts: list, field: str) -> tuple[int, str, str] | None:
        """The 413 (status, message, field) refusing `texts` past --max-texts or --max-chars; None within
        them (only strings count characters: FastAPI refuses the others by name)."""
        chars = sum(len(t) for t in texts if isinstance(t, str))
        for count, what, limit, flag in (
            (len(texts), "texts", self.max_texts, "--max-texts"),
            (chars, "characters", self.max_chars, "--max-chars"),
        ):
            if count > limit:
                return (
                    413,
                    f"{count} {what}; the limit ({flag}) is {limit} per request: split the request "
                    f"or raise {flag}",
                    field,
                )
        return None

    async def screen(self, body: bytes, path: str) -> tuple[int, str, str | None] | None:
        """The refusal (status, message, field) of a POST's whole body before FastAPI parses it: not UTF-8
        (400), serve/checks.py's json_problem, or the native endpoints' texts past their limits (413, from
        the same parse: a refused body is parsed once, never validated); None to admit it.

        A body over SCREEN_INLINE_BYTES is screened on one thread of the front end's (one at a time: at
        most one such parse competes with the event loop for the GIL, and the loop answers meanwhile).
        """
        if len(body) <= SCREEN_INLINE_BYTES:
            return self._screen(body, path)
        if getattr(self, "_screener", None) is None:
            self._screener = ThreadPoolExecutor(1, thread_name_prefix="seq2onnx-screen")
        return await asyncio.get_running_loop().run_in_executor(self._screener, self._screen, body, path)

    def _screen(self, body: bytes, path: str) -> tuple[int, str, str | None] | None:
        try:
            body.decode("utf-8")
        # json.loads would guess another encoding, or fail without saying where
        except UnicodeDecodeError as e:
            return (
                400,
                f"the body is not UTF-8 (byte {e.start}: {body[e.start : e.start + 1]!r}): "
                "send JSON encoded as UTF-8",
                None,
            )
        value, problem = json_checked(body)
        if problem is not None or not isinstance(value, dict):
            return problem
        texts, field = (
            (value.get("texts"), "texts")
            if path == TRANSLATE
            else ([value.get("text")], "text")
            if path == STREAM
            else (None, None)
        )
        return self.over_limit(texts, field) if isinstance(texts, list) else None

    def drain(self) -> None:
        """Refuses new requests (503) from now on; those accepted are still answered."""
        self.draining = True
