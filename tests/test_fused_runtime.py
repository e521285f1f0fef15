"""The runtime's choice of decoder graph and the fused decoder's static step loop (runtime/fused_step.py).

Sequence parity of both decoders with PyTorch is tests/test_runtime.py's (parametrized over the
variants); here: which decoder a Translator drives and why, the fallback where the fused graph
cannot run, and that the static loop binds once, updates the cache in place and compacts the
buffers when sentences finish, with the standard decoder's results.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from seq2onnx.export.bundle import export_bundle
from seq2onnx.runtime import bundle as fmt
from seq2onnx.runtime import decoders, fused_graph, fused_step
from seq2onnx.runtime.binding import wanted_outputs
from seq2onnx.runtime.session_tuning import SessionTuning
from seq2onnx.runtime.beam import beam_search
from seq2onnx.runtime import plan as plan_module
from seq2onnx.runtime.translator import Translator
from tiny import scratch, tiny_bundle, tiny_run

TEXTS = [
    "the cat dances in the box",
    "a small bird sleeps",
    "the queen sees young mice with an old box",
    "a cat",
    "the small teacher found 15 sad children under the garden",
    "a black dog ate five brave cats near the car",
]


@pytest.fixture(scope="module")
def standard(bundle) -> Translator:
    return Translator(bundle, device="cpu", _tuning=SessionTuning(decoder="standard"))


def _rewrite_fused(bundle: Path, name: str, edit) -> Path:
    """A copy of the bundle whose decoder_fused.onnx is edited, with bundle.json's hash rewritten."""
    out = scratch(name) / "bundle"
    shutil.copytree(bundle, out)
    path = out / fmt.FUSED_DECODER_FILE
    proto = onnx.load(str(path))
    edit(proto)
    onnx.save(proto, str(path))
    meta = json.loads((out / fmt.BUNDLE_JSON).read_text())
    meta["files"]["decoder_fused"].update(sha256=fmt.sha256(path), size=path.stat().st_size)
    (out / fmt.BUNDLE_JSON).write_text(json.dumps(meta))
    return out


def test_auto_drives_the_fused_decoder_and_says_why(bundle, standard):
    t = Translator(bundle, device="cpu")
    assert t.decoder_variant == "fused" and "com.microsoft" in t.decoder_reason
    assert {i.name for i in t.decoder.get_inputs()} >= {fmt.CACHE_INDIRECTION, fmt.BEAM_WIDTH}
    assert standard.decoder_variant == "standard" and "SessionTuning" in standard.decoder_reason
    assert fmt.CACHE_INDICES in {i.name for i in standard.decoder.get_inputs()}
    with pytest.raises(ValueError, match="decoder='fast'; choose one of auto, standard, fused"):
        SessionTuning(decoder="fast")


@pytest.mark.slow
def test_bundle_without_the_fused_decoder_uses_the_standard_one():
    out = export_bundle(tiny_run(False, True) / "last", scratch("no-fused") / "bundle", decoder="standard")
    t = Translator(out, device="cpu")
    assert t.decoder_variant == "standard" and "no fused decoder" in t.decoder_reason
    assert t.translate(TEXTS[0])
    with pytest.raises(RuntimeError, match="decoder='fused'.*no fused decoder"):
        Translator(out, device="cpu", _tuning=SessionTuning(decoder="fused"))
    int8 = Translator(
        tiny_bundle(quantize="int8"), device="cpu"
    )  # int8 GEMMs around fp32 attention: it has one
    assert int8.decoder_variant == "fused", int8.decoder_reason


