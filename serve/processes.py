"""`seq2onnx serve --processes N`: N server processes on one listening socket, each with its own copy of the
model, its own engine and its own GIL; docs/serving.md.

One Python process serves at most what one core's worth of Python allows: the front end, the planning and
the scheduler share one GIL. Processes share nothing but the socket (the kernel hands each new connection to
one of them) and the metrics.

How the connections are spread: on Linux each process listens on a socket of its own, all bound to the port
with SO_REUSEPORT, and the kernel hands each new connection to one of them by a hash (about evenly). The
parent first checks that the port is free with a plain bind, then holds it with a listening socket of the same
group before it starts anything: the port is listened on from then on, so a second server or group is refused
as a second single server is (a bound socket that does not listen let a second group in, issue 60). Every
process accepts from that socket too, beside its own, so the connections the kernel hands it are answered
(and those that arrive while the processes load wait in its queue). Elsewhere (macOS's
SO_REUSEPORT does not spread connections) the processes accept from one shared socket, and asyncio's accept
loop takes every connection waiting when its process wakes, so connections opened together land mostly on
one process.

The parent (this module's serve_processes) binds the port, starts the processes with multiprocessing's
"spawn" (a fresh interpreter: nothing of the parent's threads or onnxruntime state is inherited), prints the
listening line once all of them listen, and then only watches:
- a process that dies while serving is replaced (one log line); one that fails before it listens stops them
  all, and the error names why;
- a process that stops answering is found by its heartbeat: once listening, each process's event loop sends
  one every HEARTBEAT_S over its pipe; one silent for `liveness_s` (`--liveness-seconds`: stopped, hung,
  its event loop blocked) is logged, killed (SIGKILL) and replaced;
- SIGTERM or SIGINT is passed to every process as SIGTERM: each drains as one `seq2onnx serve` does
  (serve/server.py), and the parent exits 0 once they have;
- if the parent dies, each process notices its pipe closing and drains and exits by itself.

Metrics: prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR, a temporary folder the parent
owns and removes, and which the next group removes if the parent was killed outright): /metrics of any
process answers the sums over all of them (serve/app.py).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection, wait

try:  # an OS without flock (Windows): metrics folders are neither locked nor swept
    import fcntl
except ImportError:
    fcntl = None

from seq2onnx.errors import CommandError
from seq2onnx.serve.server import BACKLOG, STOP_SIGNALS, _bind, _descriptors, serve

log = logging.getLogger("seq2onnx.serve")

METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client reads it when a child imports it
METRICS_PREFIX = "seq2onnx-metrics-"  # the metrics folders' names, under the temporary directory
OWNER_LOCK = ".owner"  # in a metrics folder: locked by the parent that uses it (prometheus reads *.db only)
ABANDONED_AFTER_S = 60.0  # a metrics folder younger than this is never removed as abandoned
EXTRA_S = 15.0  # beyond the drain: the engine's close and the interpreter's exit, before SIGKILL
HEARTBEAT_S = 1.0  # how often a serving process tells the parent that its event loop runs


def serve_processes(
    make_app,
    processes: int,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    drain_s: float = 25.0,
    max_connections: int = 512,
    liveness_s: float = 30.0,
    **serve_options,
) -> int:
    """Serves the app that `make_app()` builds in each of `processes` processes, on one host:port.

    Args:
        make_app: a picklable callable (a module-level function, or functools.partial of one) returning the
            app of serve/app.py's create_app; each process calls it once (it loads the bundle).
        processes: how many processes (>= 1).
        host, port, drain_s, max_connections: as serve/server.py's serve (max_connections and the app's
            limits apply per process).
        liveness_s: seconds a listening process may go without a heartbeat before it is killed and
            replaced.
        **serve_options: serve()'s other keyword arguments, passed to each process.
    Returns:
        0 once every process has drained and exited 0 after SIGTERM or SIGINT; 1 otherwise.
    Raises:
        ValueError: processes < 1.
        CommandError: host:port cannot be listened on, or a process failed before it listened (its error
            is in the message).
    """
    _check_arguments(processes, liveness_s)
    _descriptors(max_connections)
    sock = hold_port(host, port)
    with _metrics_dir():
        options = dict(drain_s=drain_s, max_connections=max_connections, processes=processes, **serve_options)
        group = _Group(make_app, sock, options, liveness_s)
        stop = threading.Event()
        handlers = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in STOP_SIGNALS}
        if hasattr(signal, "SIGHUP"):  # `--api-keys`' reload (serve/keys.py): every process re-reads its file
            handlers[signal.SIGHUP] = signal.signal(signal.SIGHUP, lambda *_: group.forward(signal.SIGHUP))
        try:
            group.start(processes)
            line = group.await_listening(stop)
            kept = True
            if line is not None:
                print(line, flush=True)
                kept = group.watch(stop)
            # this copy of the socket first: once each process has closed its own, the kernel refuses new
            # connections instead of queueing them for nobody (as one server does at its drain)
            sock.close()
            code = group.stop(drain_s + EXTRA_S)
            return code if kept else 1
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            group.kill()
            sock.close()


def _check_arguments(processes: int, liveness_s: float) -> None:
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes={processes!r}: give an int >= 1")
    if not 0 < liveness_s < float("inf"):
        raise ValueError(f"liveness_s={liveness_s!r}: give a number of seconds > 0")


@contextlib.contextmanager
def _metrics_dir():
    """A temporary directory for the processes' metrics files (prometheus_client's multiprocess mode),
    named in METRICS_DIR before the spawns (each child's environment is a copy); removed, and the
    variable restored, at the end.

    A parent killed outright (SIGKILL, the OOM killer) runs no `finally`, so the folder would stay: the
    parent holds a lock on its OWNER_LOCK file for as long as it lives, and each group that starts removes
    the folders whose lock is free (remove_abandoned)."""
    remove_abandoned(tempfile.gettempdir())
    metrics = tempfile.mkdtemp(prefix=METRICS_PREFIX)
    owner = _lock_owner(metrics)
    previous = os.environ.get(METRICS_DIR)
    os.environ[METRICS_DIR] = metrics
    try:
        yield metrics
    finally:
        shutil.rmtree(metrics, ignore_errors=True)
        if owner is not None:
            os.close(owner)
        if previous is None:
            os.environ.pop(METRICS_DIR, None)
        else:
            os.environ[METRICS_DIR] = previous


def _lock_owner(folder: str) -> int | None:
    """Creates folder/OWNER_LOCK and holds an exclusive lock on it (released when this process ends, however
    it ends); None where the OS has no flock (the folder is then never taken for abandoned)."""
    if fcntl is None:
        return None
    fd = os.open(os.path.join(folder, OWNER_LOCK), os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def remove_abandoned(root: str, min_age_s: float = ABANDONED_AFTER_S) -> list[str]:
    """Removes the metrics folders under `root` whose owner is gone: named METRICS_PREFIX*, holding an
    OWNER_LOCK that nobody locks (a lock held in another process namespace counts too), older than
    `min_age_s` (a folder whose owner is between mkdtemp and its lock is not taken). Folders without the
    file, links and what another user owns are left alone. Returns the folders removed."""
    removed = []
    for folder in sorted(glob.glob(os.path.join(glob.escape(root), METRICS_PREFIX + "*"))) if fcntl else []:
        try:
            held = os.lstat(folder)
            fd = os.open(os.path.join(folder, OWNER_LOCK), os.O_RDWR | os.O_NOFOLLOW)
        except OSError:  # no lock file (not ours to judge), a link, or not readable by us
            continue
        try:
            mine = stat.S_ISDIR(held.st_mode) and held.st_uid == os.getuid()  # not a link, not another user's
            if not mine or time.time() - os.fstat(fd).st_mtime < min_age_s:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: its owner still runs
        except BlockingIOError:
            continue
        finally:
            os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


class _Worker:
    """One spawned process and the parent's end of its pipe ("listening" or "failed" messages)."""

    def __init__(self, context, make_app, sock, options: dict):
        self.conn, child = context.Pipe(duplex=True)
        self.process = context.Process(target=_child, args=(make_app, sock, options, child), daemon=False)
        self.process.start()
        child.close()  # the child's copy is the only one left: its end closes when the child does
        self.listening: str | None = None
        self.failure: str | None = None
        self.heard = time.monotonic()  # the last message (a heartbeat, once listening)

    def read(self) -> None:
        """Takes what the child has sent: its listening line, its heartbeats or its failure."""
        try:
            while self.conn.poll():
                kind, text = self.conn.recv()
                self.heard = time.monotonic()
                if kind == "listening":
                    self.listening = text
                elif kind == "failed":
                    self.failure = text
        except (EOFError, OSError):
            pass


class _Group:
    def __init__(self, make_app, sock, options: dict, liveness_s: float = 30.0):
        self.context = multiprocessing.get_context("spawn")
        self.make_app, self.sock, self.options, self.liveness_s = make_app, sock, options, liveness_s
        self.workers: list[_Worker] = []

    def start(self, n: int) -> None:
        for _ in range(n):
            self.workers.append(_Worker(self.context, self.make_app, self.sock, self.options))

    def _events(self) -> None:
        # the pipes (messages, or closed at a child's exit) and the processes' sentinels; short waits so
        # that a signal's flag is seen within a quarter of a second
        wait([w.conn for w in self.workers] + [w.process.sentinel for w in self.workers], 0.25)
        for w in self.workers:
            w.read()

    def await_listening(self, stop: threading.Event) -> str | None:
        """The first process's listening line once every process listens; None if stopped first.

        Raises:
            CommandError: a process failed or exited before it listened.
        """
        while not stop.is_set():
            self._events()
            for i, w in enumerate(self.workers):
                if w.failure is not None or (w.listening is None and not w.process.is_alive()):
                    raise CommandError(self._failed(i, w))
            if all(w.listening is not None for w in self.workers):
                return self.workers[0].listening
        return None

    def watch(self, stop: threading.Event) -> bool:
        """Until stop: replaces a process that died while serving. False (logged) if a replacement failed
        to start: the others are then stopped as at a signal."""
        while not stop.is_set():
            self._events()
            for i, w in enumerate(self.workers):
                if w.failure is not None or (w.listening is None and not w.process.is_alive()):
                    log.error("%s; stopping the others", self._failed(i, w))
                    return False
                if w.process.is_alive() and not self._silent(i, w):
                    continue
                w.process.join()
                _forget(w.process.pid)
                log.error(
                    "process %d (pid %d) exited with code %s while serving; starting another",
                    i,
                    w.process.pid,
                    w.process.exitcode,
                )
                self.workers[i] = _Worker(self.context, self.make_app, self.sock, self.options)
        return True

    def _silent(self, i: int, w: _Worker) -> bool:
        """Whether a listening process has sent no heartbeat for liveness_s; if so it is killed (logged)."""
        quiet = time.monotonic() - w.heard
        if w.listening is None or quiet < self.liveness_s:
            return False
        log.error(
            "process %d (pid %d) sent no heartbeat for %.1f s (--liveness-seconds %g): stopped or "
            "hung; killing it",
            i,
            w.process.pid,
            quiet,
            self.liveness_s,
        )
        w.process.kill()  # SIGKILL ends a stopped process too
        return True

    def _failed(self, i: int, w: _Worker) -> str:
        w.process.join(5)
        why = w.failure or f"it exited with code {w.process.exitcode} before listening (its log is above)"
        return f"server process {i} of {len(self.workers)} could not start: {why}"

    def stop(self, timeout_s: float) -> int:
        """SIGTERM to every process, then waits for each (SIGKILL past timeout_s). 0 if all exited 0."""
        for w in self.workers:
            if w.process.is_alive():
                os.kill(w.process.pid, signal.SIGTERM)
        codes = []
        for w in self.workers:
            w.process.join(timeout_s)
            if w.process.is_alive():
                log.error("process pid %d still running %g s after SIGTERM: killed", w.process.pid, timeout_s)
                w.process.kill()
                w.process.join()
            _forget(w.process.pid)
            codes.append(w.process.exitcode)
        return 0 if all(c == 0 for c in codes) else 1

    def forward(self, sig: int) -> None:
        """Sends a signal to every process still running (the parent's SIGHUP: the keys file re-read)."""
        for w in self.workers:
            if w.process.is_alive() and w.process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.process.pid, sig)

    def kill(self) -> None:
        """SIGKILL to any process still running (after an error in the parent)."""
        for w in self.workers:
            if w.process.is_alive():
                w.process.kill()
                w.process.join()


