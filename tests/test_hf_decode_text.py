"""Texts as transformers decodes them: a tokenizer that decodes as the tokenizers library's Metaspace decoder
(transformers 5's T5, NLLB and mBART) keeps the spaces of a lone ▁ first or last, which SentencePiece's
decoding and a strip drop; the importer records it (tokens.metaspace) and both hosts decode so."""

from __future__ import annotations

import json
import random
import subprocess

import pytest

from extras import require

require("transformers", "hf")

import hf_fixtures as F  # noqa: E402
import hf_t5 as T  # noqa: E402
from node_host import JS, skip_reason  # noqa: E402
from seq2onnx.export.hf.bundle import export_hf_bundle  # noqa: E402
from seq2onnx.export.hf.tokens import load_tokenizer  # noqa: E402
from seq2onnx.runtime.translator import Translator  # noqa: E402

SPACE = "\u2581"


def _id_lists(tokenizer, n: int = 300) -> list[list[int]]:
    """Random target ids, a third led by a lone ▁ and a fifth ending in one, special tokens left out."""
    vocab = tokenizer.get_vocab()
    special = set(tokenizer.all_special_ids)
    ids = sorted(i for i in vocab.values() if i not in special and i < tokenizer.vocab_size)
    rng = random.Random(0)
    lists = []
    for _ in range(n):
        row = [rng.choice(ids) for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.33:
            row = [vocab[SPACE]] + row
        if rng.random() < 0.2:
            row = row + [vocab[SPACE]]
        lists.append(row)
    return lists


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    model_dir = T.cached_t5("t5", 0, True)
    bundle = export_hf_bundle(model_dir, tmp_path_factory.mktemp("t5") / "bundle", decoder="standard")
    return model_dir, bundle


@pytest.mark.slow
def test_a_metaspace_tokenizer_s_texts_are_the_hosts_texts(t5):
    model_dir, bundle = t5
    tokenizer = load_tokenizer(model_dir)
    meta = json.loads((bundle / "bundle.json").read_text())
    assert meta["tokens"].get("metaspace") is True, meta["tokens"]
    translator = Translator(bundle, device="cpu")
    lists = _id_lists(tokenizer)
    want = [tokenizer.decode(ids, skip_special_tokens=True) for ids in lists]
    got = [translator.detokenize(ids) for ids in lists]
    assert got == want
    assert sum(w != w.strip() for w in want) > 30  # the cases where a strip would differ were drawn


@pytest.mark.slow
def test_the_node_host_decodes_a_metaspace_bundle_as_python(t5):
    reason = skip_reason("the Node host's texts")
    if reason:
        pytest.skip(reason)
    _, bundle = t5
    tokenizer = load_tokenizer(t5[0])
    lists = _id_lists(tokenizer, 100)
    translator = Translator(bundle, device="cpu")
    want = [translator.detokenize(ids) for ids in lists]
    script = (
        "import { Translator } from './src/index.js';\n"
        "const [dir, lists] = JSON.parse(process.argv[1]);\n"
        "const t = await Translator.load(dir, { threads: 1 });\n"
        "console.log(JSON.stringify(lists.map((ids) => t.tokens.decode(ids, t.targetTokenizer))));\n"
    )
    done = subprocess.run(
        ["node", "--input-type=module", "-e", script, json.dumps([str(bundle), lists])],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=JS,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == want


@pytest.mark.slow
def test_a_sentencepiece_decoding_tokenizer_is_not_recorded_as_metaspace(tmp_path):
    bundle = export_hf_bundle(F.random_model("marian"), tmp_path / "bundle", decoder="standard")
    tokens = json.loads((bundle / "bundle.json").read_text())["tokens"]
    assert "metaspace" not in tokens and tokens["strip_text"] is True, tokens
