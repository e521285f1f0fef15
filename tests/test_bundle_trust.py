"""The runtime trusts nothing it can check: a bundle.json that disagrees with its own graphs or
tokenizers, or is malformed, is a one-line BundleError at load that names the field, both values
and the fix, never garbage at the first translation or a KeyError/TypeError."""

from __future__ import annotations

from pathlib import Path

import pytest

from seq2onnx.runtime.bundle import MAX_JSON_BYTES, BundleError, sha256
from seq2onnx.runtime.checks import tokenizer_fingerprint
from seq2onnx.runtime.onnx_info import GraphInfo
from seq2onnx.runtime.translator import Translator
from tiny import copy_bundle as _copy, edit_bundle_json as _edit, tiny_bundle

TEXT = "the cat dances in the box"


def _rehash(path: Path) -> None:
    """Rewrites every sha256 in bundle.json, so that a test gets past the hash check."""
    _edit(
        path,
        lambda m: [
            e.update(sha256=sha256(path / e["path"]), size=(path / e["path"]).stat().st_size)
            for e in m["files"].values()
        ],
    )


def _refused(path: Path, *words: str, decoder: str = "auto") -> str:
    """Loading the bundle (driving the given decoder variant) is a one-line BundleError with these words."""
    from seq2onnx.runtime.session_tuning import SessionTuning

    with pytest.raises(BundleError) as e:
        Translator(path, device="cpu", _tuning=SessionTuning(decoder=decoder))
    message = str(e.value)
    assert "\n" not in message and "Traceback" not in message
    for word in words:
        assert word in message, (word, message)
    return message


def _spm(vocab_size: int) -> bytes:
    from seq2onnx.model.tokenizer import train_sentencepiece

    words = [
        "lo",
        "na",
        "tomari",
        "dalari",
        "kon",
        "jarda",
        "sub",
        "kuron",
        "pri",
        "kurot",
        "the",
        "cat",
        "dog",
    ]
    texts = [
        " ".join(words[(i * 7 + j * 3) % len(words)] + str(j % 5) for j in range(12)) for i in range(400)
    ]
    return train_sentencepiece(texts, vocab_size)


# -- values bundle.json states twice: against the tokenizers -----------------------------------------


def test_wrong_end_id_is_refused_at_load(bundle):
    path = _copy(bundle, "eos5")
    _edit(path, lambda m: m["special_ids"].update(eos=5))
    _refused(path, "special_ids.eos", "5", "model.eos_id=3")
    # stated consistently in both places, it still disagrees with the tokenizers' own eos_id()
    _edit(path, lambda m: m["model"].update(eos_id=5))
    message = _refused(path, "special_ids.eos=5", "eos_id()", "has 3", "re-export")
    assert "spm.model" in message


@pytest.mark.parametrize(
    "key, value", [("pad", 1), ("unk", 0), ("bos", 7), ("decoder_start", 500), ("eos", -1)]
)
def test_other_special_ids(bundle, key, value):
    path = _copy(bundle, f"special-{key}")
    model_key = "decoder_start_id" if key == "decoder_start" else f"{key}_id"
    _edit(path, lambda m: (m["special_ids"].update({key: value}), m["model"].update({model_key: value})))
    _refused(path, f"special_ids.{key}", str(value))


def test_swapped_tokenizers_are_refused_when_fingerprinted(bundle):
    path = _copy(bundle, "swap")
    t = Translator(bundle, device="cpu")
    fingerprints = {
        "source": tokenizer_fingerprint(t.source_tokenizer),
        "target": tokenizer_fingerprint(t.target_tokenizer),
    }
    assert fingerprints["source"] != fingerprints["target"]
    _edit(path, lambda m: m.update(tokenizers=fingerprints))
    assert Translator(path, device="cpu").translate(TEXT) == t.translate(TEXT)  # the field itself is accepted
    src, tgt = path / "source.spm.model", path / "target.spm.model"
    data = src.read_bytes()
    src.write_bytes(tgt.read_bytes())
    tgt.write_bytes(data)
    _rehash(path)
    _refused(path, "source.spm.model", "exchanged", "tokenizers.source.pieces_sha256")


