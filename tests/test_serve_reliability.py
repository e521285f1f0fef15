"""Reliability, round 3 (issue 60): real `seq2onnx serve` processes on 127.0.0.1, every wait bounded.

- a bundle's weights.bin rewritten or truncated under a running server changes nothing it answers;
- a `--processes` group owns its port from before it says "listening", and a worker that stops answering
  is found by the liveness check, logged and replaced;
- a client that pipelines requests and never reads its answers is dropped after the send timeout;
- the server-wide limit on rows in flight.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
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
from serve_process import ServeProcess, server_env  # noqa: E402
from tiny import copy_bundle, tiny_bundle  # noqa: E402

TRANSLATE = "/v1/translate"
TEXTS = ["the queen sees", "a young mouse eats", "the old king runs", "two birds sing"]


def _answers(server: ServeProcess, beam: int) -> list:
    r = server.client.post(TRANSLATE, json={"texts": TEXTS, "beam_size": beam})
    assert r.status_code == 200, r.text
    return [t["hypotheses"] for t in r.json()["translations"]]


# -- items 2 and 3: one bundle per load, for as long as it is loaded ---------------------------------------


@pytest.mark.slow
def test_weights_rewritten_then_truncated_under_a_server_change_nothing_it_answers():
    path = copy_bundle(tiny_bundle(), "rewritten-under-server")
    other = tiny_bundle(quantize="int8") / "weights.bin"  # another model's weights, of another size
    with ServeProcess(path, "--batching", "request") as server:
        before = {beam: _answers(server, beam) for beam in (1, 3)}
        shutil.copyfile(other, path / "weights.bin")  # `cp`: the same file rewritten in place
        assert {beam: _answers(server, beam) for beam in (1, 3)} == before
        os.truncate(path / "weights.bin", 0)  # `truncate -s 0`: a mapping of it would fault (SIGBUS)
        assert {beam: _answers(server, beam) for beam in (1, 3)} == before
        assert server.client.get("/health").status_code == 200
        assert server.proc.poll() is None, server.log()


# -- items 1 and 5: a process group that owns its port; a worker that stops answering ---------------------


def test_the_group_s_socket_listens_before_any_process_starts_so_a_second_group_is_refused():
    from seq2onnx.errors import CommandError
    from seq2onnx.serve.processes import hold_port
    from seq2onnx.serve.server import _bind

    first = hold_port("127.0.0.1", 0)
    try:
        port = first.getsockname()[1]
        assert first.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1  # listening, not only bound
        for second in (hold_port, _bind):  # another group's parent, a single server
            with pytest.raises(CommandError, match=rf"--port {port}: cannot listen there"):
                second("127.0.0.1", port).close()
    finally:
        first.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group(bundle, port: int, *options: str) -> subprocess.Popen:
    env = server_env()
    command = [
        sys.executable,
        "-m",
        "seq2onnx.commands",
        "serve",
        str(bundle),
        "--port",
        str(port),
        "--intra-threads",
        "1",
        "--processes",
        "2",
        *options,
    ]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group's processes with it
    proc.wait(timeout=20)


@pytest.mark.slow
def test_two_groups_started_a_moment_apart_on_one_port_one_serves_and_the_other_says_why(bundle):
    port = _free_port()
    first = _group(bundle, port)
    try:
        time.sleep(0.2)  # the offset: the first group's parent has bound, its processes still load
        second = _group(bundle, port)
        try:
            # whichever parent binds first serves (on a loaded machine the second may start faster)
            refused = until(
                lambda: next((g for g in (second, first) if g.poll() is not None), None), 90, "a group exits"
            )
            serving = first if refused is second else second
            assert refused.returncode != 0 and serving.poll() is None
            err = refused.stderr.read()
            assert "cannot listen there" in err and "choose another --port" in err, err
            assert "listening on" in serving.stdout.readline()
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
                assert c.get("/health").status_code == 200
        finally:
            _end(second)
    finally:
        _end(first)


def _pids(log: str) -> list[int]:
    """The server processes' pids, from their log lines (as tests/test_serve_processes.py finds them)."""
    pids = re.findall(r"seq2onnx serve \[pid (\d+)\]: ", log) + re.findall(
        r"Started server process \[(\d+)\]", log
    )
    return list(dict.fromkeys(int(p) for p in pids))


