"""The decoder graphs' top k (export/top_k.py): the two-stage graph equals plain TopK, ties, -inf and every k."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from seq2onnx.export.graphs import IR_VERSION, OPSET
from seq2onnx.export.top_k import MIN_VOCAB, block_size, top_k_nodes


def _session(vocab: int, two_stage: bool) -> ort.InferenceSession:
    nodes = (
        top_k_nodes("x", "k", "values", "ids", vocab)
        if two_stage
        else [helper.make_node("TopK", ["x", "k"], ["values", "ids"], axis=-1, largest=1, sorted=1)]
    )
    graph = helper.make_graph(
        nodes,
        "top_k",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", vocab]),
            helper.make_tensor_value_info("k", TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info("values", TensorProto.FLOAT, ["rows", "k"]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["rows", "k"]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _reference(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k largest, value descending then id ascending (the search's rule)."""
    ids = np.stack([np.lexsort((np.arange(x.shape[1]), -row))[:k] for row in x])
    return np.take_along_axis(x, ids, axis=1), ids


def test_block_size_splits_large_vocabularies_only():
    assert block_size(58101) == 181  # OPUS-MT's: 321 blocks of 181 ids
    assert block_size(8200) == 82
    assert block_size(3000) is None  # below MIN_VOCAB: plain TopK
    assert block_size(8209) is None  # a prime: no block size
    assert block_size(256206) is None  # NLLB's: 2 x 3 x 42701, no divisor in range
    assert MIN_VOCAB > 3000
    assert len(top_k_nodes("x", "k", "v", "i", 3000)) == 1
    assert [n.op_type for n in top_k_nodes("x", "k", "v", "i", 8200)].count("TopK") == 3


@pytest.mark.parametrize("rows", [1, 5])
def test_two_stages_equal_plain_top_k_with_ties_and_minus_infinity(rows):
    vocab = 8200  # 100 blocks of 82
    two, plain = _session(vocab, True), _session(vocab, False)
    rng = np.random.default_rng(rows)
    cases = {
        "distinct": rng.standard_normal((rows, vocab)).astype(np.float32),
        # the best value repeated across blocks, and inside one block: ties decide which ids come out
        "ties": np.round(rng.standard_normal((rows, vocab)), 1).astype(np.float32),
        # the best entries in one block alone, and a block of -inf (a suppressed range)
        "one block": np.where(np.arange(vocab) // 82 == 40, 5.0, rng.standard_normal((rows, vocab))).astype(
            np.float32
        ),
        "minus inf": np.where(np.arange(vocab) < 4000, -np.inf, rng.standard_normal((rows, vocab))).astype(
            np.float32
        ),
    }
    for name, x in cases.items():
        for k in (1, 2, 3, 9, 81, 99, 100, 101, 250, vocab):
            feed = {"x": x, "k": np.array([k], np.int64)}
            got, want = two.run(None, feed), plain.run(None, feed)
            ref_values, ref_ids = _reference(x, k)
            np.testing.assert_array_equal(got[1], want[1], err_msg=f"{name}, k={k}: ids")
            np.testing.assert_array_equal(got[0], want[0], err_msg=f"{name}, k={k}: values")
            np.testing.assert_array_equal(
                got[1], ref_ids, err_msg=f"{name}, k={k}: ids against the reference"
            )
            np.testing.assert_array_equal(got[0], ref_values, err_msg=f"{name}, k={k}")
