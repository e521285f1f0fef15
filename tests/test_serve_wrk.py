"""scripts/serve_wrk.py (issue 36, item 4): the pieces that need no wrk (the words, wrk's report read back,
the ceiling's echo engine answering through the real front end in a real process), and with wrk installed
the Lua script's bodies and a short run of the whole script."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from tiny import scratch, tiny_bundle
from extras import require

require("fastapi", "serve")
httpx = require("httpx", "bench")

BENCHMARKS = Path(__file__).resolve().parents[1] / "scripts"
HAS_WRK = shutil.which("wrk") is not None
NO_WRK = "wrk is not installed (apt-get install wrk): the benchmark's own tool"
CANNED = """Running 15s test @ http://127.0.0.1:4242/v1/translate
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   101.22ms   20.13ms 400.00ms   90.00%
    Req/Sec   316.00     30.00   400.00     70.00%
  4740 requests in 15.00s, 1.20MB read
  Non-2xx or 3xx responses: 40
Requests/sec:    316.00
Transfer/sec:     81.92KB
SERVE_WRK {"duration_us": 15000000, "requests": 4740, "bytes": 1258291, "connect": 0, "read": 0, "write": 0, \
"status": 40, "timeout": 2, "mean_us": 101220.0, "p50_us": 98000, "p90_us": 120000, "p99_us": 180500, \
"max_us": 400000}
"""


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_bench", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wrk_bench = _module("serve_wrk")


def test_wrk_report_is_read_back():
    figures = wrk_bench.parse_wrk(CANNED)
    assert figures["requests"] == 4740 and figures["ok"] == 4700
    assert figures["requests_per_s"] == pytest.approx(4700 / 15)
    assert figures["errors"] == {"status": 40, "timeout": 2}
    assert (figures["p50_ms"], figures["p99_ms"], figures["max_ms"]) == (98.0, 180.5, 400.0)
    with pytest.raises(ValueError, match="(?s)no 'SERVE_WRK' line.*unable to connect"):
        wrk_bench.parse_wrk("unable to connect to 127.0.0.1:1 Connection refused\n")


def test_words_come_from_the_source_pieces_and_are_json_escaped():
    words, sep = wrk_bench.source_words(tiny_bundle())
    assert sep == "space" and len(words) >= 20 and all(w.isalpha() for w in words)
    path = scratch("wrk-words") / "words.txt"
    wrk_bench.write_words(['say"hi', "back\\slash", "plain"], path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(f'"{line}"') for line in lines] == ['say"hi', "back\\slash", "plain"]
    drawn = wrk_bench.sample_requests(words, sep, 50, 0, (5, 9))
    assert all(3 <= len(text.split()) <= 10 and 5 <= length <= 9 for text, length in drawn)
    assert all(length is None for _, length in wrk_bench.sample_requests(words, sep, 5, 0, None))


def test_continuous_settings_cover_each_thread_count_and_lanes():
    args = wrk_bench.build_parser().parse_args(
        [str(tiny_bundle()), "--out", "x", "--servers", "continuous", "--threads", "2"]
    )
    args.continuous_intra, args.continuous_lanes = [1, 2], [1, 2]
    got = {setting: argv for name, setting, argv in wrk_bench.servers(args) if name == "continuous"}
    assert sorted(got) == ["intra 1", "intra 2", "lanes 2 x intra 1"]
    lanes = got["lanes 2 x intra 1"]
    assert lanes[lanes.index("--lanes") + 1] == "2" and lanes[lanes.index("--intra-threads") + 1] == "1"
    assert "--lanes" not in got["intra 2"]


def test_processes_add_each_server_as_p_processes_with_the_threads_split():
    args = wrk_bench.build_parser().parse_args(
        [str(tiny_bundle()), "--out", "x", "--ct2", "c", "--threads", "2", "--processes", "1", "2"]
    )
    args.continuous_intra = [1, 2]  # as main() sets it
    got = {(name, setting): argv for name, setting, argv in wrk_bench.servers(args) if "processes" in setting}
    assert sorted(got) == [
        ("ceiling", "2 processes"),
        ("continuous", "2 processes x intra 1"),
        ("ct2", "2 processes x inter 1 x intra 1"),
        ("request", "2 processes x workers 1 x intra 1"),
        ("standard-rounds", "2 processes x intra 1"),
    ]

    def option(argv, name):
        assert argv.count(name) == 1, argv
        return argv[argv.index(name) + 1]

    for (name, _), argv in got.items():
        assert option(argv, "--processes") == "2"
        if name != "ceiling":
            assert option(argv, "--intra-threads") == "1"
    assert option(got[("ct2", "2 processes x inter 1 x intra 1")], "--inter-threads") == "1"
    assert option(got[("request", "2 processes x workers 1 x intra 1")], "--workers") == "1"
    assert option(got[("standard-rounds", "2 processes x intra 1")], "--rounds") == "standard"
    single = wrk_bench.build_parser().parse_args([str(tiny_bundle()), "--out", "x", "--ct2", "c"])
    single.continuous_intra = [1, 2]
    for name, _, argv in wrk_bench.servers(single):  # one process each, named: serve's default is auto
        assert name in ("ct2", "ceiling") or option(argv, "--processes") == "1", argv
        assert name not in ("ct2", "ceiling") or "--processes" not in argv, argv


@pytest.fixture(scope="module")
def stub():
    """The ceiling's server (`serve_ct2.py BUNDLE --echo`) as the benchmark starts it: a real process."""
    scaffold = wrk_bench.sc
    argv = [
        *wrk_bench.servers(
            wrk_bench.build_parser().parse_args([str(tiny_bundle()), "--out", "x", "--servers", "ceiling"])
        )[0][2]
    ]
    log = scratch("wrk-stub") / "stub.log"
    with scaffold.Server(argv, log, "the queen sees", start_timeout=60) as server:
        yield server


