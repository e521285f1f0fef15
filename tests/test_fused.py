"""The fused decoder step (export/fused.py) against the PyTorch model's decode_step and decoder.onnx, step by step."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest
import torch

from seq2onnx.export.fused import (
    BEAM_WIDTH,
    CACHE_INDIRECTION,
    build_fused_decoder,
    export_fused_decoder,
    fused_signature,
)
from onnx import numpy_helper

from seq2onnx.runtime import bundle as names

ATOL = 1e-4
MAX_LENGTH = 12  # cache buffer positions


def session(model) -> ort.InferenceSession:
    o = ort.SessionOptions()
    o.intra_op_num_threads = 1
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(
        build_fused_decoder(model).SerializeToString(), o, providers=["CPUExecutionProvider"]
    )


def source(model, lengths: list[int], seed: int = 1):
    """Padded source ids (B, S) with different lengths, its mask, and the cross keys/values."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), model.cfg.pad_id)
    for b, n in enumerate(lengths):
        src[b, :n] = torch.randint(4, model.cfg.src_vocab_size, (n,), generator=g)
    mask = src != model.cfg.pad_id
    with torch.no_grad():
        cross = model.cross_kv(model.encode(src, mask))
    return mask, cross


class FusedStep:
    """Drives the fused graph the way a runtime would: one cache buffer per layer and kind, bound
    as both past and present, so the kernel appends in place."""

    def __init__(self, model, mask, cross, beams: int):
        cfg = model.cfg
        self.sess, self.beams, self.batch = session(model), beams, mask.shape[0]
        rows = self.batch * beams
        shape = (rows, cfg.n_heads, MAX_LENGTH, cfg.head_dim)
        self.cache = [
            ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32))
            for _ in range(2 * cfg.n_decoder_layers)
        ]
        self.pointers = [v.data_ptr() for v in self.cache]
        self.indirection = np.zeros((self.batch, beams, MAX_LENGTH), np.int32)
        self.fixed = {
            names.SRC_MASK: mask.numpy(),
            names.TOP_K: np.array([3], np.int64),
            BEAM_WIDTH: np.array([beams], np.int32),
            names.ROW_START: np.zeros(rows, np.int32),
            **{
                n: t.numpy()
                for n, t in zip(names.cross_names(cfg.n_decoder_layers), [t for kv in cross for t in kv])
            },
        }
        self.past, self.present = (
            names.past_names(cfg.n_decoder_layers),
            names.present_names(cfg.n_decoder_layers),
        )

    def __call__(self, tokens: torch.Tensor, t: int) -> tuple[np.ndarray, np.ndarray]:
        b = self.sess.io_binding()
        feeds = {
            **self.fixed,
            names.TOKENS: tokens.numpy(),
            names.STEP: np.array([t], np.int32),
            CACHE_INDIRECTION: self.indirection,
        }
        for name, value in feeds.items():
            b.bind_cpu_input(name, value)
        for name, value in zip(self.past, self.cache):
            b.bind_ortvalue_input(name, value)
        for name in (names.LOG_PROBS, names.TOPK_IDS):
            b.bind_output(name, "cpu")
        for name, value in zip(self.present, self.cache):
            b.bind_ortvalue_output(name, value)
        self.sess.run_with_iobinding(b)
        out = b.get_outputs()
        assert [v.data_ptr() for v in out[2:]] == self.pointers  # updated in place, never reallocated
        return out[0].numpy(), out[1].numpy()

    def reorder(self, parents: np.ndarray, t: int) -> None:
        """Beam w of sentence b continues beam parents[b, w] after step t: positions <= t follow it."""
        new = self.indirection.copy()
        for b in range(self.batch):
            new[b, :, :t] = self.indirection[b, parents[b], :t]
            new[b, :, t] = parents[b]
        self.indirection = new


