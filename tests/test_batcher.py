"""Continuous batching (serve/batcher.py): a request's result is translate_batch's of that request alone.

Requests of every kind are decoded at once by one scheduler: greedy and beam, n-best, scores, forced
prefixes and sampling, sources of different lengths, requests that join while others are half way.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from seq2onnx.runtime.session_tuning import SessionTuning
from seq2onnx.runtime.translator import Translator
from seq2onnx.runtime.rounds import NoServingDecoder, rounds_runner
from seq2onnx.serve.batcher import ContinuousEngine
from seq2onnx.serve.scheduler import Scheduler
from seq2onnx.serve.engine import Cancelled, Engine, RequestEngine
from tiny import copy_bundle, edit_bundle_json, restate_size

TEXTS = [
    "the cat dances in the box",
    "a small bird sleeps",
    "the red dog",
    "a",
    "the small cat sees a big red bird",
    "",
    "bird",
    "the dog sleeps in the small box with a cat",
]
REQUESTS = [  # (texts, options): mixed kinds, all in flight together
    (TEXTS[:3], {"beam_size": 1, "return_scores": True}),
    (TEXTS[3:5], {"beam_size": 4, "num_hypotheses": 3, "return_scores": True}),
    ([TEXTS[4]], {"beam_size": 1}),
    (TEXTS, {"beam_size": 2, "return_scores": True, "length_penalty": 0.6}),
    ([TEXTS[7]], {"beam_size": 4, "min_decoding_length": 3, "return_scores": True}),
    (TEXTS[:2], {"beam_size": 1, "max_decoding_length": 4, "return_scores": True}),
    (TEXTS[1:4], {"sampling_temperature": 0.8, "seed": 7, "num_hypotheses": 2, "return_scores": True}),
    (TEXTS[5:], {"beam_size": 3, "max_batch_size": 1, "return_scores": True}),
]


@pytest.fixture(scope="module", params=["standard", "fused", "fused-standard-rounds"])
def engine(bundle, request):
    """A ContinuousEngine over a Translator driving either decoder; its rounds run that decoder (the fused
    decoder's in-place rounds: runtime/fused_rounds.py), or decoder.onnx under the fused Translator."""
    decoder = request.param.split("-")[0]
    t = Translator(bundle, device="cpu", _tuning=SessionTuning(decoder=decoder))
    # solo=False: every search goes through the scheduler these tests are about (solo: its own tests below)
    e = ContinuousEngine(t, decoder="standard" if request.param.endswith("rounds") else "auto", solo=False)
    assert type(e.scheduler.runner).__name__ == (
        "FusedRounds" if request.param == "fused" else "StandardRounds"
    )
    yield e
    e.close()


@pytest.mark.parametrize("decoder", ["standard", "fused"])
def test_rounds_shrink_nothing_once_a_session_refused_the_shrinkage(bundle, decoder):
    """A session without an arena refuses the shrink option (ArenaShrink.enabled goes False): the rounds'
    shrink_arena then runs neither the decoder's one-row round nor the encoder's shrink."""
    runner = rounds_runner(Translator(bundle, device="cpu", _tuning=SessionTuning(decoder=decoder)))
    calls = []
    runner.shrink_encoder = lambda: calls.append("encoder")
    runner.shrink_arena()
    assert calls == ["encoder"]  # enabled: the round, then the encoder's shrink
    runner.shrink.enabled = False
    runner.shrink_arena()
    assert calls == ["encoder"]


def _alone(translator: Translator, texts, options):
    return translator.translate_batch(texts, **options)


def _same(a, b) -> None:
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.hypotheses for r in a] == [r.hypotheses for r in b]
    if a[0].scores is not None:
        np.testing.assert_allclose(
            [s for r in a for s in r.scores], [s for r in b for s in r.scores], rtol=0, atol=1e-4
        )