@pytest.mark.slow
def test_a_stopped_worker_is_found_by_its_heartbeat_logged_killed_and_replaced(bundle):
    with ServeProcess(bundle, "--processes", "2", "--liveness-seconds", "2") as server:
        until(lambda: len(_pids(server.log())) >= 2, 30, "both processes log")
        stopped = _pids(server.log())[0]
        os.kill(stopped, signal.SIGSTOP)
        try:
            until(lambda: "sent no heartbeat" in server.log(), 30, "the liveness check")
            until(lambda: len(_pids(server.log())) >= 3, 60, "a replacement")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
        assert re.search(
            rf"process \d \(pid {stopped}\) sent no heartbeat for [\d.]+ s \(--liveness-seconds 2\)",
            server.log(),
        ), server.log()
        until(lambda: "exited with code -9 while serving" in server.log(), 30, "its exit")
        # every fresh connection is answered again (none lands on the stopped process)
        answers = []
        for _ in range(10):
            with httpx.Client(base_url=server.url, timeout=10) as c:
                answers.append(c.get("/health").status_code)
        assert answers == [200] * 10


# -- item 4: a client that pipelines requests and never reads its answers ----------------------------------


@pytest.mark.slow
def test_a_client_that_pipelines_and_never_reads_is_dropped_after_the_send_timeout(bundle):
    with ServeProcess(bundle, "--send-timeout", "2") as server:
        size = len(server.client.get("/openapi.json").content)
        count = (32 << 20) // size + 1  # answers far past every buffer between the server and the client
        port = int(server.url.rsplit(":", 1)[1])
        request = b"GET /openapi.json HTTP/1.1\r\nHost: t\r\n\r\n"
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
            sock.connect(("127.0.0.1", port))
            sock.settimeout(5)
            with contextlib.suppress(OSError):  # the server stops reading once its writes pause
                sock.sendall(request * count)
            until(lambda: "had not read its answers for 2 s (--send-timeout)" in server.log(), 30, "the drop")
            received = 0
            with contextlib.suppress(OSError):  # reset, once what the kernel held is read
                while chunk := sock.recv(1 << 20):
                    received += len(chunk)
        assert received < count * size // 4, (received, count * size)  # most answers were never sent
        assert server.client.get("/health").status_code == 200  # the server itself goes on


@pytest.mark.slow
def test_connections_that_pipeline_and_never_read_hold_no_slot_once_another_is_refused(bundle):
    # their answers fit in the socket buffers, so no write pauses and the send timeout never starts: before,
    # 4 such connections against --max-connections 4 held every slot until their 3,000 requests were answered
    with ServeProcess(bundle, "--max-connections", "4") as server:
        port = int(server.url.rsplit(":", 1)[1])
        body = b'{"texts": ["the queen sees"]}'
        request = b"POST /v1/translate HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        request += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        hogs = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(4)]
        try:
            for hog in hogs:
                with contextlib.suppress(OSError):  # the server reads at its own pace
                    hog.sendall(request * 3000)

            def post():
                try:
                    return httpx.post(server.url + TRANSLATE, json={"texts": TEXTS}, timeout=10).status_code
                except httpx.TransportError:  # refused before its request was read
                    return None

            codes = [post()]  # every slot is held: refused, and the slots start to turn over
            codes.append(until(lambda: post() == 200 or None, 20, "a slot for a new client"))
            assert codes[0] in (503, None) and codes[-1], codes
            assert all("connection: close" in _read_to_end(hog) for hog in hogs)  # each was told so, last
        finally:
            for hog in hogs:
                hog.close()


def _read_to_end(sock: socket.socket) -> str:
    """What the server sent until it closed the connection (at most 64 MiB; the socket's timeout bounds it)."""
    data = b""
    with contextlib.suppress(OSError):
        while len(data) < 64 << 20 and (chunk := sock.recv(1 << 20)):
            data += chunk
    return data[-4096:].decode("latin-1").lower()