SPREAD = sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def hold_port(host: str, port: int) -> socket.socket:
    """The group's listening socket on host:port, held by the parent from before any process starts.

    A plain bind that listens first (serve/server.py's _bind): it fails where anything else listens on the
    port, or holds it, as a second single server fails. On Linux it is then exchanged for a socket of an
    SO_REUSEPORT group, which listens at once: between the two, a moment without a socket, in which another
    program could take the port (then this one is refused, naming it); never a moment with a socket that
    holds the port without listening, which let a second group join (issue 60).

    Raises:
        CommandError: host:port cannot be listened on.
    """
    sock = _bind(host, port)  # the port is free (else the error names it); port 0 picks one
    return _reuse_port(sock, listen=True) if SPREAD else sock


def _reuse_port(sock: socket.socket, *, listen: bool) -> socket.socket:
    """A socket with SO_REUSEPORT bound where `sock` is (which is closed first when it is not one of the
    group), listening with serve/server.py's backlog if `listen`.

    Raises:
        CommandError: the address could not be bound again (another program took the port meanwhile).
    """
    host, port = sock.getsockname()[:2]
    family, grouped = sock.family, sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
    if not grouped:
        sock.close()
    out = socket.socket(family, socket.SOCK_STREAM)
    try:
        out.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        out.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        out.bind((host, port))
        if listen:
            out.listen(BACKLOG)
    except OSError as e:
        out.close()
        raise CommandError(
            f"--host {host} --port {port}: cannot listen there ({e.strerror}): another program took the "
            "port while the processes started; choose another --port"
        ) from None
    return out


