"""The HTTP front end of `seq2onnx serve`: FastAPI endpoints over an Engine (serve/engine.py);
docs/serving.md.

Admission is decided before an engine sees a request (serve/admission.py): a bounded queue (503 +
Retry-After), limits on body bytes, texts and characters (413), a deadline (504; the job is cancelled, as
when the client leaves).
Every error is JSON {"error": message, "field": name or null} (serve/errors.py); an accepted request gets
exactly one answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from seq2onnx.runtime.model_options import check_prefix_options
from seq2onnx.serve.admission import CLIENT_LEFT, Admission
from seq2onnx.serve.checks import contradiction
from seq2onnx.serve.engine import Cancelled, Engine, Job
from seq2onnx.serve.errors import engine_error, error, invalid
from seq2onnx.serve.frontend import STREAM, TRANSLATE, Frontend
from seq2onnx.serve.memory import RowGate
from seq2onnx.serve.schemas import ERRORS, ErrorResponse, StreamRequest, TranslateRequest, TranslateResponse
from seq2onnx.serve.stream import Stream, lines, pump, soon

# -- checking a request --------------------------------------------------------------------------


def _checked(f: Frontend, texts: list[str], field: str, options: dict, model: type[BaseModel]):
    """The request's SearchOptions; or the answer refusing it (413 over a limit, 422 a bad option value)."""
    if (over := f.over_limit(texts, field)) is not None:
        return error(*over)
    try:
        search = f.engine.check(options, len(texts))
        # Languages and prefixes against the model now, as the CLI does: a bad one is refused before it is
        # queued, as an OptionError that names its field.
        t = f.engine.translator
        check_prefix_options(
            search, len(texts), t.vocabulary.languages, t.tgt_vocab, t.eos_id, max_positions=t.max_positions
        )
        return search
    except Exception as e:  # ValueError, TypeError: 422; anything else is the engine's failure (500)
        return engine_error(e, model)


# -- waiting for an engine -------------------------------------------------------------------------