@pytest.mark.parametrize("pre_norm", [False, True])
@pytest.mark.parametrize("tie", [True, False])
def test_greedy_steps_match_pytorch(make_model, pre_norm, tie):
    model = make_model(seed=3, d_model=32, n_heads=2, pre_norm=pre_norm, tie_embeddings=tie)
    mask, cross = source(model, [7, 3, 5])
    fused = FusedStep(model, mask, cross, beams=1)
    rows = mask.shape[0]
    tokens = torch.full((rows, 1), model.cfg.decoder_start_id)
    past = model.empty_cache(rows)
    for t in range(10):
        with torch.no_grad():
            ref, past = model.decode_step(tokens, torch.tensor([t]), torch.arange(rows), past, cross, mask)
        log_probs, top = fused(tokens, t)
        err = np.abs(log_probs - ref.numpy()).max()
        assert err < ATOL, f"step {t}: max |fused - pytorch| = {err:.2e}"
        greedy = ref.argmax(-1)
        np.testing.assert_array_equal(top[:, 0], greedy.numpy(), err_msg=f"step {t}")
        tokens = greedy[:, None]


def _top_ids(log_probs: np.ndarray, k: int) -> np.ndarray:
    """Each row's k best ids, log-prob descending, ties to the lower id (the graphs' rule)."""
    return np.stack([np.lexsort((np.arange(row.size), -row))[:k] for row in log_probs])


@pytest.mark.slow
@pytest.mark.parametrize("vocab", [30, 8200])  # 8,200: the two-stage top k of export/top_k.py
def test_greedy_steps_match_the_standard_decoder_graph(make_model, tmp_path, vocab):
    """The same steps through decoder.onnx (standard opset, growing cache) and the fused graph; each graph's
    top k is exactly that of its own log-probabilities."""
    from seq2onnx.export.graphs import export_graphs

    model = make_model(seed=7, d_model=32, n_heads=2, tgt_vocab_size=vocab)
    _, path = export_graphs(model, tmp_path)
    standard = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    mask, cross = source(model, [4, 6])
    fused = FusedStep(model, mask, cross, beams=1)
    rows, n = mask.shape[0], model.cfg.n_decoder_layers
    feeds = {
        names.SRC_MASK: mask.numpy(),
        names.TOP_K: np.array([3], np.int64),
        names.CACHE_INDICES: np.arange(rows, dtype=np.int64),
        **{k: t.numpy() for k, t in zip(names.cross_names(n), [t for kv in cross for t in kv])},
        **{
            k: t.numpy()
            for k, t in zip(names.past_names(n), [t for kv in model.empty_cache(rows) for t in kv])
        },
    }
    tokens = np.full((rows, 1), model.cfg.decoder_start_id, np.int64)
    for t in range(8):
        out = standard.run(None, {**feeds, names.TOKENS: tokens, names.STEP: np.array([t], np.int64)})
        feeds.update(zip(names.past_names(n), out[1 : 1 + 2 * n]))
        log_probs, top = fused(torch.from_numpy(tokens), t)
        err = np.abs(log_probs - out[0]).max()
        assert err < ATOL, f"step {t}: max |fused - decoder.onnx| = {err:.2e}"
        np.testing.assert_array_equal(top, out[-1], err_msg=f"step {t}")
        np.testing.assert_array_equal(top, _top_ids(log_probs, 3), err_msg=f"step {t}: fused top k")
        np.testing.assert_array_equal(out[-1], _top_ids(out[0], 3), err_msg=f"step {t}: decoder.onnx top k")
        tokens = out[-1][:, :1]


@pytest.mark.parametrize("pre_norm", [False, True])
def test_beam_reorder_by_cache_indirection_matches_pytorch(make_model, pre_norm):
    """Random parents each step: PyTorch gathers its cache by rows, the fused graph only rewrites
    the indirection table, and every step's log-probabilities still agree."""
    model = make_model(seed=5, d_model=16, n_heads=2, pre_norm=pre_norm)
    beams, mask, cross = 3, *source(model, [2, 6])
    fused = FusedStep(model, mask, cross, beams=beams)
    batch, rows = mask.shape[0], mask.shape[0] * beams
    rng = np.random.default_rng(0)
    tokens = torch.full((rows, 1), model.cfg.decoder_start_id)
    past, cache_indices = model.empty_cache(rows), torch.arange(rows)
    moved = 0
    for t in range(9):
        with torch.no_grad():
            ref, past = model.decode_step(tokens, torch.tensor([t]), cache_indices, past, cross, mask)
        log_probs, _ = fused(tokens, t)
        err = np.abs(log_probs - ref.numpy()).max()
        assert err < ATOL, f"step {t}: max |fused - pytorch| = {err:.2e}"
        parents = rng.integers(0, beams, (batch, beams))
        moved += int((parents != np.arange(beams)).sum())
        cache_indices = torch.from_numpy((np.arange(batch)[:, None] * beams + parents).reshape(-1))
        fused.reorder(parents, t)
        # beam w takes its parent's w-th best token: beams differ, so a wrong parent shows
        ranked = ref.index_select(0, cache_indices).topk(beams, -1).indices
        tokens = ranked[torch.arange(rows), torch.arange(rows) % beams][:, None]
    assert moved > 0  # the test reordered beams at all


