"""The runtime's API: options checked by type and range, the onnxruntime install check, huge
lines tokenised cheaply and exactly, seeded samples independent of their batch, and
generate_tokens yielding text that joins to the greedy translation."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from seq2onnx.runtime import ort_install
from seq2onnx.runtime.options import SearchOptions
from seq2onnx.runtime.translator import Translator, text_increments
from tiny import tiny_bundle

ROOT = Path(__file__).resolve().parents[1]
NAN = float("nan")


# -- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, name",
    [
        (dict(max_decoding_length=2.5), "max_decoding_length"),
        (dict(max_decoding_length=True), "max_decoding_length"),
        (dict(max_decoding_length=0), "max_decoding_length"),
        (dict(max_decoding_length=129), "max_decoding_length"),
        (dict(min_decoding_length=-1), "min_decoding_length"),
        (dict(min_decoding_length=1.0), "min_decoding_length"),
        (dict(min_decoding_length=5, max_decoding_length=5), "min_decoding_length=5"),
        (dict(min_decoding_length=9, max_decoding_length=3), "max_decoding_length=3"),
        (dict(min_decoding_length=128), "min_decoding_length"),
        (dict(length_penalty=NAN), "length_penalty"),
        (dict(length_penalty=float("inf")), "length_penalty"),
        (dict(length_penalty="1"), "length_penalty"),
        (dict(sampling_temperature=NAN), "sampling_temperature"),
        (dict(sampling_temperature=0), "sampling_temperature"),
        (dict(sampling_temperature=-1.0), "sampling_temperature"),
        (dict(sampling_temperature=True), "sampling_temperature"),
        (dict(beam_size="4"), "beam_size"),
        (dict(beam_size=0), "beam_size"),
        (dict(beam_size=True), "beam_size"),
        (dict(beam_size=2.0), "beam_size"),
        (dict(beam_size=61), "beam_size"),  # 2 x 61 > 120 target pieces
        (dict(seed=-1), "seed"),
        (dict(seed=True, sampling_temperature=1.0), "seed"),
        (dict(seed=1.5, sampling_temperature=1.0), "seed"),
        (dict(num_hypotheses=0), "num_hypotheses"),
        (dict(num_hypotheses=5, beam_size=4), "num_hypotheses"),
        (dict(num_hypotheses=1.0), "num_hypotheses"),
        (dict(max_batch_size=0), "max_batch_size"),
        (dict(max_batch_size=True), "max_batch_size"),
        (dict(max_batch_size=None), "max_batch_size"),
        (dict(sampling_topk=-1), "sampling_topk"),
        (dict(sampling_topk=2.0), "sampling_topk"),
        (dict(sampling_topp=0.0), "sampling_topp"),
        (dict(sampling_topp=1.5), "sampling_topp"),
        (dict(sampling_topp=NAN), "sampling_topp"),
        (dict(return_scores=1), "return_scores"),
        (dict(truncate="yes"), "truncate"),
    ],
)
def test_translate_batch_options_are_checked(translator, kw, name):
    with pytest.raises(ValueError, match=name) as e:
        translator.translate_batch(["the cat"], **kw)
    value = next(iter(kw.values())) if len(kw) == 1 else None
    if value is not None and not (isinstance(value, float) and value != value):
        assert repr(value) in str(e.value) or str(value) in str(e.value)
    assert any(word in str(e.value) for word in ("give", "choose", "lower", "raise", "must", "pass"))


def test_one_options_dataclass(translator):
    opts = translator.search_options(beam_size=2)
    assert isinstance(opts, SearchOptions) and opts.beam_size == 2 and opts.length_penalty == 1.0
    with pytest.raises(Exception):
        opts.beam_size = 3  # frozen
    # translate spells its options out, and both entry points refuse an unknown one
    params = inspect.signature(Translator.translate).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values())
    assert {"beam_size", "length_penalty", "max_decoding_length", "sampling_temperature", "seed"} <= set(
        params
    )
    with pytest.raises(TypeError):
        translator.translate("the cat", beams=2)
    with pytest.raises(TypeError):
        translator.translate_iterable(["the cat"], beams=2)
    with pytest.raises(ValueError, match="read_batch_size"):
        translator.translate_iterable(["the cat"], read_batch_size=0)
    with pytest.raises(ValueError, match="length_penalty"):
        translator.translate("the cat", length_penalty=NAN)
    # numpy integers are ints
    assert translator.translate_batch(["the cat"], beam_size=np.int64(2), max_decoding_length=np.int32(4))


def test_generate_tokens_checks_options_when_called(translator):
    with pytest.raises(ValueError, match="min_decoding_length"):
        translator.generate_tokens("the cat", min_decoding_length=10, max_decoding_length=5)
    with pytest.raises(ValueError, match="max_decoding_length"):
        translator.generate_tokens("the cat", max_decoding_length=500)  # was a Gather error after 128 tokens
    with pytest.raises(ValueError, match="min_decoding_length"):
        translator.generate_tokens("the cat", min_decoding_length=200)
    with pytest.raises(TypeError):
        translator.generate_tokens(["the", "cat"])


def test_min_length_above_a_sources_default_maximum_is_named(translator):
    long = "the cat dances in the box " * 4
    assert 1.5 * len(translator.prepare_source(long)[0]) + 10 > 30
    with pytest.raises(ValueError, match="source 1: min_decoding_length=30 .*max_decoding_length"):
        translator.translate_batch([long, "a cat"], min_decoding_length=30)
    assert translator.translate_batch([long, "a cat"], min_decoding_length=30, max_decoding_length=40)


@pytest.mark.parametrize("threads", [-1, os.cpu_count() + 1, 100_000, True, 1.5, "2"])
def test_intra_threads_bounded_by_the_cores(threads):
    with pytest.raises(ValueError, match="intra_threads") as e:
        Translator(tiny_bundle(), device="cpu", intra_threads=threads)
    assert str(os.cpu_count()) in str(e.value)


def test_cuda_float32_products_are_full_float32_unless_tf32_is_asked_for():
    """onnxruntime's CUDA provider allows TF32 unless told not to: on an H100 that put the Tatoeba
    model's encoder 3e-3 off the CPU and one greedy sentence in 500 off PyTorch (the GPU check)."""
    from seq2onnx.runtime.session_tuning import SessionTuning
    from seq2onnx.runtime.devices import providers_for

    assert providers_for("cuda", SessionTuning().tf32) == [
        ("CUDAExecutionProvider", {"use_tf32": "0"}),
        "CPUExecutionProvider",
    ]
    assert providers_for("cuda", True)[0] == ("CUDAExecutionProvider", {"use_tf32": "1"})
    assert providers_for("cpu", True) == ["CPUExecutionProvider"]
    with pytest.raises(ValueError, match="tf32"):
        SessionTuning(tf32="yes")


