"""The shared bad bundles (spec/cases/bad-bundles.json): every host refuses each at load, with the same
message. Each case damages a copy of the tiny bundle; the Python runtime (a Translator) and the Node
host (its CLI, `seq2onnx-js translate`) must both refuse it with a one-line error matching the case."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import zlib
from pathlib import Path

import pytest

from node_host import JS, NODE, skip_reason
from seq2onnx.runtime.bundle import BundleError
from seq2onnx.runtime.translator import Translator
from tiny import copy_bundle

ROOT = Path(__file__).resolve().parents[1]
CASES = json.loads((ROOT / "spec" / "cases" / "bad-bundles.json").read_text(encoding="utf-8"))["cases"]


def damaged(bundle: Path, case: dict) -> Path:
    """A copy of `bundle` with the case's damage applied (the cases file's $comment says how)."""
    path = copy_bundle(bundle, "bad")
    original = {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}
    meta_path = path / "bundle.json"
    for op in case["damage"]:
        kind = op["op"]
        target = path / op.get("file", "bundle.json")
        if kind == "truncate":
            target.write_bytes(original[op["file"]][: op["bytes"]])
        elif kind == "copy":
            target.write_bytes(original[op["from"]])
        elif kind == "json":
            meta = json.loads(meta_path.read_text())
            parent = meta
            for key in op["path"][:-1]:
                parent = parent[key]
            parent[op["path"][-1]] = op["value"]
            meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True))
        elif kind == "raw_json":
            text = meta_path.read_text()
            assert op["find"] in text, op
            meta_path.write_text(text.replace(op["find"], op["replace"], 1))
        elif kind == "link_dev_zero":
            target.unlink()
            target.symlink_to("/dev/zero")
        elif kind == "fifo":
            target.unlink()
            os.mkfifo(target)
        elif kind == "pad_json":
            meta_path.write_bytes(meta_path.read_bytes() + b" " * op["bytes"])
        else:
            raise AssertionError(f"unknown damage {kind!r} in the cases file")
    if case["rehash"]:
        _rehash(path, meta_path)
    return path


def _rehash(path: Path, meta_path: Path) -> None:
    """bundle.json's checksums rewritten to the files as they now are."""
    meta = json.loads(meta_path.read_text())
    for entry in meta["files"].values():
        data = (path / entry["path"]).read_bytes()
        entry["sha256"] = hashlib.sha256(data).hexdigest()
        entry["size"] = len(data)
        if "crc32" in entry:  # the weights file's load-time check (spec's weights.checksum)
            entry["crc32"] = f"{zlib.crc32(data):08x}"
    meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True))


@pytest.fixture(scope="module")
def copies(bundle):
    return {case["what"]: damaged(bundle, case) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c["what"] for c in CASES])
def test_the_python_runtime_refuses_it(case, copies):
    with pytest.raises(BundleError) as e:
        Translator(copies[case["what"]], device="cpu")
    message = str(e.value)
    assert "\n" not in message and re.search(case["message"], message), (case["message"], message)


@pytest.mark.slow
@pytest.mark.skipif(bool(skip_reason("the Node host")), reason=skip_reason("the Node host"))
@pytest.mark.parametrize("case", CASES, ids=[c["what"] for c in CASES])
def test_the_node_host_refuses_it_the_same_way(case, copies):
    proc = subprocess.run(
        [NODE, str(JS / "bin" / "seq2onnx-js.mjs"), "translate", str(copies[case["what"]])],
        input="the cat\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and re.search(case["message"], lines[0]), (case["message"], proc.stderr)
