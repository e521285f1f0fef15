"""Both hosts on the same 10,000 generated input lines (`seq2onnx translate` and the Node host's CLI,
greedy, over-long lines truncated by both): every line gets exactly one output line on each host, and
the two hosts give the same line for every input. The lines come from a seeded generator (repeated
characters, long runs, rare Unicode, control characters, invalid UTF-8 bytes, over-long lines, blank
lines, words of the corpus); tests/test_fuzz.py fuzzes the Python runtime itself with hypothesis."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from node_host import JS, NODE, skip_reason
from tiny import copy_bundle, edit_bundle_json

N_LINES = int(os.environ.get("SEQ2ONNX_FUZZ_LINES", "10000"))
WORDS = [
    "the",
    "cat",
    "dog",
    "big",
    "small",
    "bird",
    "sleeps",
    "dances",
    "in",
    "box",
    "three",
    "old",
    "kings",
    "red",
]
ALPHABETS = [
    "abcxyz",
    "éèêàçœ",
    "漢字語言文",
    "αβγδ",
    "абвгд",
    "🙂👩‍👩‍👧🚀",
    "مرحبا",
    "שלום",
    "\u0301\u200f\u202e\ufeff",
    "0123456789",
    "!?.,;:'\"-()[]",
    "\t\x00\x01\x7f",
]


def generate(n: int, seed: int = 2024) -> list[bytes]:
    """n input lines as bytes (no newline inside a line)."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        kind = rng.randrange(10)
        if kind == 0:
            text = rng.choice(["", " ", "   ", "\t"])
        elif kind == 1:  # a character repeated: where tokenizers' segmentations used to differ
            text = rng.choice("aelo!z漢é🙂 ") * rng.randrange(2, 200)
        elif kind == 2:
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 15)))
        elif kind == 3:  # longer than the model's positions: truncated, with a warning
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(150, 400)))
        elif kind == 4:  # random code points, rare planes included (no surrogates: the line is UTF-8 text)
            text = "".join(
                chr(c)
                for c in (rng.randrange(0x20, 0x2FFFF) for _ in range(rng.randrange(1, 30)))
                if not 0xD800 <= c <= 0xDFFF
            )
        elif kind == 5:
            alphabet = rng.choice(ALPHABETS)
            text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 60)))
        else:
            parts = [
                rng.choice(WORDS)
                if rng.random() < 0.6
                else rng.choice(rng.choice(ALPHABETS)) * rng.randrange(1, 6)
                for _ in range(rng.randrange(1, 12))
            ]
            text = rng.choice([" ", "", "  "]).join(parts)
        data = text.replace("\n", " ").replace("\r", " ").encode("utf-8")
        if rng.random() < 0.03:  # invalid UTF-8: a lone continuation byte, a cut sequence, an overlong form
            cut = rng.randrange(len(data) + 1)
            data = (
                data[:cut]
                + rng.choice([b"\x80", b"\xe6\xbc", b"\xc0\xaf", b"\xff", b"\xed\xa0\x80"])
                + data[cut:]
            )
        lines.append(data)
    return lines


_SKIP = skip_reason("the Node host")


