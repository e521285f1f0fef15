"""int8 bundles (export/quantize.py): per-row activation scales, so a sentence's result is its own.

onnxruntime's dynamic quantization (quantize_dynamic), the int8 of earlier bundles, scales
activations per tensor, i.e. over the whole batch: on the tiny model's generate_pairs(200, seed=777)
it gave the same greedy translation alone and in batches of 32 for 102 of the 200, and each of the
batch, row, encoder and agreement checks below fails on such a bundle (run by hand when this file
was written; the old exporter is gone). The codes are uint8 activations against int8 weights,
onnxruntime's fast u8 x s8 product; every session here takes the runtime's options for it
(runtime/u8s8_probe.py), so on an x86 CPU without VNNI these tests check the exact u8 x u8 path.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tiny import tiny_bundle

from seq2onnx.export.graph_layers import GROUPS, QuantizeError, id_tables, layer_group, linear_weights
from seq2onnx.export.quantize import SCHEME, quantize_model
from seq2onnx.model.corpus import generate_pairs
from seq2onnx.runtime import bundle as fmt
from seq2onnx.runtime.session_tuning import SessionTuning
from seq2onnx.runtime.translator import Translator
from seq2onnx.runtime.u8s8_probe import precision_entries

TEXTS = [s for s, _ in generate_pairs(48, seed=777)]  # 4 to 11 words: every batch mixes lengths
VARIANTS = (fmt.STANDARD, fmt.FUSED)


@pytest.fixture(scope="module")
def int8() -> Path:
    return tiny_bundle(quantize="int8")


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2  # as the runtime: rows may be split between threads
    options.log_severity_level = 3
    for key, value in precision_entries(ort).items():
        options.add_session_config_entry(key, value)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def test_int8_bundle_records_its_scheme_and_loads_with_hashes(int8):
    bundle = fmt.read_bundle(int8, check_hashes=True)
    meta = bundle.meta
    assert meta["quantization"] == "int8" and meta["variant"] == "int8" and meta["dtype"] == "float32"
    scheme = meta["quantization_scheme"]
    assert scheme["name"] == SCHEME["name"] and scheme["batch_invariant"] is True
    assert (scheme["activations"]["bits"], scheme["weights"]["bits"]) == (8, 8)
    assert scheme["graphs"]["decoder_fused"]["product"] == "MatMulIntegerToFloat"
    assert bundle.decoder_variants == [fmt.STANDARD, fmt.FUSED]
    # the standard graphs stay plain ONNX (hosts without com.microsoft run them); the fused one is contrib
    assert meta["graphs"]["encoder"]["domains"] == meta["graphs"]["decoder"]["domains"] == [""]
    assert fmt.MS_DOMAIN in meta["graphs"]["decoder_fused"]["domains"]
    for label, graph in scheme["graphs"].items():
        proto = onnx.load(str(bundle.file(label)))
        ops = {n.op_type for n in proto.graph.node}
        assert "DynamicQuantizeLinear" not in ops and not ops & {"Gemm", "FusedGemm"}, (label, ops)
        products = [n for n in proto.graph.node if n.op_type == graph["product"]]
        # the standard decoder's self-attention Q, K, V: one product each layer, by the fused QKV's codes
        stacked = [n for n in proto.graph.node if n.op_type == "Split" and n.name.endswith("/qkv/split")]
        assert bool(stacked) == (label == "decoder"), (label, [n.name for n in stacked])
        assert len(products) + 2 * len(stacked) == graph["linear_layers"] > 0, label
        # uint8 activations x int8 weights (onnxruntime's fast kernel): the activations' zero point a scalar
        # 128 (one for every row), the weights' one per output column
        inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
        # a tied output projection multiplies by the embedding's int8 codes, transposed by a node
        inits.update(
            {
                n.output[0]: inits[n.input[0]].T
                for n in proto.graph.node
                if n.op_type == "Transpose" and n.input[0] in inits
            }
        )
        for node in products:
            weights, a_zero, w_zero = (
                inits[node.input[i]] for i in ((1, 2, 3) if label != "decoder_fused" else (1, 4, 5))
            )
            assert a_zero.dtype == np.uint8 and a_zero.shape == () and a_zero == 128, node.name
            assert weights.dtype == w_zero.dtype == np.int8 and w_zero.shape == weights.shape[1:], node.name
        codes = [n for n in proto.graph.node if n.op_type == "QuantizeLinear"]
        assert codes and all(
            inits[n.input[1]] == np.float32(1 / 127) and inits[n.input[2]] == 128 for n in codes
        )
    t = Translator(int8, device="cpu", check_hashes=True)
    assert t.decoder_variant == fmt.FUSED and t.translate(TEXTS[0])


def _outputs(translator: Translator, texts: list[str], beam: int, batch: int) -> list[list[int]]:
    return [
        list(r.token_ids[0]) for r in translator.translate_batch(texts, beam_size=beam, max_batch_size=batch)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("beam", [1, 4])
def test_a_sentence_translates_alike_alone_and_in_any_batch(int8, variant, beam):
    t = Translator(int8, device="cpu", intra_threads=2, _tuning=SessionTuning(decoder=variant))
    alone = _outputs(t, TEXTS, beam, 1)
    assert _outputs(t, TEXTS, beam, len(TEXTS)) == alone  # one batch of every length
    assert _outputs(t, TEXTS[::-1], beam, 5)[::-1] == alone  # other neighbours, other batch sizes
    assert len({tuple(o) for o in alone}) > len(TEXTS) // 2  # real translations, not one repeated output


def _step_feeds(meta: dict, variant: str, rows: int, rng) -> dict:
    """One decoder step of `rows` sentences (greedy: a row each) at position 3, random cache and source."""
    cfg = meta["model"]
    layers, heads = cfg["n_decoder_layers"], cfg["n_heads"]
    head_dim = cfg["d_model"] // heads
    past = (
        3 if variant == fmt.STANDARD else 8
    )  # the fused graph's cache is one [rows, H, max_length, Dh] buffer
    feeds = {
        fmt.TOKENS: rng.integers(4, cfg["tgt_vocab_size"], (rows, 1)),
        fmt.TOP_K: np.array([4]),
        fmt.SRC_MASK: np.ones((rows, 6), bool),
    }
    if variant == fmt.STANDARD:
        feeds.update({fmt.STEP: np.array([3]), fmt.CACHE_INDICES: np.arange(rows)})
    else:
        feeds.update(
            {
                fmt.STEP: np.array([3], np.int32),
                fmt.BEAM_WIDTH: np.array([1], np.int32),
                fmt.CACHE_INDIRECTION: np.zeros((rows, 1, past), np.int32),
                fmt.ROW_START: np.zeros(rows, np.int32),
            }
        )
    for name in fmt.past_names(layers):
        feeds[name] = rng.standard_normal((rows, heads, past, head_dim)).astype(np.float32)
    for name in fmt.cross_names(layers):
        feeds[name] = rng.standard_normal((rows, heads, 6, head_dim)).astype(np.float32)
    return feeds


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_row_of_an_int8_decoder_step_is_computed_alone(int8, variant):
    """Bit for bit: a row's log-probabilities alone equal its row in a batch of 8 (same source padding)."""
    bundle = fmt.read_bundle(int8)
    session = _session(bundle.file(fmt.DECODER_LABELS[variant]))
    feeds = _step_feeds(bundle.meta, variant, 8, np.random.default_rng(0))
    batch = session.run([fmt.LOG_PROBS], feeds)[0]
    for r in range(8):
        row = {k: v if k in (fmt.STEP, fmt.TOP_K, fmt.BEAM_WIDTH) else v[r : r + 1] for k, v in feeds.items()}
        if variant == fmt.STANDARD:
            row[fmt.CACHE_INDICES] = np.array([0])
        assert np.array_equal(session.run([fmt.LOG_PROBS], row)[0][0], batch[r]), f"row {r}"


