"""A real `seq2onnx serve` process for the HTTP tests: started on a free port, waited for within a bound,
always killed (ServeProcess.stop, or leaving its `with`), its log kept for the assertions.

Starting returns at once and listening() waits, so that a test module can start its servers together:
their imports and bundle loads overlap instead of adding up.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tiny import scratch


def server_env() -> dict:
    """A server's environment: one OpenMP thread, unbuffered output, and TMPDIR in the run's own folder
    (removed when the run ends), so that what a server killed outright leaves there (a --processes group's
    metrics folder, multiprocessing's pymp-*) goes with the run."""
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(scratch("serve-tmp")),
    }


def wanted_servers(request, by_fixture: dict) -> set:
    """The servers of a module that this run's selected tests use, so that the module starts those and no
    other (`-m "not slow"` leaves several unused).

    Args:
        request: the module-scoped fixture's request.
        by_fixture: fixture name -> the server's name it hands out; None for a parametrized fixture, whose
            parameter is the server's name.
    """
    names = set()
    for item in request.session.items:
        if item.module is request.module:
            for fixture in item.fixturenames:
                if fixture in by_fixture:
                    names.add(by_fixture[fixture] or item.callspec.params[fixture])
    return names


START_TIMEOUT_S = 60  # importing FastAPI and onnxruntime and loading the bundle, on a busy 2-core machine


class ServeProcess:
    """`python -m seq2onnx.commands serve BUNDLE --port 0 --intra-threads 1 --processes 1 *options` on 127.0.0.1.

    Attributes:
        url, client: http://127.0.0.1:PORT (from the line the command prints once it listens) and an httpx.Client
            on it; both set by listening().
        proc: the subprocess.Popen.
    """

    def __init__(self, bundle: Path, *options: str):
        self._log = tempfile.NamedTemporaryFile(prefix="seq2onnx-serve-", suffix=".log", delete=False)
        env = server_env()
        command = [
            sys.executable,
            "-m",
            "seq2onnx.commands",
            "serve",
            str(bundle),
            "--port",
            "0",
            "--intra-threads",
            "1",
            "--processes",  # one process unless a test asks for more (a later --processes wins)
            "1",
            *options,
        ]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)
        self.lines: queue.Queue = queue.Queue()
        self.url, self.client = None, None
        threading.Thread(target=self._read, daemon=True).start()

    def listening(self) -> ServeProcess:
        """Waits (at most START_TIMEOUT_S) for the line the command prints once it listens; returns self."""
        if self.url is None:
            self.url = self._wait_listening()
            self.client = httpx.Client(base_url=self.url, timeout=30)
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def _wait_listening(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"seq2onnx serve exited with {self.proc.returncode}:\n{self.log()}"
                    ) from None
                continue
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                return found.group(1)
        raise TimeoutError(f"seq2onnx serve did not listen within {START_TIMEOUT_S} s:\n{self.log()}")

    def log(self) -> str:
        """What the process wrote on stderr so far."""
        return Path(self._log.name).read_text(encoding="utf-8", errors="replace")

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample of /metrics (0.0 when the sample is absent, as a counter not yet moved)."""
        text = self.client.get("/metrics").text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        return 0.0

    def wait_metric(self, name: str, test, timeout_s: float = 15.0, **labels: str) -> float:
        """Polls a metric until test(value) holds; returns the value, or raises TimeoutError with the last one."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.metric(name, **labels)
            if test(value):
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}{labels} stayed {value} for {timeout_s} s")
            time.sleep(0.05)

    def stop(self) -> None:
        """Kills the process if it still runs, and removes its log."""
        if self.client is not None:
            self.client.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def __enter__(self) -> ServeProcess:
        try:
            return self.listening()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
