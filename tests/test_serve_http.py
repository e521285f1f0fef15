"""`seq2onnx serve` over real HTTP: server processes on 127.0.0.1 (tests/serve_process.py), httpx as the client.

Each configuration is one process, all started together when the module's first test needs one and killed at
its end; the translation tests run on both engines (--batching request, and continuous where serve/batcher.py
exists). Every wait is bounded. The drain case also runs in process (the window in which a real server answers
503 before it closes its socket is too short to aim at).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import signal
import socket
import threading
import time

import pytest

from extras import require

require("fastapi", "serve")
import httpx  # noqa: E402

from serve_process import ServeProcess, wanted_servers  # noqa: E402

BATCHINGS = ["request"] + (["continuous"] if importlib.util.find_spec("seq2onnx.serve.batcher") else [])
FRONT = BATCHINGS[-1]  # the default engine where it exists: the front end's own cases run on it
TRANSLATE, STREAM = "/v1/translate", "/v1/translate/stream"
TEXTS = ["the queen sees young mice with an old box", "", "a black dog ate five brave cats near the car"]
LONG = (
    "the quick brown fox jumps over the lazy dog again and again " * 3
)  # 115 tokens: fits the 128 positions
# 64 sentences x 16 beams x >= 100 steps: about 3 s on the tests' machine, 10 x the tiny --timeout below
SLOW = {"texts": [LONG] * 64, "beam_size": 16, "min_decoding_length": 100, "max_decoding_length": 120}
LIMITS = ("--max-texts", "5000", "--max-chars", "20000", "--max-body-bytes", "100000")
CONFIGS = {
    **{b: ("--batching", b, *LIMITS) for b in BATCHINGS},
    "timeout": ("--batching", FRONT, "--timeout", "0.3", "--max-chars", "20000"),
    "drain": (
        "--batching",
        FRONT,
        "--max-queue",
        "2",
        "--workers",
        "1",
        "--drain-seconds",
        "20",
        "--max-chars",
        "20000",
    ),
}


@pytest.fixture(scope="module")
def servers(request, bundle):
    """The configurations this run's tests of the module use, each a process started at once (their startups
    overlap); all killed at the end."""
    wanted = wanted_servers(
        request, {"server": None, "front": FRONT, "timeout_server": "timeout", "drain_server": "drain"}
    )
    running = {}
    try:
        for name, options in CONFIGS.items():
            if name in wanted:
                running[name] = ServeProcess(bundle, *options)
        yield {name: process for name, process in running.items()}
    finally:
        for process in running.values():
            process.stop()


@pytest.fixture(scope="module", params=BATCHINGS)
def server(request, servers) -> ServeProcess:
    return servers[request.param].listening()


@pytest.fixture(scope="module")
def front(servers) -> ServeProcess:
    return servers[FRONT].listening()


@pytest.fixture(scope="module")
def timeout_server(servers) -> ServeProcess:
    return servers["timeout"].listening()


@pytest.fixture(scope="module")
def drain_server(servers) -> ServeProcess:
    return servers["drain"].listening()


def _ok(server: ServeProcess) -> None:
    """The server still translates."""
    r = server.client.post(TRANSLATE, json={"texts": ["a black dog"], "beam_size": 1})
    assert r.status_code == 200, r.text
    assert r.json()["translations"][0]["hypotheses"][0]


# -- translations ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_translate_gives_the_token_ids_of_translate_batch(server, translator):
    r = server.client.post(TRANSLATE, json={"texts": TEXTS, "beam_size": 3, "return_scores": True})
    assert r.status_code == 200, r.text
    got = r.json()["translations"]
    want = translator.translate_batch(TEXTS, beam_size=3, return_scores=True)
    assert [t["token_ids"] for t in got] == [w.token_ids for w in want]
    assert [t["hypotheses"] for t in got] == [w.hypotheses for w in want]
    assert got[1] == {"hypotheses": [""], "token_ids": [[]], "scores": [0.0]}
    for t, w in zip(got, want):
        assert t["scores"] == pytest.approx(w.scores, abs=1e-4)


@pytest.mark.slow
def test_n_best_with_and_without_scores(server, translator):
    r = server.client.post(
        TRANSLATE, json={"texts": TEXTS[:1], "beam_size": 4, "num_hypotheses": 3, "return_scores": True}
    )
    assert r.status_code == 200, r.text
    [got] = r.json()["translations"]
    [want] = translator.translate_batch(TEXTS[:1], beam_size=4, num_hypotheses=3, return_scores=True)
    assert len(got["hypotheses"]) == len(got["token_ids"]) == len(got["scores"]) == 3
    assert got["token_ids"] == want.token_ids and got["hypotheses"] == want.hypotheses
    assert got["scores"] == pytest.approx(want.scores, abs=1e-4)
    r = server.client.post(TRANSLATE, json={"texts": TEXTS[:1], "beam_size": 4, "num_hypotheses": 2})
    assert r.json()["translations"][0]["scores"] is None


def test_stream_pieces_join_to_the_greedy_translation(server, translator):
    r = server.client.post(STREAM, json={"text": TEXTS[0]})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in r.text.splitlines()]
    pieces = [line["text"] for line in lines[:-1]]
    assert len(pieces) > 1 and all(set(line) == {"text"} for line in lines[:-1])
    assert lines[-1] == {"done": True, "text": "".join(pieces)}
    assert "".join(pieces) == translator.translate(TEXTS[0], beam_size=1)


# -- health, readiness, metrics, the API's description ----------------------------------------------


def test_health_ready_and_openapi(front):
    assert front.client.get("/health").json() == {"status": "ok"}
    assert front.client.get("/ready").json() == {"ready": True, "batching": FRONT}
    spec = front.client.get("/openapi.json").json()
    assert {TRANSLATE, STREAM, "/health", "/ready", "/metrics"} <= set(spec["paths"])
    schemas = spec["components"]["schemas"]
    fields = set(schemas["TranslateRequest"]["properties"])
    assert {"texts", "beam_size", "num_hypotheses", "return_scores", "target_prefix"} <= fields
    assert "return_attention" not in fields
    assert set(schemas["Translation"]["properties"]) == {"hypotheses", "token_ids", "scores"}
    assert {"413", "422", "503", "504"} <= set(spec["paths"][TRANSLATE]["post"]["responses"])
    assert front.client.get("/docs").status_code == 200


def test_metrics_count_requests_and_tokens(front):
    def read():
        return (
            front.metric("seq2onnx_requests_total", endpoint=TRANSLATE, status="200"),
            front.metric("seq2onnx_requests_total", endpoint=TRANSLATE, status="422"),
            front.metric("seq2onnx_generated_tokens_total"),
            front.metric("seq2onnx_texts_total"),
            front.metric("seq2onnx_request_seconds_count", endpoint=TRANSLATE),
            front.metric("seq2onnx_searches_decoded_alone_total"),
        )

    deadline = time.monotonic() + 30  # nothing of an earlier test still decoding: the next search is alone
    while front.metric("seq2onnx_active_requests") and time.monotonic() < deadline:
        time.sleep(0.05)
    before = read()
    r = front.client.post(TRANSLATE, json={"texts": TEXTS, "beam_size": 2, "num_hypotheses": 2})
    tokens = sum(len(ids) for t in r.json()["translations"] for ids in t["token_ids"])
    assert front.client.post(TRANSLATE, json={"texts": ["a"], "beam_size": 0}).status_code == 422
    after = read()
    assert after[0] == before[0] + 1 and after[1] == before[1] + 1
    assert after[2] == before[2] + tokens and tokens > 0
    assert after[3] == before[3] + len(TEXTS)
    assert after[4] == before[4] + 2
    assert after[5] == before[5] + (FRONT == "continuous")  # the continuous engine's solo path; else none
    text = front.client.get("/metrics").text
    for name in (
        "seq2onnx_queue_depth",
        "seq2onnx_active_requests",
        "seq2onnx_active_sentences",
        "seq2onnx_active_rows",
        f'seq2onnx_engine_info{{batching="{FRONT}"}}',
    ):
        assert name in text


# -- bad requests: a clear 4xx, and the server goes on ----------------------------------------------


def _body(obj) -> bytes:
    return json.dumps(obj).encode()


BAD = [  # (id, endpoint, body, status, the message matches, field)
    ("malformed-json", TRANSLATE, b'{"texts": ["a"', 400, r"the body is not valid JSON", None),
    ("not-an-object", TRANSLATE, b"[1, 2]", 422, r"must be a JSON object such as", None),
    ("no-body", TRANSLATE, b"", 422, r"must be a JSON object", None),
    (
        "texts-not-a-list",
        TRANSLATE,
        _body({"texts": "hello"}),
        422,
        r'^texts="hello": Input should be a valid list',
        "texts",
    ),
    (
        "a-text-not-a-str",
        TRANSLATE,
        _body({"texts": ["a", 3]}),
        422,
        r"^texts\[1\]=3: Input should be a valid string",
        "texts",
    ),
    ("no-texts", TRANSLATE, _body({"beam_size": 2}), 422, r"^texts is missing", "texts"),
    (
        "option-of-a-wrong-type",
        TRANSLATE,
        _body({"texts": ["a"], "beam_size": "4"}),
        422,
        r'^beam_size="4": Input should be a valid integer',
        "beam_size",
    ),
    (
        "a-bool-is-no-int",
        TRANSLATE,
        _body({"texts": ["a"], "num_hypotheses": True}),
        422,
        r"^num_hypotheses=true",
        "num_hypotheses",
    ),
    (
        "unknown-option",
        TRANSLATE,
        _body({"texts": ["a"], "beam": 4}),
        422,
        r"^unknown field 'beam': this endpoint "
        r"takes texts, ",
        "beam",
    ),
    (
        "return-attention",
        TRANSLATE,
        _body({"texts": ["a"], "return_attention": True}),
        422,
        r"return_attention is not served over HTTP",
        "return_attention",
    ),
    ("invalid-utf8", TRANSLATE, b'{"texts": ["\xff\xfe"]}', 400, r"^the body is not UTF-8 \(byte 12", None),
    (
        "bad-option-value",
        TRANSLATE,
        _body({"texts": ["a"], "beam_size": 0}),
        422,
        re.escape("beam_size=0 (int): give an int >= 1 (1 is greedy search)"),
        "beam_size",
    ),
    (
        "n-best-over-the-beam",
        TRANSLATE,
        _body({"texts": ["a"], "beam_size": 2, "num_hypotheses": 3}),
        422,
        r"raise beam_size or lower num_hypotheses",
        "num_hypotheses",
    ),
    (
        "target-prefix-per-text",
        TRANSLATE,
        _body({"texts": ["a", "b"], "target_prefix": [[5]]}),
        422,
        r"^target_prefix has 1 entries for 2 sources",
        "target_prefix",
    ),
    (
        "nan",
        TRANSLATE,
        b'{"texts": ["a"], "length_penalty": NaN}',
        422,
        r"^length_penalty=nan .*give a number in \[-10, 10\]",
        "length_penalty",
    ),
    (
        "source-too-long",
        TRANSLATE,
        _body({"texts": ["a", LONG * 2]}),
        422,
        r"^source 1 .*truncate=True",
        "texts",
    ),
    (
        "too-many-texts",
        TRANSLATE,
        _body({"texts": [""] * 5001}),
        413,
        r"^5001 texts; the limit \(--max-texts\) is 5000 per request: .*raise --max-texts",
        "texts",
    ),
    (
        "too-many-characters",
        TRANSLATE,
        _body({"texts": ["a" * 10001, "b" * 10000]}),
        413,
        r"^20001 characters; the limit \(--max-chars\) is 20000 per request",
        "texts",
    ),
    (
        "body-over-the-limit",
        TRANSLATE,
        _body({"texts": ["a"] * 30000}),
        413,
        r"^the body has 150011 bytes; the limit \(--max-body-bytes\) is 100000: .*raise --max-body-bytes",
        None,
    ),
    (
        "stream-given-texts",
        STREAM,
        _body({"texts": ["a"]}),
        422,
        r"^unknown field 'texts': this endpoint takes text, ",
        "texts",
    ),
    (
        "stream-text-not-a-str",
        STREAM,
        _body({"text": 5}),
        422,
        r"^text=5: Input should be a valid string",
        "text",
    ),
    (
        "stream-bad-option-value",
        STREAM,
        _body({"text": "a", "min_decoding_length": -1}),
        422,
        r"^min_decoding_length=-1 \(int\): give an int >= 0",
        "min_decoding_length",
    ),
    ("stream-source-too-long", STREAM, _body({"text": LONG * 2}), 422, r"^source 0 .*truncate=True", "text"),
    ("stream-too-many-characters", STREAM, _body({"text": "a" * 20001}), 413, r"^20001 characters", "text"),
]


@pytest.mark.parametrize(
    "endpoint, body, status, message, field", [case[1:] for case in BAD], ids=[c[0] for c in BAD]
)
def test_a_bad_request_gets_a_clear_4xx(front, endpoint, body, status, message, field):
    r = front.client.post(endpoint, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert re.search(message, r.json()["error"]), r.json()
    assert r.json()["field"] == field
    _ok(front)


def test_a_body_over_the_limit_without_content_length_is_refused_while_read(front):
    def chunks():
        yield b'{"texts": ["'
        for _ in range(20):
            yield b"a" * 8192

    r = front.client.post(TRANSLATE, content=chunks(), headers={"content-type": "application/json"})
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert r.status_code == 413 and "more than 100000 bytes" in r.json()["error"], r.text
    _ok(front)


def test_thousands_of_empty_texts_translate_to_empty_strings(front):
    started = time.monotonic()
    r = front.client.post(TRANSLATE, json={"texts": [""] * 5000, "beam_size": 4})
    assert r.status_code == 200, r.text
    assert r.json()["translations"] == [{"hypotheses": [""], "token_ids": [[]], "scores": None}] * 5000
    assert time.monotonic() - started < 10
    _ok(front)


# -- leaving, timing out, a full queue, draining ----------------------------------------------------


@pytest.mark.slow
def test_a_client_that_leaves_has_its_job_cancelled(server):
    cancelled = server.metric("seq2onnx_cancelled_jobs_total", reason="disconnect")
    left = server.metric("seq2onnx_requests_total", endpoint=TRANSLATE, status="499")
    with httpx.Client(base_url=server.url, timeout=httpx.Timeout(30, read=0.5)) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post(TRANSLATE, json=SLOW)
    # the connection closed: the front end sees the disconnect and cancels the job; its rows leave
    server.wait_metric("seq2onnx_cancelled_jobs_total", lambda v: v == cancelled + 1, reason="disconnect")
    server.wait_metric("seq2onnx_requests_total", lambda v: v == left + 1, endpoint=TRANSLATE, status="499")
    server.wait_metric("seq2onnx_active_rows", lambda v: v == 0, timeout_s=30)
    _ok(server)


def test_a_request_past_the_timeout_gets_504_and_its_job_is_cancelled(timeout_server):
    server = timeout_server
    started = time.monotonic()
    r = server.client.post(TRANSLATE, json=SLOW)
    assert r.status_code == 504, r.text
    assert "no answer within 0.3 s (--timeout)" in r.json()["error"]
    assert time.monotonic() - started < 2.5  # answered at the deadline, not when the translation would end
    assert server.metric("seq2onnx_cancelled_jobs_total", reason="timeout") == 1
    server.wait_metric("seq2onnx_active_rows", lambda v: v == 0, timeout_s=30)
    # a body that comes too slowly holds a queue slot only until the same deadline
    with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"texts"'
        )
        assert sock.recv(4096).startswith(b"HTTP/1.1 408")
    _ok(server)


@pytest.mark.slow
def test_a_full_queue_answers_503_and_sigterm_drains_the_requests_in_flight(drain_server):
    server = drain_server
    slow = {**SLOW, "texts": [LONG] * 32, "beam_size": 8}  # about 1 s each; --workers 1 decodes one at a time
    answers, finished = {}, {}

    def post(name):
        answers[name] = httpx.post(server.url + TRANSLATE, json=slow, timeout=60)
        finished[name] = time.monotonic()

    threads = [threading.Thread(target=post, args=(name,)) for name in "AB"]
    for thread in threads:
        thread.start()
    server.wait_metric("seq2onnx_queue_depth", lambda v: v == 2)
    r = server.client.post(TRANSLATE, json={"texts": ["a"]})
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert "the queue is full" in r.json()["error"] and "--max-queue" in r.json()["error"]

    server.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    deadline = signalled + 10
    while True:  # new connections are refused once uvicorn has closed its socket (within a tick or two)
        try:
            httpx.get(server.url + "/health", timeout=1)
        except httpx.ConnectError:
            break
        except (httpx.ReadError, httpx.RemoteProtocolError):
            break  # connected into the listen backlog just before the socket closed: reset, never answered
        assert time.monotonic() < deadline, "still accepting connections 10 s after SIGTERM"
        time.sleep(0.05)
    for thread in threads:
        thread.join(timeout=60)
    assert [answers[name].status_code for name in "AB"] == [200, 200]
    assert all(len(answers[name].json()["translations"]) == 32 for name in "AB")
    assert max(finished.values()) > signalled  # at least one was answered after the signal, while draining
    assert server.proc.wait(timeout=30) == 0
    assert time.monotonic() - signalled < 20 + 5  # --drain-seconds 20, and the engine's close
    log = server.log()
    assert re.search(r"SIGTERM: draining: [12] requests in flight", log), log
    for phase in ("drained in", "every request answered", "closing the engine", "stopped"):
        assert phase in log, log


def test_a_draining_app_refuses_new_requests(translator):
    from seq2onnx.serve.app import create_app
    from seq2onnx.serve.engine import RequestEngine

    engine = RequestEngine(translator, workers=1)
    app = create_app(engine, max_texts=4)
    create_app(engine)  # a second app in the process: each has a registry of its own

    async def requests():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
            ok = await client.post(TRANSLATE, json={"texts": ["a black dog"]})
            app.state.frontend.drain()
            return (
                ok,
                await client.get("/ready"),
                await client.post(TRANSLATE, json={"texts": ["a"]}),
                await client.get("/health"),
            )

    try:
        ok, ready, refused, health = asyncio.run(requests())
    finally:
        engine.close()
    assert ok.status_code == 200 and health.status_code == 200
    assert ready.status_code == 503 and "draining" in ready.json()["error"]
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "shutting down" in refused.json()["error"]
    with pytest.raises(ValueError, match=r"max_queue=0: give an int >= 1"):
        create_app(engine, max_queue=0)
    with pytest.raises(ValueError, match=r"timeout_s=nan"):
        create_app(engine, timeout_s=float("nan"))