def test_encoder_rows_are_computed_alone(int8):
    bundle = fmt.read_bundle(int8)
    session = _session(bundle.file("encoder"))
    rng = np.random.default_rng(1)
    src = rng.integers(4, bundle.model["src_vocab_size"], (6, 9))
    lengths = np.array([9, 4, 7, 9, 2, 5])
    batch = session.run(None, {fmt.SRC_IDS: src, fmt.SRC_LENGTHS: lengths})[1:]
    for r in range(6):
        alone = session.run(None, {fmt.SRC_IDS: src[r : r + 1], fmt.SRC_LENGTHS: lengths[r : r + 1]})[1:]
        assert all(np.array_equal(a[0], b[r]) for a, b in zip(alone, batch)), f"sentence {r}"


def test_greedy_agreement_with_fp32_is_high(int8):
    texts = [s for s, _ in generate_pairs(200, seed=777)]
    fp32 = _outputs(Translator(tiny_bundle(), device="cpu"), texts, 1, 64)
    ours = _outputs(Translator(int8, device="cpu"), texts, 1, 64)
    # measured 188/200 (94%) on an AMD EPYC and 153-154/200 (77%) on an Intel Xeon with AVX-512: the tiny model
    # is trained on each machine (300 steps of its own float kernels), and so are its argmax margins, which int8
    # rounding crosses (the same 153 with onnxruntime's exact u8 x u8 kernel forced there). onnxruntime's
    # per-tensor dynamic quantization: 72/200 (one sentence at a time), far below the bound
    assert sum(a == b for a, b in zip(fp32, ours)) >= 0.75 * len(texts)