def test_tokenizer_of_another_size_is_refused(bundle):
    path = _copy(bundle, "size")
    (path / "target.spm.model").write_bytes(_spm(60))
    _rehash(path)
    _refused(path, "model.tgt_vocab_size=120", "target.spm.model", "get_piece_size()")


# -- against the graphs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("n_heads", 8, ["model.n_heads=8", "has 4", "past_key_self_0"]),
        ("n_heads", 2, ["model.n_heads=2", "has 4"]),
        ("n_decoder_layers", 3, ["model.n_decoder_layers=3", "has 2"]),
        ("n_decoder_layers", 1, ["model.n_decoder_layers=1", "has 2"]),
        ("d_model", 64, ["model.d_model=64", "has 32"]),
        ("max_positions", 256, ["model.max_positions=256", "has 128", "positional table"]),
        ("max_positions", 64, ["model.max_positions=64", "has 128"]),
    ],
)
def test_model_sizes_must_be_the_graphs(bundle, key, value, words):
    path = _copy(bundle, f"{key}-{value}")
    _edit(
        path,
        lambda m: (
            m["model"].update({key: value}),
            m.update(max_positions=value) if key == "max_positions" else None,
        ),
    )
    message = _refused(path, *words)
    assert "re-export" in message


def test_dtype_must_be_the_graphs(bundle):
    path = _copy(bundle, "dtype")
    _edit(path, lambda m: m.update(dtype="float16"))
    _refused(path, "dtype='float16'", "float32")


@pytest.mark.parametrize("side", ["source", "target"])
def test_vocabulary_size_must_be_the_graphs(bundle, side):
    # another tokenizer, and bundle.json saying its size: only the graphs can tell
    import sentencepiece as spm

    path = _copy(bundle, f"vocab-{side}")
    data = _spm(60)
    size = spm.SentencePieceProcessor(model_proto=data).get_piece_size()
    assert size != 120
    (path / f"{side}.spm.model").write_bytes(data)
    _rehash(path)
    key = "src_vocab_size" if side == "source" else "tgt_vocab_size"
    # without the tokenizer fingerprints (optional in bundle.json), which would name the file first
    _edit(path, lambda m: (m["model"].update({key: size}), m.pop("tokenizers")))
    # every decoder is checked whichever is driven, the standard one first
    _refused(path, f"model.{key}={size}", "has 120", "encoder.onnx" if side == "source" else "decoder.onnx")


def test_graph_signature_in_bundle_json_must_be_the_graphs(bundle):
    path = _copy(bundle, "signature")
    _edit(path, lambda m: m["graphs"]["decoder"]["outputs"][0].update(shape=["rows", 99]))
    # checked where the standard decoder is the one driven (a Translator checks the graph it runs)
    _refused(path, "graphs.decoder.outputs[log_probs].shape", "99", "120", decoder="standard")


def test_fused_graph_signature_in_bundle_json_must_be_the_graph(bundle):
    path = _copy(bundle, "fused-signature")
    _edit(path, lambda m: m["graphs"]["decoder_fused"]["outputs"][0].update(shape=["rows", 99]))
    _refused(path, "graphs.decoder_fused.outputs[log_probs].shape", "99", "120")
    path = _copy(bundle, "fused-step-type")
    _edit(
        path, lambda m: m["graphs"]["decoder_fused"]["inputs"][1].update(dtype="int64")
    )  # step is int32 there
    _refused(path, "graphs.decoder_fused.inputs[step].dtype", "int64", "int32", "decoder_fused.onnx")


def test_bundle_json_without_variants_and_domains_still_loads(bundle):
    """Bundles exported before the fused decoder have neither field: they stay readable."""
    path = _copy(bundle, "pre-fused")
    (path / "decoder_fused.onnx").unlink()

    def old_format(meta):
        del meta["files"]["decoder_fused"], meta["graphs"]["decoder_fused"]
        for graph in meta["graphs"].values():
            del graph["variant"], graph["domains"]

    _edit(path, old_format)
    t = Translator(path, device="cpu")
    assert t.decoder_variant == "standard" and t.translate(TEXT)


def test_missing_fused_decoder_file_is_refused(bundle):
    path = _copy(bundle, "fused-missing")
    (path / "decoder_fused.onnx").unlink()
    _refused(path, "decoder_fused.onnx", "missing", "files.decoder_fused")


