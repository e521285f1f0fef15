"""The streaming endpoint's machinery (serve/app.py): an engine's stream on a thread, its NDJSON lines, the
answer.

A stream's pieces come from Engine.stream on a thread of its own (pump) through an asyncio queue; lines turns
them into NDJSON lines; Stream sends them and cancels the job whenever the answer ends early, a client gone
before the first line included (Starlette then never starts the lines' generator, so its own cleanup never
runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading

from fastapi.responses import StreamingResponse

from seq2onnx.serve.engine import Engine, Job

log = logging.getLogger("seq2onnx.serve")


class Stream(StreamingResponse):
    """An NDJSON answer whose job is cancelled when the answer ends, whichever way (a finished job ignores
    it).

    Args:
        lines: the async iterator of NDJSON lines (lines()).
        job: the stream's Job.
    """

    def __init__(self, lines, job: Job):
        super().__init__(lines, media_type="application/x-ndjson")
        self.job = job

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


def soon(loop: asyncio.AbstractEventLoop, call, *args) -> None:
    """Runs call(*args) on the event loop, from an engine's thread; nothing once the loop has closed (nobody
    waits).
    """
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(call, *args)


def pump(engine: Engine, text: str, options, job: Job) -> asyncio.Queue:
    """Runs engine.stream on a thread; ("piece", str)..., then ("done", None) or ("error", exception) come on
    the queue.
    """
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()

    def run():
        try:
            for piece in engine.stream(text, options, job):
                soon(loop, queue.put_nowait, ("piece", piece))
            soon(loop, queue.put_nowait, ("done", None))
        except BaseException as e:  # the stream's answer carries it
            soon(loop, queue.put_nowait, ("error", e))

    threading.Thread(target=run, name="seq2onnx-stream", daemon=True).start()
    return queue


async def lines(f, job: Job, queue: asyncio.Queue, event: tuple, deadline: float):
    """The NDJSON lines of a stream whose first event has come; an early end (the client left) cancels the
    job.

    f is the app's Frontend (serve/app.py: its counters, and too_slow, the timeout's message)."""
    loop, pieces, finished = asyncio.get_running_loop(), [], False
    try:
        while event[0] == "piece":
            pieces.append(event[1])
            yield json.dumps({"text": event[1]}, ensure_ascii=False) + "\n"
            try:
                event = await asyncio.wait_for(queue.get(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                event = ("timeout", None)
        (kind, value), finished = event, True
        if kind == "done":
            f.texts.inc()
            f.tokens.inc(len(pieces))
        elif kind == "timeout":
            job.cancel()
            f.cancelled.labels("timeout").inc()
        elif not isinstance(value, (ValueError, TypeError)):
            log.error("the engine failed mid-stream", exc_info=value)
        last = (
            {"done": True, "text": "".join(pieces)}
            if kind == "done"
            else {"error": f.too_slow}
            if kind == "timeout"
            else {"error": f"{type(value).__name__}: {value}"}
        )
        yield json.dumps(last, ensure_ascii=False) + "\n"
    finally:
        if not finished:  # the client left mid-stream, or the server's drain limit
            job.cancel()
            f.cancelled.labels("disconnect").inc()
