"""The T5 family (issue 61) as transformers 5 saves it, held to generate().

Three shapes (tests/hf_t5.py): t5-small's (ReLU, tied and scaled output), mT5-small's (gated-GELU, its own
lm_head, n_heads x d_kv != d_model, relative positions past max_distance) and MADLAD-400's (gated-GELU,
its own lm_head, <2xx> target tags). Each is exported with both decoders and verified against generate()
(greedy, beam 4, both early_stopping conventions), n-best against generate(num_return_sequences), and
the Node host against the Python runtime.
"""

from __future__ import annotations

import json
import shutil

import pytest

from extras import require

require("transformers", "hf")

import hf_fixtures as F  # noqa: E402
import hf_t5 as T  # noqa: E402
from node_host import skip_reason  # noqa: E402
from seq2onnx.commands.main import main  # noqa: E402
from seq2onnx.export.hf.bundle import export_hf_bundle  # noqa: E402
from seq2onnx.export.hf.read import HFImportError  # noqa: E402
from seq2onnx.export.hf.verify import verify_hf  # noqa: E402
from seq2onnx.model.config import ModelConfig  # noqa: E402
from seq2onnx.runtime.session_tuning import SessionTuning  # noqa: E402
from seq2onnx.runtime.translator import Translator  # noqa: E402

SENTENCES = 24
# (kind, training steps, early_stopping): random t5 and mT5, a trained MADLAD (a random one emits its own
# <2xx> tags, which batch_decode keeps as text and the hosts drop as language tokens), and the heuristic
# convention (early_stopping false) on t5.
CASES = [("t5", 0, True), ("t5", 0, False), ("mt5", 0, True), ("madlad", 300, True)]


def test_config_without_t5_fields_writes_none_of_them():
    """Older models' config.json (and bundle.json's model) stay as they were: the T5 fields only where set."""
    plain = ModelConfig(src_vocab_size=100, tgt_vocab_size=100)
    assert not {"d_kv", "norm", "relative_buckets", "gated", "output_scale"} & set(plain.to_dict())
    t5 = ModelConfig(
        src_vocab_size=100,
        tgt_vocab_size=100,
        d_model=32,
        n_heads=6,
        d_kv=8,
        norm="rms",
        relative_buckets=8,
        gated=True,
        linear_bias=False,
        attention_scale=False,
    )
    data = t5.to_dict()
    assert data["d_kv"] == 8 and data["norm"] == "rms" and "output_scale" not in data
    assert ModelConfig.from_dict(data) == t5 and t5.head_dim == 8 and t5.inner_dim == 48
    with pytest.raises(ValueError, match="norm='scale'"):
        ModelConfig(src_vocab_size=100, tgt_vocab_size=100, norm="scale")


