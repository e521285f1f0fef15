"""One weights file per bundle (export/weights.py, runtime/weights.py): every weight stored once, loaded from
the file onnxruntime reads itself, the standard decoder loaded only when asked for, old bundles still read."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from seq2onnx.export.bundle import write_graphs
from seq2onnx.export.weights import TensorWriter
from seq2onnx.model.config import ModelConfig
from seq2onnx.model.transformer import Transformer
from seq2onnx.runtime import bundle as names
from seq2onnx.runtime.bundle import read_bundle, sha256
from seq2onnx.runtime.translator import Translator
from tiny import copy_bundle, scratch, tiny_bundle, tiny_run

TEXTS = ["the old cat sees two birds", "a dog", "five brave cats near the car"]
GRAPHS = (names.ENCODER_FILE, names.DECODER_FILE, names.FUSED_DECODER_FILE)


def _model(**overrides) -> Transformer:
    torch.manual_seed(0)
    cfg = dict(
        src_vocab_size=600,
        tgt_vocab_size=600,
        share_vocab=True,
        d_model=128,
        n_heads=4,
        d_ff=512,
        n_encoder_layers=2,
        n_decoder_layers=2,
        max_positions=64,
    )
    return Transformer(ModelConfig(**{**cfg, **overrides})).eval()


# T5's (issue 61): pre-LN, RMS norm, no biases, relative position bias, gated-GELU, heads x d_kv != d_model
T5 = dict(
    pre_norm=True,
    norm="rms",
    attention_scale=False,
    linear_bias=False,
    relative_buckets=32,
    gated=True,
    activation="gelu_tanh",
    d_kv=64,
    tie_embeddings=False,
    share_vocab=False,
)
SHAPES = {"tied": dict(tie_embeddings=True, share_vocab=True), "untied": dict(tie_embeddings=False), "t5": T5}


def _tensor_bytes(model: Transformer) -> int:
    """The model's distinct tensors: parameters (a tied table once) and the positional table (T5: none)."""
    positions = getattr(model, "positions", None)
    return sum(p.numel() * p.element_size() for p in model.parameters()) + (
        0 if positions is None else positions.numel() * 4
    )


def _ranges(path: Path) -> list[tuple[int, int]]:
    """(offset, length) in the weights file of a graph's external matrices (int4's codes: 3-D)."""
    proto = onnx.load(str(path), load_external_data=False)
    found = []
    for tensor in proto.graph.initializer:
        info = {e.key: e.value for e in tensor.external_data}
        if info and len(tensor.dims) >= 2:
            found.append((int(info["offset"]), int(info["length"])))
    return found


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.slow
def test_every_weight_is_stored_once(tmp_path, shape):
    """The three graphs and the weights file together are the model's tensors, not three copies of them.

    T5 (no biases) was 1.41x at MADLAD-3B shape: its standard decoder's linears were traced as
    MatMul(x, Transpose(W)), stored W^T, which the fused decoder's W could not share (docs/t5.md)."""
    model = _model(**SHAPES[shape])
    write_graphs(model, tmp_path, "float32", None, fused=True)
    on_disk = sum((tmp_path / name).stat().st_size for name in (*GRAPHS, names.WEIGHTS_FILE))
    assert on_disk <= 1.05 * _tensor_bytes(model), (on_disk, _tensor_bytes(model))
    # each graph points into the one file; none holds a large tensor of its own
    for name in GRAPHS:
        proto = onnx.load(str(tmp_path / name), load_external_data=False)
        inline = [t.name for t in proto.graph.initializer if len(t.raw_data) >= 1024]
        assert not inline, (name, inline)
        assert {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"} == {
            names.WEIGHTS_FILE
        }


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("quantize", [None, "int8", "int4"])
def test_the_two_decoders_share_every_matrix(tmp_path, shape, quantize):
    """Each matrix of decoder.onnx lies in weights.bin inside one of decoder_fused.onnx's (the same range, or
    Q, K, V as thirds of the stacked QKV): the standard decoder costs the bundle no weights of its own."""
    model = _model(**SHAPES[shape])
    write_graphs(model, tmp_path, "float32", quantize, fused=True)
    fused = _ranges(tmp_path / names.FUSED_DECODER_FILE)
    standard = _ranges(tmp_path / names.DECODER_FILE)
    assert len(standard) >= 4 * model.cfg.n_decoder_layers, standard  # the layers' matrices are external
    alone = [(at, n) for at, n in standard if not any(f <= at and at + n <= f + m for f, m in fused)]
    assert not alone, (alone, fused)