def test_echo_engine_answers_through_the_real_front_end(stub):
    from seq2onnx.runtime.translator import Translator

    tr = Translator(tiny_bundle(), device="cpu", intra_threads=1)
    with httpx.Client(timeout=30) as client:
        for text, beam in (("the queen sees", 1), ("a cat", 4)):  # bounded: two requests
            n = min(beam, 2)
            body = {
                "texts": [text],
                "beam_size": beam,
                "max_decoding_length": 7,
                "num_hypotheses": n,
                "return_scores": True,
            }
            answer = client.post(stub.url, json=body).json()["translations"][0]
            assert answer["hypotheses"] == [text] * n and answer["scores"] == [0.0] * n
            assert answer["token_ids"][0] == tr.prepare_source(text)[0][:-1]
        bad = client.post(stub.url, json={"texts": ["a"], "beam_size": 0})
        assert bad.status_code == 422 and bad.json()["field"] == "beam_size"
    assert wrk_bench.generated_tokens(stub.url) >= 2 * len(tr.prepare_source("a cat")[0][:-1])


@pytest.mark.slow
@pytest.mark.skipif(not HAS_WRK, reason=NO_WRK)
def test_lua_script_posts_random_sentences(stub):
    words, _ = wrk_bench.source_words(tiny_bundle())
    where = scratch("wrk-lua")
    wrk_bench.write_words(words, where / "words.txt")
    lua = [where / "words.txt", "space", 4, 5, 9, 0, where / "dump"]
    figures = wrk_bench.run_wrk(wrk_bench.wrk_command(stub.url, 2, 1, lua, threads=2, timeout=10), 1)
    assert figures["requests"] > 0 and figures["errors"] == {}
    bodies = [json.loads(line) for f in sorted(where.glob("dump.*")) for line in f.read_text().splitlines()]
    assert len(list(where.glob("dump.*"))) == 2  # one file per wrk thread
    assert len(bodies) >= figures["requests"]
    for body in bodies:
        assert set(body) == {"texts", "beam_size", "max_decoding_length"} and body["beam_size"] == 4
        assert len(body["texts"]) == 1 and 3 <= len(body["texts"][0].split()) <= 10
        assert set(body["texts"][0].split()) <= set(words) and 5 <= body["max_decoding_length"] <= 9
    assert len({b["texts"][0] for b in bodies}) > len(bodies) // 2  # random, not one sentence repeated


def test_table_names_each_servers_best_setting_and_the_ratios():
    def p(server, setting, rps, beam=1, clients=32):
        return {
            "server": server,
            "setting": setting,
            "beam": beam,
            "clients": clients,
            "requests_per_s": rps,
            "tokens_per_s": 10 * rps,
            "p50_ms": 10.0,
            "p90_ms": 20.0,
            "p99_ms": 30.0,
            "max_ms": 40.0,
            "requests": 100,
            "errors": {},
        }

    report = {
        "started": "now",
        "note": "note",
        "beams": [1],
        "clients": [32],
        "points": [
            p("continuous", "", 300.0),
            p("request", "workers 1 x intra 2", 100.0),
            p("request", "workers 2 x intra 1", 200.0),
            p("ct2", "inter 2 x intra 1", 150.0),
            p("ceiling", "", 600.0),
        ],
    }
    table = wrk_bench.markdown(report)
    row = next(line for line in table.splitlines() if line.startswith("| 32 |"))
    assert "200.0 / 30 (workers 2 x intra 1)" in row and "100.0" not in row
    assert row.endswith("| 2.00 | 1.50 | 0.50 |")  # cont/ct2, cont/request, cont/ceiling


@pytest.mark.skipif(not HAS_WRK, reason=NO_WRK)
@pytest.mark.slow
def test_whole_script_measures_the_ceiling():  # about 5 s: a server start and two 1-second wrk runs
    out = scratch("wrk-run") / "out"
    code = wrk_bench.main(
        [
            str(tiny_bundle()),
            "--out",
            str(out),
            "--servers",
            "ceiling",
            "--clients",
            "2",
            "--seconds",
            "1",
            "--warmup",
            "1",
            "--max-length",
            "5",
            "9",
            "--in-process-seconds",
            "0",
        ]
    )
    report = json.loads((out / "results.json").read_text())
    assert code == 0 and [p["server"] for p in report["points"]] == ["ceiling"]
    assert report["points"][0]["requests_per_s"] > 0 and report["points"][0]["tokens_per_s"] > 0
    assert "| 2 | " in (out / "results.md").read_text()
