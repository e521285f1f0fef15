"""`seq2onnx evaluate`: test-split BLEU of the reference decoder and the bundle, with agreement."""

from __future__ import annotations

import re

import pytest

from seq2onnx.commands.main import main
from tiny import tiny_bundle, tiny_run


@pytest.mark.slow
def test_evaluate_reports_bleu_and_agreement(capsys):
    assert main(["evaluate", str(tiny_run() / "last"), "--bundle", str(tiny_bundle()), "--beam", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^50 test sentences, beam 2$", out, re.M), out
    assert re.search(r"PyTorch reference: BLEU \d+\.\d\d", out), out
    m = re.search(r"token ids identical to PyTorch on (\d+)/(\d+) sentences", out)
    assert m and m.group(1) == m.group(2) == "50", out