def test_a_fused_decoder_this_onnxruntime_cannot_run_falls_back_with_the_reason(bundle, standard):
    """As on a host whose onnxruntime lacks a com.microsoft kernel: the session cannot be created."""

    def unknown_kernel(proto):
        node = next(n for n in proto.graph.node if n.op_type == "DecoderMaskedMultiHeadAttention")
        node.op_type = "NoSuchKernelAnywhere"

    out = _rewrite_fused(bundle, "unrunnable", unknown_kernel)
    t = Translator(out, device="cpu")
    assert t.decoder_variant == "standard"
    assert "cannot run the fused decoder" in t.decoder_reason and "NoSuchKernelAnywhere" in t.decoder_reason
    assert [r.token_ids for r in t.translate_batch(TEXTS, beam_size=2)] == [
        r.token_ids for r in standard.translate_batch(TEXTS, beam_size=2)
    ]
    with pytest.raises(RuntimeError, match="cannot run the fused decoder"):
        Translator(out, device="cpu", _tuning=SessionTuning(decoder="fused"))


def test_cuda_keeps_the_standard_decoder(bundle):
    """The CUDA kernel wants another cache layout: pick_decoder never chooses fused off the CPU."""
    meta = fmt.read_bundle(bundle)
    loaded = []
    variant, _, why = decoders.pick_decoder(
        meta, "cuda", "auto", lambda label: loaded.append(label) or "session"
    )
    assert variant == "standard" and "CPU" in why and loaded == [fmt.DECODER_LABELS["standard"]]


def test_sampling_is_the_same_on_both_decoders(bundle, standard):
    fused = Translator(bundle, device="cpu")
    for kw in (
        dict(sampling_temperature=1.0, seed=3),
        dict(sampling_temperature=0.7, sampling_topk=5, seed=11),
        dict(sampling_temperature=1.2, sampling_topp=0.9, seed=5, num_hypotheses=3),
    ):
        a = fused.translate_batch(TEXTS, return_scores=True, **kw)
        b = standard.translate_batch(TEXTS, return_scores=True, **kw)
        assert [r.token_ids for r in a] == [r.token_ids for r in b], kw
        assert np.allclose([r.scores for r in a], [r.scores for r in b], rtol=0, atol=1e-4), kw


def test_static_loop_binds_once_updates_in_place_and_compacts(bundle, standard, monkeypatch):
    """A beam search over sentences that finish at different steps: the loop binds once plus once
    per batch change, every step's present_* is the memory of its past_* buffer, and the n-best
    equal the standard decoder's."""
    t = Translator(bundle, device="cpu")
    binds, batches, same_memory = [], [], []
    real_bind, real_call = fused_step.FusedStep._bind, fused_step.FusedStep.__call__

    def bind(self):
        binds.append(self.batch)
        real_bind(self)

    def call(self, tokens, cache_indices, step, keep):
        out = real_call(self, tokens, cache_indices, step, keep)
        batches.append(self.batch)
        # The kernel wrote this step's keys in place: position `step` of the bound buffer is filled
        # (at step 0 in each sentence's beam 0, the only row that later steps read it from).
        rows = slice(0, self.batch * self.width, self.width if step == 0 else 1)
        same_memory.append(bool(np.all(np.any(self._cache[0][rows, :, step] != 0, axis=-1))))
        return out

    monkeypatch.setattr(fused_step.FusedStep, "_bind", bind)
    monkeypatch.setattr(fused_step.FusedStep, "__call__", call)
    ids = [t.prepare_source(s)[0] for s in TEXTS]
    limits = t.spec.max_lengths(ids, t.search_options(beam_size=4))
    step = t.graphs.step(
        t.graphs.encode(*t.sources.pad(ids)),
        rows=len(ids),
        top_k=8,
        max_length=int(limits.max()),
        beam_width=4,
    )
    got = beam_search(
        step,
        len(ids),
        beam_size=4,
        start_id=t.start_id,
        eos_id=t.eos_id,
        max_lengths=limits,
        num_hypotheses=4,
        length_penalty=0.6,
    )
    shrank = sum(1 for a, b in zip(batches, batches[1:]) if b < a)
    assert shrank >= 2 and batches[-1] < len(TEXTS)  # sentences finished at different steps, rows compacted
    assert len(binds) == 1 + shrank  # bound once, then once per change of the batch: never per step
    assert all(same_memory) and len(same_memory) == len(batches) > 5
    want = standard.translate_batch(
        ids, beam_size=4, num_hypotheses=4, length_penalty=0.6, return_scores=True
    )
    for r, w in zip(got, want):
        assert [h[:-1] if h and h[-1] == t.eos_id else h for h in r.hypotheses] == w.token_ids
        assert np.allclose(r.scores, w.scores, rtol=0, atol=1e-4)


