"""verify: a bundle computes what its checkpoint computes, and a bundle that does not is caught."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from helpers import cli_here
from tiny import scratch, tiny_bundle, tiny_run

from seq2onnx.export.bundle import TOLERANCES
from seq2onnx.export.parity import test_sentences as split_sentences, verify
from seq2onnx.export.parity_report import format_report
from seq2onnx.model import checkpoint
from seq2onnx.model.search import translate_ids
from seq2onnx.model.metrics import bleu
from seq2onnx.runtime import bundle as fmt
from seq2onnx.runtime.session_tuning import SessionTuning
from seq2onnx.runtime.u8s8_probe import precision_entries
from seq2onnx.runtime.translator import Translator


VARIANTS = {
    "post-LN tied": (False, True),
    "pre-LN tied": (True, True),
    "post-LN untied": (False, False),
}


def checks(report: dict, tier: str) -> list[dict]:
    return [c for c in report["checks"] if c["tier"] == tier]


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
def test_verify_passes_for_the_exported_model(variant):
    pre_norm, tie = VARIANTS[variant]
    run = tiny_run(pre_norm, tie)
    report = verify(run / "last", tiny_bundle(pre_norm, tie))
    text = format_report(report)
    assert report["passed"], text
    assert report["variant"] == "float32" and report["provider"] == "CPU"
    # the test split, in batches of 16 of different lengths: padding is exercised
    assert report["sentences"] >= 20
    _, tok, ckpt = checkpoint.load(run / "last")
    lengths = [len(tok.encode_source(s)) for s, _ in split_sentences(ckpt, report["sentences"])[:16]]
    assert len(set(lengths)) > 1
    assert all(c["judged"] and c["passed"] for c in report["checks"]), text
    # both decoders of the bundle, each at the same bounds, each row naming its decoder
    assert report["decoders"] == ["standard", "fused"] and "decoders: standard, fused" in text
    tensor = checks(report, "tensor")
    common = {
        "decoder log_probs (teacher-forced) max abs",
        "decoder log_probs (greedy path) max abs",
        "decoder cache max abs",
    }
    for decoder, extra in (("standard", {"decoder cross_attention max abs"}), ("fused", set())):
        names = {c["name"] for c in tensor if c["decoder"] == decoder}
        assert names == common | extra, decoder  # only the standard decoder outputs attention
    assert {c["name"] for c in tensor if c["decoder"] == ""} == {
        "encoder src_mask equal",
        "encoder cross K/V max abs",
    }
    # the log-probabilities meet the 1e-4 unwidened; K/V and cache 1e-4 relative to their size
    assert all(c["value"] <= 1e-4 and c["bound"] == 1e-4 for c in tensor if "log_probs" in c["name"])
    assert all(
        c["value"] <= c["bound"] <= 1e-4 * 100 for c in tensor if "cache" in c["name"] or "K/V" in c["name"]
    )
    tokens = checks(report, "tokens")
    assert [c["decoder"] for c in tokens] == ["standard", "fused"]
    assert all(c["value"] == 1.0 and c["bound"] == 1.0 for c in tokens)
    bleus = checks(report, "text")
    assert [c["decoder"] for c in bleus] == ["standard", "fused"] and all(
        abs(c["value"]) < 1e-9 for c in bleus
    )
    assert text.splitlines()[-1] == "PASSED" and "FAIL" not in text
    rows = [line.split() for line in text.splitlines() if line.startswith(("tensor ", "tokens ", "text "))]
    assert {r[1] for r in rows} == {"-", "standard", "fused"}


@functools.lru_cache(maxsize=None)
def perturbed_bundle(key: str = "decoder") -> Path:
    """The default bundle with noise of scale 0.01 added to the first weight matrix of one decoder
    (files.<key>: "decoder" or "decoder_fused"); hashes rewritten.

    Noise, not a constant: adding one constant to every entry of a weight can cancel out (a
    constant shift of the generator's weight shifts every logit alike, which log-softmax removes)."""
    out = scratch(f"perturbed-{key}") / "bundle"
    shutil.copytree(tiny_bundle(), out)
    path = out / {"decoder": fmt.DECODER_FILE, "decoder_fused": fmt.FUSED_DECODER_FILE}[key]
    proto = onnx.load(str(path))
    inits = {i.name: i for i in proto.graph.initializer}
    gathered = {
        n.input[0] for n in proto.graph.node if n.op_type in ("Gather", "GatherND")
    }  # embedding tables
    name = next(
        n.input[1]
        for n in proto.graph.node
        if n.op_type in ("MatMul", "Gemm") and n.input[1] in inits and n.input[1] not in gathered
    )
    init = inits[name]
    weight = numpy_helper.to_array(init)
    noise = np.random.default_rng(0).normal(0.0, 0.01, weight.shape).astype(weight.dtype)
    init.CopyFrom(numpy_helper.from_array(weight + noise, name))
    onnx.save(proto, str(path))
    meta = json.loads((out / fmt.BUNDLE_JSON).read_text())
    meta["files"][key].update(sha256=fmt.sha256(path), size=path.stat().st_size)
    (out / fmt.BUNDLE_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    fmt.read_bundle(out)  # it loads: only its numbers are wrong
    return out


# What a perturbed graph or a moved bound needs to show (the verdict, not a measurement over the split): every
# sentence's log-probabilities move with the noise, so a few sentences show it as the split's fifty would.
FEW = dict(sentences=20, tensor_sentences=4)


@pytest.mark.slow
@pytest.mark.parametrize("broken, intact", [("standard", "fused"), ("fused", "standard")])
def test_verify_fails_when_either_decoder_does_not_match(broken, intact):
    report = verify(
        tiny_run(False, True) / "last",
        perturbed_bundle("decoder_fused") if broken == "fused" else perturbed_bundle(),
        **FEW,
    )
    text = format_report(report)
    assert report["passed"] is False, text
    log_probs = [c for c in checks(report, "tensor") if c["name"].startswith("decoder log_probs")]
    bad = [c for c in log_probs if c["decoder"] == broken]
    good = [c for c in log_probs if c["decoder"] == intact]
    assert len(bad) == len(good) == 2, text
    assert all(c["judged"] and not c["passed"] and c["value"] > 1e-4 for c in bad), text
    assert all(c["passed"] and c["value"] <= 1e-4 for c in good), text  # only the perturbed graph fails
    failing = [line for line in text.splitlines() if "FAIL" in line and "log_probs" in line]
    assert failing and all(line.split()[1] == broken for line in failing), text
    assert text.splitlines()[-1].startswith("FAILED")


@pytest.mark.slow
def test_verify_fails_on_a_bundle_that_does_not_match():
    report = verify(tiny_run(False, True) / "last", perturbed_bundle(), **FEW)
    text = format_report(report)
    assert report["passed"] is False, text
    decoder = [
        c
        for c in checks(report, "tensor")
        if c["name"].startswith("decoder log_probs") and c["decoder"] == "standard"
    ]
    assert decoder and all(c["judged"] and not c["passed"] and c["value"] > 1e-4 for c in decoder), text
    # the encoder is untouched and still matches
    [cross] = [c for c in checks(report, "tensor") if c["name"] == "encoder cross K/V max abs"]
    assert cross["passed"] and cross["value"] <= 1e-4
    failing = [line for line in text.splitlines() if "FAIL" in line and "log_probs" in line]
    assert failing and all("e-" in line or "e+" in line for line in failing), text  # numbers shown
    assert text.splitlines()[-1].startswith("FAILED")


def _independent_agreement(run: Path, bundle: Path, n: int, decoder: str = "auto") -> tuple[float, float]:
    """Greedy agreement and BLEU drop of a bundle against PyTorch, measured here without verify()."""
    model, tok, ckpt = checkpoint.load(run)
    pairs = split_sentences(ckpt, n)
    srcs = [tok.encode_source(s) for s, _ in pairs]
    want = [h[0].tokens for h in translate_ids(model, srcs, beam_size=1)]
    want = [w[:-1] if w and w[-1] == model.cfg.eos_id else w for w in want]
    got = Translator(bundle, device="cpu", _tuning=SessionTuning(decoder=decoder)).translate_batch(
        srcs, beam_size=1
    )
    refs = [t for _, t in pairs]
    drop = bleu([tok.decode_target(w) for w in want], refs) - bleu([g.hypotheses[0] for g in got], refs)
    return sum(g.token_ids[0] == w for g, w in zip(got, want)) / len(pairs), drop


@pytest.mark.slow
def test_int8_bundle_is_judged_by_the_codes_bounds_on_tokens_and_bleu():
    run, bundle = tiny_run(False, True) / "last", tiny_bundle(False, True, "int8")
    bounds = TOLERANCES["int8"]  # the one constant export writes into bundle.json
    assert fmt.read_bundle(bundle).meta["tolerances"] == bounds
    report = verify(run, bundle)
    text = format_report(report)
    # the int8 bundle has both decoders (int8 GEMMs around fp32 attention), each judged at the same bounds
    assert [c["decoder"] for c in checks(report, "tokens")] == ["standard", "fused"], text
    verdicts = []
    for decoder in ("standard", "fused"):
        [tokens] = [c for c in checks(report, "tokens") if c["decoder"] == decoder]
        [drop] = [c for c in checks(report, "text") if c["decoder"] == decoder]
        assert (tokens["bound"], drop["bound"]) == (bounds["min_greedy_agreement"], bounds["max_bleu_drop"])
        # The values are what decoding both ways here gives, and the verdict follows from them.
        rate, bleu_drop = _independent_agreement(run, bundle, report["sentences"], decoder)
        assert tokens["value"] == rate and drop["value"] == pytest.approx(bleu_drop, abs=1e-6)
        meets = {
            "greedy token ids identical": rate >= bounds["min_greedy_agreement"],
            "BLEU drop (torch - bundle)": bleu_drop <= bounds["max_bleu_drop"],
        }
        verdicts += meets.values()
        for name, ok in meets.items():
            [line] = [line for line in text.splitlines() if name in line and f" {decoder} " in line]
            assert (" ok " in line) is ok and ("FAIL" in line) is not ok, line
    assert report["passed"] is all(verdicts), text
    # the integer kernel this CPU multiplies with, as the runtime chose it (runtime/u8s8_probe.py)
    want = (
        "u8 x u8 (this CPU's u8 x s8 kernel saturates"
        if precision_entries(ort)
        else "u8 x s8 (exact on this CPU)"
    )
    assert text.splitlines()[2].startswith(f"int8 products: {want}"), text
    # int8 changes logits by far more than fp32's 1e-4: tensor differences are measurements, not checks
    tensor = checks(report, "tensor")
    assert tensor and not any(c["judged"] for c in tensor) and max(c["value"] for c in tensor) > 1e-2, text
    measurements = text.split("measurements (not checks")[1].splitlines()[1:-1]
    assert len(measurements) == len(tensor) and all(line.startswith("tensor ") for line in measurements), text
    assert not any(
        "FAIL" in line or " ok " in line or "<=" in line or "(info)" in line for line in measurements
    ), text


def _with_tolerances(name: str, **tolerances) -> Path:
    """The int8 bundle with other bounds in bundle.json (the graphs, and so every value, unchanged)."""
    out = scratch(name) / "bundle"
    shutil.copytree(tiny_bundle(False, True, "int8"), out)
    meta = json.loads((out / fmt.BUNDLE_JSON).read_text())
    meta["tolerances"].update(tolerances)
    (out / fmt.BUNDLE_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out


@pytest.mark.slow
def test_int8_verdict_moves_with_its_bounds_and_names_the_failing_check():
    run = tiny_run(False, True) / "last"
    # An agreement of at least 0% and any BLEU drop pass, however far the tensors are off (atol 0).
    lax = verify(
        run, _with_tolerances("lax", min_greedy_agreement=0.0, max_bleu_drop=100.0, tensor_atol=0.0), **FEW
    )
    assert lax["passed"] is True, format_report(lax)
    # No bundle agrees on more than 100% of sentences: the token check fails, and only it.
    strict = verify(run, _with_tolerances("strict", min_greedy_agreement=1.01, max_bleu_drop=100.0), **FEW)
    text = format_report(strict)
    assert strict["passed"] is False
    assert [c["name"] for c in strict["checks"] if c["judged"] and not c["passed"]] == [
        "greedy token ids identical"
    ] * 2
    failing = [line for line in text.splitlines() if "FAIL" in line and not line.startswith("FAILED")]
    assert [re.match(r"tokens +(\w+) +greedy token ids identical", line)[1] for line in failing] == [
        "standard",
        "fused",
    ], text
    assert text.splitlines()[-1].startswith("FAILED")


def test_format_report_lists_only_deciding_checks_with_bounds():
    report = {
        "bundle": "B",
        "checkpoint": "C",
        "variant": "int8",
        "provider": "CPU",
        "sentences": 10,
        "passed": False,
        "checks": [
            {
                "tier": "tensor",
                "name": "decoder cache max abs",
                "value": 3.5,
                "bound": 1.0,
                "passed": False,
                "detail": "d1",
                "judged": False,
                "decoder": "standard",
            },
            {
                "tier": "tokens",
                "name": "greedy token ids identical",
                "value": 0.5,
                "bound": 0.8,
                "passed": False,
                "detail": "5/10 sentences",
                "judged": True,
                "decoder": "standard",
            },
            {
                "tier": "text",
                "name": "BLEU drop (torch - bundle)",
                "value": 1.0,
                "bound": 5.0,
                "passed": True,
                "detail": "d3",
                "judged": True,
                "decoder": "fused",
            },
        ],
    }
    lines = format_report(report).splitlines()
    assert any(
        re.fullmatch(r"tokens +standard +greedy token ids identical +50\.0% +>= 80% +FAIL +5/10 sentences", x)
        for x in lines
    )
    assert any(
        re.fullmatch(r"text +fused +BLEU drop \(torch - bundle\) +1\.00 +<= 5\.0 +ok +d3", x) for x in lines
    )
    [cache] = [x for x in lines if "decoder cache" in x]
    assert re.fullmatch(
        r"tensor +standard +decoder cache max abs +3\.50e\+00 +d1", cache
    )  # a value, no bound, no verdict
    assert lines.index(cache) > max(
        i for i, x in enumerate(lines) if x.startswith("text")
    )  # after the checks
    assert "measurements (not checks" in lines[lines.index(cache) - 1]
    assert lines[-1].startswith("FAILED")
    report["checks"] = report["checks"][1:]  # fp32-like: nothing unjudged, no measurements section
    assert "measurements" not in format_report(report)


def cli_verify(bundle: Path, json_out: Path) -> subprocess.CompletedProcess:
    few = ("--sentences", FEW["sentences"], "--tensor-sentences", FEW["tensor_sentences"])
    return cli_here("verify", tiny_run(False, True), bundle, "--json", json_out, *few)


@pytest.mark.slow
def test_cli_verify_exit_status_and_json():
    out = scratch("cli-verify")
    good = cli_verify(tiny_bundle(), out / "good.json")
    assert good.returncode == 0, good.stdout + good.stderr
    report = json.loads((out / "good.json").read_text())
    assert report["passed"] is True and report["sentences"] >= 20
    assert "PASSED" in good.stdout
    bad = cli_verify(perturbed_bundle(), out / "bad.json")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert json.loads((out / "bad.json").read_text())["passed"] is False
    assert "FAIL" in bad.stdout and "Traceback" not in bad.stderr