def _linear_graph(w: np.ndarray, b: np.ndarray, op: str) -> onnx.ModelProto:
    """x (M, K) -> op(x, W, b): Gemm with transB (as the traced decoder), or FusedGemm(Relu) (as the fused one)."""
    k, n = w.shape
    ms = op == "FusedGemm"
    node = helper.make_node(
        op,
        ["x", "w", "b"],
        ["y"],
        transB=1,
        domain="com.microsoft" if ms else "",
        **({"activation": "Relu"} if ms else {}),
    )
    graph = helper.make_graph(
        [node],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
        initializer=[
            numpy_helper.from_array(np.ascontiguousarray(w.T), "w"),
            numpy_helper.from_array(b, "b"),
        ],
    )
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    return helper.make_model(graph, opset_imports=opsets)


@pytest.mark.parametrize("op, contrib", [("Gemm", False), ("Gemm", True), ("FusedGemm", True)])
def test_linear_layer_zero_rows_extremes_and_accuracy(op, contrib):
    rng = np.random.default_rng(2)
    k, n = 64, 16
    w = rng.uniform(-0.5, 0.8, (k, n)).astype(np.float32)
    w[:, 0] = 0  # an all-zero column
    b = rng.standard_normal(n).astype(np.float32)
    proto = _linear_graph(w, b, op)
    assert quantize_model(proto, contrib=contrib) == 1
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    codes, zero, scale127 = (inits[f"w/rowq_t/{name}"] for name in ("codes", "zero_point", "scale"))
    assert codes.dtype == zero.dtype == np.int8 and np.all(
        codes[:, 0] == zero[0]
    )  # an all-zero column: its zero point
    assert codes.min() == -128 and codes.max() == 127  # the full 8-bit range
    dequantized = (codes.astype(np.float64) - zero) * scale127 * 127
    options = ort.SessionOptions()
    for key, value in precision_entries(ort).items():
        options.add_session_config_entry(key, value)
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    relu = (lambda v: np.maximum(v, 0)) if op == "FusedGemm" else (lambda v: v)
    x = np.stack([np.zeros(k), np.full(k, 2.5), np.full(k, -2.5), *rng.standard_normal((5, k))]).astype(
        np.float32
    )
    y = session.run(None, {"x": x})[0]
    # an all-zero row: codes of 0/0 times a row scale of 0 leave the bias, exactly
    assert np.array_equal(y[0], relu(b))
    # activation codes at their ends (255, 1) against weight codes -128..127: x / max|x| is exactly +-1, so
    # the integer product is exact (no u8s8 saturation: on x86 without VNNI through the runtime's session
    # option) and y is x times the dequantized weights, plus b
    np.testing.assert_allclose(y[1:3], relu(x[1:3] @ dequantized + b), rtol=1e-5, atol=1e-4)
    # other rows: int8's error, small against the outputs' scale
    want = relu(x[3:] @ w + b)
    assert np.abs(y[3:] - want).max() < 0.02 * np.abs(want).max()