async def _wait(f: Frontend, waited: asyncio.Future, request: Request, job: Job) -> JSONResponse | None:
    """Waits for `waited`: None once it is done; else cancels the job and returns the answer (504, or 499
    for a client that left). A wait cancelled by the server's drain limit cancels the job too."""
    loop, outcome = asyncio.get_running_loop(), "shutdown"

    # the only reader of receive() now (the body was read before); a broken receive: gone too
    async def left():
        with contextlib.suppress(Exception):
            while (await request.receive())["type"] != "http.disconnect":
                pass

    listener = asyncio.ensure_future(left())
    try:
        timeout = max(0.0, request.scope["seq2onnx.deadline"] - loop.time())
        await asyncio.wait({waited, listener}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        outcome = "done" if waited.done() else "disconnect" if listener.done() else "timeout"
    finally:
        listener.cancel()
        if outcome != "done":
            waited.cancel()
            job.cancel()
            f.cancelled.labels(outcome).inc()
    return (
        None
        if outcome == "done"
        else error(504, f.too_slow)
        if outcome == "timeout"
        else error(CLIENT_LEFT, "the client left")
    )


def _bridge(job: Job) -> asyncio.Future:
    """An asyncio future done with job.future; cancelling it never cancels the engine's (read the result
    there)."""
    done = (loop := asyncio.get_running_loop()).create_future()
    job.future.add_done_callback(lambda _: soon(loop, lambda: done.done() or done.set_result(None)))
    return done


# -- the app ---------------------------------------------------------------------------------------


def create_app(
    engine: Engine,
    *,
    max_queue: int = 256,
    max_texts: int = 64,
    max_chars: int = 10000,
    max_body_bytes: int = 1 << 20,
    timeout_s: float = 60.0,
    read_timeout_s: float = 10.0,
    registry: CollectorRegistry | None = None,
    max_rows_in_flight: int = 1 << 30,
) -> FastAPI:
    """Makes the ASGI app that serves `engine`: POST /v1/translate and /v1/translate/stream, GET /health,
    /ready, /metrics.

    Args:
        engine: the Engine (serve/engine.py) to drive; serve/server.py closes it after draining.
        max_queue: requests accepted and not yet answered, at most; beyond: 503 with Retry-After.
        max_texts: texts per request, at most (413 beyond).
        max_chars: characters per request, all texts together (413 beyond).
        max_body_bytes: request body bytes, at most (413 beyond; checked on Content-Length and while
            reading).
        timeout_s: seconds from a request's arrival to its answer; then 504 and the job is cancelled.
        read_timeout_s: seconds a request's body may take to arrive after its headers; then 408, and the
            connection closes.
        registry: the prometheus_client registry of /metrics; None: a new one for this app (never the global
            one, so that several apps can live in one process).
        max_rows_in_flight: decoder rows (texts x beams, or x samples) of POST /v1/translate requests
            being answered, all together, at most; beyond, a request waits in line for rows
            (`--max-rows-in-flight`; serve/memory.py RowGate).
    Returns:
        The FastAPI app; app.state.frontend is its Frontend (the engine, the queue's depth, drain()).
    Raises:
        ValueError: a limit that is not an int >= 1, or a timeout that is not a finite number > 0.
    """
    limits = dict(
        max_queue=max_queue, max_texts=max_texts, max_chars=max_chars, max_body_bytes=max_body_bytes
    )
    f = _frontend(engine, limits, timeout_s, read_timeout_s, registry, max_rows_in_flight)
    app = FastAPI(
        title="seq2onnx serve", summary="A seq2onnx bundle's Translator over HTTP (docs/serving.md)."
    )
    app.state.frontend = f
    app.add_middleware(Admission, frontend=f)
    _add_error_handlers(app)
    _add_translate(app, f)
    _add_stream(app, f)
    _add_probes(app, f)
    return app


def _frontend(
    engine: Engine,
    limits: dict,
    timeout_s: float,
    read_timeout_s: float,
    registry: CollectorRegistry | None,
    max_rows_in_flight: int,
) -> Frontend:
    """The app's Frontend, its limits and timeouts checked first (_check_limits)."""
    _check_limits(
        {**limits, "max_rows_in_flight": max_rows_in_flight},
        timeout_s=timeout_s,
        read_timeout_s=read_timeout_s,
    )
    f = Frontend(
        engine,
        **limits,
        timeout_s=float(timeout_s),
        read_timeout_s=float(read_timeout_s),
        registry=CollectorRegistry() if registry is None else registry,
    )
    f.rows = RowGate(max_rows_in_flight)  # _take_rows
    return f


def _check_limits(limits: dict, *, timeout_s: float, read_timeout_s: float) -> None:
    """Refuses a limit that is not an int >= 1, or a timeout that is not a finite number > 0.

    Raises:
        ValueError: naming the setting and its value.
    """
    for name, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: give an int >= 1")
    for name, value in (("timeout_s", timeout_s), ("read_timeout_s", read_timeout_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ValueError(f"{name}={value!r}: give a finite number of seconds > 0")


def _add_error_handlers(app: FastAPI) -> None:
    """FastAPI's validation errors and HTTP errors (404, 405, ...) answered as {"error", "field"} JSON."""

    @app.exception_handler(RequestValidationError)
    async def refuse_invalid(request: Request, exc: RequestValidationError):
        model = StreamRequest if request.url.path.endswith(STREAM) else TranslateRequest
        return invalid(list(exc.errors()), model)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        where = ""
        if exc.status_code in (404, 405):
            where = f"no endpoint {request.method} {request.url.path}: /docs lists them"
        return JSONResponse({"error": where or str(exc.detail), "field": None}, exc.status_code, exc.headers)


def _translations(results: list) -> JSONResponse:
    """POST /v1/translate's answer: each text's hypotheses, token ids and scores."""
    return JSONResponse(
        {
            "translations": [
                {  # JSON has no -inf: a non-finite score is null
                    "hypotheses": r.hypotheses,
                    "token_ids": [list(map(int, ids)) for ids in r.token_ids],
                    "scores": None
                    if r.scores is None
                    else [s if math.isfinite(s) else None for s in r.scores],
                }
                for r in results
            ]
        }
    )


def _add_translate(app: FastAPI, f: Frontend) -> None:
    """POST /v1/translate."""
    engine = f.engine

    @app.post(TRANSLATE, response_model=TranslateResponse, responses=ERRORS, summary="Translate texts")
    async def translate(body: TranslateRequest, request: Request):
        """Returns each text's n-best (texts, token ids, and scores with return_scores) in the order given."""
        options = body.model_dump(exclude_unset=True, exclude={"texts"})
        clash = contradiction(options)
        search = error(*clash) if clash else _checked(f, body.texts, "texts", options, TranslateRequest)
        if isinstance(search, Response):
            return search
        # the rows it holds at once, as --max-rows counts them (serve/engine.py Engine.check)
        rows = min(len(body.texts), search.max_batch_size) * (
            search.num_hypotheses if search.sampling else search.beam_size
        )
        if (answer := await _take_rows(f, rows, request)) is not None:
            return answer
        try:
            job = engine.submit(body.texts, search)
            answer = await _wait(f, _bridge(job), request, job)
            if answer is not None:
                return answer
            results = job.future.result()
        except Cancelled:
            return error(
                503, "the engine dropped the request (it is closing): retry on another replica", retry=True
            )
        except Exception as e:
            return engine_error(e, TranslateRequest)
        finally:
            f.rows.give(rows)
        f.texts.inc(len(results))
        f.tokens.inc(sum(len(ids) for r in results for ids in r.token_ids))
        return _translations(results)


_STREAM_EXAMPLE = '{"text": "lo"}\n{"text": " kesari"}\n{"done": true, "text": "lo kesari"}\n'
_STREAM_200 = {
    "content": {"application/x-ndjson": {"example": _STREAM_EXAMPLE}},
    "description": 'NDJSON: a line {"text": piece} per piece, then {"done": true, "text": the whole '
    'translation}; an error after the first piece ends the stream with {"error": message}',
}


async def _take_rows(f: Frontend, rows: int, request: Request) -> Response | None:
    """Waits in line (serve/memory.py RowGate) until a request's decoder rows fit in --max-rows-in-flight; the
    caller gives them back once answered. None once they are held; else the answer: 504 when the request's
    time ran out in line, 499 when its client left, 503 when the rows could never fit. A request's own rows
    are bounded by --max-rows (422); this bounds what all requests hold together, and so memory."""
    if rows > f.rows.limit:
        return error(
            503,
            f"this request needs {rows} rows (texts x beams or samples) at once; the limit "
            f"(--max-rows-in-flight) is {f.rows.limit}: send fewer texts or beams, or raise the limit",
        )
    granted = f.rows.take(rows)
    try:
        return await _wait(f, granted, request, Job())
    except BaseException:  # the drain cut the wait: rows granted meanwhile go back
        if granted.done() and not granted.cancelled():
            f.rows.give(rows)
        raise


def _add_stream(app: FastAPI, f: Frontend) -> None:
    """POST /v1/translate/stream."""
    engine = f.engine

    @app.post(
        STREAM,
        responses={**ERRORS, 200: _STREAM_200},
        summary="Translate one text greedily, piece by piece as each token is decided (NDJSON)",
    )
    async def translate_stream(body: StreamRequest, request: Request):
        """Streams the greedy translation of one text; the pieces join to its translation with beam_size=1."""
        options = {**body.model_dump(exclude_unset=True, exclude={"text"}), "beam_size": 1}
        search = _checked(f, [body.text], "text", options, StreamRequest)
        if isinstance(search, Response):
            return search
        queue = pump(engine, body.text, search, job := Job())
        first = asyncio.ensure_future(queue.get())
        answer = await _wait(f, first, request, job)
        if answer is not None:
            return answer
        if first.result()[0] == "error":  # before any piece: still a plain HTTP error
            return engine_error(first.result()[1], StreamRequest)
        return Stream(lines(f, job, queue, first.result(), request.scope["seq2onnx.deadline"]), job)


def _add_probes(app: FastAPI, f: Frontend) -> None:
    """GET /health, /ready and /metrics."""

    @app.get("/health", summary="The process is alive (200)")
    async def health():
        return {"status": "ok"}

    @app.get(
        "/ready",
        summary="200 while the server takes requests; 503 while it drains",
        responses={503: {"model": ErrorResponse, "description": "draining"}},
    )
    async def ready():
        if f.draining:
            return error(503, "draining: the server is shutting down and takes no new requests")
        return {"ready": True, "batching": f.engine.batching}

    @app.get(
        "/metrics",
        response_class=Response,
        summary="Prometheus metrics (text format): requests, queue depth, load, tokens, latency",
    )
    async def metrics():
        return Response(f.metrics(), media_type=CONTENT_TYPE_LATEST)