@pytest.mark.parametrize("beams", [1, 2])
def test_rows_that_begin_later_read_only_their_own_positions(make_model, beams):
    """Serving rounds share one cache buffer between rows that joined at different steps (row_start):
    a row that begins at position s, over a buffer whose positions < s hold another sentence's keys, gives
    what PyTorch gives for its sentence alone, its positions counted from s. With beam width 2 the rows go
    through the kernel's cache-indirection path, as a round with a beam search in it does."""
    model = make_model(seed=11, d_model=32, n_heads=2)
    cfg = model.cfg
    mask, cross = source(model, [5, 3])  # sentence 0 from position 0, sentence 1 joins at `late`
    late, rows = 4, 2 * beams
    sess = session(model)
    cache = [
        ort.OrtValue.ortvalue_from_numpy(
            np.random.default_rng(1)
            .standard_normal((rows, cfg.n_heads, MAX_LENGTH, cfg.head_dim))
            .astype(np.float32)
            * 30
        )
        for _ in range(2 * cfg.n_decoder_layers)
    ]
    indirection = np.tile(np.arange(beams, dtype=np.int32)[None, :, None], (rows // beams, 1, MAX_LENGTH))
    # row r holds sentence r // beams; a beam width of 2 pairs the rows (0, 1) and (2, 3)
    sentence = np.arange(rows) // beams
    start = np.where(sentence == 1, late, 0).astype(np.int32)
    row_mask = mask.numpy()[sentence]
    row_cross = [t.numpy()[sentence] for kv in cross for t in kv]
    tokens = torch.full((rows, 1), cfg.decoder_start_id)
    pasts = [model.empty_cache(1) for _ in range(2)]
    for slot in range(late + 6):
        b = sess.io_binding()
        feeds = {
            names.SRC_MASK: row_mask,
            names.TOP_K: np.array([1], np.int64),
            BEAM_WIDTH: np.array([beams], np.int32),
            CACHE_INDIRECTION: indirection,
            names.ROW_START: start,
            names.TOKENS: tokens.numpy(),
            names.STEP: np.array([slot], np.int32),
            **dict(zip(names.cross_names(cfg.n_decoder_layers), row_cross)),
        }
        for name, value in feeds.items():
            b.bind_cpu_input(name, np.ascontiguousarray(value))
        for past, present, value in zip(
            names.past_names(cfg.n_decoder_layers), names.present_names(cfg.n_decoder_layers), cache
        ):
            b.bind_ortvalue_input(past, value)
            b.bind_ortvalue_output(present, value)
        b.bind_output(names.LOG_PROBS, "cpu")
        b.bind_output(names.TOPK_IDS, "cpu")
        sess.run_with_iobinding(b)
        log_probs = b.get_outputs()[-2].numpy()  # the presents come first, in the order bound
        next_tokens = tokens.clone()
        for s in (0, 1):
            t = slot - (late if s else 0)
            if t < 0:
                continue  # the row is not in use yet: its outputs are unread
            rows_s = np.flatnonzero(sentence == s)
            with torch.no_grad():
                ref, pasts[s] = model.decode_step(
                    tokens[rows_s[:1]],
                    torch.tensor([t]),
                    torch.zeros(1, dtype=torch.long),
                    pasts[s],
                    [(k[s : s + 1], v[s : s + 1]) for k, v in cross],
                    mask[s : s + 1],
                )
            for r in rows_s:  # every beam of the sentence carries the same tokens here
                err = np.abs(log_probs[r] - ref.numpy()[0]).max()
                assert err < ATOL, f"sentence {s} row {r} step {t}: max |fused - pytorch| = {err:.2e}"
            next_tokens[rows_s] = int(ref.argmax(-1))
        tokens = next_tokens


def test_graph_is_fused(make_model):
    """One attention kernel per attention, one Add and one LayerNormalization per residual (not onnxruntime's
    slow SkipLayerNormalization: optimisation-notes row 87), each bias in its Gemm, no unfused attention."""
    model = make_model(d_model=16, n_heads=2, n_decoder_layers=3)
    graph = build_fused_decoder(model).graph
    ops = Counter(n.op_type for n in graph.node)
    assert ops["DecoderMaskedMultiHeadAttention"] == 3 and ops["MultiHeadAttention"] == 3
    assert ops["LayerNormalization"] == 9 and ops["SkipLayerNormalization"] == 0 and ops["FusedGemm"] == 3
    out_gemms = [n for n in graph.node if n.op_type == "Gemm" and n.name.endswith(("_out", "_ff_2"))]
    assert len(out_gemms) == 9 and all(len(n.input) == 3 for n in out_gemms)  # each bias in its Gemm
    assert ops["Softmax"] == ops["Transpose"] == 0 and ops["Concat"] == 1  # the one cross-query shape
    # 17 nodes once (embedding 5: the model's own table, scaled by a Mul, each row's position; the rows' own
    # past mask 6; cross-query shape 2, mask cast, generator, log-softmax, top-k) and 19 per layer, 4 of them
    # aliasing Reshapes (docs/fused-decoder.md): a change here is a design change
    assert sum(ops.values()) == 17 + 19 * 3, ops


def test_tied_table_and_weights_are_the_models_own_tensors(make_model):
    """The tied embedding and output projection are one initializer (Gather, then Gemm transB), and every
    linear weight is nn.Linear's (out, in) tensor: the bytes the standard decoder holds, so that the
    bundle's weights file stores them once (export/weights.py)."""
    model = make_model(d_model=16, n_heads=2)
    proto = build_fused_decoder(model)
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    table = model.tgt_embed.weight.detach().numpy()
    assert sum(a.shape == table.shape and np.array_equal(a, table) for a in inits.values()) == 1
    layer = model.decoder_layers[0]
    stacked = torch.cat([layer.self_attn.w_q.weight, layer.self_attn.w_k.weight, layer.self_attn.w_v.weight])
    np.testing.assert_array_equal(inits["l0_w_qkv"], stacked.detach().numpy())
    np.testing.assert_array_equal(inits["l0_ff_w2"], layer.feed_forward.w_2.weight.detach().numpy())
    gemms = [n for n in proto.graph.node if n.op_type in ("Gemm", "FusedGemm")]
    assert gemms and all(any(a.name == "transB" and a.i == 1 for a in n.attribute) for n in gemms)
    assert not [n for n in proto.graph.node if n.op_type == "MatMul"]


def test_fp16_model_is_refused(make_model):
    model = make_model().half()
    with pytest.raises(ValueError, match="fp32-only"):
        build_fused_decoder(model)


def test_step_beyond_the_cache_buffer_is_an_error(make_model):
    """The kernel checks past_sequence_length < max_length itself: no write past the buffer."""
    model = make_model(d_model=16, n_heads=2)
    mask, cross = source(model, [3, 2])
    fused = FusedStep(model, mask, cross, beams=1)
    tokens = torch.full((2, 1), model.cfg.decoder_start_id)
    fused(tokens, MAX_LENGTH - 1)  # the last position fits
    with pytest.raises(Exception, match="less than max_sequence_length"):
        fused(tokens, MAX_LENGTH)


def test_exported_file_has_the_signature(make_model, tmp_path):
    model = make_model(d_model=16, n_heads=2)
    sess = ort.InferenceSession(
        str(export_fused_decoder(model, tmp_path)), providers=["CPUExecutionProvider"]
    )
    sig = fused_signature(2, 2, 8, model.cfg.tgt_vocab_size)
    assert [i.name for i in sess.get_inputs()] == [s["name"] for s in sig["inputs"]]
    assert [o.name for o in sess.get_outputs()] == [s["name"] for s in sig["outputs"]]
    step = next(i for i in sess.get_inputs() if i.name == names.STEP)
    assert step.type == "tensor(int32)"  # differs from decoder.onnx's int64 on purpose