def test_a_graph_without_linear_layers_is_refused():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "no_linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(QuantizeError, match="'no_linear' has no linear layer with constant fp32 weights"):
        quantize_model(helper.make_model(graph), contrib=False)


def _graph(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path))


def _linear_nodes(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The linear layers still fp32 (constant fp32 weights)."""
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    return [n for n in proto.graph.node if linear_weights(n, inits) is not None]


def _linear_groups(proto: onnx.ModelProto) -> list[str | None]:
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    ids = {n.input[0] for n in id_tables(proto.graph, inits)}  # the token embeddings' tables
    return [layer_group(n, ids) for n in proto.graph.node if linear_weights(n, inits) is not None]


def test_every_linear_layer_of_each_graph_has_a_keep_float_group():
    """keep_float (scripts/int4_quality.py) finds its layers by the exporter's names: a renamed layer
    fails here."""
    bundle = fmt.read_bundle(tiny_bundle())
    labels = ("encoder", "decoder", "decoder_fused")
    found = {label: _linear_groups(_graph(bundle.file(label))) for label in labels}
    assert all(g is not None for groups in found.values() for g in groups), found
    assert set(found["encoder"]) == {"encoder_self_attention", "encoder_feed_forward", "cross_attention"}
    assert (
        set(found["decoder"])
        == set(found["decoder_fused"])
        == {"decoder_self_attention", "cross_attention", "decoder_feed_forward", "embeddings"}
    )


@pytest.mark.parametrize("label, contrib", [("decoder", False), ("decoder_fused", True)])
def test_keep_float_leaves_one_group_fp32_and_the_default_is_unchanged(label, contrib):
    path = fmt.read_bundle(tiny_bundle()).file(label)
    default, explicit, kept = _graph(path), _graph(path), _graph(path)
    total = quantize_model(default, contrib=contrib)
    assert quantize_model(explicit, contrib=contrib, keep_float=frozenset()) == total
    assert explicit.SerializeToString() == default.SerializeToString()  # no group kept: as before the option
    n_ff = _linear_groups(_graph(path)).count("decoder_feed_forward")
    ff = frozenset({"decoder_feed_forward"})
    assert n_ff > 0 and quantize_model(kept, contrib=contrib, keep_float=ff) == total - n_ff
    left = _linear_nodes(kept)
    assert len(left) == n_ff and all(GROUPS["decoder_feed_forward"].search(n.name) for n in left)
    # embeddings fp32: the lookups read the fp32 table and the output projection multiplies by it
    tables = _graph(path)
    quantize_model(tables, contrib=contrib, keep_float=frozenset({"embeddings"}))
    assert not any("rowq8" in i.name for i in tables.graph.initializer)
    (projection,) = _linear_nodes(tables)
    assert GROUPS["embeddings"].search(projection.name)
    with pytest.raises(QuantizeError, match="unknown groups \\['attention'\\]"):
        quantize_model(_graph(path), contrib=contrib, keep_float=frozenset({"attention"}))
