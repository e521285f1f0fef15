"""Text edges of an imported NLLB bundle against transformers 5 (issue 35, item 5), in both hosts.

- White space at a text's end: transformers 5's NllbTokenizer (Metaspace, split) keeps it as a lone
  ▁ token where SentencePiece drops it. Matched: the bundle records the ids (tokens.trailing_space)
  and both hosts add them, so "Ein Hund.\\n" gives transformers' ids.
- Literal special tokens and language codes inside a text ("<unk>", "</s>", "<pad>", "fra_Latn"):
  transformers reads them as the special tokens; the bundle reads them as text, on purpose
  (docs/decoding.md): a user's text cannot end the source early or switch its language.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import sentencepiece as spm

from extras import require

require("transformers", "hf")

import hf_fixtures as F  # noqa: E402
import hf_nllb as N  # noqa: E402
from seq2onnx.export.hf.bundle import export_hf_bundle  # noqa: E402
from seq2onnx.runtime.translator import Translator  # noqa: E402

SENTENCE = F.test_sentences(1)[0]
TRAILING = [SENTENCE + end for end in ("\n", " ", "\t", "\r\n", "  \n\n", "\f")] + [
    f"{SENTENCE} \n{SENTENCE}\n"
]
LITERAL = [f"the cat {t} sees a dog" for t in ("<unk>", "</s>", "<pad>", "<s>", "fra_Latn", "deu_Latn")]
PLAIN = [SENTENCE, " " + SENTENCE, SENTENCE.replace(" ", "  "), SENTENCE.replace(" ", "\n"), SENTENCE + "\v"]


@pytest.fixture(scope="module")
def nllb(tmp_path_factory):
    from transformers import AutoTokenizer

    model_dir = N.cached_nllb(with_spm=True)
    bundle = export_hf_bundle(model_dir, tmp_path_factory.mktemp("text") / "bundle", decoder="standard")
    return bundle, AutoTokenizer.from_pretrained(str(model_dir)), Translator(bundle, device="cpu")


def _node_ids(bundle: Path, texts: list[str]) -> list[list[int]]:
    """The Node host's prepareSource ids of each text (js/src/translator.js through js/src/index.js)."""
    from seq2onnx.commands.node_host import find_node_host

    host = find_node_host()
    index = (Path(host["js_dir"]) / "src" / "index.js").as_uri()
    script = (
        f"import {{ Translator }} from {json.dumps(index)};\n"
        "const [dir, texts] = JSON.parse(process.argv[1]);\n"
        "const t = await Translator.load(dir, { threads: 1 });\n"
        "console.log(JSON.stringify(texts.map((x) => t.prepareSource(x).ids)));\n"
    )
    run = subprocess.run(
        [host["node"], "--input-type=module", "-e", script, json.dumps([str(bundle), texts])],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=host["js_dir"],
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.slow
def test_trailing_white_space_matches_transformers(nllb):
    bundle, tok, t = nllb
    space = tok.convert_tokens_to_ids("\u2581")
    assert t.bundle.meta["tokens"]["trailing_space"] == [space]
    for text in TRAILING + PLAIN:
        assert t.prepare_source(text)[0] == tok(text).input_ids, repr(text)
    assert (
        tok(SENTENCE + "\n").input_ids
        == tok(SENTENCE).input_ids[:-1] + [space] + tok(SENTENCE).input_ids[-1:]
    )


@pytest.mark.slow
def test_literal_special_tokens_are_read_as_text(nllb):
    """The documented difference: the text's pieces (SentencePiece through the source map), never a special id."""
    import numpy as np

    bundle, tok, t = nllb
    processor = spm.SentencePieceProcessor(model_file=str(bundle / "source.spm.model"))
    source_map = np.frombuffer((bundle / "source.vocab.bin").read_bytes(), dtype="<i4")
    languages = set(t.bundle.meta["tokens"]["languages"].values())
    for text in LITERAL:
        ids = t.prepare_source(text)[0]
        body = ids[1:-1]
        assert body == source_map[processor.encode(text)].tolist(), text
        assert not ({tok.eos_token_id, tok.pad_token_id, tok.bos_token_id} | languages) & set(body), (
            text,
            body,
        )
        assert ids != tok(text).input_ids, (
            text
        )  # transformers reads the token as special: the difference is real


@pytest.mark.slow
def test_node_host_reads_the_edges_as_python_does(nllb):
    bundle, _, t = nllb
    texts = TRAILING + PLAIN + LITERAL
    assert _node_ids(bundle, texts) == [t.prepare_source(x)[0] for x in texts]
