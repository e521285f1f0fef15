"""`seq2onnx verify-host`: the Node host against the Python runtime on the same bundle, as a command.

It passes on the tiny bundle, and it fails (exit 1, the row named) when the Node side is made to
differ: a fake `--node` runs the real node and alters one token id, one score or one tokenizer id
in what it writes. The errors for a missing node, a missing js/node_modules and missing sentences
name what to install or pass; they need no node and always run.

The tests that run node need Node.js and `npm ci --prefix js`; without them they skip with one line."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from seq2onnx.model.corpus import generate_pairs
from seq2onnx import errors as cli
from seq2onnx.commands.host_sentences import read_sentences
from node_host import NODE, skip_reason

ROOT = Path(__file__).resolve().parents[1]
JS = ROOT / "js"
N_SENTENCES = 40  # the command's parity on 240 sentences is tests/test_js_host.py's; here, the command

_SKIP = skip_reason("verify-host")
needs_node = pytest.mark.skipif(bool(_SKIP), reason=_SKIP)


def verify_host(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "seq2onnx.commands", "verify-host", *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=ROOT,
        timeout=300,
        env=env,
    )


def rows(stdout: str) -> dict[str, str]:
    """check name -> "ok" or "FAIL", read from the printed table."""
    found = {}
    for line in stdout.splitlines():
        for result in (" ok ", " FAIL "):
            if result in line and ("identical" in line or "score diff" in line):
                found[line.split("  ")[0].strip()] = result.strip()
    return found


@pytest.fixture(scope="module")
def sentences_file(tmp_path_factory) -> Path:
    # seed 11: not the training corpus (tests/tiny.py trains on seed 3), as in tests/test_js_host.py
    path = tmp_path_factory.mktemp("verify-host") / "sentences.txt"
    path.write_text("".join(src + "\n" for src, _ in generate_pairs(N_SENTENCES, seed=11)), encoding="utf-8")
    return path


# A stand-in for node that runs the real one and alters what it writes: FAULT names what.
FAKE_NODE = """#!{python}
import json, subprocess, sys
args = sys.argv[1:]
proc = subprocess.run([{node!r}, *args], stdin=sys.stdin, capture_output=True, text=True)
lines = proc.stdout.splitlines()
fault = {fault!r}
if lines and fault == "ids" and "translate" in args and args[args.index("--beam") + 1] == "4":
    first = json.loads(lines[3])
    first["token_ids"][1] = first["token_ids"][1] + [7]  # the second hypothesis of sentence 3
    lines[3] = json.dumps(first)
elif lines and fault == "score" and "translate" in args and args[args.index("--beam") + 1] == "1":
    first = json.loads(lines[0])
    first["scores"][0] += 1e-3
    lines[0] = json.dumps(first)
elif lines and fault == "tokens" and "tokenize" in args and args[args.index("--side") + 1] == "target":
    first = json.loads(lines[0])
    first["ids"] = first["ids"] + [4]
    lines[0] = json.dumps(first)
