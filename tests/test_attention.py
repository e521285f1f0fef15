"""Attention as data: translate_batch(return_attention=True), `translate --attention FILE`, and
verify's check of the decoder's cross_attention output against PyTorch."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch

from seq2onnx.export.parity import verify
from seq2onnx.model import checkpoint
from seq2onnx.runtime import bundle as names
from seq2onnx.runtime.attention import NoAttentionOutput
from seq2onnx.runtime.session_tuning import SessionTuning
from seq2onnx.runtime.translator import Translator
from tiny import copy_bundle, edit_bundle_json, restate_size, scratch, tiny_bundle, tiny_run

TEXTS = [
    "the old cat sees two birds",
    "a dog",
    "the small bird sleeps in the box near the red car",
    "",
    "five brave cats",
    "the queen sees young mice with an old box",
]


@pytest.fixture(scope="module")
def fused():
    return Translator(tiny_bundle(), device="cpu")


@pytest.fixture(scope="module")
def standard():
    return Translator(tiny_bundle(), device="cpu", _tuning=SessionTuning(decoder="standard"))


@pytest.mark.slow
@pytest.mark.parametrize("beam,n_best", [(1, 1), (4, 2)])
@pytest.mark.parametrize("which", ["fused", "standard"])
def test_asking_for_attention_leaves_hypotheses_and_scores_unchanged(request, which, beam, n_best):
    translator = request.getfixturevalue(which)
    plain = translator.translate_batch(TEXTS, beam_size=beam, num_hypotheses=n_best, return_scores=True)
    seen = translator.translate_batch(
        TEXTS, beam_size=beam, num_hypotheses=n_best, return_scores=True, return_attention=True
    )
    assert [r.token_ids for r in seen] == [r.token_ids for r in plain]
    assert [r.scores for r in seen] == [r.scores for r in plain]  # exactly: the search ran as without it
    assert all(r.attention is None for r in plain)
    for text, r in zip(TEXTS, seen):
        source = translator.prepare_source(text)[0]
        assert len(r.attention) == n_best
        for tokens, weights in zip(r.token_ids, r.attention):
            assert weights.dtype == np.float32 and weights.shape == (len(tokens), len(source))
            np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-5)  # a distribution per target piece


@pytest.mark.slow
@torch.no_grad()
def test_attention_is_pytorchs_along_the_hypothesis(standard):
    model, _, _ = checkpoint.load(tiny_run() / "last")
    model.eval()
    results = standard.translate_batch(TEXTS, beam_size=4, num_hypotheses=2, return_attention=True)
    compared = 0
    for text, r in zip(TEXTS, results):
        source = standard.prepare_source(text)[0]
        if not source:
            continue
        src = torch.tensor([source])
        mask = torch.ones_like(src, dtype=torch.bool)
        cross = model.cross_kv(model.encode(src, mask))
        for tokens, got in zip(r.token_ids, r.attention):
            past, rows = model.empty_cache(1), torch.zeros(1, dtype=torch.long)
            fed = [model.cfg.decoder_start_id, *tokens[:-1]] if tokens else []
            want = []
            for t, token in enumerate(fed):
                _, past, attention = model.decode_step(
                    torch.tensor([[token]]), torch.tensor([t]), rows, past, cross, mask, return_attention=True
                )
                want.append(attention[0].numpy())
            want = np.array(want, dtype=np.float32).reshape(len(tokens), len(source))
            np.testing.assert_allclose(got, want, atol=1e-5)
            compared += 1
    assert compared == 10


def test_a_sentences_attention_does_not_depend_on_its_batch(fused):
    alone = [fused.translate_batch([t], beam_size=4, return_attention=True)[0] for t in TEXTS]
    together = fused.translate_batch(TEXTS, beam_size=4, return_attention=True)
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.attention[0], b.attention[0], atol=1e-6)


def _without_attention_output(name: str):
    """A copy of the tiny bundle as exported before 0.3: decoder.onnx without cross_attention."""
    path = copy_bundle(tiny_bundle(), name)
    proto = onnx.load(str(path / names.DECODER_FILE))
    outputs = [o for o in proto.graph.output if o.name != names.CROSS_ATTENTION]
    del proto.graph.output[:]
    proto.graph.output.extend(outputs)
    onnx.save(proto, str(path / names.DECODER_FILE))

    def edit(meta):
        spec = meta["graphs"]["decoder"]
        spec["outputs"] = [o for o in spec["outputs"] if o["name"] != names.CROSS_ATTENTION]

    edit_bundle_json(path, edit)
    restate_size(path, "decoder")
    return path


def test_a_bundle_without_the_output_translates_but_refuses_attention_naming_the_fix():
    translator = Translator(_without_attention_output("old-decoder"), device="cpu", check_hashes=False)
    assert translator.translate_batch(["a dog"])[0].hypotheses[0]
    with pytest.raises(NoAttentionOutput, match="cross_attention.*seq2onnx export"):
        translator.translate_batch(["a dog"], return_attention=True)


def _translate(*args, stdin: str):
    return subprocess.run(
        [sys.executable, "-m", "seq2onnx.commands", "translate", str(tiny_bundle()), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_translate_attention_writes_json_lines_and_a_heatmap_page():
    out = scratch("attention-cli")
    data = out / "attention.jsonl"
    lines = "the old cat sees two birds\n\na dog\n"
    plain = _translate("--beam", "2", stdin=lines)
    seen = _translate("--beam", "2", "--attention", str(data), stdin=lines)
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout == plain.stdout and seen.stdout.count("\n") == 3
    records = [json.loads(line) for line in data.read_text().splitlines()]
    assert [r["line"] for r in records] == [0, 1, 2]
    first = records[0]
    assert first["source_pieces"][-1] == "</s>" and first["target_pieces"]
    assert np.array(first["attention"]).shape == (len(first["target_pieces"]), len(first["source_pieces"]))
    np.testing.assert_allclose(np.array(first["attention"]).sum(axis=1), 1.0, atol=1e-3)
    assert records[1] == {"line": 1, "source_pieces": [], "target_pieces": [], "attention": []}
    page = (out / "attention.html").read_text()
    assert page.count("<table>") == 3 and "▁cat" in page and "3 of 3 lines drawn" in page

    again = _translate("--attention", str(data), stdin="a dog\n")
    assert again.returncode != 0 and "--attention" in again.stderr and "--force" in again.stderr
    assert len(data.read_text().splitlines()) == 3  # untouched
    forced = _translate("--attention", str(data), "--force", stdin="a dog\n")
    assert forced.returncode == 0 and len(data.read_text().splitlines()) == 1


@pytest.mark.slow
def test_verify_checks_the_attention_output_against_pytorch():
    report = verify(tiny_run() / "last", tiny_bundle(), sentences=8)
    [check] = [c for c in report["checks"] if c["name"] == "decoder cross_attention max abs"]
    assert check["passed"] and check["judged"] and 0.0 < check["value"] < 1e-5