def test_beams_may_only_continue_their_own_sentence(bundle):
    t = Translator(bundle, device="cpu")
    ids = [t.prepare_source(s)[0] for s in TEXTS[:2]]
    step = t.graphs.step(
        t.graphs.encode(*t.sources.pad(ids)), rows=len(ids), top_k=4, max_length=5, beam_width=2
    )
    step(np.full((2, 1), t.start_id), np.arange(2), 0, None)
    with pytest.raises(ValueError, match="own sentence"):
        step(np.full((4, 1), 5), np.array([0, 0, 0, 0]), 1, None)  # sentence 1's beams continue sentence 0


@pytest.mark.parametrize(
    "keep", [[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [0, 1, 4, 5], [0, 2, 4], [5], [0], [2, 3]]
)
def test_compaction_moves_kept_rows_as_a_gather_would(keep, monkeypatch):
    """Block moves of runs of kept sentences leave every buffer as the plain gather of kept rows."""
    batch, width, t, rng = 6, 3, 4, np.random.default_rng(0)
    step = object.__new__(fused_step.FusedStep)
    step.width, step.batch = width, batch
    step._cache = [rng.standard_normal((batch * width, 2, 7, 5)).astype(np.float32) for _ in range(4)]
    step._cross = [rng.standard_normal((batch, 2, 3, 5)).astype(np.float32) for _ in range(2)]
    step._mask = rng.integers(0, 2, (batch, 3)).astype(bool)
    step._indirection = rng.integers(0, width, (batch, width, 7)).astype(np.int32)
    monkeypatch.setattr(step, "_bind", lambda: None)
    keep = np.array(keep)
    rows = (keep[:, None] * width + np.arange(width)).reshape(-1)
    want = (
        [c[rows, :, :t].copy() for c in step._cache],
        [c[keep].copy() for c in step._cross],
        step._mask[keep].copy(),
        step._indirection[keep, :, :t].copy(),
    )
    step._compact(keep, t)
    assert step.batch == keep.size
    for got, expected in zip(step._cache, want[0]):
        np.testing.assert_array_equal(got[: rows.size, :, :t], expected)
    for got, expected in zip(step._cross, want[1]):
        np.testing.assert_array_equal(got[: keep.size], expected)
    np.testing.assert_array_equal(step._mask[: keep.size], want[2])
    np.testing.assert_array_equal(step._indirection[: keep.size, :, :t], want[3])


@pytest.mark.parametrize("keep", [[1, 0], [], [0, 0], [-1], [6], [2, 7]])
def test_compaction_refuses_keep_that_is_not_ascending_sentences(keep):
    step = object.__new__(fused_step.FusedStep)
    step.width, step.batch = 1, 6
    with pytest.raises(ValueError, match="strictly ascending"):
        step(np.zeros((len(keep), 1), np.int64), np.arange(len(keep)), 3, np.array(keep, dtype=np.int64))


@pytest.mark.parametrize("writable", [False, True])
def test_compaction_writes_into_the_encoders_arrays_only_where_allowed(bundle, writable):
    """A writable step moves the encoder's rows in place (no copy of the cross keys and values); otherwise the
    encoder's arrays are left as they were (the attention pass reads them after the search). Both give the
    same n-best, scores included."""
    t = Translator(bundle, device="cpu")
    ids = [t.prepare_source(s)[0] for s in TEXTS]
    limits = t.spec.max_lengths(ids, t.search_options(beam_size=4))
    encoded = t.graphs.encode(*t.sources.pad(ids))
    hosts = [v if isinstance(v, np.ndarray) else v.numpy() for v in (encoded[0], *encoded[1])]
    before = [a.copy() for a in hosts]
    step = t.graphs.step(
        encoded, rows=len(ids), top_k=8, max_length=int(limits.max()), beam_width=4, writable=writable
    )
    options = dict(beam_size=4, start_id=t.start_id, eos_id=t.eos_id, max_lengths=limits, num_hypotheses=2)
    got = beam_search(step, len(ids), **options)
    assert step._compacted and step.batch < len(ids)  # sentences left: rows were moved
    assert np.shares_memory(step._cross[0], hosts[1]) == writable
    assert all(np.array_equal(a, b) for a, b in zip(hosts, before)) != writable
    want = t.translate_batch(ids, beam_size=4, num_hypotheses=2, return_scores=True)
    assert [[h[:-1] if h[-1:] == [t.eos_id] else h for h in r.hypotheses] for r in got] == [
        w.token_ids for w in want
    ]
    assert [r.scores for r in got] == [w.scores for w in want]


def test_step_buffers_are_reused_across_batches_with_the_standard_results(bundle, standard, monkeypatch):
    """Batches of a shape seen before take its spare FusedBuffers and their bindings (no reset between them:
    stale cache positions, indirection entries and encoder bindings must never be read), interleaved with
    other shapes and with compactions; every result equals the standard decoder's."""
    t = Translator(bundle, device="cpu")
    pool = t.graphs.decoder_graph.pool
    pool.spares = 8  # every shape of this test stays: a repeated shape must make nothing new
    made, bound = [], []
    real_init, real_binding = fused_graph.FusedBuffers.__init__, fused_graph.fused_binding

    def init(self, graph, capacity, positions, mapped=False):
        made.append((capacity, positions))
        real_init(self, graph, capacity, positions, mapped)

    def binding(*a, **kw):
        bound.append(1)
        return real_binding(*a, **kw)

    monkeypatch.setattr(fused_graph.FusedBuffers, "__init__", init)
    monkeypatch.setattr(fused_graph, "fused_binding", binding)
    runs = [
        dict(beam_size=1, max_batch_size=1),
        dict(beam_size=4, max_batch_size=6),
        dict(beam_size=1, max_batch_size=1),
        dict(beam_size=2, max_batch_size=3),
        dict(beam_size=4, max_batch_size=6),
        dict(beam_size=1, max_batch_size=1),
        dict(beam_size=2, max_batch_size=3),
    ]
    seen, new_per_run = set(), []
    for kw in runs:
        before = len(made), len(bound)
        got = t.translate_batch(TEXTS, return_scores=True, **kw)
        want = standard.translate_batch(TEXTS, return_scores=True, **kw)
        assert [r.token_ids for r in got] == [r.token_ids for r in want], kw
        assert np.allclose([r.scores for r in got], [r.scores for r in want], rtol=0, atol=1e-4), kw
        new_per_run.append((tuple(kw.values()) in seen, len(made) - before[0], len(bound) - before[1]))
        seen.add(tuple(kw.values()))
    # a repeated shape allocates nothing and binds nothing new (its bindings are kept with its buffers)
    assert all(n == b == 0 for repeated, n, b in new_per_run if repeated), new_per_run
    assert all(n > 0 and b > 0 for repeated, n, b in new_per_run if not repeated), new_per_run
    # a spare does not keep its last batch's encoder outputs alive
    encoded = set(t.graphs.decoder_graph.encoded_names)
    assert all(not set(held) & encoded for b in pool._spares for _, held, _ in b.bindings.values())


@pytest.mark.parametrize("beam", [1, 4])
def test_a_large_batchs_cache_grows_as_its_steps_need_with_the_same_results(bundle, beam, monkeypatch):
    """A batch too large to keep its buffers starts with few positions and grows them, over the rows still in
    use, as its longest live sentence needs: the same n-best and scores, to the bit, as buffers of every
    position from the start."""
    t = Translator(bundle, device="cpu")
    options = dict(beam_size=beam, num_hypotheses=min(beam, 2), return_scores=True)
    want = t.translate_batch(TEXTS, **options)
    pool = t.graphs.decoder_graph.pool
    monkeypatch.setattr(pool, "max_bytes", 0)  # every batch is large
    monkeypatch.setattr(pool, "grow_from", 2)
    pool._spares.clear()  # the first call's buffers, of every position
    grown, real = [], fused_step.FusedStep._grow

    def grow(self, step):
        before = (self.buffers.capacity, self.buffers.positions)
        real(self, step)
        grown.append((step, before, (self.buffers.capacity, self.buffers.positions)))

    monkeypatch.setattr(fused_step.FusedStep, "_grow", grow)
    got = t.translate_batch(TEXTS, **options)
    assert [r.token_ids for r in got] == [w.token_ids for w in want]
    assert [r.scores for r in got] == [w.scores for w in want]
    assert len(grown) >= 3 and grown[0][1][1] == 2  # 2 -> 3 -> 4 -> 6 ...
    assert all(after[1] > step >= before[1] for step, before, after in grown)
    assert any(after[0] < before[0] for _, before, after in grown)  # grown after sentences had left


def test_buffer_pool_keeps_small_buffers_only_and_after_a_normal_end(bundle, monkeypatch):
    t = Translator(bundle, device="cpu")
    pool = t.graphs.decoder_graph.pool
    t.translate_batch(TEXTS[:1], beam_size=1)
    assert len(pool._spares) == 1
    # a larger spare serves a shorter decoding; rounding makes similar lengths share one
    (kept,) = pool._spares
    rows, positions = kept.capacity, kept.positions
    assert positions % pool.position_quantum == 0
    assert pool.take(rows, positions - 3) is kept and pool._spares == []
    pool.give(kept)
    assert pool.take(rows, positions + 1) is None and pool.take(rows + 1, 1) is None
    # sampling and a stream read to its end give theirs back too
    pool._spares.clear()
    t.translate_batch(TEXTS[:1], sampling_temperature=1.0, seed=1)
    assert len(pool._spares) == 1
    pool._spares.clear()
    streamed = "".join(t.generate_tokens(TEXTS[0]))
    assert len(pool._spares) == 1
    assert streamed == t.translate(TEXTS[0], beam_size=1)
    # buffers over max_bytes are not kept, and they start at grow_from positions at most, not rounded up
    pool._spares.clear()
    monkeypatch.setattr(pool, "max_bytes", 1000)
    t.translate_batch(TEXTS, beam_size=2, max_batch_size=3)
    assert pool._spares == [] and pool.positions(6, 17, 4) == pool.grow_from == 16
    assert pool.positions(6, 9, 4) == 9
    # a search that raises gives nothing back (its buffers may be half bound)
    monkeypatch.setattr(pool, "max_bytes", 4 << 20)

    def failing(batch, **kw):  # a search program that raises after its first step
        yield np.full((batch, 1), t.start_id, np.int64), np.arange(batch), 0, None
        raise RuntimeError("stop")

    monkeypatch.setattr(plan_module, "greedy_program", failing)
    with pytest.raises(RuntimeError, match="stop"):
        t.translate_batch(TEXTS[:1], beam_size=1)
    assert pool._spares == []


@pytest.mark.parametrize("key", [(1, 32, 2), (8, 64, 9), (6, 17, None)])
def test_buffer_bytes_is_what_fused_buffers_allocate(bundle, key):
    """The pool rounds and keeps by buffer_bytes, computed before allocating: it must match the arrays once a
    search of that top_k bound its outputs."""
    t = Translator(bundle, device="cpu")
    graph = t.graphs.decoder_graph
    rows, positions, top_k = key
    buffers = graph.buffers(rows, positions)
    _, wanted = wanted_outputs([top_k])
    for name in wanted:
        buffers.output(name, top_k or 0)
    dims = graph.pool.dims
    assert fused_graph.buffer_bytes(*key, **dims) == buffers.nbytes
    arrays = [*buffers.cache, buffers.indirection, buffers.tokens, buffers.row_start]
    assert buffers.nbytes == sum(a.nbytes for a in arrays) + sum(a.nbytes for a in buffers._outputs.values())
