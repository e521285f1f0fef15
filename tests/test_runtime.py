"""runtime.translator.Translator on the tiny bundle (CPU provider): torch-free import, token-for-token
parity with the PyTorch reference (model.search.translate_ids), the API, bad input, damaged
bundles and sharing one Translator between threads."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from seq2onnx.runtime.bundle import BundleError
from seq2onnx.runtime.session_tuning import (
    DECODER_SPIN_US,
    ENCODER_SPIN_US,
    SessionTuning,
    _version,
    spin_settings,
)
from seq2onnx.runtime import sessions as sessions_module
from seq2onnx.runtime.devices import cuda_usable as _cuda_usable
from seq2onnx.runtime.translator import TranslationResult, Translator
from tiny import copy_bundle as _copy, edit_bundle_json as _edit_meta, tiny_bundle, tiny_run

# The tiny model is fastest on one thread: on a 2-core machine shared with other work, torch's
# default thread pool made training and reference decoding 10-100x slower.
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
EOS = 3


def _run() -> Path:
    # tiny_bundle() calls tiny_run(pre_norm, tie) positionally: call it the same way so that the
    # lru_cache key is the same and the run is trained once.
    return tiny_run(False, True)


@pytest.fixture(scope="module", params=["standard", "fused"])
def any_translator(bundle, request) -> Translator:
    """The parity tests run on both decoder graphs of the bundle (docs/fused-decoder.md)."""
    t = Translator(bundle, device="cpu", _tuning=SessionTuning(decoder=request.param))
    assert t.decoder_variant == request.param, t.decoder_reason
    return t


@pytest.fixture(scope="module")
def reference(bundle):
    """(model, tokenizer, test sentences) of the checkpoint the bundle was exported from."""
    from seq2onnx.model import checkpoint
    from seq2onnx.model.options import TrainOptions
    from seq2onnx.model.splits import load_split

    last = _run() / "last"
    options = json.loads((last / "train_state.json").read_text())["options"]
    sentences = [src for src, _ in load_split(TrainOptions(**options)).test]
    model, tok, _ = checkpoint.load(last)
    return model, tok, sentences


def _strip_eos(tokens: list[int]) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] == EOS else tokens


# -- torch-free ------------------------------------------------------------------------------------

_TORCH_FREE = r"""
import importlib.abc, json, sys
block = sys.argv[2] == "block"
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "onnx", "model", "export", "runtime") or name.startswith(("seq2onnx.model", "seq2onnx.export")):
            raise ImportError(f"{name} is blocked: the runtime must not need it")
if block:
    sys.meta_path.insert(0, Block())
from seq2onnx import Translator, TranslationResult, __version__
t = Translator(sys.argv[1], device="cpu")
r = t.translate_batch(["the cat dances in the box", "", "a small bird sleeps"], beam_size=2)
g = list(t.generate_tokens("a small bird sleeps"))
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "onnx", "model", "export", "runtime")
                or m.startswith(("seq2onnx.model", "seq2onnx.export")))