def test_tensors_are_matched_by_every_byte_and_their_type(tmp_path):
    """The exporter's dedupe compares bytes (a prefix, then 1 MiB pieces), not hashes: a tensor that differs
    only in its last piece, or has the same bytes under another type, is stored again; an equal one is not."""
    a = np.zeros(300_000, np.float32)  # 1.2 MB: two pieces
    late = a.copy()
    late[-1] = 1.0  # the same prefix and first piece
    with TensorWriter(tmp_path / "staging") as writer:
        offsets = [
            int({e.key: e.value for e in writer.tensor(name, array).external_data}["offset"])
            for name, array in (("a", a), ("late", late), ("again", a.copy()), ("as int32", a.view(np.int32)))
        ]
    assert offsets[0] == offsets[2] and len(set(offsets)) == 3, offsets
    assert (tmp_path / "staging").stat().st_size == offsets[3] + a.nbytes  # three tensors written


@pytest.mark.slow
def test_stored_weights_compute_what_the_graphs_did(tmp_path):
    """Moving the tensors into the file changes no value: each graph's initializers, read back through its
    references, are the model's own tensors (the fused Q, K, V are the three standard weights stacked)."""
    model = _model()
    write_graphs(model, tmp_path, "float32", None, fused=True)
    fused = onnx.load(str(tmp_path / names.FUSED_DECODER_FILE))  # external data followed
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in fused.graph.initializer}
    sa = model.decoder_layers[1].self_attn
    want = torch.cat([sa.w_q.weight, sa.w_k.weight, sa.w_v.weight]).detach().numpy()
    np.testing.assert_array_equal(inits["l1_w_qkv"], want)
    np.testing.assert_array_equal(inits["embed"], model.tgt_embed.weight.detach().numpy())


