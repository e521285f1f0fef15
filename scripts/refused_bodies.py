"""/health's latency while clients send bodies the server refuses (issue 60 item 7), against a quiet server or
clients that translate.

    python scripts/refused_bodies.py BUNDLE [--mode texts|chars|length|chunked|translate|none]
        [--clients 16] [--seconds 8]

Starts `seq2onnx serve BUNDLE --intra-threads 1` (scaffold.Server); --clients threads each send, one
connection per request, for --seconds (after 1 s of start): `texts` ~1 MB of 166,001 short texts (under
--max-body-bytes, refused 413 by --max-texts), `chars` one text of ~1 MB (413 by --max-chars), `length` a
Content-Length over the limit, `chunked` a chunked body over it, `translate` two short texts (200), `none`
nothing. Meanwhile /health is asked every 50 ms on a fresh connection. Prints the answers' statuses, the
server's CPU seconds, and /health's median, p99 and largest latency.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scaffold as sc  # noqa: E402

BODIES = {
    "texts": b'{"texts": [' + b'"abc",' * 166_000 + b'"a"]}',
    "chars": b'{"texts": ["' + b"a" * 999_980 + b'"]}',
    "length": b'{"texts": ["' + b"a" * (1 << 20) + b'"]}',
    "translate": b'{"texts": ["the queen sees", "a young mouse eats"]}',
}


def request(mode: str) -> bytes:
    head = b"POST /v1/translate HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
    if mode == "chunked":
        body = BODIES["length"]
        return head + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    return head + b"Content-Length: %d\r\n\r\n" % len(BODIES[mode]) + BODIES[mode]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle")
    p.add_argument("--mode", default="texts", choices=[*BODIES, "chunked", "none"])
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=8.0)
    a = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    log = Path(tempfile.mkdtemp()) / "server.log"
    with sc.Server(sc.serve_argv(a.bundle, "--intra-threads", 1), log, probe=None) as server:
        port = server.port
        stop, statuses, data = threading.Event(), {}, None if a.mode == "none" else request(a.mode)

        def flood():
            while not stop.is_set():
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                        s.sendall(data)
                        code = s.recv(65536)[9:12].decode(errors="replace") or "closed"
                except OSError as e:
                    code = type(e).__name__
                statuses[code] = statuses.get(code, 0) + 1

        for _ in range(a.clients if data else 0):
            threading.Thread(target=flood, daemon=True).start()
        time.sleep(1.0)
        waits, end = [], time.monotonic() + a.seconds
        while time.monotonic() < end:
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                while s.recv(65536):
                    pass
            waits.append(time.monotonic() - started)
            time.sleep(0.05)
        stop.set()
        stat = open(f"/proc/{server.proc.pid}/stat").read().split()
        cpu = (int(stat[13]) + int(stat[14])) / os.sysconf("SC_CLK_TCK")
    waits.sort()
    p99 = waits[int(0.99 * (len(waits) - 1))]
    print(
        f"mode {a.mode}: answers {statuses}; server CPU {cpu:.1f} s (its start included); /health "
        f"n={len(waits)} median {statistics.median(waits) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
        f"largest {waits[-1] * 1000:.0f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