sys.stdout.write("".join(line + "\\n" for line in lines))
sys.stderr.write(proc.stderr)
sys.exit(proc.returncode)
"""


def fake_node(directory: Path, fault: str, node: str | None = NODE, version: str | None = None) -> Path:
    path = directory / f"node-{fault}"
    if version is not None:  # a node that only says its version
        path.write_text(f"#!/bin/sh\necho {version}\n")
    else:
        path.write_text(FAKE_NODE.format(python=sys.executable, node=node, fault=fault))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.slow
@needs_node
def test_passes_on_the_tiny_bundle_and_writes_the_report(bundle, sentences_file, tmp_path):
    report_path = tmp_path / "report.json"
    # a bundle path relative to where the command runs: the Node host runs elsewhere and must get it whole
    relative = os.path.relpath(bundle, ROOT)
    assert not Path(relative).is_absolute()
    proc = verify_host(relative, "--sentences-file", str(sentences_file), "--json", str(report_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("PASSED")
    assert set(rows(proc.stdout).values()) == {"ok"} and len(rows(proc.stdout)) == 8, proc.stdout
    report = json.loads(report_path.read_text())
    checks = {c["name"]: c for c in report["checks"]}
    n = N_SENTENCES
    assert checks["source tokenizer ids identical"]["value"] == f"{n}/{n}"
    assert checks["greedy token ids identical"]["value"] == f"{n}/{n}"
    assert checks["beam 4 (n-best 4) token ids identical"]["value"] == f"{n}/{n}"
    assert checks["beam 4 (n-best 4) translations identical"]["value"] == f"{4 * n}/{4 * n}"
    assert (
        checks["beam 4 (n-best 4) max |score diff|"]["detail"]
        == f"over {4 * n} hypotheses with identical ids"
    )
    assert report["passed"] and report["sentences"] == n and report["decoder"] == "standard"
    assert report["speed"]["beam 4"]["host_s"] > 0 and report["speed"]["beam 4"]["host_tokens"] > n
    # the report file is not overwritten without --force, and that is said before any work
    again = verify_host(str(bundle), "--sentences-file", str(sentences_file), "--json", str(report_path))
    assert again.returncode == 1 and "exists; choose another --json FILE or pass --force" in again.stderr


@needs_node
@pytest.mark.parametrize(
    "fault,failing",
    [
        ("ids", "beam 4 (n-best 4) token ids identical"),
        ("score", "greedy max |score diff|"),
        ("tokens", "target tokenizer ids identical"),
    ],
)
@pytest.mark.slow
def test_fails_when_the_node_host_differs(bundle, sentences_file, tmp_path, fault, failing):
    proc = verify_host(
        str(bundle), "--sentences-file", str(sentences_file), "--node", str(fake_node(tmp_path, fault))
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED: see the rows marked FAIL" in proc.stdout
    found = rows(proc.stdout)
    assert len(found) == 8 and {name for name, r in found.items() if r == "FAIL"} == {failing}, proc.stdout
    if fault == "ids":  # the difference is shown with both hosts' ids and scores
        assert "beam 4 (n-best 4), sentence 3, hypothesis 1:" in proc.stdout
        assert (
            "    python ids [" in proc.stdout
            and "    node   ids [" in proc.stdout
            and ", score -" in proc.stdout
        )
    if fault == "score":
        assert f"{1e-3:.1e}" in next(line for line in proc.stdout.splitlines() if line.startswith(failing))


@pytest.mark.slow
def test_missing_node_and_missing_node_modules_name_what_to_install(tmp_path):
    sentences = tmp_path / "s.txt"
    sentences.write_text("the cat\n")
    env = {**os.environ, "PATH": str(tmp_path)}  # no node on PATH (python is run by its full path)
    proc = verify_host("nowhere", "--sentences-file", str(sentences), env=env)
    assert proc.returncode == 1
    assert "node is not installed (not on PATH): install Node.js >= 18.17" in proc.stderr
    assert f"npm ci --prefix {JS}" in proc.stderr
    proc = verify_host(
        "nowhere", "--sentences-file", str(sentences), "--node", str(tmp_path / "no-such-node")
    )
    assert proc.returncode == 1 and "not an executable file" in proc.stderr
    bare = tmp_path / "js"  # the JS host without its dependencies
    shutil.copytree(JS / "bin", bare / "bin")
    proc = verify_host(
        "nowhere",
        "--sentences-file",
        str(sentences),
        "--js-dir",
        str(bare),
        "--node",
        str(fake_node(tmp_path, "none", version="v20.1.0")),
    )
    assert proc.returncode == 1
    assert (
        f"{bare / 'node_modules' / 'onnxruntime-node'}: missing; install the JS host's dependencies: npm ci --prefix {bare}"
        in proc.stderr
    )
    proc = verify_host(
        "nowhere",
        "--sentences-file",
        str(sentences),
        "--node",
        str(fake_node(tmp_path, "old", version="v16.20.0")),
    )
    assert proc.returncode == 1 and "is Node.js v16.20.0; the JS host needs Node.js >= 18.17" in proc.stderr
    proc = verify_host("nowhere", "--sentences-file", str(sentences), "--js-dir", str(tmp_path))
    assert proc.returncode == 1 and "no JS host there (bin/seq2onnx-js.mjs)" in proc.stderr


def test_a_node_that_is_not_node_is_named_without_its_output(bundle, sentences_file):
    proc = verify_host(str(bundle), "--sentences-file", str(sentences_file), "--node", "/bin/false")
    assert proc.returncode == 1
    assert (
        "--node /bin/false: not Node.js" in proc.stderr and "give the path of the node binary" in proc.stderr
    )
    assert (
        "Copyright" not in proc.stderr and "License" not in proc.stderr and len(proc.stderr.splitlines()) == 1
    )


def test_sentences_come_from_one_named_source(tmp_path):
    proc = verify_host("nowhere")
    assert proc.returncode == 1
    for option in ("--sentences-file FILE", "--data TSV --src-col N", "--synthetic"):
        assert option in proc.stderr
    tsv = tmp_path / "corpus.tsv"
    # a byte order mark, CRLF ends, a blank line and a file ending in two newlines, as Tatoeba's
    rows_ = [f"src{i}\ttgt {i}" for i in range(10)]
    tsv.write_bytes(
        ("\ufeff" + "\r\n".join(rows_[:5]) + "\r\n\r\n" + "\n".join(rows_[5:]) + "\n\n").encode("utf-8")
    )
    texts, what = read_sentences(bundle_dir="nowhere", data=str(tsv), src_col=1, count=4)
    assert texts == ["tgt 0", "tgt 2", "tgt 5", "tgt 7"]  # evenly spaced over the 10
    assert what == "4 sentences from column 1 of corpus.tsv (evenly spaced over its 10 non-empty ones)"
    assert (
        read_sentences(bundle_dir="nowhere", data=str(tsv), src_col=0, count=50)[0][0] == "src0"
    )  # no BOM left
    with pytest.raises(
        cli.CommandError, match=r"line 1 has 2 tab-separated columns; --src-col 2 needs at least 3"
    ):
        read_sentences(bundle_dir="nowhere", data=str(tsv), src_col=2)
    with pytest.raises(cli.CommandError, match="--data and --synthetic: give one source of sentences"):
        read_sentences(bundle_dir="nowhere", data=str(tsv), synthetic=True)
    (tmp_path / "latin1.txt").write_bytes(b"ok\ncaf\xe9\n")
    with pytest.raises(cli.CommandError, match=r"latin1\.txt: line 2 is not UTF-8"):
        read_sentences(bundle_dir="nowhere", sentences_file=str(tmp_path / "latin1.txt"))


def test_synthetic_sentences_are_made_from_the_bundle(bundle):
    texts, what = read_sentences(bundle_dir=bundle, synthetic=True, count=30)
    assert len(texts) == 30 and len(set(texts)) > 20 and all(t.strip() for t in texts)
    assert texts == read_sentences(bundle_dir=bundle, synthetic=True, count=30)[0]  # seeded
    assert what == "30 synthetic texts from the bundle's source vocabulary (seed 0)"


def test_the_command_is_listed():
    out = subprocess.run(
        [sys.executable, "-m", "seq2onnx.commands", "--help"], capture_output=True, text=True, cwd=ROOT
    ).stdout
    assert "verify-host" in out and "check that the Node host (js/)" in out