def test_measuring_knobs_left_the_public_constructor():
    for knob in ("optimization", "top_k_from_graph", "thread_spinning"):
        assert knob not in inspect.signature(Translator).parameters
        with pytest.raises(TypeError):
            Translator(tiny_bundle(), device="cpu", **{knob: True})


# -- the onnxruntime install check ----------------------------------------------------------------


class _Dist:
    def __init__(self, name: str, top: str | None = "onnxruntime", version: str = "1.20.0"):
        self.metadata = {"Name": name}
        self.version = version
        self._top = top

    def read_text(self, name):
        return self._top if name == "top_level.txt" else None

    files = None


@pytest.mark.parametrize(
    "names, words",
    [
        (
            ["onnxruntime", "onnxruntime-gpu"],
            [
                "onnxruntime 1.20.0 and onnxruntime-gpu 1.20.0 are both installed",
                "pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'seq2onnx[gpu]'",
            ],
        ),
        (
            ["onnxruntime", "onnxruntime_directml"],
            ["onnxruntime-directml", "pip uninstall -y onnxruntime onnxruntime-directml", "seq2onnx[cpu]"],
        ),
        (
            ["onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime"],
            ["all installed", "onnxruntime-openvino"],
        ),
    ],
)
def test_two_flavours_installed(monkeypatch, names, words):
    dists = [_Dist("onnxruntime-genai", "onnxruntime_genai"), *map(_Dist, names)]
    monkeypatch.setattr(ort_install, "_candidate_paths", lambda: [f"/site/{d}.dist-info" for d in names])
    monkeypatch.setattr(ort_install, "_candidates", lambda: dists)
    with pytest.raises(ImportError) as e:
        ort_install.import_onnxruntime()
    for word in words:
        assert word in str(e.value), (word, str(e.value))


