"""A minimal keep-alive HTTP/1.1 client on asyncio streams: the load generator of scripts/soak.py --serve.

httpx's AsyncClient spends ~5 ms of CPU per request in Python (h11, anyio, its pool): at 128 clients the
load generator, which shares the server's 2 cores, capped every server at ~80-190 requests/s (measured:
the server's queue held 2-34 requests while 128 clients were "sending"). This client writes the request
and reads the answer by its Content-Length, nothing else: a small fraction of that cost, the same for
every server measured.
"""

from __future__ import annotations

import asyncio
import json


class HTTPError(Exception):
    """The connection failed or the answer was not HTTP/1.1 as expected (the class name is what is
    counted)."""


class Connection:
    """One keep-alive connection to host:port, reopened after an error.

    Args:
        host, port: the server.
    """

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post_json(self, path: str, payload: dict, timeout: float) -> tuple[int, dict | None]:
        """POSTs `payload` as JSON; returns (status, the answer's JSON or None when it is not JSON).

        Raises:
            HTTPError: a broken connection or a malformed answer; asyncio.TimeoutError past `timeout`.
        """
        try:
            return await asyncio.wait_for(self._post(path, json.dumps(payload).encode()), timeout)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            self.close()
            raise HTTPError(f"{type(e).__name__}: {e}") from e
        except asyncio.TimeoutError:
            self.close()
            raise

    async def _post(self, path: str, body: bytes) -> tuple[int, dict | None]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        self._writer.write(
            b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (path.encode(), self.host.encode(), self.port, len(body), body)
        )
        await self._writer.drain()
        head = (await self._reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        status = int(head.split(" ", 2)[1])
        length = next(
            (int(line.split(":", 1)[1]) for line in head.split("\r\n") if line.startswith("content-length:")),
            None,
        )
        if length is None:
            raise ValueError("an answer without Content-Length")
        data = await self._reader.readexactly(length)
        if "connection: close" in head:
            self.close()
        try:
            return status, json.loads(data)
        except ValueError:
            return status, None

    def close(self) -> None:
        """Closes the connection (the next request opens another)."""
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
