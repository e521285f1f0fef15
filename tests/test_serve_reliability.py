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

from serve_process import ServeProcess  # noqa: E402
from tiny import copy_bundle, tiny_bundle  # noqa: E402

TRANSLATE = "/v1/translate"
TEXTS = ["the queen sees", "a young mouse eats", "the old king runs", "two birds sing"]


def _until(test, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = test()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not within {timeout_s} s")


def _answers(server: ServeProcess, beam: int) -> list:
    r = server.client.post(TRANSLATE, json={"texts": TEXTS, "beam_size": beam})
    assert r.status_code == 200, r.text
    return [t["hypotheses"] for t in r.json()["translations"]]


# -- items 2 and 3: one bundle per load, for as long as it is loaded ---------------------------------------


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