def test_one_flavour_beside_onnxruntime_addons(monkeypatch):
    dists = [
        _Dist("onnxruntime-gpu"),
        _Dist("onnxruntime-genai", "onnxruntime_genai"),
        _Dist("onnxruntime_extensions", "onnxruntime_extensions"),
    ]
    monkeypatch.setattr(ort_install, "_candidates", lambda: dists)
    assert ort_install.onnxruntime_distributions() == ["onnxruntime-gpu 1.20.0"]
    assert ort_install.import_onnxruntime().__name__ == "onnxruntime"


def test_no_onnxruntime_installed(monkeypatch):
    monkeypatch.setattr(ort_install, "_candidates", lambda: [])

    def no_module(name):
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(ort_install.importlib, "import_module", no_module)
    with pytest.raises(
        ImportError,
        match=r"onnxruntime is not installed: pip install 'seq2onnx\[cpu\]' "
        r"\(or 'seq2onnx\[gpu\]' on a CUDA machine\)",
    ):
        ort_install.import_onnxruntime()


def test_the_real_environment_has_one_flavour():
    assert len(ort_install.onnxruntime_distributions()) == 1


def test_one_flavour_is_imported_without_reading_metadata():
    # importlib.metadata costs ~25 ms of every load (email, zipfile, socket): only a possible clash reads it
    code = (
        "import sys; from seq2onnx.runtime.ort_install import import_onnxruntime; import_onnxruntime(); "
        "print('importlib.metadata' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out


_BOTH = r"""
import seq2onnx
assert "onnxruntime" not in __import__("sys").modules  # import seq2onnx loads no onnxruntime
try:
    from seq2onnx import Translator
except ImportError as e:
    print(e)
"""


def test_translator_import_runs_the_check(tmp_path):
    """A second flavour's metadata directory on the path (as pip leaves it) is found by the scan and named."""
    info = tmp_path / "onnxruntime_gpu-1.20.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-gpu\nVersion: 1.20.0\n\n")
    (info / "top_level.txt").write_text("onnxruntime\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", _BOTH], capture_output=True, text=True, cwd=ROOT, timeout=60, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert "onnxruntime-gpu 1.20.0 are both installed" in proc.stdout and "pip uninstall -y" in proc.stdout


