"""uvicorn's h11 connection, with the bounds that uvicorn lacks: a time limit on a request's head, and a cap
on connections that closes those beyond it at once; its framing errors answered as JSON.

uvicorn bounds a request's headers (h11's max_incomplete_event_size: `--max-header-bytes`, which also bounds
the count of header fields) and idle keep-alive connections (timeout_keep_alive: `--keep-alive`). It has no
timeout on reading a request's head (uvicorn issue #157, "--timeout-request-start", open since 2018): a
connection that sends nothing, or half its headers, is held forever. Its limit_concurrency answers 503 only
once a request's head is read, so connections that never send one still pile up until file descriptors
run out. This protocol adds both, as Go's ReadHeaderTimeout and hyper's header_read_timeout do:
- the head must arrive within `read_timeout_s` of the connection's start (its first request) or of its first
  byte (a later request; the idle time before it is timeout_keep_alive's); else 408 and the connection closes;
- beyond `max_connections` open connections, a new one is answered 503 and closed at once (its descriptor
  freed); and once one was refused, every open connection closes after its next answer (`connection:
  close`), so that the slots turn over: a client that holds a connection open with requests it pipelines
  and never reads (its answers fit in the socket buffers, so its writes never pause) holds no slot for
  longer than one answer while others wait; as Envoy's overload action "disable_http_keepalive";
- a client that does not read its answers (it pipelines requests and never reads, or stops reading mid-answer)
  is dropped once the server's writes to it have been paused for `send_timeout_s` (`--send-timeout`): asyncio
  pauses a transport's writes when its buffer passes its high-water mark, after the kernel's send buffer and
  the client's receive buffer are full. uvicorn has no such timeout (its flow control only waits, for ever).
The body's time limit is the front end's (serve/app.py), which can answer it with the request's own JSON
error.
"""

from __future__ import annotations

import json
import math
import re

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

