"""NLLB as transformers 5 saves it (issue 35, item 1): NllbTokenizer is the tokenizers-backed class.

The checkpoint is built in the test (tests/hf_nllb.py). A hub snapshot (sentencepiece.bpe.model
beside tokenizer.json) exports and is held to generate() by `seq2onnx verify`; a directory that
save_pretrained wrote alone (tokenizer.json, no .model) is refused in one line that names the file
and where it comes from, writing nothing.
"""

from __future__ import annotations

import json

import pytest

from extras import require

require("transformers", "hf")

import hf_fixtures as F  # noqa: E402
from helpers import cli_here  # noqa: E402
import hf_nllb as N  # noqa: E402


@pytest.mark.slow
def test_tokenizer_is_what_transformers_5_saves():
    """The fixture is the case of the issue: the fast NllbTokenizer, a Metaspace decoder, no .model saved."""
    from transformers import AutoTokenizer

    without = N.cached_nllb(with_spm=False)
    assert not (without / N.SPM_FILE).exists() and (without / "tokenizer.json").is_file()
    tok = AutoTokenizer.from_pretrained(str(without))
    assert type(tok).__name__ == "NllbTokenizer" and type(tok.decoder).__name__ == "Metaspace"
    assert not hasattr(tok, "additional_special_tokens") and "fra_Latn" in tok.extra_special_tokens
    assert (N.cached_nllb(with_spm=True) / N.SPM_FILE).is_file()


@pytest.mark.slow
def test_hub_snapshot_exports_and_verifies(tmp_path, capsys):
    model_dir = N.cached_nllb(with_spm=True)
    bundle = tmp_path / "bundle"
    done = cli_here("export", model_dir, bundle, "--decoder", "standard")
    assert done.returncode == 0, done.stderr
    meta = json.loads((bundle / "bundle.json").read_text())
    tokens = meta["tokens"]
    assert {"eng_Latn", "fra_Latn", "deu_Latn"} <= set(tokens["languages"])
    assert "<s>" not in tokens["languages"] and "</s>" not in tokens["languages"]
    assert tokens["source_prefix"] == [tokens["languages"]["eng_Latn"]] and tokens["source_suffix"] == [2]
    data = tmp_path / "sentences.txt"
    data.write_text("\n".join(F.test_sentences(30)) + "\n", encoding="utf-8")
    for lang in ("fra_Latn", "deu_Latn"):  # the command in this process
        report = F.verify_command(
            capsys, model_dir, bundle, data, "--source-lang", "eng_Latn", "--target-lang", lang
        )
        for check in F.TOKEN_CHECKS:
            [row] = [line for line in report.splitlines() if check in line]
            assert "100.0%" in row and row.split()[-3] == "ok", row


@pytest.mark.slow
def test_tokenizer_json_alone_is_refused_naming_the_file(tmp_path):
    model_dir = N.cached_nllb(with_spm=False)
    out = tmp_path / "bundle"
    run = cli_here("export", model_dir, out)
    assert run.returncode == 1
    errors = [line for line in run.stderr.splitlines() if line.startswith("seq2onnx export: error:")]
    assert len(errors) == 1 and "Traceback" not in run.stderr, run.stderr
    for words in (
        "sentencepiece.bpe.model: missing",
        "tokenizer.json only",
        "hf_hub_download(",
        "facebook/nllb-200-distilled-600M",
        str(model_dir),
    ):
        assert words in errors[0], errors[0]
    assert not out.exists()


def test_hf_extra_pins_the_tested_transformers_range():
    import tomllib
    from pathlib import Path

    import transformers
    from packaging.specifiers import SpecifierSet

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    [spec] = [
        r[len("transformers") :]
        for r in project["project"]["optional-dependencies"]["hf"]
        if r.startswith("transformers")
    ]
    assert "<" in spec, f"[hf] leaves transformers unbounded above: {spec}"
    assert transformers.__version__ in SpecifierSet(spec), (transformers.__version__, spec)
