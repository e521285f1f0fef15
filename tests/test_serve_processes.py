"""`seq2onnx serve --processes N` (serve/processes.py): real processes on 127.0.0.1, every wait bounded.

One server of two processes serves the module; the tests that kill or stop processes start their own.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from extras import require

require("fastapi", "serve")
import httpx  # noqa: E402

from helpers import until  # noqa: E402
from serve_process import ServeProcess  # noqa: E402

from seq2onnx.serve.frontend import SHARED_REFRESH_S  # noqa: E402

TRANSLATE = "/v1/translate"
TEXTS = ["the queen sees", "a young mouse eats", "the old king runs", "two birds sing"]


@pytest.fixture(scope="module")
def two(bundle):
    with ServeProcess(bundle, "--processes", "2") as server:
        yield server


def _workers(server: ServeProcess) -> list[int]:
    """The pids of the server processes the parent started (from their log lines), newest last."""
    pids = re.findall(r"seq2onnx serve \[pid (\d+)\]: ", server.log())
    pids += re.findall(r"Started server process \[(\d+)\]", server.log())
    return list(dict.fromkeys(int(p) for p in pids))


def _children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return {int(x) for x in out.split()}


def _post_fresh(url: str, body: dict) -> httpx.Response:
    # a new connection each time: the kernel hands each connection to one of the processes
    with httpx.Client(base_url=url, timeout=30) as c:
        return c.post(TRANSLATE, json=body)


@pytest.mark.slow
def test_two_processes_answer_as_one_translate_batch_and_say_so(two, translator):
    expected = [h[0] for h in (r.hypotheses for r in translator.translate_batch(TEXTS, beam_size=1))]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda t: _post_fresh(two.url, {"texts": [t], "beam_size": 1}), TEXTS * 6))
    assert [a.status_code for a in answers] == [200] * len(answers)
    got = [a.json()["translations"][0]["hypotheses"][0] for a in answers]
    assert got == expected * 6
    pids = _workers(two)
    assert len(pids) == 2 and set(pids) <= _children(two.proc.pid), (pids, two.log())


@pytest.mark.slow
def test_metrics_sum_every_process_whichever_answers_the_scrape(two):
    before = two.metric("seq2onnx_texts_total")
    n = 20
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda t: _post_fresh(two.url, {"texts": [t, t], "beam_size": 1}), TEXTS * 5))

    def scrape() -> str:  # on a fresh connection, so that both processes answer some
        with httpx.Client(base_url=two.url, timeout=30) as c:
            return c.get("/metrics").text

    # A gauge is each process's last-written value, rewritten every SHARED_REFRESH_S (serve/app.py): the
    # process that did not answer the scrape may still show the load's queue for up to that long.
    time.sleep(SHARED_REFRESH_S)
    idle = re.compile(r"^seq2onnx_queue_depth 0\.0$", re.M)
    until(lambda: all(idle.search(scrape()) for _ in range(4)), 10, "the queue depth back to 0")
    # each scrape must read the sums
    for _ in range(12):
        text = scrape()
        found = re.search(r"^seq2onnx_texts_total ([0-9.e+]+)$", text, re.M)
        assert found and float(found.group(1)) == before + 2 * n, text[:2000]
        assert re.search(r'^seq2onnx_engine_info\{batching="continuous"\} 1\.0$', text, re.M)
        assert idle.search(text), text[:2000]


def _established(pid: int, port: int, peers: set[int]) -> int:
    """Connections to `port` from the client ports `peers` that process `pid` holds open (its socket descriptors
    found in /proc/net/tcp*). Counting only the test's own connections: another one (the fixture's kept-alive
    connection, closed when its idle time runs out) must not move the count."""
    inodes = set()
    for name in ("tcp", "tcp6"):
        with open(f"/proc/net/{name}") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, remote = (int(a.rsplit(":", 1)[1], 16) for a in fields[1:3])
                if local == port and remote in peers and fields[3] == "01":  # 01: established
                    inodes.add(fields[9])
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            held += target.startswith("socket:[") and target[8:-1] in inodes
    return held


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT spreads connections on Linux")
def test_the_kernel_spreads_connections_over_the_processes_whichever_is_awake(two):
    port = int(two.url.rsplit(":", 1)[1])
    pids = _workers(two)
    n = 48  # opened at once, as a load generator or a proxy's pool does
    # one process stopped while the connections arrive and the other accepts: the kernel still hands the
    # stopped one its share, waiting in its own socket's queue (a shared socket would give all of them to
    # the process that is awake). The group is three sockets (serve/processes.py): each process's own and
    # the parent's, which both processes accept from, so the stopped one's share is a third.
    os.kill(pids[0], signal.SIGSTOP)
    try:
        socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]
        peers = {s.getsockname()[1] for s in socks}
        time.sleep(0.5)
    finally:
        os.kill(pids[0], signal.SIGCONT)
    try:

        def held():
            out = [_established(pid, port, peers) for pid in pids]
            return out if sum(out) == n else None

        spread = until(held, 10, "every connection accepted")
        # by the kernel's hash the stopped one holds about n/3 (16); fewer than 3 of 48 happens once in about
        # a million runs (binomial, p = 1/3; with 24 connections it was once in ~200, and CI met it)
        assert spread[0] >= 3, spread
        body = b'{"texts": ["the queen sees"]}'
        for s in socks:
            s.sendall(
                b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
        for s in socks:
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        for s in socks:
            s.close()


@pytest.mark.slow
def test_the_listening_line_comes_once_every_process_listens_and_names_them(bundle):
    server = ServeProcess(bundle, "--processes", "2")
    try:
        line = until(lambda: _line(server), 60, "the listening line")
        assert re.search(r"listening on http://127\.0\.0\.1:\d+ \(batching continuous, .*2 processes", line)
        assert len(re.findall(r"Started server process", server.log())) == 2, server.log()
    finally:
        server.stop()


def _line(server: ServeProcess) -> str | None:
    try:
        line = server.lines.get(timeout=0.2)
    except Exception:  # queue.Empty
        if server.proc.poll() is not None:
            raise RuntimeError(server.log()) from None
        return None
    return line if "listening on" in line else None


@pytest.mark.slow
def test_a_process_that_dies_is_replaced_and_sigterm_drains_all_and_exits_0(bundle):
    with ServeProcess(bundle, "--processes", "2") as server:
        first = until(lambda: len(_workers(server)) == 2 and _workers(server), 30, "two workers")
        os.kill(first[0], signal.SIGKILL)
        until(lambda: "exited with code -9 while serving; starting another" in server.log(), 30, "replaced")
        until(lambda: len(_workers(server)) == 3, 60, "the replacement's log line")
        replacement = _workers(server)[-1]
        until(lambda: replacement in _children(server.proc.pid), 10, "the replacement running")
        until(lambda: len(re.findall(r"Started server process", server.log())) == 3, 60, "it listening")
        for _ in range(6):
            assert _post_fresh(server.url, {"texts": ["the queen sees"]}).status_code == 200
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0, server.log()
        log = server.log()
        assert len(re.findall(r"SIGTERM: draining", log)) == 2, log
        assert len(re.findall(r"\]: stopped", log)) == 2, log
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=2).close()


@pytest.mark.slow
def test_while_they_drain_new_connections_are_refused_and_the_request_in_flight_answered(bundle):
    long = "the quick brown fox jumps over the lazy dog again and again " * 3
    # 1,024 rows of >= 100 steps: ~2 s alone on the tests' machine; two of them, one per process or both on
    # one, so that at least one is still decoding when the connection is tried
    slow = {"texts": [long] * 64, "beam_size": 16, "min_decoding_length": 100, "max_decoding_length": 120}
    with ServeProcess(bundle, "--processes", "2", "--drain-seconds", "60", "--max-chars", "20000") as server:
        until(lambda: len(re.findall(r"Started server process", server.log())) == 2, 30, "both listening")
        port = int(server.url.rsplit(":", 1)[1])
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            answers = [pool.submit(_post_fresh, server.url, slow) for _ in range(2)]
            until(lambda: server.metric("seq2onnx_active_rows") > 0, 30, "decoding")
            server.proc.send_signal(signal.SIGTERM)
            until(lambda: len(re.findall(r"SIGTERM: draining", server.log())) == 2, 30, "both draining")
            time.sleep(0.3)  # uvicorn closes its listener at its next tick (0.1 s)
            assert not all(a.done() for a in answers), "the slow requests ended before the check"
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
            assert [a.result(timeout=120).status_code for a in answers] == [200, 200]
        assert server.proc.wait(timeout=60) == 0, server.log()


@pytest.mark.slow
def test_processes_stop_by_themselves_when_the_parent_is_killed(bundle):
    with ServeProcess(bundle, "--processes", "2") as server:
        pids = until(lambda: len(_workers(server)) == 2 and _workers(server), 30, "two workers")
        server.proc.kill()
        server.proc.wait(timeout=10)

        def gone():
            return all(not os.path.exists(f"/proc/{p}") or _zombie(p) for p in pids)

        try:
            until(gone, 40, f"processes {pids} still running after their parent died")
        finally:  # else they would hold the log pipe open and the fixture's close would wait for them
            for p in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.slow
def test_a_process_that_cannot_start_stops_the_command_naming_why(tmp_path):
    bad = tmp_path / "not-a-bundle"
    bad.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "seq2onnx.commands", "serve", str(bad), "--port", "0", "--processes", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "server process" in done.stderr and "could not start" in done.stderr, done.stderr
    assert str(bad) in done.stderr, done.stderr
    assert "listening on" not in done.stdout


def test_processes_below_one_are_refused_naming_the_value(bundle):
    done = subprocess.run(
        [sys.executable, "-m", "seq2onnx.commands", "serve", str(bundle), "--processes", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "--processes 0: give an int >= 1" in done.stderr, done.stderr


# -- --processes auto (the default) --------------------------------------------------------------------


def _options(bundle, **given):
    import argparse

    fields = dict(
        bundle=bundle, batching="continuous", lanes=1, intra_threads=0, device="cpu", processes="auto"
    )
    return argparse.Namespace(**{**fields, **given})


def test_auto_is_one_process_per_core_for_a_small_cpu_bundle_and_one_otherwise(bundle, tmp_path):
    from seq2onnx.commands.serve import AUTO_PROCESSES_MAX_MB, auto_processes

    assert auto_processes(_options(bundle), cores=4)[0] == 4
    assert auto_processes(_options(bundle, intra_threads=1), cores=2)[0] == 2
    assert auto_processes(_options(bundle), cores=1) == (1, "one core")
    for given in (dict(batching="request"), dict(lanes=2), dict(intra_threads=2)):
        assert auto_processes(_options(bundle, **given), cores=4)[0] == 1, given
    assert auto_processes(_options(bundle, device="cuda"), cores=4) == (1, "the graphs run on CUDA")
    assert auto_processes(_options(bundle, device="auto"), cores=4, cuda=True)[0] == 1
    assert auto_processes(_options(bundle, device="auto"), cores=4, cuda=False)[0] == 4
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "weights.bin", "wb") as f:  # sparse: its size on disk is what auto reads
        f.truncate((AUTO_PROCESSES_MAX_MB + 1) << 20)
    processes, why = auto_processes(_options(big), cores=4)
    assert processes == 1 and f"above {AUTO_PROCESSES_MAX_MB} MB" in why, why


@pytest.mark.slow
def test_the_default_serves_with_a_process_per_core_and_says_so(bundle):
    cores = len(os.sched_getaffinity(0))
    with ServeProcess(bundle, "--processes", "auto", "--intra-threads", "0") as server:
        server.listening()
        assert f"--processes auto: {cores} (" in server.log(), server.log()
        if cores > 1:  # the parent and one server process per core
            until(lambda: len(_children(server.proc.pid)) >= cores, 30, f"{cores} server processes")
        r = server.client.post(TRANSLATE, json={"texts": TEXTS[:1], "beam_size": 1})
        assert r.status_code == 200, r.text


def _metrics_folder(root, name: str, *, lock: bool = True, age_s: float = 120.0):
    from seq2onnx.serve import processes

    folder = root / f"{processes.METRICS_PREFIX}{name}"
    folder.mkdir()
    (folder / "counter_1.db").write_bytes(b"\0" * 8)
    if lock:
        (folder / processes.OWNER_LOCK).write_bytes(b"")
        os.utime(folder / processes.OWNER_LOCK, (time.time() - age_s,) * 2)
    return folder


def test_a_killed_parents_metrics_folder_is_removed_and_no_folder_still_owned(tmp_path):
    import fcntl

    from seq2onnx.serve import processes

    dead = _metrics_folder(tmp_path, "dead")
    live = _metrics_folder(tmp_path, "live")
    young = _metrics_folder(tmp_path, "young", age_s=0)  # between its owner's mkdtemp and its lock
    unknown = _metrics_folder(tmp_path, "old", lock=False)  # no lock file: not ours to judge
    (tmp_path / "elsewhere").mkdir()
    elsewhere = _metrics_folder(tmp_path / "elsewhere", "x")  # abandoned-looking, outside the swept names
    link = tmp_path / f"{processes.METRICS_PREFIX}link"
    link.symlink_to(elsewhere, target_is_directory=True)  # a link to it: never followed
    held = os.open(live / processes.OWNER_LOCK, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)  # as a running parent holds it (flock: per open file, so in-process too)
    try:
        assert processes.remove_abandoned(str(tmp_path)) == [str(dead)]
        assert [p.exists() for p in (dead, live, young, unknown, elsewhere)] == [
            False,
            True,
            True,
            True,
            True,
        ]
    finally:
        os.close(held)
    assert processes.remove_abandoned(str(tmp_path)) == [str(live)]  # its owner gone
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [young.name, unknown.name, link.name, "elsewhere"]
    )


@pytest.mark.slow
def test_a_group_holds_its_metrics_folders_lock_and_removes_an_abandoned_one_at_start(tmp_path, monkeypatch):
    from seq2onnx.serve import processes

    monkeypatch.setattr(processes.tempfile, "tempdir", str(tmp_path))
    dead = _metrics_folder(tmp_path, "dead")
    with processes._metrics_dir() as metrics:
        assert not dead.exists() and os.environ[processes.METRICS_DIR] == metrics
        assert os.path.dirname(metrics) == str(tmp_path)
        assert processes.remove_abandoned(str(tmp_path), min_age_s=0) == []  # held by this process
    assert not os.path.exists(metrics) and list(tmp_path.iterdir()) == []