# -- item 6 and the low items: one rule per option, shared by both hosts -------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "body, field, words",
    [
        ({"texts": ["a black dog"], "beam_size": 2, "length_penalty": 200}, "length_penalty", "[-10, 10]"),
        ({"texts": ["a black dog"], "sampling_temperature": 5e-324}, "sampling_temperature", "[0.001, 1000]"),
    ],
)
def test_out_of_range_float_options_get_422_naming_the_range_not_500(bundle, body, field, words):
    with ServeProcess(bundle) as server:
        r = server.client.post(TRANSLATE, json=body)
        assert r.status_code == 422, r.text
        assert r.json()["field"] == field and words in r.json()["error"], r.text


# -- item 8: a server-wide limit on rows in flight ----------------------------------------------------------


@pytest.mark.slow
def test_rows_in_flight_are_bounded_server_wide_beyond_it_requests_wait_in_line(bundle):
    import concurrent.futures

    body = {"texts": TEXTS * 2, "beam_size": 4}  # 8 texts x beam 4: 32 rows, the whole limit
    with ServeProcess(
        bundle, "--max-rows-in-flight", "32", "--max-rows", "32", "--batching", "request", "--workers", "4"
    ) as server:

        def post(_):
            with httpx.Client(base_url=server.url, timeout=60) as c:
                return c.post(TRANSLATE, json=body)

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(post, range(48)))
        # 16 at once, one fits: the others waited in line for the rows (they were refused 503 before)
        assert [a.status_code for a in answers] == [200] * 48, [
            a.text for a in answers if a.status_code != 200
        ]
        assert len({a.text for a in answers}) == 1  # the same answer, whoever waited
        # every row was given back: a whole-limit request is admitted at once, not left waiting (504)
        assert server.client.post(TRANSLATE, json={**body, "beam_size": 1}).status_code == 200
        assert server.client.post(TRANSLATE, json=body, timeout=30).status_code == 200
        too_many = server.client.post(TRANSLATE, json={"texts": TEXTS * 2, "beam_size": 5})  # 40 rows alone
        assert too_many.status_code == 422, too_many.text  # one request's limit (--max-rows), never admitted


def test_rows_wait_in_line_first_come_first_served():
    import asyncio

    from seq2onnx.serve.memory import RowGate

    async def run():
        gate, order = RowGate(32), []
        first = gate.take(24)
        big, small = gate.take(32), gate.take(4)  # 4 would fit beside 24, but 32 came first
        for name, granted in (("big", big), ("small", small)):
            granted.add_done_callback(lambda f, name=name: f.cancelled() or order.append(name))
        await asyncio.sleep(0)
        assert first.done() and not big.done() and not small.done() and gate.waiting == 2
        gate.give(24)
        await asyncio.sleep(0)
        assert big.done() and not small.done() and gate.held == 32
        gate.give(32)
        await asyncio.sleep(0)
        assert order == ["big", "small"] and gate.held == 4
        gate.give(4)
        late = gate.take(32)
        blocked = gate.take(8)
        blocked.cancel()  # its client left: the line forgets it
        after = gate.take(8)
        await asyncio.sleep(0)
        assert late.done() and not after.done() and gate.waiting == 1
        gate.give(32)
        await asyncio.sleep(0)
        assert after.done() and gate.held == 8 and gate.waiting == 0

    asyncio.run(run())


def test_the_default_rows_in_flight_follow_the_machine_s_memory():
    from seq2onnx.serve.memory import MAX_ROWS, ROW_BYTES, ROWS_CAP, rows_in_flight_default

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert ROWS_CAP == MAX_ROWS == 512  # measured (serve/memory.py): more kept more than 1.5x the warm RSS
    assert rows_in_flight_default(16) == max(16, min(512, int(total * 0.5 / ROW_BYTES)))
    assert rows_in_flight_default(16, processes=64) == max(16, min(512, int(total * 0.5 / ROW_BYTES / 64)))
    assert rows_in_flight_default(512) == 512  # the default --max-rows: the cap, never below it
    assert rows_in_flight_default(10**9) == 10**9  # never below one request's --max-rows


@pytest.mark.slow
def test_a_target_prefix_longer_than_the_model_is_refused_not_cut(bundle):
    with ServeProcess(bundle) as server:
        r = server.client.post(TRANSLATE, json={"texts": ["a black dog"], "target_prefix": [[5] * 10_000]})
        assert r.status_code == 422 and r.json()["field"] == "target_prefix", r.text
        assert re.search(
            r"has 10000 ids; give at most \d+ \(the model has \d+ positions", r.json()["error"]
        ), r.text
