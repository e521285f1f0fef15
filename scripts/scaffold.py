"""What the serving benchmarks share (serve_load.py, serve_wrk.py, serve_identity.py, soak.py): the Tatoeba
sentences, a server process on 127.0.0.1 awaited until it translates, latency percentiles, the output folder
and progress lines."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = HERE.parents[1] / "shared" / "data" / "tatoeba-cmn-eng" / "cmn.txt"
PATH = "/v1/translate"


def log(message: str) -> None:
    """A progress line on stderr."""
    print(f"[{Path(sys.argv[0]).stem} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def beam_label(beam: int) -> str:
    return "greedy" if beam == 1 else f"beam{beam}"


def read_sentences(path: Path, col: int, n: int, seed: int = 0) -> list[str]:
    """Returns n distinct non-empty texts of column `col` of a TSV (Tatoeba's format), shuffled with `seed`.

    Raises:
        ValueError: the file is missing, a line lacks the column, or it has fewer than n texts (naming the
            fix).
    """
    if not path.is_file():
        raise ValueError(f"{path} does not exist: pass --data with a TSV of sentences (Tatoeba's cmn.txt)")
    seen: dict[str, None] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), 1):
        fields = line.split("\t")
        if len(fields) <= col and line.strip():  # blank lines are skipped
            raise ValueError(
                f"{path}:{number} has {len(fields)} columns, --src-col is {col}: choose 0..{len(fields) - 1}"
            )
        if line.strip() and fields[col].strip():
            seen.setdefault(fields[col].strip(), None)
    texts = list(seen)
    if len(texts) < n:
        raise ValueError(
            f"{path} has {len(texts)} distinct texts in column {col}, {n} asked: lower --sentences"
        )
    random.Random(seed).shuffle(texts)
    return texts[:n]


def free_port() -> int:
    """A port free on 127.0.0.1 now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on 127.0.0.1: started, awaited until it translates, always stopped (context manager).

    Args:
        argv: the command without --port.
        log_path: where its stdout and stderr go.
        probe: a text to translate (greedy) to tell that it is ready.
        start_timeout: seconds it may take to answer the probe.
    """

    def __init__(self, argv: list[str], log_path: Path, probe: str, start_timeout: float = 180.0):
        self.argv, self.log_path, self.probe, self.start_timeout = argv, log_path, probe, start_timeout
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> "Server":
        import httpx

        port = free_port()
        self.url = f"http://127.0.0.1:{port}{PATH}"
        self._log = open(self.log_path, "wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            self.argv + ["--port", str(port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        try:
            deadline = time.monotonic() + self.start_timeout
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"server exited with code {self.proc.returncode} before answering: "
                        f"{' '.join(self.argv)}\n{self.log_tail()}"
                    )
                try:
                    r = httpx.post(self.url, json={"texts": [self.probe], "beam_size": 1}, timeout=30)
                    # and every process listens (serve --processes prints the line once all of them do)
                    if r.status_code == 200 and "listening on" in self.log_path.read_text(errors="replace"):
                        return self
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"server did not answer within {self.start_timeout:.0f} s (--start-timeout): "
                        f"{' '.join(self.argv)}\n{self.log_tail()}"
                    )
                time.sleep(0.25)
        except BaseException:
            self.stop()
            raise

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to its process group, SIGKILL after `grace` seconds (idempotent)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            except ProcessLookupError:
                pass
        if not self._log.closed:
            self._log.close()

    def __exit__(self, *exc) -> None:
        self.stop()


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None}
    p = np.percentile(np.array(values) * 1000, [50, 95, 99])
    return {"p50_ms": float(p[0]), "p95_ms": float(p[1]), "p99_ms": float(p[2])}


def prepare_out(out: Path, force: bool) -> None:
    """Creates --out (and out/logs); refuses a non-empty one without force.

    Raises:
        ValueError: out exists, is not empty and force is False.
    """
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise ValueError(
            f"{out} exists and is not empty: choose another --out or pass --force to write over it"
        )
    (out / "logs").mkdir(parents=True, exist_ok=True)


def terminate(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through every `finally`: the servers are stopped
