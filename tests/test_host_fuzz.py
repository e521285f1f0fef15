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


def _host_lines(command: list[str], source, timeout: float) -> list[str]:
    with open(source, "rb") as stdin:
        done = subprocess.run(command, stdin=stdin, capture_output=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-1000:]
    return done.stdout.decode("utf-8").split("\n")[:-1]


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
    options = [str(bundle), "--beam", "1", "--threads", "1"]
    python = [sys.executable, "-m", "seq2onnx.commands", "translate", *options, "-i", str(source)]
    got_python = _host_lines(python, source, 1800)
    got_node = _host_lines(
        [NODE, str(JS / "bin" / "seq2onnx-js.mjs"), "translate", *options, "--truncate"], source, 1800
    )
    assert len(got_python) == len(got_node) == N_LINES
    differ = [(i + 1, lines[i][:80], p, n) for i, (p, n) in enumerate(zip(got_python, got_node)) if p != n]
    assert not differ, f"{len(differ)} of {N_LINES} lines differ; first: {differ[:3]}"
    # blank lines give blank lines; the others a translation on both hosts
    blank = [i for i, line in enumerate(lines) if not line.decode("utf-8", "replace").strip()]
    assert all(got_python[i] == "" for i in blank)
    assert sum(bool(t) for t in got_python) > N_LINES * 0.8


# -- the same, with inputs drawn by hypothesis -------------------------------------------------------

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
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


def _drawn(examples: int, per_example: int) -> list[list[bytes]]:
    """`examples` lists of `per_example` lines, drawn by hypothesis (derandomized: the same on every run).

    Drawn first and run through each host once, not once per example: a host's start (onnxruntime's and
    Node's imports) cost more than its 500 lines. A difference is reported with its lines, not shrunk:
    shrinking would run both hosts again for every candidate.
    """
    drawn: list[list[bytes]] = []

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=[
            HealthCheck.data_too_large,
            HealthCheck.too_slow,
            HealthCheck.large_base_example,
        ],
    )
    @given(lines=st.lists(_LINE, min_size=per_example, max_size=per_example))
    def draw(lines):
        drawn.append(lines)

    draw()
    return drawn


@pytest.mark.slow
@pytest.mark.skipif(bool(_SKIP), reason=_SKIP)
def test_both_hosts_answer_hypothesis_lines_alike(bundle, tmp_path):
    examples = _drawn(HYPOTHESIS_EXAMPLES, LINES_PER_EXAMPLE)
    assert len(examples) == HYPOTHESIS_EXAMPLES  # hypothesis drew every example it was asked for
    lines = [line for example in examples for line in example]
    standard = copy_bundle(bundle, "fuzz-hypothesis")
    edit_bundle_json(standard, lambda m: (m["files"].pop("decoder_fused"), m["graphs"].pop("decoder_fused")))
    (standard / "decoder_fused.onnx").unlink()
    source = tmp_path / "lines.txt"
    source.write_bytes(b"".join(line + b"\n" for line in lines))
    options = [str(standard), "--beam", "1", "--threads", "1"]
    python = [sys.executable, "-m", "seq2onnx.commands", "translate", *options]
    got_python = _host_lines(python, source, 1800)
    got_node = _host_lines(
        [NODE, str(JS / "bin" / "seq2onnx-js.mjs"), "translate", *options, "--truncate"], source, 1800
    )
    assert len(got_python) == len(got_node) == len(lines)
    differ = [
        (i // LINES_PER_EXAMPLE, i + 1, lines[i][:60], p, n)
        for i, (p, n) in enumerate(zip(got_python, got_node))
        if p != n
    ]
    assert not differ, f"{len(differ)} of {len(lines)} lines differ (example, line, ...); first: {differ[:3]}"
