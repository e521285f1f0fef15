"""Runs an app of serve/app.py's create_app under uvicorn until SIGTERM or SIGINT, then drains and stops.

Shutdown, one log line per phase:
1. the signal: the front end drains at once (/ready and new POSTs answer 503 with Retry-After);
2. uvicorn closes its listening socket (new connections are refused) and its idle keep-alive connections;
3. the requests in flight are answered, for at most `drain_s` seconds (then uvicorn cancels them, and the
   front end cancels their jobs);
4. the engine is closed (its threads end once every submitted job is answered), and serve() returns 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time

import uvicorn

from seq2onnx.errors import CommandError
from seq2onnx.serve.connection import limited_protocol

log = logging.getLogger("seq2onnx.serve")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
BACKLOG = 2048  # uvicorn's default: connections the kernel queues before they are accepted
FD_SPARE = 64  # descriptors besides the connections: the bundle's files, the log, onnxruntime, the listener


class _Server(uvicorn.Server):
    """uvicorn's server, with the front end's drain at the signal and a line at each phase of the shutdown."""

    def __init__(
        self, config: uvicorn.Config, frontend, listening: str, drain_s: float, on_listening, heartbeat=None
    ):
        super().__init__(config)
        self.frontend, self.listening, self.drain_s = frontend, listening, drain_s
        self.on_listening, self.heartbeat = on_listening, heartbeat
        self.signal_name = "stop"

    def handle_exit(self, sig: int, frame) -> None:
        # In the signal handler: only flags here (logging waits for shutdown()). The drain starts now, not at
        # uvicorn's next tick (0.1 s later), so that a request arriving in between is refused, not half
        # served.
        self.frontend.drain()
        self.signal_name = signal.Signals(sig).name
        super().handle_exit(sig, frame)

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:  # listening now: the line that scripts and tests wait for
            self.on_listening(self.listening)
            if self.heartbeat is not None:  # kept referenced: a task only the loop holds may be collected
                self._beating = asyncio.get_running_loop().create_task(self._beat(*self.heartbeat))

    async def _beat(self, send, period_s: float) -> None:
        """Calls send() every period_s from the event loop (serve/processes.py's liveness check): it stops
        when the loop does, whatever stopped it."""
        while not self.should_exit:
            send()
            await asyncio.sleep(period_s)

    async def shutdown(self, sockets=None) -> None:
        started = time.monotonic()
        log.info(
            "%s: draining: %d requests in flight, new connections refused, at most %g s (--drain-seconds)",
            self.signal_name,
            self.frontend.inflight,
            self.drain_s,
        )
        await super().shutdown(sockets)
        left = self.frontend.inflight
        log.info(
            "drained in %.1f s: %s",
            time.monotonic() - started,
            f"{left} requests cancelled at the drain limit" if left else "every request answered",
        )


def _print(line: str) -> None:
    print(line, flush=True)


def url_of(sock: socket.socket) -> str:
    """http://HOST:PORT of a bound socket (IPv6 hosts bracketed)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}"


def _bind(host: str, port: int) -> socket.socket:
    """A listening-ready socket on (host, port); port 0 picks a free one (read it with getsockname)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:
        raise CommandError(
            f"--host {host}: not an address of this machine ({e}); give an IP address or a host name "
            "such as 127.0.0.1 or 0.0.0.0"
        ) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart may reuse a port in TIME_WAIT
        sock.bind((host, port))
        # Listen now: with SO_REUSEADDR two processes may both bind a port that neither listens on yet, and
        # only listen() tells the second that the first has it (else it says "listening" and hears nothing).
        sock.listen(BACKLOG)
    except OSError as e:
        sock.close()
        raise CommandError(
            f"--host {host} --port {port}: cannot listen there ({e.strerror}): choose another --port "
            "(0 picks a free one) or --host"
        ) from None
    return sock


def _descriptors(max_connections: int) -> None:
    """Raises the soft limit on open files to fit max_connections (up to the hard limit), or refuses."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = max_connections + FD_SPARE
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise CommandError(
                f"--max-connections {max_connections} needs {needed} open files; this process "
                f"may open {hard} (ulimit -Hn): lower --max-connections or raise the limit"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def serve(
    app,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    drain_s: float = 25.0,
    log_level: str = "info",
    max_connections: int = 512,
    read_timeout_s: float = 10.0,
    max_header_bytes: int = 65536,
    keep_alive_s: float = 5.0,
    send_timeout_s: float = 30.0,
    sock: socket.socket | None = None,
    on_listening=None,
    processes: int = 1,
    shared: socket.socket | None = None,
    heartbeat=None,
) -> int:
    """Serves `app` (from create_app) on host:port until SIGTERM or SIGINT, then drains and closes its engine.

    Prints one line once listening: "seq2onnx serve: listening on http://HOST:PORT (batching B, bundle PATH)"
    (continuous batching adds its rounds' graph: "batching continuous, fused rounds"; several processes add
    "N processes").
    The app's engine is closed whenever serve returns or raises (after a bad drain_s, the caller still owns
    it).

    Args:
        app: the FastAPI app of seq2onnx.serve.app.create_app (app.state.frontend holds its engine).
        host: the address to listen on.
        port: the port; 0 picks a free one (the line above names it).
        drain_s: seconds the requests in flight get to finish after the signal (uvicorn's
            timeout_graceful_shutdown).
        log_level: uvicorn's log level.
        max_connections, read_timeout_s, max_header_bytes, keep_alive_s, send_timeout_s: each
            connection's limits (_uvicorn_config says each).
        sock: a listening socket to serve on instead of binding host:port (serve/processes.py binds one for
            all its processes; it names the URL and is closed on return).
        on_listening: called with the line instead of printing it (serve/processes.py prints it once every
            process listens).
        processes: how many processes serve this port (the line says so when more than one).
        shared: a second listening socket to accept from (serve/processes.py's group socket, which the
            parent holds; closed on return).
        heartbeat: (send, period_s): send() is called every period_s seconds from the event loop once
            listening (serve/processes.py's liveness check).
    Returns:
        0 once stopped (the exit status of `seq2onnx serve`).
    Raises:
        CommandError: host:port cannot be listened on (the message names them and the fix), or the file
            descriptor limit is too low for max_connections.
        ValueError: drain_s is not a number >= 0.
    """
    if isinstance(drain_s, bool) or not isinstance(drain_s, (int, float)) or not 0 <= drain_s < float("inf"):
        raise ValueError(f"drain_s={drain_s!r}: give a finite number of seconds >= 0")
    frontend = app.state.frontend
    sock = _socket(frontend.engine, host, port, max_connections, sock)
    listening = f"seq2onnx serve: listening on {url_of(sock)} ({_how(frontend.engine, processes)})"
    limits = (max_connections, read_timeout_s, max_header_bytes, keep_alive_s, send_timeout_s)
    config = _uvicorn_config(app, log_level, drain_s, *limits)
    server = _Server(config, frontend, listening, drain_s, on_listening or _print, heartbeat)
    return _run(app, server, sock, shared)


def _socket(engine, host: str, port: int, max_connections: int, sock: socket.socket | None) -> socket.socket:
    """The listening socket: `sock`, or host:port bound, with the open-files limit raised for
    max_connections; on an error the engine is closed (its threads would keep the process alive)."""
    try:
        _descriptors(max_connections)
        return _bind(host, port) if sock is None else sock
    except BaseException:
        engine.close()
        raise


def _how(engine, processes: int) -> str:
    """The listening line's parenthesis: batching (continuous: its rounds' graph), processes, bundle."""
    bundle = getattr(getattr(engine, "translator", None), "bundle", None)
    where = getattr(bundle, "path", "?")
    rounds = f", {engine.rounds} rounds" if getattr(engine, "rounds", None) else ""
    many = f", {processes} processes" if processes > 1 else ""
    return f"batching {engine.batching}{rounds}{many}, bundle {where}"


def _uvicorn_config(
    app,
    log_level: str,
    drain_s: float,
    max_connections: int,
    read_timeout_s: float,
    max_header_bytes: int,
    keep_alive_s: float,
    send_timeout_s: float,
) -> uvicorn.Config:
    """uvicorn's configuration, with the connection limits.

    Args:
        max_connections: open connections at most; beyond, a new one is answered 503 and closed at once.
        read_timeout_s: seconds a request's line and headers may take to arrive (408 and closed beyond; the
            body's own limit is the app's).
        max_header_bytes: bytes of a request's line and headers at most (431 and closed beyond).
        keep_alive_s: seconds an idle kept-alive connection stays open (uvicorn's timeout_keep_alive).
        send_timeout_s: seconds a connection whose client reads none of its answers is kept (the server's
            writes to it paused) before it is dropped (serve/connection.py).
    """
    # lifespan off: the engine exists before the app and is closed after uvicorn (below), not by the app
    # h11, not httptools: only uvicorn's h11 protocol bounds the headers (h11_max_incomplete_event_size);
    # serve/connection.py adds the head's read timeout and the connection cap that uvicorn lacks.
    protocol = limited_protocol(
        read_timeout_s=read_timeout_s,
        max_connections=max_connections,
        max_header_bytes=max_header_bytes,
        send_timeout_s=send_timeout_s,
    )
    return uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="off",
        http=protocol,
        timeout_graceful_shutdown=drain_s,
        timeout_keep_alive=keep_alive_s,
        h11_max_incomplete_event_size=max_header_bytes,
        backlog=BACKLOG,
    )


def _run(app, server, sock: socket.socket, shared: socket.socket | None) -> int:
    """Runs the server until it has drained; then closes the sockets, the engine and the drop-in APIs'
    other bundles."""
    engine = app.state.frontend.engine
    # uvicorn raises the signal it caught again once it has stopped, so that the process dies of it; this
    # process exits 0 instead: while it serves, its own handlers for those signals do nothing (uvicorn's
    # replace them until it stops, then these take that second signal).
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in STOP_SIGNALS} if main else {}
    try:
        server.run(sockets=[sock] if shared is None else [sock, shared])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
        if shared is not None:
            shared.close()
        log.info("closing the engine (batching %s)", engine.batching)
        engine.close()
        for other in getattr(app.state, "also_close", ()):  # the drop-in APIs' other bundles (--route)
            other.close()
        log.info("stopped")
    return 0
