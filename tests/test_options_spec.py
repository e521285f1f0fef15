"""The decoding options declared once (issue 56 item 4): spec/capabilities.json is what runtime/option_spec.py
writes from runtime/options.py, the shared option cases (spec/cases/options.json, also run by
js/test/options.test.mjs) hold the Python host to the same limits as the JS host, and Translator's methods take
their options by one declaration: signatures, docstrings and unknown keywords."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from seq2onnx.runtime import option_spec
from seq2onnx.runtime.options import OPTIONS, OptionError, SearchOptions
from seq2onnx.runtime.translator import Translator

ROOT = Path(__file__).resolve().parents[1]
CASES = json.loads((ROOT / "spec" / "cases" / "options.json").read_text(encoding="utf-8"))["cases"]


def test_the_committed_capabilities_are_what_the_generator_writes():
    committed = (ROOT / "spec" / "capabilities.json").read_text(encoding="utf-8")
    assert committed == option_spec.render(), (
        "run `python -m seq2onnx.runtime.option_spec` and commit the file"
    )


def test_the_check_fails_where_the_file_differs(tmp_path, monkeypatch):
    path = tmp_path / "capabilities.json"
    monkeypatch.setattr(option_spec, "CAPABILITIES_PATH", path)
    assert option_spec.main(["--check"]) == 1  # no file
    assert (
        option_spec.main([]) == 0
        and json.loads(path.read_text(encoding="utf-8")) == option_spec.capabilities()
    )
    assert option_spec.main(["--check"]) == 0
    path.write_text(path.read_text(encoding="utf-8").replace('"min": -10', '"min": -11'), encoding="utf-8")
    assert option_spec.main(["--check"]) == 1


def test_the_generator_runs_as_a_module_with_check():
    proc = subprocess.run(
        [sys.executable, "-m", "seq2onnx.runtime.option_spec", "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def test_the_spec_states_each_option_as_declared():
    spec = option_spec.capabilities()["options"]
    assert list(spec) == list(SearchOptions.__dataclass_fields__)
    penalty = spec["length_penalty"]
    assert (penalty["min"], penalty["max"], penalty["js"], penalty["cli"]) == (
        -10,
        10,
        "lengthPenalty",
        "--length-penalty",
    )
    assert spec["sampling_topp"]["min_open"] is True and spec["return_attention"]["http"] is None
    assert spec["beam_size"]["bundle_default"] == "beam_size" and spec["max_batch_size"]["default"] == 32


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_shared_option_cases(case):
    if case["refused"] is None:
        SearchOptions(**case["options"])
        return
    with pytest.raises(OptionError) as e:
        SearchOptions(**case["options"])
    assert e.value.option == case["refused"], str(e.value)


def test_the_shared_cases_refuse_every_bounded_option_somewhere():
    refused = {c["refused"] for c in CASES}
    bounded = {name for name, o in OPTIONS.items() if o.kind in ("int", "number", "bool")}
    assert bounded <= refused, bounded - refused


@pytest.mark.parametrize(
    "method, scope", [("translate", "text"), ("translate_batch", "batch"), ("generate_tokens", "stream")]
)
def test_each_method_lists_its_options_in_its_signature_and_docstring(method, scope):
    function = getattr(Translator, method)
    params = inspect.signature(function).parameters
    taken = [name for name, p in params.items() if p.kind == p.KEYWORD_ONLY]
    assert taken == option_spec.names(scope) and "**" not in str(inspect.signature(function))
    assert params["beam_size" if scope != "stream" else "truncate"].default in (None, False)
    doc = function.__doc__
    assert "OPTIONS" not in doc and all(f"            {name}: " in doc for name in taken), doc
    assert ("num_hypotheses" in taken) == (method == "translate_batch")


def test_unknown_and_misplaced_keywords_name_the_option_and_the_valid_ones(translator):
    with pytest.raises(
        TypeError, match=r"translate_batch\(\) got an unknown option 'beam'; it takes beam_size, "
    ):
        translator.translate_batch(["a"], beam=2)
    with pytest.raises(
        TypeError,
        match=r"translate\(\) got an unknown option 'num_hypotheses'; "
        r"num_hypotheses is translate_batch's; it takes beam_size, length_penalty",
    ):
        translator.translate("a", num_hypotheses=2)
    with pytest.raises(
        TypeError,
        match=r"generate_tokens\(\) got an unknown option 'beam_size'; beam_size is "
        r"translate_batch's; it takes max_decoding_length, min_decoding_length",
    ):
        translator.generate_tokens("a", beam_size=2)


def test_the_keyword_api_still_works(translator):
    batch = translator.translate_batch(["a b", "b"], beam_size=2, num_hypotheses=2, return_scores=True)
    assert [len(r.hypotheses) for r in batch] == [2, 2] and batch[0].scores is not None
    assert translator.translate("a b", beam_size=2) == batch[0].hypotheses[0]
    assert "".join(translator.generate_tokens("a b", max_decoding_length=8)) == translator.translate(
        "a b", beam_size=1, max_decoding_length=8
    )