def _forget(pid: int | None) -> None:
    """Drops a dead process's live gauges from the shared metrics (its counters stay in the sums)."""
    if pid is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


def _child(make_app, sock, options: dict, conn: Connection) -> None:
    """A server process: builds the app, serves on the parent's socket, exits with serve()'s status."""
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s seq2onnx serve [pid {os.getpid()}]: %(message)s"
    )
    # While loading, only the parent's SIGTERM stops this process: a terminal's Ctrl-C reaches the whole
    # process group, and the parent passes it on as SIGTERM. Once serving, uvicorn's handlers take both.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_orphaned, args=(conn,), daemon=True, name="parent-watch").start()
    shared = None
    try:
        app = make_app()
        # then a listening socket of this process's own in the parent's group (module docstring): joined once
        # the app is loaded, so that the kernel hands it no connection to wait through the load
        if SPREAD:
            shared, sock = sock, _reuse_port(sock, listen=True)
    except BaseException as e:  # whatever it is, the parent names it and stops
        conn.send(("failed", str(e) or type(e).__name__))
        raise SystemExit(1) from None
    lock = threading.Lock()

    def listening(line: str) -> None:
        with lock:
            conn.send(("listening", line))

    def beat() -> None:
        with lock:
            conn.send(("alive", None))

    raise SystemExit(
        serve(app, sock=sock, shared=shared, on_listening=listening, heartbeat=(beat, HEARTBEAT_S), **options)
    )


def _orphaned(conn: Connection) -> None:
    """Waits for the parent's end of the pipe to close (the parent died), then stops this process."""
    try:
        while True:
            conn.recv()
    except (EOFError, OSError):
        os.kill(os.getpid(), signal.SIGTERM)
