"""Issue 34's cross-host checks, small: an int8 bundle (int8 linear layers and int8 embedding tables,
per-row scales) through `seq2onnx verify-host`, with --max-length.

The real-size runs (an OPUS-MT-size Marian with random weights, fp32 and int8, through verify-host
and the browser page) take minutes and are not run here. A model with random weights seldom ends a
sentence, so it decodes to its limit (511 for OPUS-MT's max_length); --max-length caps both hosts.

Needs Node.js and `npm ci --prefix js`; without them the tests skip with one line."""

from __future__ import annotations

import pytest

from seq2onnx.commands.host_sentences import read_sentences
from seq2onnx.commands.host_report import format_report
from seq2onnx.commands.verify_host import verify_host
from seq2onnx.errors import CommandError
from node_host import skip_reason
from tiny import tiny_bundle

_SKIP = skip_reason("verify-host")
pytestmark = pytest.mark.skipif(bool(_SKIP), reason=_SKIP)
MAX_LENGTH = 6
N_SENTENCES = 16


@pytest.fixture(scope="module")
def int8_bundle():
    return tiny_bundle(quantize="int8")


@pytest.mark.slow
def test_node_host_matches_python_on_an_int8_bundle_capped_by_max_length(int8_bundle):
    sentences, source = read_sentences(bundle_dir=int8_bundle, synthetic=True, count=N_SENTENCES)
    report = verify_host(int8_bundle, sentences, beam=4, threads=1, max_length=MAX_LENGTH)
    assert report["passed"], format_report(report, source)
    assert report["max_length"] == MAX_LENGTH
    assert f"max length {MAX_LENGTH}; " in format_report(report, source)
    for label in ("greedy", "beam 4"):
        speed = report["speed"][label]
        # the best hypotheses and their end tokens: never past the cap on either host
        assert speed["python_tokens"] == speed["host_tokens"] <= N_SENTENCES * (MAX_LENGTH + 1)


@pytest.mark.parametrize("max_length", [0, 10_000, True])
def test_max_length_outside_the_model_positions_is_refused(int8_bundle, max_length):
    with pytest.raises(CommandError, match=r"--max-length .*: give an integer from 1 to \d+"):
        verify_host(int8_bundle, ["a b"], max_length=max_length)
