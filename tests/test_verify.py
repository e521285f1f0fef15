"""verify: a bundle computes what its checkpoint computes, and a bundle that does not is caught."""
from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tiny import scratch, tiny_bundle, tiny_run

from seq2onnx.export.parity import format_report, test_sentences as split_sentences, verify
from seq2onnx.model import checkpoint
from seq2onnx.runtime import bundle as fmt

REPO = Path(__file__).resolve().parents[1]

VARIANTS = {
    "post-LN tied": (False, True),
    "pre-LN tied": (True, True),
    "post-LN untied": (False, False),
}


def checks(report: dict, tier: str) -> list[dict]:
    return [c for c in report["checks"] if c["tier"] == tier]


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
    tensor = checks(report, "tensor")
    names = {c["name"] for c in tensor}
    assert {"encoder cross K/V max abs", "decoder log_probs (teacher-forced) max abs",
            "decoder log_probs (greedy path) max abs", "decoder cache max abs"} <= names
    # the log-probabilities meet the 1e-4 unwidened; K/V and cache 1e-4 relative to their size
    assert all(c["value"] <= 1e-4 and c["bound"] == 1e-4 for c in tensor if "log_probs" in c["name"])
    assert all(c["value"] <= c["bound"] <= 1e-4 * 100 for c in tensor if "cache" in c["name"] or "K/V" in c["name"])
    [tokens] = checks(report, "tokens")
    assert tokens["value"] == 1.0 and tokens["bound"] == 1.0
    [bleu] = checks(report, "text")
    assert abs(bleu["value"]) < 1e-9
    assert text.splitlines()[-1] == "PASSED" and "FAIL" not in text


@functools.lru_cache(maxsize=None)
def perturbed_bundle() -> Path:
    """The default bundle with noise of scale 0.01 added to the decoder's first weight matrix; hashes rewritten.

    Noise, not a constant: adding one constant to every entry of a weight can cancel out (a
    constant shift of the generator's weight shifts every logit alike, which log-softmax removes)."""
    out = scratch("perturbed") / "bundle"
    shutil.copytree(tiny_bundle(), out)
    path = out / fmt.DECODER_FILE
    proto = onnx.load(str(path))
    inits = {i.name: i for i in proto.graph.initializer}
    gathered = {n.input[0] for n in proto.graph.node if n.op_type == "Gather"}  # embedding tables
    name = next(n.input[1] for n in proto.graph.node
                if n.op_type in ("MatMul", "Gemm") and n.input[1] in inits and n.input[1] not in gathered)
    init = inits[name]
    weight = numpy_helper.to_array(init)
    noise = np.random.default_rng(0).normal(0.0, 0.01, weight.shape).astype(weight.dtype)
    init.CopyFrom(numpy_helper.from_array(weight + noise, name))
    onnx.save(proto, str(path))
    meta = json.loads((out / fmt.BUNDLE_JSON).read_text())
    meta["files"]["decoder"]["sha256"] = fmt.sha256(path)
    (out / fmt.BUNDLE_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    fmt.read_bundle(out)  # it loads: only its numbers are wrong
    return out


def test_verify_fails_on_a_bundle_that_does_not_match():
    report = verify(tiny_run(False, True) / "last", perturbed_bundle())
    text = format_report(report)
    assert report["passed"] is False, text
    decoder = [c for c in checks(report, "tensor") if c["name"].startswith("decoder log_probs")]
    assert decoder and all(c["judged"] and not c["passed"] and c["value"] > 1e-4 for c in decoder), text
    # the encoder is untouched and still matches
    [cross] = [c for c in checks(report, "tensor") if c["name"] == "encoder cross K/V max abs"]
    assert cross["passed"] and cross["value"] <= 1e-4
    failing = [line for line in text.splitlines() if "FAIL" in line and "log_probs" in line]
    assert failing and all("e-" in line or "e+" in line for line in failing), text  # numbers shown
    assert text.splitlines()[-1].startswith("FAILED")


def test_int8_bundle_is_held_to_its_own_bounds():
    report = verify(tiny_run(False, True) / "last", tiny_bundle(False, True, "int8"))
    text = format_report(report)
    assert report["variant"] == "int8"
    tensor = checks(report, "tensor")
    assert tensor and not any(c["judged"] for c in tensor), text
    [tokens], [bleu] = checks(report, "tokens"), checks(report, "text")
    assert tokens["judged"] and tokens["bound"] == 0.8
    assert bleu["judged"] and bleu["bound"] == 5.0
    assert "FAIL" not in "\n".join(line for line in text.splitlines() if line.startswith("tensor"))
    # The verdict is exactly the two judged bounds. Whether this barely trained tiny model keeps
    # 80% greedy agreement under int8 depends on the CPU's integer kernels (it has near-tied
    # logits everywhere); the demo and Tatoeba models are checked by hand in the closing notes.
    assert report["passed"] == (tokens["value"] >= 0.8 and bleu["value"] <= 5.0), text
    assert tokens["value"] >= 0.3, text  # quantized, not broken


def cli_verify(bundle: Path, json_out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "seq2onnx.runtime.cli", "verify", str(tiny_run(False, True)), str(bundle), "--json", str(json_out)],
        cwd=REPO, capture_output=True, text=True, timeout=300)


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