@pytest.mark.slow
def test_variants_pass_the_checks(bundle):
    """The checks do not refuse what `seq2onnx export` writes: fp32 (both decoders), int8 (export
    validates by loading, so a float16 bundle is checked by test_export's export)."""
    from seq2onnx.runtime.session_tuning import SessionTuning

    for decoder in ("standard", "fused"):
        t = Translator(bundle, device="cpu", _tuning=SessionTuning(decoder=decoder))
        assert t.decoder_variant == decoder and t.translate(TEXT)
    for path in (bundle, tiny_bundle(quantize="int8")):
        assert Translator(path, device="cpu").translate(TEXT)


def test_a_tables_shape_is_found_through_casts_and_dequantization_only():
    """The checks find an embedding's rows behind the nodes an int8 or float16 table passes through (up to
    `depth` of them), and never through arithmetic."""
    info = GraphInfo(
        shapes={"codes": (30, 8), "s": (30, 1)},
        nodes=[
            ("Mul", ["codes", "s"], ["scaled"]),
            ("DequantizeLinear", ["codes", "s"], ["deq"]),
            ("Cast", ["deq"], ["table"]),
            ("Gather", ["table", "ids"], ["emb"]),
            ("Gather", ["scaled", "ids"], ["x"]),
            ("Identity", ["table"], ["again"]),
        ],
    )
    assert info.table_shape("table") == (30, 8) and info.table_shape("again") == (30, 8)
    assert info.table_shape("scaled") is None  # a Mul is not followed
    assert info.table_shape("table", depth=1) is None and info.table_shape("again", depth=2) is None
    assert info.gather_tables() == [("ids", (30, 8))]


# -- malformed bundle.json --------------------------------------------------------------------------


def _node(meta: dict, dotted: str):
    """The parent of a dotted path (digits index lists) and the last key."""
    *parents, last = dotted.split(".")
    node = meta
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    return node, int(last) if last.isdigit() else last


def _set(dotted: str, value):
    def edit(meta):
        node, key = _node(meta, dotted)
        node[key] = value

    return edit


def _drop(dotted: str):
    def edit(meta):
        node, key = _node(meta, dotted)
        del node[key]

    return edit


@pytest.mark.parametrize(
    "edit, field",
    [
        (_set("files", []), "files"),
        (_set("files", {}), "files.encoder"),
        (_set("files.encoder", "encoder.onnx"), "files.encoder"),
        (_set("files.encoder.path", 5), "files.encoder.path"),
        (_drop("files.decoder.sha256"), "files.decoder.sha256"),
        (_set("format_version", True), "format_version"),
        (_set("format_version", 1.0), "format_version"),
        (_set("format_version", "1"), "format_version"),
        (_drop("model"), "model"),
        (_set("model", [1]), "model"),
        (_drop("model.n_heads"), "model.n_heads"),
        (_set("model.n_heads", "4"), "model.n_heads"),
        (_set("model.n_heads", 4.0), "model.n_heads"),
        (_set("model.n_heads", True), "model.n_heads"),
        (_set("model.n_heads", 0), "model.n_heads"),
        (_set("model.n_heads", 5), "model.d_model"),
        (_set("model.src_vocab_size", None), "model.src_vocab_size"),
        (_set("max_positions", 64), "max_positions"),
        (_drop("special_ids.eos"), "special_ids.eos"),
        (_set("special_ids", None), "special_ids"),
        (_set("special_ids.pad", "0"), "special_ids.pad"),
        (_set("dtype", "bfloat16"), "dtype"),
        (_set("dtype", None), "dtype"),
        (_set("quantization", "int3"), "quantization"),
        (_drop("decoding.max_length_b"), "decoding.max_length_b"),
        (_set("decoding.beam_size", 2.5), "decoding.beam_size"),
        (_set("decoding.length_penalty", float("nan")), "decoding.length_penalty"),
        (_set("decoding.max_length_a", "1.5"), "decoding.max_length_a"),
        (_set("decoding", "greedy"), "decoding"),
        (_set("graphs.decoder", []), "graphs.decoder"),
        (_set("graphs.decoder.inputs", {}), "graphs.decoder.inputs"),
        (_set("graphs.encoder.outputs", [5]), "graphs.encoder.outputs[0]"),
        (_drop("graphs.encoder.inputs.0.name"), "graphs.encoder.inputs[0].name"),
        (_set("graphs.encoder.inputs.0.shape", "batch"), "graphs.encoder.inputs[0].shape"),
        (_set("tokenizers", {"source": {}}), "tokenizers.source.pieces"),
        (_set("graphs.decoder_fused.variant", "standard"), "graphs.decoder_fused.variant"),
        (_set("graphs.decoder.variant", "fused"), "graphs.decoder.variant"),
        (_drop("graphs.decoder_fused"), "graphs.decoder_fused"),
        (_drop("files.decoder_fused"), "files.decoder_fused"),
        (_drop("files.decoder_fused.sha256"), "files.decoder_fused.sha256"),
        (_set("graphs.decoder.domains", "com.microsoft"), "graphs.decoder.domains"),
        (_set("graphs.decoder_fused.inputs", []), "graphs.decoder_fused.inputs"),
    ],
)
def test_malformed_bundle_json(bundle, edit, field):
    path = _copy(bundle, "malformed")
    _edit(path, edit)
    message = _refused(path, "bundle.json", field)
    for raw in ("KeyError", "TypeError", "AttributeError", "unexpected"):
        assert raw not in message


