"""runtime/exact_int8.py: int8 weights flipped to uint8 in the weights' private copy, in place of onnxruntime's
rewrite, where this CPU's u8 x s8 kernel saturates.

The saturating CPU is simulated (sessions.precision_entries patched), so these run on any x86 CPU: there
onnxruntime's option rewrites the weights for its u8 x u8 kernel whatever the CPU, which is what the flip
must compute to the bit.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from tiny import tiny_bundle

from seq2onnx.model.corpus import generate_pairs
from seq2onnx.runtime import exact_int8, sessions, u8s8_probe
from seq2onnx.runtime.bundle import read_bundle
from seq2onnx.runtime.checks import read_graphs
from seq2onnx.runtime.onnx_info import ExternalTensor, GraphInfo
from seq2onnx.runtime.translator import Translator
from seq2onnx.runtime.weights import _checksum

TEXTS = [s for s, _ in generate_pairs(12, seed=4242)]
SATURATES = {u8s8_probe.PRECISION_KEY: "1"}


def _translate(translator: Translator, beam: int) -> list:
    results = translator.translate_batch(TEXTS, beam_size=beam, num_hypotheses=beam, return_scores=True)
    return [(r.token_ids, r.scores) for r in results]


@pytest.mark.parametrize("beam", [1, 3])
def test_flipped_weights_give_onnxruntimes_rewrite_to_the_bit(monkeypatch, beam):
    monkeypatch.setattr(sessions, "precision_entries", lambda _: SATURATES)
    path = tiny_bundle(quantize="int8")
    with monkeypatch.context() as m:
        m.setattr(exact_int8, "plan", lambda graphs: None)  # every weight left to onnxruntime's rewrite
        rewritten = Translator(path, device="cpu")
    flipped = Translator(path, device="cpu")
    got = _translate(flipped, beam)
    assert got == _translate(rewritten, beam)  # token ids and scores, exactly
    assert len({tuple(ids[0]) for ids, _ in got}) > len(TEXTS) // 2  # real translations

    def precision(session):
        try:
            return session.get_session_options().get_session_config_entry(u8s8_probe.PRECISION_KEY)
        except Exception:  # onnxruntime's own type: an entry never set
            return None

    # no int8 product is left to rewrite, the tied projection's included (its table's lookups dequantize
    # around a zero point, which flips with the codes)
    assert (precision(flipped.encoder), precision(flipped.decoder)) == (None, None)
    assert (precision(rewritten.encoder), precision(rewritten.decoder)) == ("1", "1")


def test_a_flipped_copy_still_hashes_as_checked_and_the_bundle_is_untouched(monkeypatch, tmp_path):
    path = tiny_bundle(quantize="int8")
    on_disk = hashlib.sha256((path / "weights.bin").read_bytes()).hexdigest()
    bundle = read_bundle(path)
    flips = exact_int8.plan(read_graphs(bundle))
    assert flips is not None and flips.ranges
    weights = bundle.weights
    weights.flip(flips)
    copy = np.fromfile(f"/proc/self/fd/{weights._file_fd}", np.uint8)
    original = np.fromfile(path / "weights.bin", np.uint8)
    changed = np.flatnonzero(copy != original)
    assert changed.size and np.all(copy[changed] ^ original[changed] == 0x80)  # the top bit, nothing else
    inside = np.zeros(original.size, bool)
    for offset, length in flips.ranges:
        inside[offset : offset + length] = True
    assert inside[changed].all()
    assert _checksum(weights._file_fd, "sha256", weights._read_as_checked) == on_disk == weights.sha256
    assert _checksum(weights._file_fd, "sha256") != on_disk  # the copy itself did change
    weights.copy_to(tmp_path / "w.bin")  # `seq2onnx web`'s copy: the file as checked
    assert hashlib.sha256((tmp_path / "w.bin").read_bytes()).hexdigest() == on_disk
    weights.flip(flips)  # once only: a second flip would undo the first
    assert _checksum(weights._file_fd, "sha256", weights._read_as_checked) == on_disk
    assert hashlib.sha256((path / "weights.bin").read_bytes()).hexdigest() == on_disk


def _tensor(name, offset, length, data_type=exact_int8.INT8):
    return ExternalTensor(name, data_type, (length,), {"offset": str(offset), "length": str(length)}, 7)


def _graph(nodes, external, inline=()):
    info = GraphInfo(nodes=nodes, external=external)
    info.inline_int8.update({name: (9, (20, 24)) for name in inline})
    return info


PRODUCT = ("MatMulInteger", ["x", "w", "xz", "wz"], ["y"])


def test_a_weight_and_its_zero_point_are_flipped_together_and_the_graph_is_then_complete():
    flips = exact_int8.plan({"encoder": _graph([PRODUCT], [_tensor("w", 0, 64), _tensor("wz", 64, 4)])})
    assert flips.ranges == ((0, 64), (64, 4)) and flips.complete == {"encoder": True}
    assert flips.entries("encoder", {**SATURATES, "other": "1"}) == {"other": "1"}
    # a zero point inside the graph is flipped there: its bytes and its type
    flips = exact_int8.plan({"encoder": _graph([PRODUCT], [_tensor("w", 0, 64)], inline=["wz"])})
    assert flips.ranges == ((0, 64),) and flips.inline == {"encoder": ((20, 24),)}
    data = bytes(range(30))
    patched = flips.graph("encoder", data)
    assert patched[7] == patched[9] == exact_int8.UINT8
    assert patched[20:24] == bytes(b ^ 0x80 for b in data[20:24]) and patched[24:] == data[24:]


@pytest.mark.parametrize(
    "graphs",
    [
        # the weight also read by a lookup (a tied embedding): neither it nor its zero point
        {
            "d": _graph(
                [PRODUCT, ("Gather", ["w", "ids"], ["e"])], [_tensor("w", 0, 64), _tensor("wz", 64, 4)]
            )
        },
        # no zero point: uint8 codes would be read around 0, not 128
        {"d": _graph([("MatMulInteger", ["x", "w", "xz"], ["y"])], [_tensor("w", 0, 64)])},
        # another graph reads the same bytes through a lookup: the file is shared, so in none
        {
            "e": _graph([PRODUCT], [_tensor("w", 0, 64), _tensor("wz", 64, 4)]),
            "d": _graph([("Gather", ["t", "ids"], ["e"])], [_tensor("t", 0, 64)]),
        },
        # bytes read as float32 by another tensor
        {"d": _graph([PRODUCT], [_tensor("w", 0, 64), _tensor("wz", 64, 4), _tensor("f", 32, 64, 1)])},
    ],
    ids=["read-by-a-lookup", "no-zero-point", "shared-with-another-graph", "overlapping-bytes"],
)
def test_nothing_is_flipped_where_a_use_would_read_it_otherwise(graphs):
    assert exact_int8.plan(graphs) is None


def _tied(lookup_reads):
    """A table looked up (then read by `lookup_reads`) and, transposed, a product's weights."""
    nodes = [
        ("GatherND", ["table", "ids"], ["codes"]),
        *lookup_reads,
        ("Transpose", ["table"], ["table_t"]),
        ("MatMulIntegerToFloat", ["x", "table_t", "s", "ts", "xz", "tz"], ["logits"]),
    ]
    return _graph(nodes, [_tensor("table", 0, 64), _tensor("tz", 64, 4)], inline=["lz"])