def test_the_scan_reads_only_onnxruntime_named_metadata(tmp_path, monkeypatch):
    for name, top in (
        ("onnxruntime_gpu-1.20.0.dist-info", "onnxruntime"),
        ("numpy-2.0.dist-info", "numpy"),
        ("ort_nightly-1.21.dev1.dist-info", "onnxruntime"),
        ("onnxruntime_genai-0.5.dist-info", "onnxruntime_genai"),
    ):
        info = tmp_path / name
        info.mkdir()
        dist, version = name.removesuffix(".dist-info").split("-", 1)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n\n")
        (info / "top_level.txt").write_text(top + "\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), str(tmp_path / "missing")])
    assert ort_install.onnxruntime_distributions() == ["onnxruntime-gpu 1.20.0", "ort-nightly 1.21.dev1"]


# -- huge lines ------------------------------------------------------------------------------------


def _texts():
    rng = np.random.default_rng(4)
    words = [
        "the",
        "cat",
        "dances",
        "in",
        "box",
        "a",
        "small",
        "bird",
        "sleeps",
        "漢字",
        "🙂",
        "queen",
        "x" * 40,
        "\u0301e",
        "mice",
        "old",
        "\tteacher",
        "  ",
        "na",
    ]
    for n in (300, 2_000, 9_000):
        yield " ".join(words[i] for i in rng.integers(0, len(words), n))
    yield "abcdefghij" * 9_000  # 90,000 characters without a space: cut mid-word
    yield "the cat " + "漢字ちゃん" * 20_000


def test_truncation_equals_cutting_the_full_tokenisation(translator):
    limit = translator.max_positions
    for text in _texts():
        full = translator.source_tokenizer.encode(text) + [translator.eos_id]
        ids, cut = translator.prepare_source(text, truncate=True)
        assert cut == (len(full) > limit)
        assert ids == (full[: limit - 1] + [translator.eos_id] if cut else full)
        if cut:
            with pytest.raises(ValueError, match=f"(more than {limit}|{len(full)}) tokens.*truncate=True"):
                translator.prepare_source(text)
    short = "the cat dances in the box"
    assert translator.prepare_source(short) == (
        translator.source_tokenizer.encode(short) + [translator.eos_id],
        False,
    )


class _Recording:
    """A tokenizer that records the length of every text it is asked to encode."""

    def __init__(self, inner):
        self.inner, self.lengths = inner, []

    def encode(self, text):
        self.lengths.append(len(text))
        return self.inner.encode(text)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_20_mb_line_is_tokenised_by_a_small_prefix(translator, monkeypatch):
    huge = "the big dog sleeps in a small box " * 600_000  # 20 MB
    assert len(huge) > 20_000_000
    recording = _Recording(translator.source_tokenizer)
    monkeypatch.setattr(translator.sources, "tokenizer", recording)  # what encodes translate_batch's texts
    ids, cut = translator.prepare_source(huge, truncate=True)
    assert cut and len(ids) == translator.max_positions and ids[-1] == translator.eos_id
    with pytest.raises(ValueError, match=f"more than {translator.max_positions} tokens.*truncate=True"):
        translator.prepare_source(huge)
    assert recording.lengths and max(recording.lengths) < 10_000  # not 20 MB
    (r,) = translator.translate_batch([huge], beam_size=1, max_decoding_length=5, truncate=True)
    assert r.hypotheses[0]
    # one word of 20 MB: cut mid-word, still cheap
    recording.lengths.clear()
    ids, cut = translator.prepare_source("q" * 20_000_000, truncate=True)
    assert cut and len(ids) == translator.max_positions and max(recording.lengths) < 1_000_000


# -- sampling --------------------------------------------------------------------------------------


def test_a_seeded_sample_does_not_depend_on_its_batch(translator):
    s = "the queen sees young mice with an old box"
    others = ["a cat", "the small teacher found 15 sad children under the garden", "a bird", "the dog ate"]
    for seed in (1, 7, 123):
        for n in (1, 3):
            kw = dict(sampling_temperature=1.5, seed=seed, num_hypotheses=n, return_scores=True)
            [alone] = translator.translate_batch([s], **kw)
            batch = translator.translate_batch(others[:2] + [s] + others[2:], **kw)
            small = translator.translate_batch([others[0], s], max_batch_size=1, **kw)
            assert batch[2].token_ids == alone.token_ids == small[1].token_ids, (seed, n)
            if n == 3:
                assert len(set(map(tuple, alone.token_ids))) > 1  # the hypotheses are different samples
    a = translator.translate_batch([s] * 6, sampling_temperature=1.5, seed=2)
    assert len({tuple(r.token_ids[0]) for r in a}) == 1  # one sentence, one seed: one sample
    assert translator.translate(s, sampling_temperature=1.5, seed=2) == a[0].hypotheses[0]


# -- generate_tokens -------------------------------------------------------------------------------


def test_generate_tokens_joins_to_the_greedy_translation(translator):
    texts = [
        "the cat dances in the box",
        "a small bird sleeps",
        "漢字 ☃ 🙂 the cat",
        "the queen sees young mice",
        "15 sad children",
        "x",
        "\x00\x01 dog",
        "the  cat\tin   the box",
    ]
    for text in texts:
        pieces = list(translator.generate_tokens(text))
        greedy = translator.translate(text, beam_size=1)
        assert "".join(pieces) == greedy
        assert len(pieces) == 0 or all(pieces)
    for m in (1, 2, 5):
        assert "".join(translator.generate_tokens(texts[0], max_decoding_length=m)) == translator.translate(
            texts[0], beam_size=1, max_decoding_length=m
        )


def test_text_increments_with_unknown_and_byte_fallback_pieces():
    import io

    import sentencepiece as spm

    target = spm.SentencePieceProcessor(model_file=str(tiny_bundle() / "target.spm.model"))
    rng = np.random.default_rng(0)
    for _ in range(500):  # any ids, unknown (1) and control ids included
        ids = rng.integers(0, target.get_piece_size(), rng.integers(1, 15)).tolist()
        assert "".join(text_increments(target.decode, ids)) == target.decode(ids)
    # byte fallback: one character from several ids, held back until its last byte arrives
    texts = ["the cat sat on the mat", "a dog ran far", "birds sing"] * 50
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=out,
        vocab_size=300,
        byte_fallback=True,
        model_type="unigram",
        hard_vocab_limit=False,
        minloglevel=2,
        num_threads=1,
    )
    byte = spm.SentencePieceProcessor(model_proto=out.getvalue())
    for text in ["the 漢字 cat 🙂", "ünïcödé dog", "👩‍👩‍👧 sat"]:
        ids = byte.encode(text)
        assert any(byte.is_byte(i) for i in ids)
        pieces = list(text_increments(byte.decode, ids))
        assert "".join(pieces) == byte.decode(ids) and "\ufffd" not in "".join(pieces)
        assert len(pieces) > 2
