"""mBART-50 many-to-many as transformers 5 saves it (issue 35, item 7), held to generate() by
`seq2onnx verify`.

The checkpoint is built in the test (tests/hf_mbart.py): MBart50Tokenizer from a SentencePiece model
trained here, an MBartForConditionalGeneration trained en_XX -> fr_XX / de_DE. What the family adds
over M2M100 (export/hf/family_mbart.py): layernorm_embedding, a learned position table per stack
(offset 2), the language code as the source's first token and as the forced first target token.
"""

from __future__ import annotations

import json
import shutil

import pytest

from extras import require

require("transformers", "hf")

import hf_fixtures as F  # noqa: E402
from helpers import cli_here  # noqa: E402
import hf_mbart as M  # noqa: E402
from seq2onnx.commands.main import main  # noqa: E402
from seq2onnx.runtime.translator import Translator  # noqa: E402


@pytest.mark.slow
def test_fixture_is_mbart50_as_transformers_5_saves_it():
    from transformers import AutoConfig, AutoTokenizer

    model_dir = M.cached_mbart()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    assert type(tok).__name__ == "MBart50Tokenizer" and type(tok.decoder).__name__ == "Metaspace"
    tok.src_lang = "en_XX"
    ids = tok("a man helps").input_ids
    assert ids[0] == tok.convert_tokens_to_ids("en_XX") and ids[-1] == tok.eos_token_id
    config = AutoConfig.from_pretrained(str(model_dir))
    assert type(config).__name__ == "MBartConfig" and config.scale_embedding is True


@pytest.mark.slow
def test_export_verifies_against_generate_in_both_target_languages(tmp_path, capsys):
    model_dir = M.cached_mbart()
    bundle = tmp_path / "bundle"
    done = cli_here("export", model_dir, bundle)
    assert done.returncode == 0, done.stderr
    meta = json.loads((bundle / "bundle.json").read_text())
    assert (
        "decoder_fused" in meta["graphs"]
    )  # the fused step has the embedding norm and the decoder's own table
    model, tokens = meta["model"], meta["tokens"]
    assert (
        model["embedding_norm"] is True and model["separate_positions"] is True and model["pre_norm"] is True
    )
    assert model["logits_bias"] is True and model["activation"] == "gelu"
    assert {"en_XX", "fr_XX", "de_DE"} <= set(tokens["languages"]) and tokens[
        "target_lang_in"
    ] == "target_prefix"
    assert tokens["source_prefix"] == [tokens["languages"]["en_XX"]] and tokens["source_suffix"] == [2]
    assert meta["decoding"]["forced_eos"] is True and meta["special_ids"]["decoder_start"] == 2
    data = tmp_path / "sentences.txt"
    data.write_text("\n".join(F.test_sentences(30)) + "\n", encoding="utf-8")
    for lang in ("fr_XX", "de_DE"):  # the command in this process
        report = F.verify_command(
            capsys, model_dir, bundle, data, "--source-lang", "en_XX", "--target-lang", lang
        )
        for check in F.TOKEN_CHECKS:
            rows = [line for line in report.splitlines() if check in line]
            assert rows and all("100.0%" in row and row.split()[-3] == "ok" for row in rows), rows
            if "source ids" not in check:  # one row per decoder: the standard and the fused one
                assert sorted(row.split()[1] for row in rows) == ["fused", "standard"], rows
    # the forced first token picks the language: the trained model's outputs differ between the two
    translator = Translator(bundle, device="cpu")
    sentences = F.test_sentences(5)
    french = [
        r.hypotheses[0]
        for r in translator.translate_batch(sentences, source_lang="en_XX", target_lang="fr_XX")
    ]
    german = [
        r.hypotheses[0]
        for r in translator.translate_batch(sentences, source_lang="en_XX", target_lang="de_DE")
    ]
    assert french != german and all(french) and all(german)


@pytest.mark.slow
def test_tokenizer_json_alone_is_refused_naming_the_file(tmp_path, capsys):
    model_dir = tmp_path / "model"
    shutil.copytree(M.cached_mbart(), model_dir)
    (model_dir / M.SPM_FILE).unlink()
    out = tmp_path / "bundle"
    assert main(["export", str(model_dir), str(out)]) == 1  # in this process
    stderr = capsys.readouterr().err
    [error] = [line for line in stderr.splitlines() if line.startswith("seq2onnx export: error:")]
    for words in (
        "sentencepiece.bpe.model: missing",
        "facebook/mbart-large-50-many-to-many-mmt",
        str(model_dir),
    ):
        assert words in error, error
    assert not out.exists()
