"""The admission of `seq2onnx serve`'s requests (serve/app.py), as ASGI middleware: every answer counted by
endpoint and status; a POST's body read within the byte and time limits, its JSON checked, then admitted to
the bounded queue (503 + Retry-After past it); a job cut by the server's drain answered once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from fastapi.responses import Response

from seq2onnx.serve.errors import RETRY_AFTER_S, error
from seq2onnx.serve.frontend import STREAM, Frontend

log = logging.getLogger("seq2onnx.serve")

# nginx's status for "client closed request": only /metrics sees it, nobody reads the answer
CLIENT_LEFT = 499


class Admission:
    """ASGI middleware: counts every answer by endpoint and status; reads a POST's body within the byte and
    time limits (a body is never buffered past them), checks its JSON, then admits it to the bounded queue."""

    def __init__(self, app, frontend: Frontend):
        self.app, self.frontend = app, frontend

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        # Starlette's paths include a mount's prefix
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        endpoint = path if path in self.frontend.endpoints else "other"
        status: list[int] = []

        async def answer(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        start = time.perf_counter()
        try:
            if scope["method"] == "POST" and path in self.frontend.admitted:
                await self._admit(scope, receive, answer)
            else:
                await self.app(scope, receive, answer)
        except asyncio.CancelledError:
            # uvicorn cancels the requests still in flight at the drain limit: a JSON 503 (retrying elsewhere
            # is safe: the job was cancelled), not its 500 and a traceback per request.
            asyncio.current_task().uncancel()
            await _cut(scope, receive, answer, status, path == STREAM)
        except Exception as e:  # a fault of the server's own code: JSON, one traceback in the log
            log.error("the request failed: %s: %s", type(e).__name__, e, exc_info=e)
            if not status:
                await error(
                    500,
                    f"the server failed ({type(e).__name__}: {e}); the server log has the traceback",
                    close=True,
                )(scope, receive, answer)
        finally:
            self.frontend.requests.labels(endpoint, str(status[0] if status else CLIENT_LEFT)).inc()
            self.frontend.latency.labels(endpoint).observe(time.perf_counter() - start)

    async def _admit(self, scope, receive, send) -> None:
        f, loop = self.frontend, asyncio.get_running_loop()
        scope["seq2onnx.deadline"] = deadline = loop.time() + f.timeout_s
        if f.draining:
            why = "the server is shutting down (draining): send the request to another replica"
            return await error(503, why, retry=True, close=True)(scope, receive, send)
        # The body before the queue: a client that stalls its body holds its connection (--max-connections,
        # for at most --read-timeout), never a queue slot that another request could use.
        body = await self._body(scope, receive, min(deadline, loop.time() + f.read_timeout_s))
        if not isinstance(body, bytes):  # refused (answer it) or the client left (None)
            return None if body is None else await body(scope, receive, send)
        if f.draining or f.inflight >= f.max_queue:
            why = (
                "the server is shutting down (draining): send the request to another replica"
                if f.draining
                else f"the queue is full: {f.inflight} requests accepted and unanswered, the limit "
                f"(--max-queue) is {f.max_queue}: retry after {RETRY_AFTER_S} s or raise --max-queue"
            )
            return await error(503, why, retry=True)(scope, receive, send)
        f.inflight += 1
        try:
            messages = [{"type": "http.request", "body": body, "more_body": False}]

            async def replay():  # the body once, then the client's disconnect when it comes
                return messages.pop() if messages else await receive()

            await self.app(scope, replay, send)
        finally:
            f.inflight -= 1

    async def _body(self, scope, receive, until: float) -> bytes | Response | None:
        """The request's body, by `until` (the loop's time); or the answer refusing it (413, 408, 400, 422);
        or None when the client left."""
        limit, loop, chunks, size = self.frontend.max_body_bytes, asyncio.get_running_loop(), [], 0
        length = dict(scope["headers"]).get(b"content-length", b"")
        over = f"the body has {int(length)} bytes" if length.isdigit() and int(length) > limit else None
        while over is None:
            try:
                message = await asyncio.wait_for(receive(), until - loop.time())
            except asyncio.TimeoutError:
                f = self.frontend
                return error(
                    408,
                    f"the body did not arrive in time ({f.read_timeout_s:g} s after the "
                    f"headers, --read-timeout; {f.timeout_s:g} s after the arrival, "
                    "--timeout): send it at once",
                    close=True,
                )
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                over = f"the body has more than {limit} bytes"
            elif not message.get("more_body", False):
                break
        if over is not None:
            return error(
                413,
                f"{over}; the limit (--max-body-bytes) is {limit}: send fewer or shorter texts "
                "per request, or raise --max-body-bytes",
                close=True,
            )
        body = b"".join(chunks)
        # UTF-8, JSON and the texts' limits, off the event loop for a large body (Frontend.screen)
        problem = await self.frontend.screen(body, scope["path"].removeprefix(scope.get("root_path", "")))
        return body if problem is None else error(*problem)


async def _cut(scope, receive, send, status: list[int], stream: bool) -> None:
    """Answers a request cut by the drain limit: 503 as JSON, or a stream's last line if it has begun."""
    message = (
        "the server stopped before answering (the drain limit, --drain-seconds, passed): the job was "
        "cancelled; retry on another replica"
    )
    with contextlib.suppress(Exception):
        if not status:
            return await error(503, message, retry=True, close=True)(scope, receive, send)
        end = (json.dumps({"error": message}) + "\n").encode() if stream else b""
        await send({"type": "http.response.body", "body": end, "more_body": False})