@pytest.mark.slow
def test_relative_buckets_are_transformers_own():
    """bucket_table against T5Attention._relative_position_bucket for every relative position it covers."""
    import torch
    from transformers.models.t5.modeling_t5 import T5Attention

    from seq2onnx.model.layers import bucket_table

    n = 300  # beyond max_distance 128: the far buckets
    relative = torch.arange(1 - n, n)
    for both_ways in (True, False):
        want = T5Attention._relative_position_bucket(
            relative, bidirectional=both_ways, num_buckets=32, max_distance=128
        )
        assert torch.equal(bucket_table(both_ways, 32, 128, n), want)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One export per model for the module: the verify, n-best and Node host tests read the same bundle."""
    return F.export_cache(tmp_path_factory)


def _data(tmp_path, n=SENTENCES):
    data = tmp_path / "sentences.txt"
    data.write_text("\n".join(F.test_sentences(n)) + "\n", encoding="utf-8")
    return data


@pytest.mark.slow
@pytest.mark.parametrize("kind, steps, early", CASES)
def test_export_verifies_against_generate(tmp_path, exported, kind, steps, early):
    model_dir = T.cached_t5(kind, steps, early)
    bundle = exported(model_dir)
    meta = json.loads((bundle / "bundle.json").read_text())
    model = meta["model"]
    assert "decoder_fused" in meta["graphs"]  # the fused step takes the relative bias
    assert model["norm"] == "rms" and model["relative_buckets"] > 0 and model["linear_bias"] is False
    assert model.get("gated", False) is (kind != "t5") and (model.get("d_kv", 0) > 0) is (kind == "mt5")
    assert ("output_scale" in model) is (kind == "t5")  # tied: d_model ** -0.5
    assert meta["special_ids"]["decoder_start"] == meta["special_ids"]["pad"] == 0
    assert meta["decoding"]["beam_convention"] == ("transformers" if early else "transformers_heuristic")
    target = "de" if kind == "madlad" else None
    if kind == "madlad":
        assert set(meta["tokens"]["languages"]) == {"fr", "de"}
    report = verify_hf(
        model_dir,
        bundle,
        data=str(_data(tmp_path)),
        sentences=SENTENCES,
        tensor_sentences=2,
        target_lang=target,
    )
    assert report["passed"], [c for c in report["checks"] if not c["passed"]]
    tokens = [c for c in report["checks"] if c["tier"] == "tokens" and c["decoder"]]
    assert sorted({c["decoder"] for c in tokens}) == ["fused", "standard"]
    assert all(c["value"] == 1.0 for c in tokens), tokens


def _strip(row: list[int], eos: int) -> list[int]:
    row = row[1:]
    return row[: row.index(eos)] if eos in row else row


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mt5", "madlad"])
def test_n_best_is_generate_s(exported, kind):
    """beam 4 x 3 hypotheses identical to generate(num_return_sequences=3), on both decoders."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model_dir = T.cached_t5(kind, 300 if kind == "madlad" else 0, True)
    bundle = exported(model_dir)  # test_export_verifies_against_generate's
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    hf = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir)).eval()
    sources, max_length = F.test_sentences(40), 24
    texts = [T.source_text(s, kind, "de") for s in sources]
    batch = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        rows = hf.generate(
            **batch,
            num_beams=4,
            num_return_sequences=3,
            early_stopping=True,
            length_penalty=1.0,
            max_length=max_length,
        ).tolist()
    want = [[_strip(rows[3 * i + j], tok.eos_token_id) for j in range(3)] for i in range(len(sources))]
    for decoder in ("standard", "fused"):
        got = Translator(bundle, device="cpu", _tuning=SessionTuning(decoder=decoder)).translate_batch(
            sources,
            beam_size=4,
            num_hypotheses=3,
            length_penalty=1.0,
            max_decoding_length=max_length - 1,
            **({"target_lang": "de"} if kind == "madlad" else {}),
        )
        same = sum(g.token_ids == w for g, w in zip(got, want))
        assert same == len(sources), (decoder, same, [(g.token_ids, w) for g, w in zip(got, want)][:2])


@pytest.mark.slow
@pytest.mark.skipif(bool(skip_reason("the Node host")), reason=skip_reason("the Node host"))
@pytest.mark.parametrize("kind", ["mt5", "madlad"])
def test_node_host_is_identical_to_python(exported, kind):
    from seq2onnx.commands.verify_host import verify_host

    bundle = exported(T.cached_t5(kind, 300 if kind == "madlad" else 0, True))
    report = verify_host(
        bundle, F.test_sentences(16), beam=4, max_length=20, target_lang="fr" if kind == "madlad" else None
    )
    assert report["passed"], ([c for c in report["checks"] if not c["passed"]], report["differences"][:3])


@pytest.mark.slow
def test_directory_without_spiece_model_is_refused_naming_the_file(tmp_path, capsys):
    model_dir = tmp_path / "model"
    shutil.copytree(T.cached_t5("mt5", 0, True), model_dir)
    (model_dir / T.SPM_FILE).unlink()
    out = tmp_path / "bundle"
    assert main(["export", str(model_dir), str(out)]) == 1  # in this process
    stderr = capsys.readouterr().err
    [error] = [line for line in stderr.splitlines() if line.startswith("seq2onnx export: error:")]
    for words in ("spiece.model: missing", "google/mt5-small", str(model_dir)):
        assert words in error, error
    assert not out.exists()


@pytest.mark.slow
def test_config_that_transformers_cannot_run_is_refused(tmp_path):
    """A max_distance at or below half the buckets makes transformers' own buckets negative: refused first."""
    model_dir = tmp_path / "model"
    shutil.copytree(T.cached_t5("t5", 0, True), model_dir)
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "relative_attention_max_distance": 16}))
    with pytest.raises(HFImportError, match="relative_attention_max_distance 16: T5 needs"):
        export_hf_bundle(model_dir, tmp_path / "bundle")
    path.write_text(json.dumps({**config, "d_kv": 0}))
    with pytest.raises(HFImportError, match="d_kv is 0, expected an integer >= 1"):
        export_hf_bundle(model_dir, tmp_path / "bundle")