def _resident_bytes_of(path: Path) -> int:
    """Bytes of `path` resident in this process's memory maps (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5 and fields[0][0] in "0123456789abcdef":
            inside = len(fields) >= 6 and fields[-1] == str(path)
        elif inside and fields[:1] == ["Rss:"]:
            total += int(fields[1]) * 1024
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps")
@pytest.mark.slow
def test_a_tied_table_is_resident_once_after_the_decoder_is_loaded(tmp_path):
    """The tied projection multiplies by the table under a name of its own, pointing at the same bytes: the
    lookups read the table, the Gemm packs its copy at load and onnxruntime unmaps what it packed, so the
    table's file pages do not stay resident beside the packed copy (export/weights.py
    separate_packed_operands)."""
    import onnxruntime as ort

    from seq2onnx.runtime.weights import FOLDER_OPTION

    model = _model(src_vocab_size=30000, tgt_vocab_size=30000)  # a 15 MB table
    write_graphs(model, tmp_path, "float32", None, fused=True)
    table = model.tgt_embed.weight.numel() * 4
    for name in (names.DECODER_FILE, names.FUSED_DECODER_FILE):
        proto = onnx.load(str(tmp_path / name), load_external_data=False)
        inits = {t.name: {e.key: e.value for e in t.external_data} for t in proto.graph.initializer}
        products = [n for n in proto.graph.node if n.op_type in ("Gemm", "MatMul") and n.input[1] in inits]
        lookups = [n for n in proto.graph.node if n.op_type in ("Gather", "GatherND") and n.input[0] in inits]
        projection = next(n.input[1] for n in products if inits[n.input[1]]["length"] == str(table))
        looked_up = next(n.input[0] for n in lookups if inits[n.input[0]]["length"] == str(table))
        assert projection != looked_up, name  # two names ...
        assert inits[projection] == inits[looked_up], name  # ... for one tensor in the file
        options = ort.SessionOptions()
        options.add_session_config_entry(FOLDER_OPTION, str(tmp_path))
        session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
        resident = _resident_bytes_of(tmp_path / names.WEIGHTS_FILE)
        assert resident < 0.25 * table, (name, resident, table)
        del session


def _old_format(bundle: Path) -> Path:
    """The bundle as exported before the weights file: every graph holds its own tensors."""
    path = copy_bundle(bundle, "old-format")
    meta = json.loads((path / names.BUNDLE_JSON).read_text())
    for name in GRAPHS:
        proto = onnx.load(str(path / name))  # the external data read in
        for tensor in proto.graph.initializer:
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.DEFAULT
        onnx.save(proto, str(path / name))
    (path / names.WEIGHTS_FILE).unlink()
    del meta["files"]["weights"]
    for entry in meta["files"].values():
        entry["sha256"] = sha256(path / entry["path"])
        entry["size"] = (path / entry["path"]).stat().st_size
    (path / names.BUNDLE_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True))
    return path


def test_a_bundle_without_a_weights_file_loads_and_translates_the_same():
    bundle = tiny_bundle()
    old = _old_format(bundle)
    assert not (old / names.WEIGHTS_FILE).exists() and (old / names.DECODER_FILE).stat().st_size > 20_000
    new, before = Translator(bundle, device="cpu"), Translator(old, device="cpu")
    for beam in (1, 3):
        a = new.translate_batch(TEXTS, beam_size=beam, return_scores=True)
        b = before.translate_batch(TEXTS, beam_size=beam, return_scores=True)
        assert [r.token_ids for r in a] == [r.token_ids for r in b]
        np.testing.assert_allclose([r.scores for r in a], [r.scores for r in b], rtol=0, atol=1e-6)


def test_the_standard_decoder_is_loaded_when_first_asked_for():
    t = Translator(tiny_bundle(), device="cpu")
    assert t.decoder_variant == "fused"
    assert t.graphs._sessions._standard is None  # not loaded: most translators never need it
    plain = t.translate_batch(TEXTS, beam_size=2)
    with_attention = t.translate_batch(TEXTS, beam_size=2, return_attention=True)  # runs the standard decoder
    assert t.graphs._sessions._standard is not None
    assert [r.token_ids for r in plain] == [r.token_ids for r in with_attention]
    assert all(r.attention is not None and len(r.attention) for r in with_attention)


@pytest.mark.parametrize("beside", [True, False])
def test_a_load_copies_the_weights_file_once(monkeypatch, beside):
    """The encoder's and the decoder's sessions map one private copy (weights.py kept_linked): a session that
    linked its own once the first link was gone would copy the whole file again (8.8 s at NLLB-600M). Both
    ways a load makes them: the encoder's beside the decoder's (small bundles), or after it (large ones)."""
    from seq2onnx.runtime import private_copy, sessions

    monkeypatch.setattr(sessions, "BESIDE_MAX_BYTES", 1 << 30 if beside else 0)
    bundle = tiny_bundle()
    size, copies, copy_bytes = (bundle / names.WEIGHTS_FILE).stat().st_size, [], private_copy.copy_bytes
    monkeypatch.setattr(private_copy, "copy_bytes", lambda *a: copies.append(a[2]) or copy_bytes(*a))
    t = Translator(bundle, device="cpu")
    assert (t.decoder_variant, copies) == ("fused", [size])
    t.translate_batch(TEXTS, beam_size=2, return_attention=True)  # the standard decoder, loaded later: a copy
    assert copies == [size, size]


def test_a_weights_file_changed_after_the_export_is_refused():
    path = copy_bundle(tiny_bundle(), "swapped-weights")
    shutil.copyfile(tiny_bundle(quantize="int8") / names.WEIGHTS_FILE, path / names.WEIGHTS_FILE)
    from seq2onnx.runtime.bundle import BundleError

    # another size than bundle.json's files.weights.size: refused before a byte is read
    with pytest.raises(BundleError, match=r"weights\.bin: \d+ bytes, bundle\.json records \d+ \(size\)"):
        Translator(path, device="cpu")
    _edit_weights_entry(path, lambda entry: entry.pop("size"))  # as a bundle before the size: by its sha256
    with pytest.raises(
        BundleError, match=r"weights\.bin: sha256 differs from bundle\.json \(files\.weights\)"
    ):
        Translator(path, device="cpu")  # checked in a thread while the sessions are made
    with pytest.raises(
        BundleError, match=r"weights\.bin: sha256 differs from bundle\.json \(files\.weights\)"
    ):
        read_bundle(path)  # checked before read_bundle returns


def _edit_weights_entry(bundle: Path, edit) -> None:
    meta = json.loads((bundle / names.BUNDLE_JSON).read_text())
    edit(meta["files"]["weights"])
    (bundle / names.BUNDLE_JSON).write_text(json.dumps(meta))


def test_the_weights_crc32_is_zlibs_and_a_crc_fixed_edit_is_refused_by_the_sha256():
    import zlib

    from seq2onnx.runtime.bundle import BundleError

    path = copy_bundle(tiny_bundle(), "flipped-weights")
    entry = json.loads((path / names.BUNDLE_JSON).read_text())["files"]["weights"]
    data = bytearray((path / names.WEIGHTS_FILE).read_bytes())
    assert entry[names.WEIGHTS_CHECKSUM] == f"{zlib.crc32(data):08x}" and entry["sha256"] == sha256(
        path / names.WEIGHTS_FILE
    )
    read_bundle(path)  # intact: checked and read
    data[len(data) // 3] ^= 0x01  # one bit of one weight
    (path / names.WEIGHTS_FILE).write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"weights\.bin: sha256 differs from bundle\.json"):
        Translator(path, device="cpu")
    # the same edit with the CRC-32 fixed up (issue 60): the sha256 still refuses it, in both load paths
    _edit_weights_entry(
        path, lambda entry: entry.__setitem__(names.WEIGHTS_CHECKSUM, f"{zlib.crc32(data):08x}")
    )
    with pytest.raises(BundleError, match=r"weights\.bin: sha256 differs from bundle\.json"):
        Translator(path, device="cpu")
    with pytest.raises(BundleError, match=r"weights\.bin: sha256 differs from bundle\.json"):
        read_bundle(path)
    assert read_bundle(path, check_hashes=False).weights is not None  # the check is what refused it


@pytest.mark.parametrize("value", ["1234567", "ABCDEF01", 305419896, "0x123456"])
def test_a_malformed_weights_crc32_is_refused_by_name(value):
    from seq2onnx.runtime.bundle import BundleError

    path = copy_bundle(tiny_bundle(), "bad-crc32")
    _edit_weights_entry(path, lambda entry: entry.__setitem__(names.WEIGHTS_CHECKSUM, value))
    with pytest.raises(BundleError, match=r"files\.weights\.crc32 is .*expected 8 lowercase hex digits"):
        read_bundle(path)


_RSS_SCRIPT = """
import json, sys, psutil
from seq2onnx.runtime.translator import Translator
rss = lambda: psutil.Process().memory_info().rss
t = Translator(sys.argv[1], device="cpu", intra_threads=1)
t.translate_batch(["the cat sees a dog"] * 4, beam_size=2)
fused = rss()
t.translate_batch(["the cat sees a dog"] * 4, beam_size=2, return_attention=True)
print(json.dumps({"fused": fused, "both": rss()}))
"""


def _wide_bundle() -> Path:
    """A bundle of a random model whose decoder layers (50 MB) dwarf onnxruntime's own memory."""
    from safetensors.torch import save_file

    from seq2onnx.export.bundle import export_bundle
    from seq2onnx.model.checkpoint import _unique_state

    ckpt = scratch("wide") / "ckpt"
    shutil.copytree((tiny_run() / "last").resolve(), ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(d_model=512, n_heads=8, d_ff=2048, n_decoder_layers=3, n_encoder_layers=1)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**cfg))
    save_file(_unique_state(model), str(ckpt / "model.safetensors"))
    model.cfg.save(ckpt / "config.json")
    return export_bundle(ckpt, ckpt.parent / "bundle"), sum(
        p.numel() * 4 for p in model.decoder_layers.parameters()
    )


