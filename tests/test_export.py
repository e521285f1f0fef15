"""Export: the encoder and decoder-step ONNX graphs, and the bundle around them."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from helpers import cli_here
from tiny import scratch, tiny_bundle, tiny_run

from seq2onnx.export.bundle import DECODING_DEFAULTS, TOLERANCES, ExportError, export_bundle
from seq2onnx.export.graphs import IR_VERSION, OPSET
from seq2onnx.export.parity import test_sentences as split_sentences
from seq2onnx.model import checkpoint
from seq2onnx.model.checkpoint import CheckpointError
from seq2onnx.model.search import translate_ids
from seq2onnx.runtime.signature import graph_signature
from seq2onnx.runtime import bundle as fmt
from seq2onnx.runtime.translator import Translator

ATOL = 1e-4
GRAPHS = (fmt.ENCODER_FILE, fmt.DECODER_FILE)


def run_dir() -> Path:
    return tiny_run(False, True)


def fp32_bundle() -> Path:
    return tiny_bundle()


def load_model():
    model, tok, ckpt = checkpoint.load(run_dir() / "last")
    return model, tok, ckpt


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def proto(bundle: Path, name: str) -> onnx.ModelProto:
    return onnx.load(str(bundle / name))


def real_inputs(p: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {i.name for i in p.graph.initializer}
    return [i for i in p.graph.input if i.name not in initializers]


def all_ops(graph: onnx.GraphProto) -> Counter:
    """Op types of a graph and of every subgraph inside it (If/Loop bodies)."""
    ops: Counter = Counter()
    for node in graph.node:
        ops[node.op_type] += 1
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                ops.update(all_ops(attr.g))
            for g in attr.graphs:
                ops.update(all_ops(g))
    return ops


def dtype_name(value: onnx.ValueInfoProto) -> str:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)).name


def dims(value: onnx.ValueInfoProto) -> list:
    return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in value.type.tensor_type.shape.dim]


def max_abs(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.isfinite(a).all() and np.isfinite(b).all()
    return float(np.abs(a - b).max()) if a.size else 0.0


def run_decoder(dec: ort.InferenceSession, feed: dict, top_k: int = 1) -> dict[str, np.ndarray]:
    """Runs the decoder graph (plain session.run), feeding top_k where the graph takes it."""
    if fmt.TOP_K in {i.name for i in dec.get_inputs()}:
        feed = {**feed, fmt.TOP_K: np.array([top_k], np.int64)}
    names = [o.name for o in dec.get_outputs()]
    return dict(zip(names, dec.run(None, feed)))


# -- the graphs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GRAPHS)
def test_graph_is_valid_opset17_inference_graph(name):
    p = proto(fp32_bundle(), name)
    onnx.checker.check_model(p, full_check=True)
    onnx.shape_inference.infer_shapes(p, check_type=True, strict_mode=True)
    opsets = {o.domain: o.version for o in p.opset_import}
    assert opsets.get("", opsets.get("ai.onnx")) == OPSET == 17
    ops = all_ops(p.graph)
    assert not {"Dropout", "If", "Loop", "Scan"} & set(ops), ops
    # attention written out: MatMul + Softmax, not a fused Attention op
    assert ops["MatMul"] > 0 and ops["Softmax"] > 0, ops
    assert not {"Attention", "MultiHeadAttention"} & set(ops)


def test_fp32_bundle_has_the_standard_and_the_fused_decoder():
    """One standard-opset decoder (what every host can run) and the fused one, each described
    with its variant and the operator domains read from its file."""
    bundle = fp32_bundle()
    assert sorted(p.name for p in bundle.glob("*.onnx")) == sorted([*GRAPHS, fmt.FUSED_DECODER_FILE])
    meta = json.loads((bundle / fmt.BUNDLE_JSON).read_text())
    assert set(meta["graphs"]) == {"encoder", "decoder", "decoder_fused"}
    onnx_files = {k: e["path"] for k, e in meta["files"].items() if e["path"].endswith(".onnx")}
    assert onnx_files == {
        "encoder": fmt.ENCODER_FILE,
        "decoder": fmt.DECODER_FILE,
        "decoder_fused": fmt.FUSED_DECODER_FILE,
    }
    variants = {label: g["variant"] for label, g in meta["graphs"].items()}
    assert variants == {"encoder": "standard", "decoder": "standard", "decoder_fused": "fused"}
    for label, path in onnx_files.items():
        used = {"" if n.domain in ("", "ai.onnx") else n.domain for n in proto(bundle, path).graph.node}
        assert meta["graphs"][label]["domains"] == sorted(used), label
    assert meta["graphs"]["decoder"]["domains"] == meta["graphs"]["encoder"]["domains"] == [""]
    assert meta["graphs"]["decoder_fused"]["domains"] == ["", "com.microsoft"]


@pytest.mark.parametrize("quantize", [None, "int8", "int4"])
@pytest.mark.slow
def test_every_graph_has_opset_17s_ir_version(quantize):
    """Every graph, the fused decoder and int8's included, is written with opset 17's IR version:
    onnx's make_model would stamp its own newest (14 with onnx 1.23), which onnxruntime 1.31
    refuses to load at all (found on the GPU machine, whose image has 1.31)."""
    from tiny import tiny_bundle

    versions = {
        p.name: onnx.load(p, load_external_data=False).ir_version
        for p in tiny_bundle(quantize=quantize).glob("*.onnx")
    }
    assert fmt.FUSED_DECODER_FILE in versions or quantize, versions
    assert versions and set(versions.values()) == {IR_VERSION} == {8}, versions


@pytest.mark.slow
def test_decoder_standard_writes_no_fused_graph_and_a_bad_choice_is_named():
    out = export_bundle(run_dir() / "last", scratch("standard-only") / "bundle", decoder="standard")
    meta = fmt.read_bundle(out).meta
    assert sorted(p.name for p in out.glob("*.onnx")) == sorted(GRAPHS)
    assert "decoder_fused" not in meta["files"] and "decoder_fused" not in meta["graphs"]
    assert (
        meta["graphs"]["decoder"]
        == json.loads((fp32_bundle() / fmt.BUNDLE_JSON).read_text())["graphs"]["decoder"]
    )
    with pytest.raises(ExportError, match="--decoder fast: choose both or standard"):
        export_bundle(run_dir() / "last", scratch("bad-decoder") / "bundle", decoder="fast")


@pytest.mark.parametrize("label", ["encoder", "decoder", "decoder_fused"])
def test_graph_io_names_and_dtypes_equal_bundle_json(label):
    bundle = fp32_bundle()
    spec = json.loads((bundle / fmt.BUNDLE_JSON).read_text())["graphs"][label]
    p = proto(bundle, f"{label}.onnx")
    # hosts bind inputs and outputs by name: each name once, with bundle.json's dtype and rank
    for kind, values in (("inputs", real_inputs(p)), ("outputs", list(p.graph.output))):
        got = {v.name: (dtype_name(v), len(dims(v))) for v in values}
        want = {s["name"]: (s["dtype"], len(s["shape"])) for s in spec[kind]}
        assert len(got) == len(values) and len(want) == len(spec[kind]), kind
        assert got == want, kind


@pytest.mark.parametrize("label", ["encoder", "decoder", "decoder_fused"])
def test_graph_axes_equal_bundle_json(label):
    """A named axis in bundle.json is a dim_param of that name in the graph; a number is that size."""
    bundle = fp32_bundle()
    spec = json.loads((bundle / fmt.BUNDLE_JSON).read_text())["graphs"][label]
    p = proto(bundle, f"{label}.onnx")
    got = {v.name: dims(v) for v in [*real_inputs(p), *p.graph.output]}
    want = {s["name"]: s["shape"] for s in spec["inputs"] + spec["outputs"]}
    wrong = {name: (want[name], got[name]) for name in want if got[name] != want[name]}
    assert not wrong, f"bundle.json shape vs graph shape: {wrong}"


# -- dynamic sizes against PyTorch ----------------------------------------------------------------


def encode_both(model, enc, sources: list[list[int]]):
    """Pads sources; returns (torch cross, torch mask, ort cross, ort mask), compared already."""
    cfg = model.cfg
    lengths = np.array([len(s) for s in sources], np.int64)
    src = np.full((len(sources), int(lengths.max())), cfg.pad_id, np.int64)
    for i, s in enumerate(sources):
        src[i, : len(s)] = s
    mask_ort, *cross_ort = enc.run(None, {fmt.SRC_IDS: src, fmt.SRC_LENGTHS: lengths})
    src_t = torch.from_numpy(src)
    mask_t = src_t != cfg.pad_id
    with torch.no_grad():
        cross_t = model.cross_kv(model.encode(src_t, mask_t))
    assert mask_ort.dtype == np.bool_ and np.array_equal(mask_ort, mask_t.numpy())
    flat_t = [x for kv in cross_t for x in kv]
    assert len(cross_ort) == len(flat_t)
    for got, want in zip(cross_ort, flat_t):
        assert got.shape == (len(sources), cfg.n_heads, src.shape[1], cfg.head_dim)
        assert max_abs(got, want.numpy()) <= ATOL
    return cross_t, mask_t, cross_ort, mask_ort


class Both:
    """Steps the ONNX decoder and decode_step side by side, each fed its own previous cache."""

    def __init__(self, model, dec, cross_t, mask_t, cross_ort, mask_ort):
        self.model, self.dec, self.n = model, dec, model.cfg.n_decoder_layers
        self.cross_t, self.mask_t, self.cross_ort, self.mask_ort = cross_t, mask_t, cross_ort, mask_ort
        batch = mask_ort.shape[0]
        self.past_t = model.empty_cache(batch)
        self.past_ort = [np.zeros((batch, model.cfg.n_heads, 0, model.cfg.head_dim), np.float32)] * (
            2 * self.n
        )
        self.t = 0
        self.top_k = 5

    def keep_sentences(self, keep: list[int]) -> None:
        """Finished sentences leave: their cross keys/values and mask rows go."""
        idx = torch.tensor(keep)
        self.cross_t = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in self.cross_t]
        self.mask_t = self.mask_t.index_select(0, idx)
        self.cross_ort = [np.ascontiguousarray(c[keep]) for c in self.cross_ort]
        self.mask_ort = np.ascontiguousarray(self.mask_ort[keep])

    def step(self, tokens: np.ndarray, cache_indices: np.ndarray) -> tuple[np.ndarray, float]:
        tokens, cache_indices = tokens.astype(np.int64).reshape(-1, 1), cache_indices.astype(np.int64)
        rows, cfg = tokens.shape[0], self.model.cfg
        self.top_k = (1, 5, cfg.tgt_vocab_size)[self.t % 3]  # k is dynamic: 1 .. vocab
        out = run_decoder(
            self.dec,
            {
                fmt.TOKENS: tokens,
                fmt.STEP: np.array([self.t], np.int64),
                fmt.CACHE_INDICES: cache_indices,
                **dict(zip(fmt.past_names(self.n), self.past_ort)),
                **dict(zip(fmt.cross_names(self.n), self.cross_ort)),
                fmt.SRC_MASK: self.mask_ort,
            },
            top_k=self.top_k,
        )
        with torch.no_grad():
            lp_t, self.past_t = self.model.decode_step(
                torch.from_numpy(tokens),
                torch.tensor([self.t]),
                torch.from_numpy(cache_indices),
                self.past_t,
                self.cross_t,
                self.mask_t,
            )
        log_probs = out[fmt.LOG_PROBS]
        self.past_ort = [out[name] for name in fmt.present_names(self.n)]
        assert log_probs.dtype == np.float32 and log_probs.shape == (rows, cfg.tgt_vocab_size)
        if fmt.TOPK_IDS in out:  # the k best of each row, best first, ties to the lower id
            ids, values = out[fmt.TOPK_IDS], out[fmt.TOPK_LOG_PROBS]
            assert ids.shape == values.shape == (rows, self.top_k)
            order = np.argsort(-log_probs, axis=1, kind="stable")[:, : self.top_k]
            assert np.array_equal(ids, order)
            assert np.array_equal(values, np.take_along_axis(log_probs, order, axis=1))
        worst = max_abs(log_probs, lp_t.numpy())
        for got, want in zip(self.past_ort, [x for kv in self.past_t for x in kv]):
            assert got.shape == (rows, cfg.n_heads, self.t + 1, cfg.head_dim)
            worst = max(worst, max_abs(got, want.numpy()))
        self.t += 1
        return log_probs, worst


def sources(tok, n: int) -> list[list[int]]:
    _, _, ckpt = load_model()
    return [tok.encode_source(s) for s, _ in split_sentences(ckpt, n)]


def test_batch1_src1_first_step_then_past_7():
    model, tok, _ = load_model()
    enc, dec = session(fp32_bundle() / fmt.ENCODER_FILE), session(fp32_bundle() / fmt.DECODER_FILE)
    real = tok.encode_source("the cat")[0]
    assert real >= 4  # a real piece, not a special id
    both = Both(model, dec, *encode_both(model, enc, [[real]]))  # batch 1, src_len 1
    token = model.cfg.decoder_start_id
    worst = []
    for _ in range(9):  # past 0 (first step) .. past 8: 7 included
        log_probs, diff = both.step(np.array([[token]]), np.array([0]))
        worst.append(diff)
        log_probs[0, :4] = -np.inf  # keep feeding real pieces
        token = int(log_probs[0].argmax())
    assert max(worst) <= ATOL, worst


def test_beams_reordering_and_dropping_rows_with_padding():
    """batch 3 padded sources; rows = 3 x 3 beams; cache_indices reorder; a sentence leaves."""
    model, tok, _ = load_model()
    enc, dec = session(fp32_bundle() / fmt.ENCODER_FILE), session(fp32_bundle() / fmt.DECODER_FILE)
    srcs = sorted(sources(tok, 30), key=len)
    batch = [srcs[-1], srcs[0], srcs[len(srcs) // 2]]  # different lengths: padding
    assert len({len(s) for s in batch}) == 3 and max(len(s) for s in batch) not in (1, 5)
    both = Both(model, dec, *encode_both(model, enc, batch))
    rng = np.random.default_rng(0)
    vocab, beams = model.cfg.tgt_vocab_size, 3
    worst = []
    # first step: rows = batch, past 0, cache_indices = arange(batch)
    _, d = both.step(np.full(3, model.cfg.decoder_start_id), np.arange(3))
    worst.append(d)
    # every sentence's one row becomes 3 beams (rows 9, prev_rows 3)
    _, d = both.step(rng.integers(4, vocab, 9), np.repeat(np.arange(3), beams))
    worst.append(d)
    for _ in range(6):  # beams reordered within their sentence, past 2 .. 7
        idx = np.concatenate([s * beams + rng.integers(0, beams, beams) for s in range(3)])
        _, d = both.step(rng.integers(4, vocab, 9), idx)
        worst.append(d)
    # sentence 1 finishes: rows 6 continue rows of sentences 0 and 2 (prev_rows 9, batch 2)
    both.keep_sentences([0, 2])
    idx = np.array([2, 0, 1, 8, 8, 6])
    _, d = both.step(rng.integers(4, vocab, 6), idx)
    worst.append(d)
    assert both.t == 9
    assert max(worst) <= ATOL, worst


def test_padding_does_not_change_a_sentence():
    """A short sentence padded in a batch gets the log-probabilities it gets alone."""
    model, tok, _ = load_model()
    enc, dec = session(fp32_bundle() / fmt.ENCODER_FILE), session(fp32_bundle() / fmt.DECODER_FILE)
    srcs = sorted(sources(tok, 30), key=len)
    short, long_ = srcs[0], srcs[-1]
    assert len(short) < len(long_)
    start = model.cfg.decoder_start_id
    together = Both(model, dec, *encode_both(model, enc, [long_, short]))
    alone = Both(model, dec, *encode_both(model, enc, [short]))
    lp_together, _ = together.step(np.array([start, start]), np.arange(2))
    lp_alone, _ = alone.step(np.array([start]), np.arange(1))
    assert max_abs(lp_together[1:], lp_alone) <= ATOL


# -- bundle.json ----------------------------------------------------------------------------------


def test_bundle_json_describes_the_bundle():
    bundle = fp32_bundle()
    meta = json.loads((bundle / fmt.BUNDLE_JSON).read_text())
    model, _, ckpt = load_model()
    cfg = model.cfg
    assert meta["format"] == fmt.FORMAT == "seq2onnx-bundle"
    assert meta["format_version"] == fmt.FORMAT_VERSION == 1
    assert meta["model"] == cfg.to_dict() == json.loads((ckpt / checkpoint.CONFIG).read_text())
    assert meta["special_ids"] == {
        "pad": cfg.pad_id,
        "unk": cfg.unk_id,
        "bos": cfg.bos_id,
        "eos": cfg.eos_id,
        "decoder_start": cfg.decoder_start_id,
    }
    assert meta["max_positions"] == cfg.max_positions
    assert meta["dtype"] == "float32" and meta["quantization"] is None and meta["variant"] == "float32"
    assert meta["tolerances"] == TOLERANCES["float32"]
    assert meta["decoding"] == DECODING_DEFAULTS
    assert set(meta["decoding"]) == {
        "beam_size",
        "length_penalty",
        "max_length_a",
        "max_length_b",
        "min_length",
    }
    domains = {label: g.pop("domains") for label, g in meta["graphs"].items()}  # read from the files
    assert set(domains) == {"encoder", "decoder", "decoder_fused"}
    assert meta["graphs"] == graph_signature(
        cfg.n_decoder_layers, cfg.n_heads, cfg.head_dim, "float32", cfg.tgt_vocab_size, fused=True
    )
    for label in ("encoder", "decoder", "decoder_fused"):
        for value in meta["graphs"][label]["inputs"] + meta["graphs"][label]["outputs"]:
            assert set(value) == {"name", "dtype", "shape"} and value["shape"]
    producer = meta["producer"]
    assert producer["torch"] == torch.__version__
    assert producer["onnx"] == onnx.__version__
    assert producer["onnxruntime"] == ort.__version__
    assert producer["opset"] == OPSET
    assert producer["seq2onnx"] and producer["python"] == ".".join(map(str, sys.version_info[:3]))
    assert meta["source_checkpoint"] == ckpt.name


def test_bundle_json_hashes_are_the_files_hashes():
    bundle = fp32_bundle()
    meta = json.loads((bundle / fmt.BUNDLE_JSON).read_text())
    assert set(meta["files"]) == set(fmt.FILE_KEYS) | set(fmt.OPTIONAL_GRAPH_KEYS) | {"weights"}
    for key, entry in meta["files"].items():
        assert entry["path"] == {**fmt.FILE_KEYS, **fmt.OPTIONAL_FILE_KEYS}[key]
        assert entry["sha256"] == hashlib.sha256((bundle / entry["path"]).read_bytes()).hexdigest(), key
    # the tokenizers are the checkpoint's
    _, _, ckpt = load_model()
    assert (bundle / fmt.SOURCE_SPM).read_bytes() == (ckpt / "source.spm.model").read_bytes()
    assert (bundle / fmt.TARGET_SPM).read_bytes() == (ckpt / "target.spm.model").read_bytes()
    assert fmt.read_bundle(bundle).meta == meta


# -- writing the bundle ---------------------------------------------------------------------------


def leftovers(parent: Path, name: str) -> list[str]:
    return [
        p.name
        for p in parent.iterdir()
        if p.name.startswith(f".{name}.tmp-") or p.name.startswith(f".{name}.old-")
    ]


@pytest.mark.slow
def test_export_refuses_to_overwrite_without_force_and_replaces_with_it():
    out = scratch("overwrite") / "bundle"
    export_bundle(run_dir() / "last", out)
    (out / "marker").write_text("old")
    with pytest.raises(ExportError, match="--force"):
        export_bundle(run_dir() / "last", out)
    assert (out / "marker").exists()  # untouched
    assert export_bundle(run_dir() / "last", out, force=True) == out
    assert not (out / "marker").exists()
    fmt.read_bundle(out)
    assert leftovers(out.parent, out.name) == []


def test_export_to_an_unwritable_place_names_it():
    parent = scratch("unwritable")
    blocker = parent / "a-file"
    blocker.write_text("not a directory")
    for out in (blocker / "bundle", blocker / "deeper" / "bundle"):
        with pytest.raises(ExportError) as info:
            export_bundle(run_dir() / "last", out)
        assert str(out) in str(info.value)
    assert sorted(p.name for p in parent.iterdir()) == ["a-file"]


@pytest.mark.slow
def test_failed_export_leaves_no_temporary_directory(monkeypatch):
    import seq2onnx.export.bundle as export_module

    def broken(directory):
        raise RuntimeError("validation failed on purpose")

    parent = scratch("failed")
    monkeypatch.setattr(export_module, "validate", broken)
    with pytest.raises(RuntimeError, match="on purpose"):
        export_bundle(run_dir() / "last", parent / "bundle")
    assert list(parent.iterdir()) == []
    # a failed --force export keeps the old bundle whole
    monkeypatch.undo()
    export_bundle(run_dir() / "last", parent / "bundle")
    before = {p.name: p.read_bytes() for p in (parent / "bundle").iterdir()}
    monkeypatch.setattr(export_module, "validate", broken)
    with pytest.raises(RuntimeError, match="on purpose"):
        export_bundle(run_dir() / "last", parent / "bundle", force=True)
    assert {p.name: p.read_bytes() for p in (parent / "bundle").iterdir()} == before
    assert leftovers(parent, "bundle") == []


# -- bad checkpoints ------------------------------------------------------------------------------


def checkpoint_copy(name: str) -> Path:
    copy = scratch(name) / "ckpt"
    shutil.copytree((run_dir() / "last").resolve(), copy)
    return copy


def bad_checkpoints() -> dict[str, tuple[Path, str]]:
    missing = checkpoint_copy("missing")
    (missing / checkpoint.WEIGHTS).unlink()
    shapes = checkpoint_copy("shapes")
    config = json.loads((shapes / checkpoint.CONFIG).read_text())
    config["d_ff"] *= 2
    (shapes / checkpoint.CONFIG).write_text(json.dumps(config))
    damaged = checkpoint_copy("damaged")
    (damaged / checkpoint.WEIGHTS).write_bytes((damaged / checkpoint.WEIGHTS).read_bytes()[:100])
    not_ckpt = scratch("notckpt")
    (not_ckpt / "notes.txt").write_text("hello")
    return {
        "missing weights": (missing, r"missing model\.safetensors"),
        "mismatched shapes": (
            shapes,
            r"model\.safetensors does not match .*config\.json.*w_1\.weight has shape",
        ),
        "damaged weights": (damaged, r"model\.safetensors: cannot be read"),
        "not a checkpoint": (not_ckpt, r"not a complete checkpoint, missing config\.json"),
        "does not exist": (not_ckpt / "nowhere", r"nowhere: no such checkpoint directory"),
    }


def test_bad_checkpoints_raise_checkpoint_error_naming_the_problem():
    out_parent = scratch("bad-out")
    for label, (path, pattern) in bad_checkpoints().items():
        with pytest.raises(CheckpointError, match=pattern):
            export_bundle(path, out_parent / "bundle")
        assert list(out_parent.iterdir()) == [], label  # nothing written, no temporary left


@pytest.mark.slow
def test_cli_export_errors_are_one_line():
    cases = bad_checkpoints()
    out = scratch("cli-out") / "bundle"
    for label in ("missing weights", "does not exist"):
        path, pattern = cases[label]
        r = cli_here("export", str(path), str(out))
        assert r.returncode == 1, (label, r.stderr)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, r.stderr
        assert lines[0].startswith("seq2onnx export: error:") and "Traceback" not in r.stderr
        assert re.search(pattern, lines[0]), lines[0]
        assert not out.exists()
    existing = fp32_bundle()
    r = cli_here("export", str(run_dir()), str(existing))
    assert r.returncode == 1
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("seq2onnx export: error:") and "--force" in lines[0], (
        r.stderr
    )


@pytest.mark.slow
def test_cli_export_decoder_choice():
    out = scratch("cli-decoder") / "bundle"
    r = cli_here("export", str(run_dir()), str(out), "--decoder", "standard")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.glob("*.onnx")) == sorted(GRAPHS)
    r = cli_here("export", str(run_dir()), str(out), "--force")  # the default: both decoders
    assert r.returncode == 0, r.stderr
    assert fmt.read_bundle(out).decoder_variants == ["standard", "fused"]
    r = cli_here("export", str(run_dir()), str(out), "--force", "--decoder", "fused-only")
    assert r.returncode != 0 and "--decoder" in r.stderr


# -- int8 and fp16 --------------------------------------------------------------------------------


@pytest.mark.slow
def test_int8_export_is_quantized():
    bundle = tiny_bundle(False, True, "int8")
    meta = fmt.read_bundle(bundle).meta
    assert meta["quantization"] == "int8" and meta["variant"] == "int8" and meta["dtype"] == "float32"
    assert meta["tolerances"] == TOLERANCES["int8"]
    for name in GRAPHS:
        p = proto(bundle, name)
        onnx.checker.check_model(p, full_check=True)
        ops = all_ops(p.graph)
        # per-row activation scales (export/quantize.py), not onnxruntime's per-tensor DynamicQuantizeLinear
        assert (
            ops["MatMulInteger"] > 0 and ops["QuantizeLinear"] > 0 and "DynamicQuantizeLinear" not in ops
        ), ops
        assert not {"Dropout", "If"} & set(ops)
    # the fused decoder quantizes its GEMMs (MatMulIntegerToFloat) around the fp32 attention kernels
    assert fmt.read_bundle(bundle).decoder_variants == ["standard", "fused"]
    fused_ops = all_ops(proto(bundle, fmt.FUSED_DECODER_FILE).graph)
    assert fused_ops["MatMulIntegerToFloat"] > 0 and fused_ops["DecoderMaskedMultiHeadAttention"] > 0, (
        fused_ops
    )
    assert meta["quantization_scheme"]["name"], meta["quantization_scheme"]
    # the graphs' interface is unchanged: float32 cache, bundle.json's names
    dec = proto(bundle, fmt.DECODER_FILE)
    assert {dtype_name(v) for v in real_inputs(dec) if v.name.startswith("past_")} == {"float32"}


@pytest.fixture(scope="module")
def fp16_bundle() -> Path:
    return export_bundle(run_dir() / "last", scratch("fp16") / "bundle", dtype="float16")


def float32_inputs(p: onnx.ModelProto, ops: tuple[str, ...]) -> dict[str, list[str]]:
    """Element types of the data input of every node of the given op types."""
    inferred = onnx.shape_inference.infer_shapes(p, check_type=True, strict_mode=True)
    types = {
        v.name: dtype_name(v)
        for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    }
    types.update(
        {
            i.name: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(i.data_type)).name
            for i in p.graph.initializer
        }
    )
    found: dict[str, list[str]] = {}
    for node in p.graph.node:
        if node.op_type in ops:
            found.setdefault(node.op_type, []).append(types.get(node.input[0], "?"))
    return found


@pytest.mark.slow
def test_fp16_export_keeps_norms_and_softmax_in_float32(fp16_bundle):
    meta = fmt.read_bundle(fp16_bundle).meta
    assert meta["dtype"] == "float16" and meta["variant"] == "float16" and meta["quantization"] is None
    cfg = meta["model"]
    assert {label: g.pop("domains") for label, g in meta["graphs"].items()} == {
        "encoder": [""],
        "decoder": [""],
    }
    assert meta["graphs"] == graph_signature(
        cfg["n_decoder_layers"],
        cfg["n_heads"],
        cfg["d_model"] // cfg["n_heads"],
        "float16",
        cfg["tgt_vocab_size"],
    )
    enc, dec = proto(fp16_bundle, fmt.ENCODER_FILE), proto(fp16_bundle, fmt.DECODER_FILE)
    for p in (enc, dec):
        onnx.checker.check_model(p, full_check=True)
    dec_in = {v.name: dtype_name(v) for v in real_inputs(dec)}
    dec_out = {v.name: dtype_name(v) for v in dec.graph.output}
    n = cfg["n_decoder_layers"]
    assert {dec_in[x] for x in fmt.past_names(n) + fmt.cross_names(n)} == {"float16"}
    assert {dec_out[x] for x in fmt.present_names(n)} == {"float16"}
    assert dec_out[fmt.LOG_PROBS] == "float32"
    assert {dtype_name(v) for v in enc.graph.output if v.name != fmt.SRC_MASK} == {"float16"}
    for label, p in (("encoder", enc), ("decoder", dec)):
        found = float32_inputs(p, ("LayerNormalization", "ReduceMean", "Softmax", "LogSoftmax"))
        assert found.get("Softmax") and (found.get("LayerNormalization") or found.get("ReduceMean")), (
            label,
            found,
        )
        assert all(t == "float32" for types in found.values() for t in types), (label, found)
        assert all_ops(p.graph)["Cast"] > 0


@pytest.mark.slow
def test_fp16_decoder_runs_on_cpu_and_agrees_with_fp32_torch(fp16_bundle):
    model, tok, ckpt = load_model()
    srcs = [tok.encode_source(s) for s, _ in split_sentences(ckpt, 20)]
    assert len(srcs) == 20
    # onnxruntime's CPU provider runs these fp16 graphs (it falls back to fp32 kernels where it has
    # no fp16 one); an error here is a broken export, and fails the test.
    translator = Translator(fp16_bundle, device="cpu")
    got = translator.translate_batch(srcs, beam_size=1)
    # one decoder step by hand: finite fp32 log-probabilities
    enc, dec = session(fp16_bundle / fmt.ENCODER_FILE), session(fp16_bundle / fmt.DECODER_FILE)
    n = model.cfg.n_decoder_layers
    mask, *cross = enc.run(
        None, {fmt.SRC_IDS: np.array([srcs[0]], np.int64), fmt.SRC_LENGTHS: np.array([len(srcs[0])])}
    )
    empty = np.zeros((1, model.cfg.n_heads, 0, model.cfg.head_dim), np.float16)
    out = run_decoder(
        dec,
        {
            fmt.TOKENS: np.array([[model.cfg.decoder_start_id]], np.int64),
            fmt.STEP: np.array([0], np.int64),
            fmt.CACHE_INDICES: np.array([0], np.int64),
            **{x: empty for x in fmt.past_names(n)},
            **dict(zip(fmt.cross_names(n), cross)),
            fmt.SRC_MASK: mask,
        },
    )
    log_probs = out[fmt.LOG_PROBS]
    assert log_probs.dtype == np.float32 and np.isfinite(log_probs).all()
    want = [h[0].tokens for h in translate_ids(model, srcs, beam_size=1)]
    want = [w[:-1] if w and w[-1] == model.cfg.eos_id else w for w in want]
    agree = sum(g.token_ids[0] == w for g, w in zip(got, want)) / len(srcs)
    assert agree >= 0.8, agree


@pytest.mark.parametrize("quantize", [None, "int8", "int4"])
@pytest.mark.slow
def test_export_streams_the_weights_no_graph_is_held_with_them(tmp_path, monkeypatch, quantize):
    """No graph is loaded or saved with its weights inside (an NLLB-3.3B graph is past protobuf's 2 GiB,
    and every such copy is a copy of the model in memory): the tensors go to a staging file as they are
    made, and the weights file holds each once; the staging file is gone at the end."""
    from seq2onnx.export.bundle import write_graphs
    from seq2onnx.export.weights import STAGING_FILE
    from seq2onnx.model.config import ModelConfig
    from seq2onnx.model.transformer import Transformer
    from seq2onnx.runtime import bundle as fmt

    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(
            src_vocab_size=3000,
            tgt_vocab_size=3000,
            share_vocab=True,
            d_model=64,
            n_heads=4,
            d_ff=128,
            n_encoder_layers=2,
            n_decoder_layers=2,
        )
    ).eval()
    weights = sum(p.numel() * 4 for p in model.parameters())  # 1.1 MB, three quarters of it the table
    sizes = []
    real_save, real_load = onnx.save_model, onnx.load_model

    def save(proto, *args, **kwargs):
        if isinstance(proto, onnx.ModelProto):
            sizes.append(proto.ByteSize())
        return real_save(proto, *args, **kwargs)

    def load(*args, **kwargs):
        proto = real_load(*args, **kwargs)
        sizes.append(proto.ByteSize())
        return proto

    for module in (onnx,):
        monkeypatch.setattr(module, "save", save)
        monkeypatch.setattr(module, "save_model", save)
        monkeypatch.setattr(module, "load", load)
        monkeypatch.setattr(module, "load_model", load)
    write_graphs(model, tmp_path, "float32", quantize, True)
    assert sizes and max(sizes) < 200_000 < weights / 5, (max(sizes), weights)
    assert not (tmp_path / STAGING_FILE).exists()
    stored = (tmp_path / fmt.WEIGHTS_FILE).stat().st_size
    assert stored <= 1.05 * weights if quantize is None else stored <= 0.35 * weights, (stored, weights)


def test_a_tied_table_is_stored_once_in_the_decoder(tmp_path):
    """The tied output projection is traced as Gemm(transB) on the embedding's own initializer: no
    transposed copy (NLLB's would pass 2 GiB, and the weights file could not share it), and the
    log-probabilities of the model."""
    import onnx
    import onnxruntime as ort
    import torch

    import seq2onnx.export.graphs as graphs
    from seq2onnx.model.config import ModelConfig
    from seq2onnx.model.transformer import Transformer

    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(
            src_vocab_size=300,
            tgt_vocab_size=300,
            share_vocab=True,
            d_model=16,
            n_heads=2,
            d_ff=32,
            n_encoder_layers=1,
            n_decoder_layers=1,
        )
    ).eval()
    _, dec = graphs.export_graphs(model, tmp_path)
    proto = onnx.load(str(dec))
    assert sum(300 in i.dims and 16 in i.dims for i in proto.graph.initializer) == 1
    _, feeds = graphs.example_inputs(model, torch.float32)
    session = ort.InferenceSession(str(dec), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    values = [t.numpy().copy() for t in feeds] + [np.array([3], np.int64)]
    got = session.run(["log_probs"], dict(zip(names, values)))[0]
    with torch.no_grad():
        want = graphs.DecoderGraph(model.eval())(*[t.clone() for t in feeds])[0].numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert model.generator.bias is None  # the zero bias was only there for the tracing


@pytest.mark.slow
def test_the_export_traces_without_torchs_shape_inference_and_the_graphs_are_the_same(tmp_path, monkeypatch):
    """The tracer runs with torch's ONNX shape inference off (it serializes each parameter a node reads: a
    copy of an embedding table per lookup, the export's peak at NLLB size), and the graphs it writes have
    the same nodes, inputs, outputs and attributes as the public torch.onnx.export's."""
    from seq2onnx.export import graphs
    from seq2onnx.export.bundle import write_graphs
    from seq2onnx.model.config import ModelConfig
    from seq2onnx.model.transformer import Transformer

    assert graphs._tracer_without_shape_inference() is not None  # this torch has the entry: the low peak

    def nodes(directory):
        out = {}
        for name in (fmt.ENCODER_FILE, fmt.DECODER_FILE, fmt.FUSED_DECODER_FILE):
            proto = onnx.load(str(directory / name), load_external_data=False)
            out[name] = [
                (n.op_type, list(n.input), list(n.output), sorted(str(a) for a in n.attribute))
                for n in proto.graph.node
            ]
            out[name].append(
                [str(v) for v in (*proto.graph.input, *proto.graph.output)]
            )  # names, types, axes
            out[name].append(sorted((t.name, t.data_type, tuple(t.dims)) for t in proto.graph.initializer))
        return out

    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(
            src_vocab_size=300,
            tgt_vocab_size=300,
            share_vocab=True,
            d_model=32,
            n_heads=4,
            d_ff=64,
            n_encoder_layers=1,
            n_decoder_layers=2,
        )
    ).eval()
    for d in ("private", "public"):
        (tmp_path / d).mkdir()
    write_graphs(model, tmp_path / "private", "float32", None, fused=True)
    monkeypatch.setattr(graphs, "_tracer_without_shape_inference", lambda: None)
    write_graphs(model, tmp_path / "public", "float32", None, fused=True)
    private, public = nodes(tmp_path / "private"), nodes(tmp_path / "public")
    assert all(private[name] for name in private)
    assert private == public