def test_concurrent_requests_equal_each_request_alone(engine):
    wanted = [_alone(engine.translator, texts, options) for texts, options in REQUESTS]
    jobs = [engine.submit(texts, engine.check(options)) for texts, options in REQUESTS * 3]
    got = [job.future.result(timeout=120) for job in jobs]
    for i, result in enumerate(got):
        _same(result, wanted[i % len(REQUESTS)])
    assert engine.scheduler.rounds > 0
    assert engine.load()["active_requests"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("decoder", ["fused", "standard"])
def test_two_lanes_share_the_requests_and_each_equals_its_request_alone(bundle, decoder):
    t = Translator(bundle, device="cpu", intra_threads=1, _tuning=SessionTuning(decoder=decoder))
    engine = ContinuousEngine(t, lanes=2, solo=False)  # every search to a lane, the first one too
    try:
        assert [lane._thread.name for lane in engine.schedulers] == [
            "seq2onnx-scheduler-0",
            "seq2onnx-scheduler-1",
        ]
        wanted = [_alone(t, texts, options) for texts, options in REQUESTS]
        jobs = [engine.submit(texts, engine.check(options)) for texts, options in REQUESTS * 3]
        got = [job.future.result(timeout=120) for job in jobs]
        for i, result in enumerate(got):
            _same(result, wanted[i % len(REQUESTS)])
        assert all(lane.rounds > 0 for lane in engine.schedulers)  # both lanes decoded
        assert [lane.rows_in_flight for lane in engine.schedulers] == [0, 0]
        assert engine.load()["active_requests"] == 0
    finally:
        engine.close()


@pytest.mark.parametrize("lanes", [0, -1, 1.5, True])
def test_lanes_out_of_range_are_named(translator, lanes):
    with pytest.raises(ValueError, match=r"lanes=.*give an int >= 1"):
        ContinuousEngine(translator, lanes=lanes)


@pytest.mark.slow
def test_fused_rounds_that_move_positions_and_grow_give_each_request_alone(bundle):
    """The fused rounds' buffers under every change they make (runtime/fused_rounds.py): positions no live row
    reads dropped, positions and rows grown, the source width widened, beams and greedy rows in one group,
    rows freed by finished sentences taken by later ones; every result is translate_batch's alone."""
    t = Translator(bundle, device="cpu")
    e = ContinuousEngine(t, solo=False)  # the rounds' buffers are what is tested: no request decoded alone
    runner = e.scheduler.runner
    # the first burst's positions and rows run out at once; every wider source widens
    runner.first_positions, runner.first_rows, runner.width_quantum = 4, 1, 1
    try:
        order = sorted(REQUESTS, key=lambda r: max(len(x) for x in r[0]))  # the widest sources last: widen
        wanted = [_alone(t, texts, options) for texts, options in order]
        jobs = []
        for texts, options in order * 2:
            jobs.append(e.submit(texts, e.check(options)))
            threading.Event().wait(0.005)  # some join rounds already running
        for i, job in enumerate(jobs):
            _same(job.future.result(timeout=120), wanted[i % len(order)])
        # the rest depends on when requests join: tests/test_fused_rounds.py scripts every move
        assert runner.copies["grow_rows"] > 0 and runner.copies["grow_positions"] > 0, runner.copies
    finally:
        e.close()


@pytest.mark.slow
def test_fused_rounds_keep_their_buffers_between_requests_and_drop_them_when_idle(bundle, monkeypatch):
    """A lone client's requests, one after another: the next one finds the fused rounds' buffers and binding as
    the last one left them (rows it takes masked from what they held) and gets translate_batch's result
    alone; once the scheduler has been idle IDLE_S, the buffers are dropped."""
    from seq2onnx.serve import scheduler

    # however slow the machine between two requests, nothing is dropped while the first part runs
    monkeypatch.setattr(scheduler, "IDLE_S", 60.0)
    t = Translator(bundle, device="cpu")
    e = ContinuousEngine(t, solo=False)  # a lone request would otherwise be decoded alone, not in the rounds
    runner = e.scheduler.runner
    try:
        mixed = REQUESTS[:6] + REQUESTS[:6]  # greedy, beams, n-best: one at a time
        wanted = [_alone(t, texts, options) for texts, options in mixed]
        for (texts, options), alone in zip(mixed, wanted):
            _same(e.submit(texts, e.check(options)).future.result(timeout=60), alone)
            assert runner.capacity > 0  # kept while idle
        texts, options = REQUESTS[2]  # one greedy sentence, three times: the same buffers and binding
        alone, kept = _alone(t, texts, options), []
        for _ in range(3):
            _same(e.submit(texts, e.check(options)).future.result(timeout=60), alone)
            kept.append((runner._binding, runner._generation))
        assert kept[0][0] is not None and kept[0][0] is kept[1][0] is kept[2][0] and kept[0][1] == kept[2][1]
        monkeypatch.setattr(scheduler, "IDLE_S", 0.05)  # read at the scheduler's next idle wait
        _same(e.submit(texts, e.check(options)).future.result(timeout=60), alone)
        # dropped: seen once with neither rows nor cache (giving memory back after a burst then runs a one-row
        # round under arena shrinkage in buffers of its own, and drops those too)
        deadline, dropped = time.monotonic() + 30, False
        while not dropped and time.monotonic() < deadline:
            dropped = runner.capacity == 0 and runner.cache == []
            time.sleep(0.01)
        assert dropped
        _same(e.submit(TEXTS[:2], e.check({})).future.result(timeout=60), _alone(t, TEXTS[:2], {}))
    finally:
        e.close()


@pytest.mark.slow
def test_after_a_burst_the_idle_scheduler_trims_once_more_late(bundle, monkeypatch):
    """The memory is given back when the scheduler falls idle, and the heaps are trimmed once more LATE_TRIM_S
    later (what a request's thread freed after the first trim), then not again."""
    from seq2onnx.serve import scheduler

    trims = []  # (thread, time): another test's engine still alive in this worker trims through the patch too
    monkeypatch.setattr(
        scheduler,
        "release_memory",
        lambda shrink=None: trims.append((threading.current_thread(), time.monotonic())),
    )
    monkeypatch.setattr(scheduler, "TRIM_AFTER_ROUNDS", 1)  # any request is a burst here
    monkeypatch.setattr(scheduler, "IDLE_S", 0.05)
    monkeypatch.setattr(scheduler, "LATE_TRIM_S", 0.3)
    t = Translator(bundle, device="cpu")
    before = set(threading.enumerate())
    e = ContinuousEngine(t, solo=False)
    schedulers = set(threading.enumerate()) - before  # started by the engine: its lanes' threads
    try:
        texts, options = REQUESTS[2]
        _same(e.submit(texts, e.check(options)).future.result(timeout=60), _alone(t, texts, options))
        deadline = time.monotonic() + 30
        ours = lambda: [at for thread, at in trims if thread in schedulers]  # noqa: E731
        while len(ours()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.6)  # two late periods more: no third trim
        assert len(ours()) == 2, trims
        assert ours()[1] - ours()[0] >= 0.3
    finally:
        e.close()


@pytest.mark.parametrize("decoder", ["fused", "standard"])
def test_a_lone_request_is_decoded_alone_and_requests_meanwhile_join_the_lanes(bundle, decoder, monkeypatch):
    """solo (the default): a request that finds nothing decoding runs translate_batch's own search on its worker
    thread, never the scheduler's rounds; while it runs, another request goes to a lane (and is answered
    before it); load() counts the lone search's rows; a cancel reaches it at its next step; solo=False sends
    every search to a lane."""
    t = Translator(bundle, device="cpu", _tuning=SessionTuning(decoder=decoder))
    e = ContinuousEngine(t)
    release = threading.Event()
    try:
        for texts, options in REQUESTS:  # every kind, one at a time
            _same(e.submit(texts, e.check(options)).future.result(timeout=60), _alone(t, texts, options))
        assert e.solo_searches >= len(REQUESTS) and e.scheduler.rounds == 0
        wide = ([TEXTS[0]] * 9, {"beam_size": 4})  # 36 rows > SOLO_MAX_ROWS: to a lane, whose idle time trims
        _same(e.submit(wide[0], e.check(wide[1])).future.result(timeout=60), _alone(t, *wide))
        assert e.scheduler.rounds > 0

        wanted = [
            _alone(t, [TEXTS[i]], {}) for i in (0, 1)
        ]  # before the patch below (translate_batch uses it)
        entered, real = threading.Event(), t.search

        def held(search, wrap=None):  # the lone search waits here until released
            entered.set()
            assert release.wait(60)
            return real(search, wrap=wrap)

        monkeypatch.setattr(t, "search", held)
        first = e.submit(TEXTS[3:5], e.check({"beam_size": 4}))
        assert entered.wait(60)
        assert e.load() == {"active_requests": 1, "active_sentences": 2, "active_rows": 8}
        second = e.submit([TEXTS[0]], e.check({}))  # the lone path is taken: this one joins a lane
        _same(second.future.result(timeout=60), wanted[0])
        assert not first.future.done()
        first_cancelled = e.submit(
            [TEXTS[7]], e.check({"max_decoding_length": 30})
        )  # to a lane: cancel there
        first_cancelled.cancel()
        with pytest.raises(Cancelled):
            first_cancelled.future.result(timeout=60)
        first.cancel()  # the lone search's next step raises
        release.set()
        with pytest.raises(Cancelled):
            first.future.result(timeout=60)
        monkeypatch.setattr(t, "search", real)
        rounds, alone = e.scheduler.rounds, e.solo_searches
        _same(e.submit([TEXTS[1]], e.check({})).future.result(timeout=60), wanted[1])
        assert (e.solo_searches, e.scheduler.rounds) == (alone + 1, rounds)
    finally:
        release.set()  # never leave the lone search waiting (a failed assertion above)
        e.close()
    e = ContinuousEngine(t, solo=False)
    try:
        _same(e.submit([TEXTS[1]], e.check({})).future.result(timeout=60), _alone(t, [TEXTS[1]], {}))
        assert e.solo_searches == 0 and e.scheduler.rounds > 0
    finally:
        e.close()


def test_rows_of_many_requests_share_one_round(engine, monkeypatch):
    members_per_round = []
    run_round = engine.scheduler._round

    def counted(work):
        if not members_per_round:  # the first round waits (bounded) until all five have joined: no race
            deadline = time.monotonic() + 30
            while (
                len(engine.scheduler._active) + len(engine.scheduler._incoming) < 5
                and time.monotonic() < deadline
            ):
                time.sleep(0.005)
        members_per_round.append(len(work))
        return run_round(work)

    monkeypatch.setattr(engine.scheduler, "_round", counted)
    options = engine.check({"beam_size": 1, "max_decoding_length": 8})
    jobs = [engine.submit([text], options) for text in TEXTS[:5]]
    steps = [
        min(len(job.future.result(timeout=60)[0].token_ids[0]) + 1, 8) for job in jobs
    ]  # + the end token
    assert max(members_per_round) >= 2  # requests decoded together
    assert len(members_per_round) < sum(steps)  # one request after another would take sum(steps) rounds


def test_requests_join_a_running_batch(engine):
    """A request submitted while another is half way joins it: rows at different steps in one round."""
    options = engine.check({"beam_size": 2, "return_scores": True, "max_decoding_length": 20})
    long_text = [TEXTS[7]] * 4
    first = engine.submit(long_text, options)
    later = []
    for text in TEXTS[:5]:
        threading.Event().wait(0.01)
        later.append((text, engine.submit([text], options)))
    _same(
        first.future.result(timeout=60),
        _alone(engine.translator, long_text, dict(beam_size=2, return_scores=True, max_decoding_length=20)),
    )
    for text, job in later:
        _same(
            job.future.result(timeout=60),
            _alone(engine.translator, [text], dict(beam_size=2, return_scores=True, max_decoding_length=20)),
        )


def test_stream_equals_greedy_translate(engine):
    options = engine.check({"beam_size": 1})
    from seq2onnx.serve.engine import Job

    pieces = list(engine.stream(TEXTS[4], options, Job()))
    assert "".join(pieces) == engine.translator.translate(TEXTS[4], beam_size=1)
    assert len(pieces) > 1


def test_a_cancelled_request_leaves_and_the_others_finish(engine):
    options = engine.check({"beam_size": 4, "max_decoding_length": 30})
    jobs = [engine.submit([TEXTS[7]] * 8, options) for _ in range(2)]
    jobs[0].cancel()
    with pytest.raises(Cancelled):
        jobs[0].future.result(timeout=60)
    _same(
        jobs[1].future.result(timeout=60),
        _alone(engine.translator, [TEXTS[7]] * 8, dict(beam_size=4, max_decoding_length=30)),
    )
    assert engine.scheduler.load()["active_searches"] == 0


def test_a_bad_request_fails_alone(engine):
    bad = engine.submit(["x " * 5000], engine.check({}))  # too long for the model's positions, no truncate
    good = engine.submit([TEXTS[0]], engine.check({}))
    with pytest.raises(ValueError, match="truncate"):
        bad.future.result(timeout=60)
    _same(good.future.result(timeout=60), _alone(engine.translator, [TEXTS[0]], {}))


def test_bundle_without_per_row_steps_is_refused(bundle, tmp_path):
    """A decoder.onnx whose step is [1] (exported before serve/) cannot be served continuously."""
    import onnx

    old = copy_bundle(bundle, "old-step")
    proto = onnx.load(str(old / "decoder.onnx"))
    step = next(i for i in proto.graph.input if i.name == "step")
    step.type.tensor_type.shape.dim[0].Clear()
    step.type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(proto, str(old / "decoder.onnx"))

    def restate(meta):  # bundle.json states the graph as it now is (the hashes are not checked below)
        for entry in meta["graphs"]["decoder"]["inputs"]:
            if entry["name"] == "step":
                entry["shape"] = [1]

    edit_bundle_json(old, restate)
    restate_size(old, "decoder")
    standard = Translator(old, device="cpu", check_hashes=False, _tuning=SessionTuning(decoder="standard"))
    with pytest.raises(NoServingDecoder, match="--batching request"):
        ContinuousEngine(standard)
    # where the fused decoder is driven its rounds serve it: decoder.onnx is never run
    fused = ContinuousEngine(Translator(old, device="cpu", check_hashes=False))
    assert type(fused.scheduler.runner).__name__ == "FusedRounds"
    fused.close()


def test_scheduler_refuses_members_after_close(bundle):
    t = Translator(bundle, device="cpu")
    s = Scheduler(rounds_runner(t))
    s.close()
    with pytest.raises(RuntimeError, match="closed"):
        s.submit(None, iter(()), None)


def test_rows_over_the_limit_are_refused(engine):
    small = ContinuousEngine.__new__(ContinuousEngine)  # only check(): no scheduler needed
    Engine.__init__(small, engine.translator, max_rows=8)
    assert small.check({"beam_size": 4}, texts=2).beam_size == 4
    with pytest.raises(ValueError, match=r"12 decoder rows; the limit \(--max-rows\) is 8"):
        small.check({"beam_size": 4}, texts=3)
    with pytest.raises(ValueError, match="--max-rows"):
        small.check({"sampling_temperature": 1.0, "num_hypotheses": 9}, texts=1)
    assert small.check({"beam_size": 4, "max_batch_size": 2}, texts=50).beam_size == 4  # 2 texts at a time


def test_request_engine_stops_a_cancelled_request_at_its_next_step(bundle, monkeypatch):
    translator = Translator(bundle, device="cpu")
    engine = RequestEngine(translator, workers=1)
    made, steps, job = translator.graphs.step, [], []
    submitted = threading.Event()  # the worker may reach step 2 before submit() has returned here

    def spying(*args, **kwargs):
        step = made(*args, **kwargs)

        def counted(tokens, cache_indices, t, keep):
            steps.append(t)
            if t == 2:
                assert submitted.wait(timeout=30)
                job[0].cancel()  # as the front end does when the client leaves
            return step(tokens, cache_indices, t, keep)

        counted.buffers = step.buffers
        return counted

    monkeypatch.setattr(translator.graphs, "step", spying)
    job.append(engine.submit([TEXTS[7]] * 4, engine.check({"beam_size": 4, "max_decoding_length": 40})))
    submitted.set()
    with pytest.raises(Cancelled):
        job[0].future.result(timeout=60)
    assert steps == [0, 1, 2]  # step 3 was never run
    engine.close()


def test_a_stream_answer_cancels_its_job_however_it_ends():
    """Starlette never starts a stream's lines when the client is gone first: the answer itself cancels the job."""
    import asyncio

    from starlette.requests import ClientDisconnect

    from seq2onnx.serve.engine import Job
    from seq2onnx.serve.stream import Stream

    async def never_started():
        raise AssertionError("not reached")
        yield ""

    async def gone(message):
        raise OSError("the client left")

    async def nothing():
        return {"type": "http.disconnect"}

    job = Job()
    with pytest.raises(
        (OSError, ClientDisconnect)
    ):  # Starlette turns the send's OSError into ClientDisconnect
        asyncio.run(
            Stream(never_started(), job)({"type": "http", "asgi": {"spec_version": "2.4"}}, nothing, gone)
        )
    assert job.cancelled.is_set()