@pytest.mark.slow
def test_loading_the_second_decoder_costs_one_copy_of_its_weights():
    """The standard decoder beside the fused one adds about one copy of the decoder's weights (onnxruntime's
    packed layout, read from the weights file), not two (a copy of the file's bytes and the packed one)."""
    bundle, decoder_bytes = _wide_bundle()
    out = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, str(bundle)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    extra = rss["both"] - rss["fused"]
    assert 0.5 * decoder_bytes < extra < 1.4 * decoder_bytes, (extra / 1e6, decoder_bytes / 1e6)


@pytest.mark.slow
def test_an_int8_bundle_is_a_quarter_of_the_weights(tmp_path):
    """int8 layers and int8 embedding tables (per row), the tied projection multiplying by the same codes: the
    files hold about a quarter of the fp32 tensors (CTranslate2's int8 model is the anchor, about 0.26x)."""
    model = _model(
        d_model=256, d_ff=1024, src_vocab_size=2000, tgt_vocab_size=2000
    )  # graph protobufs ~5% of it
    write_graphs(model, tmp_path, "float32", "int8", fused=True)
    on_disk = sum((tmp_path / name).stat().st_size for name in (*GRAPHS, names.WEIGHTS_FILE))
    assert on_disk <= 0.30 * _tensor_bytes(model), (on_disk, _tensor_bytes(model))
    for name in GRAPHS:  # every embedding lookup reads int8 codes
        proto = onnx.load(str(tmp_path / name), load_external_data=False)
        dtypes = {t.name: t.data_type for t in proto.graph.initializer}
        tables = [
            n.input[0]
            for n in proto.graph.node
            if n.op_type in ("Gather", "GatherND")
            and n.input[0] in dtypes
            and len(next(t.dims for t in proto.graph.initializer if t.name == n.input[0])) == 2
        ]
        assert tables and all(dtypes[t] in (onnx.TensorProto.INT8, onnx.TensorProto.FLOAT) for t in tables)
        assert any(dtypes[t] == onnx.TensorProto.INT8 for t in tables), name