def test_over_large_bundle_json_is_refused_before_parsing(bundle):
    path = _copy(bundle, "large")
    text = (path / "bundle.json").read_text()
    (path / "bundle.json").write_text(text + " " * MAX_JSON_BYTES)  # still valid JSON
    _refused(path, "bundle.json", "bytes", str(MAX_JSON_BYTES))


def test_deeply_nested_json_is_a_bundle_error(bundle):
    path = _copy(bundle, "nested")
    (path / "bundle.json").write_text("[" * 100_000 + "]" * 100_000)
    _refused(path, "bundle.json")


def test_a_graph_that_is_a_directory_is_named_by_both_hosts(bundle):
    """A directory where decoder.onnx should be: one line naming the file and the fix on Python and Node alike
    (Python's file object said only `[Errno 21] Is a directory: 7`)."""
    import subprocess

    from node_host import JS, NODE, skip_reason

    path = _copy(bundle, "graph-dir")
    (path / "decoder.onnx").unlink()
    (path / "decoder.onnx").mkdir()
    message = _refused(path, "decoder.onnx: not a regular file (a directory)", "re-export")
    assert "Errno" not in message
    if skip_reason("the Node host"):
        assert not __import__("os").environ.get("CI"), skip_reason(
            "the Node host"
        )  # CI has node: never skip there
        return
    out = subprocess.run(
        [NODE, str(JS / "bin" / "seq2onnx-js.mjs"), "translate", str(path)],
        input="a cat\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "decoder.onnx: not a regular file (a directory" in out.stderr, out.stderr


@pytest.mark.parametrize(
    "value, words",
    [
        (
            "a/" * 200_000,
            "expected a path of at most 1024 characters",
        ),  # 400 KB: 162 s of CPU before issue 60
        (
            "encoder\0.onnx",
            "expected a path without a NUL character",
        ),  # was "embedded null byte", naming nothing
    ],
)
def test_a_huge_or_nul_path_is_refused_at_once_in_one_short_line(bundle, value, words):
    import time

    path = _copy(bundle, "bad-path")
    _edit(path, lambda m: m["files"]["encoder"].update(path=value))
    start = time.perf_counter()
    with pytest.raises(BundleError) as e:
        Translator(path, device="cpu")
    assert time.perf_counter() - start < 5
    message = str(e.value)
    assert "files.encoder.path" in message and words in message and len(message) < 500, message


def test_a_weights_file_of_another_size_is_refused_before_it_is_read(bundle):
    import time

    path = _copy(bundle, "sparse-weights")
    with open(path / "weights.bin", "r+b") as f:
        f.truncate(8 << 30)  # sparse: 8 GB that read as zeros (101 s of hashing before issue 60)
    start = time.perf_counter()
    with pytest.raises(
        BundleError, match=r"weights\.bin: 8589934592 bytes, bundle\.json records \d+ \(size\)"
    ):
        Translator(path, device="cpu")
    assert time.perf_counter() - start < 5