def test_a_tied_table_flips_where_its_lookups_read_it_around_a_zero_point():
    flips = exact_int8.plan({"d": _tied([("DequantizeLinear", ["codes", "one", "lz"], ["e"])])})
    assert flips.ranges == ((0, 64), (64, 4)) and flips.complete == {"d": True}
    assert flips.inline == {"d": ((20, 24),)}  # the lookup's zero point with it
    # a lookup that casts the codes as they are (bundles exported before): nothing flips
    assert exact_int8.plan({"d": _tied([("Cast", ["codes"], ["e"])])}) is None
    # the moved codes leaving the graph as an output: nothing flips
    leaving = _tied([("DequantizeLinear", ["codes", "one", "lz"], ["e"])])
    leaving.outputs.append(type("Out", (), {"name": "codes"})())
    assert exact_int8.plan({"d": leaving}) is None


def test_a_table_only_looked_up_is_left_as_it_is_unless_a_product_elsewhere_reads_its_bytes():
    encoder = _graph(
        [("Gather", ["src", "ids"], ["codes"]), ("DequantizeLinear", ["codes", "one", "lz"], ["e"])],
        [_tensor("src", 0, 64)],
        inline=["lz"],
    )
    assert exact_int8.plan({"encoder": encoder}) is None  # nothing would gain from it
    decoder = _tied([("DequantizeLinear", ["codes", "one", "lz"], ["e"])])
    flips = exact_int8.plan({"encoder": encoder, "decoder": decoder})  # the bytes are the decoder's table too
    assert flips.ranges == ((0, 64), (64, 4)) and flips.complete == {"encoder": True, "decoder": True}
    assert len(flips.type_bytes["encoder"]) == 2  # the table and its lookup's zero point


def test_a_flip_leaves_a_pair_whose_partner_cannot_be_flipped():
    # wz is also read by a Cast: w keeps int8 with it; the second product flips alone
    nodes = [PRODUCT, ("Cast", ["wz"], ["c"]), ("MatMulInteger", ["x", "v", "xz", "vz"], ["u"])]
    external = [_tensor("w", 0, 64), _tensor("wz", 64, 4), _tensor("v", 128, 64), _tensor("vz", 192, 4)]
    flips = exact_int8.plan({"d": _graph(nodes, external)})
    assert flips.ranges == ((128, 64), (192, 4)) and flips.complete == {"d": False}
    assert flips.entries("d", SATURATES) == SATURATES  # onnxruntime still rewrites the pair left