print(json.dumps({"hyps": [x.hypotheses[0] for x in r], "stream": g, "loaded": loaded}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "block"])
def test_runtime_is_torch_free(bundle, mode):
    proc = subprocess.run(
        [sys.executable, "-c", _TORCH_FREE, str(bundle), mode],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["loaded"] == []
    assert out["hyps"][0] and out["hyps"][1] == "" and out["hyps"][2] and out["stream"]


_QUIET = """
import os, sys
from seq2onnx import Translator
Translator(sys.argv[1], device="cpu").translate("a small bird sleeps")
print(os.environ["ORT_DISABLE_TELEMETRY"])
"""


@pytest.mark.slow
@pytest.mark.parametrize("asked", [None, "0"])
def test_onnxruntime_s_telemetry_is_off_unless_the_app_asks(bundle, tmp_path, asked):
    """onnxruntime's official builds report usage by default (a device id in TMPDIR/.ses, an upload thread): the
    package turns that off before onnxruntime loads, and keeps an app's own setting."""
    env = {
        k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"
    }  # this process's import set it
    env["TMPDIR"] = str(tmp_path)
    if asked is not None:
        env["ORT_DISABLE_TELEMETRY"] = asked
    proc = subprocess.run(
        [sys.executable, "-c", _QUIET, str(bundle)],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == (asked or "1")
    if asked is None:
        assert sorted(os.listdir(tmp_path)) == []  # nothing written to TMPDIR by a translation


# -- parity with the PyTorch reference -------------------------------------------------------------


def test_greedy_parity_on_the_test_split(any_translator, reference):
    from seq2onnx.model.search import translate_ids

    model, tok, sentences = reference
    assert len(sentences) == 50
    ids = [tok.encode_source(s) for s in sentences]
    want = translate_ids(model, ids, beam_size=1)
    got = any_translator.translate_batch(ids, beam_size=1, return_scores=True)
    assert len(got) == 50
    for i, (r, [h]) in enumerate(zip(got, want)):
        assert r.token_ids == [_strip_eos(h.tokens)], (i, sentences[i])
        assert r.scores[0] == pytest.approx(h.score, abs=1e-4)
        assert r.hypotheses == [tok.decode_target(h.tokens)]
    # the same from text: the runtime tokenises like the checkpoint's tokenizer
    assert [r.token_ids for r in any_translator.translate_batch(sentences, beam_size=1)] == [
        r.token_ids for r in got
    ]
    assert len({tuple(r.token_ids[0]) for r in got}) > 10  # a model that does translate, not a constant


@pytest.fixture(scope="module")
def beam_reference(reference):
    from seq2onnx.model.search import translate_ids

    model, tok, sentences = reference
    ids = [tok.encode_source(s) for s in sentences[:20]]
    want = {}
    for k in (1, 2, 4):
        for alpha in (0.0, 0.6, 1.0):
            want[k, alpha] = translate_ids(model, ids, beam_size=k, length_penalty=alpha, num_hypotheses=k)
    return ids, want


@pytest.mark.slow
@pytest.mark.parametrize("max_batch_size", [1, 32])
def test_beam_parity_n_best(any_translator, beam_reference, max_batch_size):
    ids, want = beam_reference
    for (k, alpha), hyps in want.items():
        got = any_translator.translate_batch(
            ids,
            beam_size=k,
            length_penalty=alpha,
            num_hypotheses=k,
            return_scores=True,
            max_batch_size=max_batch_size,
        )
        for i, (r, ref) in enumerate(zip(got, hyps)):
            assert len(r.token_ids) == len(ref) == k
            assert r.token_ids == [_strip_eos(h.tokens) for h in ref], (k, alpha, i)
            assert np.allclose(r.scores, [h.score for h in ref], rtol=0, atol=1e-4), (k, alpha, i)


@pytest.mark.slow  # it guards the slow parity test above, and its reference searches take ~5 s
def test_beam_reference_is_not_trivial(beam_reference):
    """The parity above means something: beams differ from greedy and the penalty reorders n-best."""
    _, want = beam_reference
    n_best = lambda key: [[h.tokens for h in hyps] for hyps in want[key]]
    assert n_best((4, 0.0)) != n_best((4, 1.0))
    assert n_best((2, 1.0)) != [hyps[:2] for hyps in n_best((4, 1.0))] or n_best((1, 1.0)) != n_best((2, 1.0))
    assert any(h[0].tokens != h[1].tokens for h in want[4, 1.0])
    assert any(len(h[0].tokens) != len(h[-1].tokens) for h in want[4, 1.0])


def test_text_translation_matches_reference(any_translator, reference):
    from seq2onnx.model.search import translate_ids

    model, tok, sentences = reference
    for s in sentences[:8]:
        [[h]] = translate_ids(model, [tok.encode_source(s)], beam_size=4, length_penalty=1.0)
        assert any_translator.translate(s) == tok.decode_target(
            h.tokens
        )  # bundle defaults: beam 4, penalty 1.0
        assert any_translator.translate(s, beam_size=4, length_penalty=1.0) == tok.decode_target(h.tokens)


@pytest.mark.slow
def test_min_and_max_decoding_length(any_translator, reference):
    from seq2onnx.model.search import translate_ids

    model, tok, sentences = reference
    ids = [tok.encode_source(s) for s in sentences[:6]]
    for kw, ref_kw in (
        (dict(max_decoding_length=3), dict(max_length=3)),
        (dict(min_decoding_length=12), dict(min_length=12)),
    ):
        for k in (1, 2):
            got = any_translator.translate_batch(ids, beam_size=k, **kw)
            want = translate_ids(model, ids, beam_size=k, **ref_kw)
            assert [r.token_ids[0] for r in got] == [_strip_eos(h[0].tokens) for h in want]
    short = any_translator.translate_batch(ids, beam_size=2, max_decoding_length=3)
    assert all(len(r.token_ids[0]) <= 3 for r in short)
    long = any_translator.translate_batch(ids, beam_size=2, min_decoding_length=12)
    assert all(len(r.token_ids[0]) >= 12 for r in long)
    # the default limit, 1.5 x source length + 10 (bundle.json), binds when the end token is held off
    assert (
        any_translator.bundle.decoding["max_length_a"] == 1.5
        and any_translator.bundle.decoding["max_length_b"] == 10
    )
    hit_limit = 0
    for s in ids:
        limit = int(1.5 * len(s)) + 10
        for k in (1, 2):
            [r] = any_translator.translate_batch(
                [s], beam_size=k, min_decoding_length=limit - 1, return_scores=True
            )
            [[h]] = translate_ids(model, [s], beam_size=k, min_length=limit - 1)
            assert r.token_ids == [_strip_eos(h.tokens)] and r.scores[0] == pytest.approx(h.score, abs=1e-4)
            assert len(r.token_ids[0]) in (limit - 1, limit)
            hit_limit += len(r.token_ids[0]) == limit
    assert hit_limit > 0


# -- API -------------------------------------------------------------------------------------------


@pytest.mark.skipif(_cuda_usable()[0], reason="this machine can run CUDA")
def test_device_auto_and_cuda_without_gpu(bundle):
    t = Translator(bundle, device="auto")
    assert t.device == "cpu"
    assert t.device_reason == _cuda_usable()[1]  # says why CUDA was not taken: the provider or driver missing
    assert "onnxruntime-gpu" in t.device_reason or "no usable GPU" in t.device_reason, t.device_reason
    assert t.translate("the cat dances in the box")
    why = _cuda_usable()[1]
    with pytest.raises(RuntimeError, match="cuda") as e:
        Translator(bundle, device="cuda")
    assert why in str(e.value)


@pytest.mark.slow
def test_spinning_is_bounded_by_default_and_changes_no_output(bundle, translator, reference):
    sentences = reference[2][:8]
    # onnxruntime reads session.intra_op.spin_duration_us from 1.26 on (written out, not the runtime's constant)
    bounded = (
        {"encoder": ("1", "100"), "decoder": ("1", "1000")}
        if _version(ort.__version__) >= (1, 26)
        else {"encoder": ("0", ""), "decoder": ("1", "")}
    )
    none = Translator(bundle, device="cpu", _tuning=SessionTuning(thread_spinning="none"))
    unbounded = Translator(bundle, device="cpu", _tuning=SessionTuning(thread_spinning="unbounded"))
    cases = [
        (translator, bounded),
        (none, {"encoder": ("0", ""), "decoder": ("0", "")}),
        (unbounded, {"encoder": ("1", ""), "decoder": ("1", "")}),
    ]
    for t, expected in cases:
        for graph, session in (("encoder", t.encoder), ("decoder", t.decoder)):
            options = session.get_session_options()
            got = tuple(
                _entry(options, k)
                for k in ("session.intra_op.allow_spinning", "session.intra_op.spin_duration_us")
            )
            assert got == expected[graph], (graph, got)
    want = [r.hypotheses for r in none.translate_batch(sentences, beam_size=2)]
    assert want == [r.hypotheses for r in translator.translate_batch(sentences, beam_size=2)]
    assert want == [r.hypotheses for r in unbounded.translate_batch(sentences, beam_size=2)]


@pytest.mark.slow
def test_float_cpu_sessions_plan_no_memory_patterns(translator):
    # a decoder's shapes change at every step: patterns cost the OPUS-MT-size peak 61 MB (optimisation row 41)
    sessions = translator.graphs._sessions
    loaded = {**sessions.by_label(), "standard": sessions.standard}
    for label, session in loaded.items():
        assert session.get_session_options().enable_mem_pattern is False, label
    # int8 graphs keep them (two threads at one row were 25-30% slower without), and so does CUDA
    assert (
        sessions_module.session_options(SessionTuning(), 1, "decoder", "cpu", True).enable_mem_pattern is True
    )
    int8 = Translator(tiny_bundle(quantize="int8"), device="cpu")
    assert int8.decoder.get_session_options().enable_mem_pattern is True
    assert sessions_module.session_options(SessionTuning(), 1, "decoder", "cuda").enable_mem_pattern is True


def _entry(options, key: str) -> str:
    try:
        return options.get_session_config_entry(key)
    except Exception:  # onnxruntime raises when the key was never set
        return ""


def test_spin_settings_follow_the_onnxruntime_version():
    assert spin_settings("bounded", "encoder", "1.32.0") == {
        "session.intra_op.allow_spinning": "1",
        "session.intra_op.spin_duration_us": str(ENCODER_SPIN_US),
    }
    assert spin_settings("bounded", "decoder", "1.26.0")["session.intra_op.spin_duration_us"] == str(
        DECODER_SPIN_US
    )
    assert (
        spin_settings("bounded", "decoder", "1.27.0.dev20260401")["session.intra_op.spin_duration_us"]
        == "1000"
    )
    # An onnxruntime that cannot bound a spin: only the decoder spins.
    assert spin_settings("bounded", "encoder", "1.25.1") == {"session.intra_op.allow_spinning": "0"}
    assert spin_settings("bounded", "decoder", "1.18.0") == {"session.intra_op.allow_spinning": "1"}
    assert spin_settings("none", "decoder", "1.32.0") == {"session.intra_op.allow_spinning": "0"}


@pytest.mark.parametrize(
    "text, want",
    [
        ("1.32.0", (1, 32)),
        ("1.32.0+cpu", (1, 32)),
        ("1.27.0.dev20260401", (1, 27)),
        ("2", (2, 0)),
        ("1.3rc27", (1, 3)),
        ("", (0, 0)),
        ("abc", (0, 0)),
        ("1.²", (1, 0)),
    ],
)
def test_version_reads_leading_digits(text, want):
    assert _version(text) == want


@pytest.mark.parametrize("value", [True, "yes", "decoder", None])
def test_thread_spinning_names_its_choices(value):
    with pytest.raises(ValueError, match="thread_spinning=.*bounded, none, unbounded"):
        SessionTuning(thread_spinning=value)


@pytest.mark.parametrize("device", ["gpu", "CUDA", "", None])
def test_bad_device(bundle, device):
    with pytest.raises(ValueError, match="device"):
        Translator(bundle, device=device)


def test_return_scores_num_hypotheses_and_repr(translator):
    text = "the queen sees young mice with an old box"
    [plain] = translator.translate_batch([text], beam_size=4)
    assert plain.scores is None and len(plain.hypotheses) == 1 and isinstance(plain.hypotheses[0], str)
    [r] = translator.translate_batch([text], beam_size=4, num_hypotheses=3, return_scores=True)
    assert len(r.hypotheses) == len(r.token_ids) == len(r.scores) == 3
    assert r.hypotheses[0] == plain.hypotheses[0]
    assert len(set(map(tuple, r.token_ids))) == 3
    assert all(isinstance(s, float) and s < 0 for s in r.scores)
    # best first by score / len^alpha, len counting the end token
    norm = [s / (len(t) + 1) for s, t in zip(r.scores, r.token_ids)]
    assert norm == sorted(norm, reverse=True)
    text_repr = repr(r)
    assert (
        text_repr.startswith("TranslationResult(") and r.hypotheses[0] in text_repr and "scores=" in text_repr
    )
    assert "scores=" not in repr(plain) and len(text_repr) < 400
    with pytest.raises(ValueError, match="num_hypotheses"):
        translator.translate_batch([text], beam_size=2, num_hypotheses=3)
    with pytest.raises(ValueError, match="beam_size"):
        translator.translate_batch([text], beam_size=0)


def test_translate_iterable_keeps_order_and_reads_lazily(translator, reference):
    _, _, sentences = reference
    lines = sentences[:9] + ["", "   "] + sentences[40:45]
    pulled = []

    def source():
        for line in lines:
            pulled.append(line)
            yield line

    it = translator.translate_iterable(source(), read_batch_size=4, beam_size=2)
    first = next(it)
    assert len(pulled) == 4  # reads one batch at a time
    results = [first, *it]
    assert [r.hypotheses for r in results] == [
        r.hypotheses for r in translator.translate_batch(lines, beam_size=2)
    ]
    assert [r.hypotheses for r in results] == [[translator.translate(s, beam_size=2)] for s in lines]
    assert results[9].hypotheses == [""] and results[10].hypotheses == [""]


def test_generate_tokens_joins_to_greedy(any_translator, reference):
    _, _, sentences = reference
    for s in sentences[:6]:
        pieces = list(any_translator.generate_tokens(s))
        assert len(pieces) > 1 and all(isinstance(p, str) and p for p in pieces)
        assert "".join(pieces) == any_translator.translate(s, beam_size=1)
        assert not any("\u2581" in p for p in pieces)  # text, not SentencePiece pieces
    assert list(any_translator.generate_tokens("   ")) == []
    assert len(list(any_translator.generate_tokens(sentences[0], max_decoding_length=2))) <= 2


def test_sampling_reproducible_with_seed(any_translator, reference):
    _, _, sentences = reference
    src = sentences[:10]
    a = any_translator.translate_batch(src, sampling_temperature=1.5, seed=7, return_scores=True)
    b = any_translator.translate_batch(src, sampling_temperature=1.5, seed=7, return_scores=True)
    c = any_translator.translate_batch(src, sampling_temperature=1.5, seed=8)
    greedy = any_translator.translate_batch(src, beam_size=1)
    assert [r.token_ids for r in a] == [r.token_ids for r in b] and [r.scores for r in a] == [
        r.scores for r in b
    ]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]
    assert [r.token_ids for r in a] != [r.token_ids for r in greedy]
    topk1 = any_translator.translate_batch(src, sampling_temperature=1.0, sampling_topk=1, seed=1)
    assert [r.token_ids for r in topk1] == [r.token_ids for r in greedy]
    with pytest.raises(ValueError):
        any_translator.translate_batch(src, sampling_temperature=0.0)


# -- bad input -------------------------------------------------------------------------------------


def test_empty_and_whitespace_give_empty_translation(translator):
    res = translator.translate_batch(
        ["", "  \t ", "the cat dances in the box"], beam_size=2, return_scores=True
    )
    assert [r.hypotheses for r in res[:2]] == [[""], [""]]
    assert [r.token_ids for r in res[:2]] == [[[]], [[]]]
    assert res[2].hypotheses[0]
    [r] = translator.translate_batch([""], beam_size=2, num_hypotheses=2)
    assert r.hypotheses == ["", ""]
    assert translator.translate("") == ""
    assert translator.translate_batch([[]]) == [TranslationResult([""], [[]])]


def test_too_long_source(translator):
    text = " ".join(["the cat dances in the box"] * 60)
    assert len(translator.source_tokenizer.encode(text)) > translator.max_positions
    with pytest.raises(ValueError, match="truncate") as e:
        translator.translate_batch(["a cat", text])
    assert str(translator.max_positions) in str(e.value) and "source 1" in str(e.value)
    with pytest.raises(ValueError, match="truncate"):
        translator.translate_batch([[5] * 300])
    r = translator.translate_batch(["a cat", text], truncate=True, beam_size=2)
    assert isinstance(r[1].hypotheses[0], str) and len(r[1].token_ids[0]) <= translator.max_positions
    cut = translator.source_tokenizer.encode(text)[: translator.max_positions - 1]
    assert r[1].token_ids == translator.translate_batch([cut], beam_size=2)[0].token_ids


def test_characters_outside_the_vocabulary(translator):
    texts = ["漢字 ☃ 🙂", "the cat 🙂 dances", "\ud800 lone surrogate", "\x00\x01"]
    res = translator.translate_batch(texts, beam_size=2)
    unk = translator.bundle.special_ids["unk"]
    for text, r in zip(texts, res):
        ids, cut = translator.prepare_source(text)
        # unknown characters become <unk> pieces of the source, never an error or a dropped text
        assert unk in ids and ids[-1] == translator.eos_id and not cut, (text, ids)
        assert r.token_ids[0] and r.hypotheses[0], (text, r)  # a real translation, not an empty one
        by_ids = translator.translate_batch([ids], beam_size=2)[0]
        assert (r.token_ids, r.hypotheses) == (by_ids.token_ids, by_ids.hypotheses), text
    # a lone surrogate cannot be UTF-8: it is read as "?" (runtime/source.py), as the tokenizer would
    assert res[2].token_ids == translator.translate_batch(["? lone surrogate"], beam_size=2)[0].token_ids
    assert "".join(translator.generate_tokens(texts[0])) == translator.translate(texts[0], beam_size=1)


@pytest.mark.parametrize("item", [None, 3, b"bytes", 2.5, {"a": 1}, ["a", "b"]])
def test_non_string_items_raise_type_error_naming_the_index(translator, item):
    with pytest.raises(TypeError, match="source 1"):
        translator.translate_batch(["the cat", item])


def test_batch_argument_errors(translator):
    with pytest.raises(TypeError):
        translator.translate_batch("a string")
    with pytest.raises(TypeError):
        translator.translate_batch(b"bytes")
    assert translator.translate_batch([]) == []
    for bad in (translator.max_positions + 1, 0, -3):
        with pytest.raises(ValueError, match="max_decoding_length"):
            translator.translate_batch(["the cat"], max_decoding_length=bad)
    assert translator.translate_batch(["the cat"], max_decoding_length=translator.max_positions, beam_size=1)
    for ids in ([5, 120], [-1, 5], [5, 10_000]):
        with pytest.raises(ValueError, match="vocabulary"):
            translator.translate_batch([ids])
    with pytest.raises(ValueError, match="min_decoding_length"):
        translator.translate_batch(["the cat"], max_decoding_length=4, min_decoding_length=4)


def test_ids_with_or_without_end_token_are_the_same_source(translator, reference):
    _, tok, sentences = reference
    for s in sentences[:5]:
        ids = tok.encode_source(s)
        assert ids[-1] == EOS
        a, b, c, d = translator.translate_batch(
            [ids, ids[:-1], np.array(ids), s], beam_size=2, return_scores=True
        )
        assert a.token_ids == b.token_ids == c.token_ids == d.token_ids
        assert a.scores == b.scores == c.scores == d.scores


# -- damaged bundles -------------------------------------------------------------------------------


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_intact_copy_loads(bundle):
    copy = _copy(bundle, "intact")
    assert Translator(copy, device="cpu").translate("the cat") == Translator(bundle, device="cpu").translate(
        "the cat"
    )


def _outside(path):
    shutil.copy(path / "encoder.onnx", path.parent / "x")  # exists, but outside the bundle
    _edit_meta(path, lambda m: m["files"]["encoder"].update(path="../x"))


def _absolute(path):
    outside = path.parent / "y.onnx"
    shutil.copy(path / "encoder.onnx", outside)
    _edit_meta(path, lambda m: m["files"]["encoder"].update(path=str(outside.resolve())))


def _swapped_graphs(path):
    shutil.copy(path / "decoder.onnx", path / "encoder.onnx")
    _edit_meta(path, lambda m: m["files"]["encoder"].update(sha256=m["files"]["decoder"]["sha256"]))


# Each damage done to a copy of the bundle, and the names its error must carry.
DAMAGES = {
    "missing_json": (lambda p: (p / "bundle.json").unlink(), ["bundle.json", "missing"]),
    "invalid_json": (
        lambda p: (p / "bundle.json").write_text('{"format": "seq2onnx-bundle", '),
        ["bundle.json", "JSON"],
    ),
    "not_object": (lambda p: (p / "bundle.json").write_text("[1, 2]"), ["bundle.json"]),
    "format_version": (
        lambda p: _edit_meta(p, lambda m: m.update(format_version=2)),
        ["bundle.json", "format_version"],
    ),
    "missing_field": (lambda p: _edit_meta(p, lambda m: m.pop("graphs")), ["bundle.json", "graphs"]),
    "missing_decoder": (lambda p: (p / "decoder.onnx").unlink(), ["decoder.onnx", "missing"]),
    # another size than bundle.json's files.<key>.size: refused before the file is read (issue 60)
    "truncated_encoder": (
        lambda p: _truncate(p / "encoder.onnx"),
        ["encoder.onnx", "bundle.json records", "(size)"],
    ),
    "replaced_tokenizer": (
        lambda p: shutil.copy(p / "source.spm.model", p / "target.spm.model"),
        ["target.spm.model", "(size)"],
    ),
    "outside": (_outside, ["'../x'", "outside"]),
    "absolute": (_absolute, ["outside"]),
    "swapped_graphs": (_swapped_graphs, ["encoder.onnx"]),
    "no_dir": (shutil.rmtree, ["not a bundle directory"]),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_bundle(bundle, damage):
    path = _copy(bundle, damage)
    do, names = DAMAGES[damage]
    do(path)
    with pytest.raises(BundleError) as e:
        Translator(path, device="cpu")
    for name in names:
        assert name in str(e.value), (name, str(e.value))
    assert "Traceback" not in str(e.value) and isinstance(e.value, ValueError)


def test_truncated_graph_without_hash_check_is_a_bundle_error(bundle):
    path = _copy(bundle, "nohash")
    _truncate(path / "encoder.onnx")
    with pytest.raises(BundleError, match=r"bundle\.json records \d+ \(size\)"):
        Translator(path, device="cpu")
    with pytest.raises(BundleError) as e:
        Translator(path, device="cpu", check_hashes=False)
    assert "encoder.onnx" in str(e.value) or str(path) in str(e.value)
    # a damaged tokenizer as well
    path = _copy(bundle, "nohash-spm")
    _truncate(path / "source.spm.model")
    with pytest.raises(BundleError):
        Translator(path, device="cpu", check_hashes=False)


# -- threads ---------------------------------------------------------------------------------------


def test_one_translator_shared_by_threads(translator, reference):
    _, _, sentences = reference
    src = sentences[:12]
    serial = translator.translate_batch(src, beam_size=2, return_scores=True)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [
            pool.submit(
                translator.translate_batch, src, beam_size=2, return_scores=True, max_batch_size=4 + i % 3
            )
            for i in range(16)
        ]
        results = [f.result(timeout=120) for f in futures]
    for got in results:
        assert [r.token_ids for r in got] == [r.token_ids for r in serial]
        assert [r.hypotheses for r in got] == [r.hypotheses for r in serial]
        assert np.allclose([r.scores for r in got], [r.scores for r in serial], rtol=0, atol=1e-5)


# -- regressions of bugs found by these tests ----------------------------------------------------


def test_sampling_honours_or_refuses_num_hypotheses(translator):
    try:
        [r] = translator.translate_batch(
            ["the cat dances in the box"], sampling_temperature=1.0, num_hypotheses=3, seed=1
        )
    except ValueError:
        return
    assert len(r.hypotheses) == 3


def test_max_batch_size_zero_is_named(translator):
    with pytest.raises(ValueError, match="max_batch_size"):
        translator.translate_batch(["the cat"], max_batch_size=0)