@pytest.mark.slow
@pytest.mark.skipif(bool(_SKIP), reason=_SKIP)
def test_both_hosts_answer_every_generated_line_alike(bundle, tmp_path):
    # Both hosts on the standard decoder (the Node host cannot run the fused one): its bundle.json
    # without the fused decoder is a complete bundle, as `seq2onnx export --decoder standard` writes.
    bundle = copy_bundle(bundle, "fuzz")
    edit_bundle_json(bundle, lambda m: (m["files"].pop("decoder_fused"), m["graphs"].pop("decoder_fused")))
    (bundle / "decoder_fused.onnx").unlink()
    lines = generate(N_LINES)
    source = tmp_path / "fuzz.txt"
    source.write_bytes(b"".join(line + b"\n" for line in lines))
    python = subprocess.run(
        [
            sys.executable,
            "-m",
            "seq2onnx.commands",
            "translate",
            str(bundle),
            "-i",
            str(source),
            "--beam",
            "1",
            "--threads",
            "1",
        ],
        capture_output=True,
        timeout=1800,
    )
    with open(source, "rb") as stdin:
        node = subprocess.run(
            [
                NODE,
                str(JS / "bin" / "seq2onnx-js.mjs"),
                "translate",
                str(bundle),
                "--beam",
                "1",
                "--threads",
                "1",
                "--truncate",
            ],
            stdin=stdin,
            capture_output=True,
            timeout=1800,
        )
    assert python.returncode == 0, python.stderr[-2000:]
    assert node.returncode == 0, node.stderr[-2000:]
    got_python = python.stdout.decode("utf-8").split("\n")[:-1]
    got_node = node.stdout.decode("utf-8").split("\n")[:-1]
    assert len(got_python) == len(got_node) == N_LINES
    differ = [(i + 1, lines[i][:80], p, n) for i, (p, n) in enumerate(zip(got_python, got_node)) if p != n]
    assert not differ, f"{len(differ)} of {N_LINES} lines differ; first: {differ[:3]}"
    # blank lines give blank lines; the others a translation on both hosts
    blank = [i for i, line in enumerate(lines) if not line.decode("utf-8", "replace").strip()]
    assert all(got_python[i] == "" for i in blank)
    assert sum(bool(t) for t in got_python) > N_LINES * 0.8


# -- the same, with inputs drawn by hypothesis -------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

HYPOTHESIS_EXAMPLES, LINES_PER_EXAMPLE = 20, 500  # 10,000 drawn lines per run
_TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\n\r"), max_size=60)
_LINE = st.one_of(
    _TEXT.map(lambda s: s.encode("utf-8")),
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b" ").replace(b"\r", b" ")),  # invalid UTF-8 too
    st.tuples(st.sampled_from(["a", "!", "漢", "🙂", " ", "é"]), st.integers(1, 300)).map(
        lambda t: (t[0] * t[1]).encode()
    ),
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=300).map(lambda w: " ".join(w).encode()),
)


@pytest.fixture(scope="module")
def standard_bundle(bundle, tmp_path_factory):
    path = copy_bundle(bundle, "fuzz-hypothesis")
    edit_bundle_json(path, lambda m: (m["files"].pop("decoder_fused"), m["graphs"].pop("decoder_fused")))
    (path / "decoder_fused.onnx").unlink()
    return path


@pytest.mark.slow
@pytest.mark.skipif(bool(_SKIP), reason=_SKIP)
@settings(
    max_examples=HYPOTHESIS_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
        HealthCheck.too_slow,
        HealthCheck.large_base_example,
    ],
)
@pytest.mark.slow
@given(lines=st.lists(_LINE, min_size=LINES_PER_EXAMPLE, max_size=LINES_PER_EXAMPLE))
def test_both_hosts_answer_hypothesis_lines_alike(standard_bundle, tmp_path_factory, lines):
    source = tmp_path_factory.mktemp("fuzz") / "lines.txt"
    source.write_bytes(b"".join(line + b"\n" for line in lines))
    python = subprocess.run(
        [
            sys.executable,
            "-m",
            "seq2onnx.commands",
            "translate",
            str(standard_bundle),
            "-i",
            str(source),
            "--beam",
            "1",
            "--threads",
            "1",
        ],
        capture_output=True,
        timeout=600,
    )
    with open(source, "rb") as stdin:
        node = subprocess.run(
            [
                NODE,
                str(JS / "bin" / "seq2onnx-js.mjs"),
                "translate",
                str(standard_bundle),
                "--beam",
                "1",
                "--threads",
                "1",
                "--truncate",
            ],
            stdin=stdin,
            capture_output=True,
            timeout=600,
        )
    assert python.returncode == 0 and node.returncode == 0, (python.stderr[-1000:], node.stderr[-1000:])
    got_python = python.stdout.decode("utf-8").split("\n")[:-1]
    got_node = node.stdout.decode("utf-8").split("\n")[:-1]
    assert len(got_python) == len(got_node) == len(lines)
    differ = [(i + 1, lines[i][:60], p, n) for i, (p, n) in enumerate(zip(got_python, got_node)) if p != n]
    assert not differ, f"{len(differ)} of {len(lines)} lines differ; first: {differ[:3]}"