LOG_EVERY_S = 60.0
LINGER_S = 2.0  # how long a refused request's rest is read and dropped before the connection closes
_HEAD_END = re.compile(rb"\n\r?\n")  # h11 ends a head at a blank line, "\r\n" or a bare "\n"
REASONS = {
    400: "Bad Request",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


class _Connection(h11.Connection):
    """h11's server connection, keeping the last framing error (uvicorn's handler drops it)."""

    error: h11.RemoteProtocolError | None = None

    def next_event(self):
        try:
            return super().next_event()
        except h11.RemoteProtocolError as e:
            self.error = e
            raise


def _head_ends(data: bytes, limit: int) -> bool:
    """Whether the head in `data` (a request's first bytes) ends within `limit` bytes."""
    return _HEAD_END.search(data, 0, limit + 3) is not None


def answer(status: int, message: str, retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection: {"error": message, "field": null} as JSON."""
    body = json.dumps({"error": message, "field": None}).encode()
    retry = f"retry-after: {retry_after}\r\n" if retry_after is not None else ""
    return (
        f"HTTP/1.1 {status} {REASONS[status]}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{retry}connection: close\r\n\r\n"
    ).encode() + body


class LimitedH11Protocol(H11Protocol):
    """uvicorn's H11Protocol with a head read timeout and a connection cap; limited_protocol sets its limits.

    Attributes:
        read_timeout_s: seconds a request's head may take to arrive.
        max_connections: open connections at most.
        max_header_bytes: the request line and headers, at most.
        refused: connections refused since the last line that said so, and that line's time (one list
            for every connection of a protocol class).
    """

    read_timeout_s: float
    max_connections: int
    max_header_bytes: int
    send_timeout_s: float
    refused: list
    dropped: list
    turned: list  # [connections refused since the server started]: each connection's answer reads it

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.conn = _Connection(h11.SERVER, self.max_header_bytes)
        self._head_timer = self._lingering = self._send_timer = None
        self._turned_seen = self.turned[0]

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self.refused[0] += 1
            self.turned[0] += 1
            if self.loop.time() - self.refused[1] >= LOG_EVERY_S:  # one line a minute at most, under a flood
                self.logger.warning(
                    "refused %d connections since the last such line: %d open, the limit "
                    "(--max-connections) is %d",
                    self.refused[0],
                    self.max_connections,
                    self.max_connections,
                )
                self.refused[:] = [0, self.loop.time()]
            self._close_with(
                503,
                f"too many connections: {self.max_connections} are open, the limit "
                "(--max-connections): retry after 1 s, or reuse a connection",
                retry_after=1,
                linger=False,
            )  # its descriptor now: the cap is what bounds them
            return
        self._arm()  # the first request's head: from the connection's start

    def data_received(self, data: bytes) -> None:
        if self._lingering is not None:
            return  # answered and closing: the rest is read only to be dropped
        if self.conn.their_state is h11.IDLE:
            if self._head_timer is None:
                self._arm()  # a later request's head: from its first byte
            if len(self.conn.trailing_data[0]) + len(data) > self.max_header_bytes and not _head_ends(
                self.conn.trailing_data[0] + data, self.max_header_bytes
            ):
                # h11 measures only a head still incomplete after a read: one that came whole in a
                # single read of up to 256 KiB would pass
                self.conn.error = h11.RemoteProtocolError("head too long", error_status_hint=431)
                return self.send_400_response("head too long")
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # the head is read (or broken: answered already)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle and self.cycle is not None and self.turned[0] > self._turned_seen:
            # a connection was refused since this one's last answer: this answer is its last, and says so
            # (uvicorn adds `connection: close` to the answer of a request that carries it, then closes)
            self.cycle.keep_alive = False
            self.cycle.scope["headers"].append((b"connection", b"close"))

    def eof_received(self):
        if self._lingering is not None:
            self.transport.close()
        return super().eof_received()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.send_timeout_s, self._not_reading)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _not_reading(self) -> None:
        """The client has read nothing of its answers for send_timeout_s: dropped (it reads none of an
        answer, so none is sent), one log line a minute at most."""
        self._send_timer = None
        self.dropped[0] += 1
        if self.loop.time() - self.dropped[1] >= LOG_EVERY_S:
            self.logger.warning(
                "dropped %d connections since the last such line: each had not read its answers for %g s "
                "(--send-timeout)",
                self.dropped[0],
                self.send_timeout_s,
            )
            self.dropped[:] = [0, self.loop.time()]
        self.transport.abort()  # its unsent answers discarded: close() would wait to send them

    def connection_lost(self, exc) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        self._disarm()
        if self._lingering is not None:
            self._lingering.cancel()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        e = self.conn.error
        if e is not None and e.error_status_hint == 431:
            self._close_with(
                431,
                f"the request's line and headers exceed {self.max_header_bytes} bytes (the limit, "
                "--max-header-bytes): send fewer or shorter headers",
            )
        else:
            self._close_with(
                400,
                f"malformed HTTP/1.1 request ({e if e is not None else msg}): send a valid "
                "request line, headers and body framing",
            )

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.read_timeout_s, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._close_with(
                408,
                f"the request's line and headers did not arrive within {self.read_timeout_s:g} s "
                "(--read-timeout): send them at once",
            )

    def _close_with(
        self, status: int, message: str, retry_after: int | None = None, linger: bool = True
    ) -> None:
        """Answers and closes. Closing a socket with unread input resets it, and the client may lose the
        answer: so, as nginx's lingering_close, the input is read and dropped for at most LINGER_S
        first."""
        self._disarm()
        self._unset_keepalive_if_required()
        if self.transport.is_closing() or self._lingering is not None:
            return
        self.transport.write(answer(status, message, retry_after))
        if linger and self.transport.can_write_eof():
            self.transport.write_eof()
            self._lingering = self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def limited_protocol(
    *, read_timeout_s: float, max_connections: int, max_header_bytes: int, send_timeout_s: float = 30.0
) -> type[H11Protocol]:
    """uvicorn's H11Protocol with a head read timeout and a connection cap (the module docstring).

    Args:
        read_timeout_s: seconds a request's head may take to arrive (`--read-timeout`).
        max_connections: open connections at most (`--max-connections`); beyond: 503 and closed.
        max_header_bytes: the request line and headers, at most (`--max-header-bytes`): h11's limit.
        send_timeout_s: seconds the server's writes to a connection may stay paused (the client reads
            nothing) before it is dropped (`--send-timeout`).
    Returns:
        The protocol class for uvicorn.Config(http=...).
    """
    limits = {
        "read_timeout_s": read_timeout_s,
        "max_connections": max_connections,
        "max_header_bytes": max_header_bytes,
        "send_timeout_s": send_timeout_s,
        "refused": [0, -math.inf],
        "dropped": [0, -math.inf],
        "turned": [0],
    }
    return type("LimitedH11Protocol", (LimitedH11Protocol,), limits)
