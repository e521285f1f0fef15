"""OptionError (issue 38 item 3): every option check raises it with .option and .value; the HTTP front end
names the field and the CLI the flag from .option through the option's declaration (runtime/options.py's
Option.http and Option.cli; issue 56), never by reading the message's text."""

from __future__ import annotations

import argparse
import ast
import asyncio
import dataclasses
import math
from pathlib import Path

import pytest

from seq2onnx.runtime.model_options import (
    check_min_length,
    check_prefix_options,
    language_id,
    target_prefixes,
)
from seq2onnx.runtime.options import OPTIONS, OptionError, SearchOptions, resolve_search_options
from seq2onnx.runtime.session_tuning import SessionTuning, check_intra_threads

ROOT = Path(__file__).resolve().parents[1]
NAN = math.nan

# (SearchOptions keywords, the option at fault, its value as given, the message as users have always read it)
SEARCH = [
    (dict(beam_size=0), "beam_size", 0, "beam_size=0 (int): give an int >= 1 (1 is greedy search)"),
    (dict(beam_size=True), "beam_size", True, "beam_size=True (bool): give an int >= 1 (1 is greedy search)"),
    (dict(num_hypotheses=0), "num_hypotheses", 0, "num_hypotheses=0 (int): give an int >= 1"),
    (
        dict(beam_size=2, num_hypotheses=3),
        "num_hypotheses",
        3,
        "num_hypotheses=3 must lie in [1, beam_size=2]: raise beam_size or lower num_hypotheses",
    ),
    (
        dict(length_penalty=NAN),
        "length_penalty",
        NAN,
        "length_penalty=nan (float): give a number in [-10, 10] (1.0 is the default)",
    ),
    (
        dict(length_penalty=200),
        "length_penalty",
        200,  # issue 60: an OverflowError (HTTP 500) before
        "length_penalty=200 (int): give a number in [-10, 10] (1.0 is the default)",
    ),
    (
        dict(max_decoding_length=0),
        "max_decoding_length",
        0,
        "max_decoding_length=0 (int): give an int >= 1, at most the model's max_positions, or None",
    ),
    (
        dict(min_decoding_length=-1),
        "min_decoding_length",
        -1,
        "min_decoding_length=-1 (int): give an int >= 0",
    ),
    (
        dict(min_decoding_length=5, max_decoding_length=5),
        "min_decoding_length",
        5,
        "min_decoding_length=5 must be below max_decoding_length=5: lower the minimum or raise the maximum",
    ),
    (dict(return_scores=1), "return_scores", 1, "return_scores=1 (int): give True or False"),
    (
        dict(return_attention="yes"),
        "return_attention",
        "yes",
        "return_attention='yes' (str): give True or False",
    ),
    (dict(truncate=None), "truncate", None, "truncate=None (NoneType): give True or False"),
    (dict(max_batch_size=0), "max_batch_size", 0, "max_batch_size=0 (int): give an int >= 1"),
    (
        dict(sampling_temperature=0),
        "sampling_temperature",
        0,
        "sampling_temperature=0 (int): give a number in [0.001, 1000] (or None for beam search (beam_size=1 "
        "is greedy))",
    ),
    (
        dict(sampling_temperature=5e-324),
        "sampling_temperature",
        5e-324,  # issue 60: "" before
        "sampling_temperature=5e-324 (float): give a number in [0.001, 1000] (or None for beam search "
        "(beam_size=1 is greedy))",
    ),
    (
        dict(sampling_topk=-1),
        "sampling_topk",
        -1,
        "sampling_topk=-1 (int): give an int >= 0 (0 keeps every token)",
    ),
    (
        dict(sampling_topp=NAN),
        "sampling_topp",
        NAN,
        "sampling_topp=nan (float): give a number in (0, 1] (1 keeps every token)",
    ),
    (dict(source_lang=5), "source_lang", 5, "source_lang=5 (int): give a language code (a str) or None"),
    (
        dict(target_lang=b"de"),
        "target_lang",
        b"de",
        "target_lang=b'de' (bytes): give a language code (a str) or None",
    ),
    (dict(seed=-1), "seed", -1, "seed=-1 (int): give an int >= 0, or None for a different sample each call"),
]


def _same(a, b) -> bool:
    both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    return a is b or a == b or both_nan


def _check(e: OptionError, option: str, value, message: str | None = None) -> None:
    assert type(e) is OptionError and isinstance(e, ValueError)  # callers' `except ValueError` still hold
    assert e.option == option and _same(e.value, value), (e.option, e.value)
    assert e.limit and e.hint and str(e).endswith(e.hint), (e.limit, e.hint, str(e))
    if message is not None:
        assert str(e) == message


@pytest.mark.parametrize(
    "kwargs, option, value, message", SEARCH, ids=[f"{case[1]}-{i}" for i, case in enumerate(SEARCH)]
)
def test_each_search_option_check_raises_option_error(kwargs, option, value, message):
    with pytest.raises(OptionError) as e:
        SearchOptions(**kwargs)
    _check(e.value, option, value, message)


def test_every_search_option_has_a_case():
    checked = {case[1] for case in SEARCH}
    unchecked = {"target_prefix"}  # its checks need the model's vocabulary: target_prefixes below
    assert checked | unchecked == set(SearchOptions.__dataclass_fields__)


@pytest.mark.parametrize(
    "kwargs, option, value, message",
    [
        (
            dict(optimization="most"),
            "optimization",
            "most",
            "optimization='most'; choose one of all, extended, basic, none",
        ),
        (
            dict(thread_spinning="fast"),
            "thread_spinning",
            "fast",
            "thread_spinning='fast'; choose one of bounded, none, unbounded",
        ),
        (dict(decoder="best"), "decoder", "best", "decoder='best'; choose one of auto, standard, fused"),
        (dict(top_k_from_graph=0), "top_k_from_graph", 0, "top_k_from_graph=0 (int): give True or False"),
        (dict(tf32="on"), "tf32", "on", "tf32='on' (str): give True or False"),
    ],
)
def test_each_session_tuning_check_raises_option_error(kwargs, option, value, message):
    with pytest.raises(OptionError) as e:
        SessionTuning(**kwargs)
    _check(e.value, option, value, message)


@pytest.mark.parametrize("value", [-1, 10**6, True, 2.0])
def test_intra_threads_raises_option_error(value):
    with pytest.raises(OptionError) as e:
        check_intra_threads(value)
    _check(e.value, "intra_threads", value)
    assert "cores (os.cpu_count())" in str(e.value)


@pytest.mark.parametrize(
    "kwargs, option, value, message",
    [
        (
            dict(max_decoding_length=600),
            "max_decoding_length",
            600,
            "max_decoding_length=600; this model has 512 positions (max_positions in bundle.json): choose 1..that",
        ),
        (
            dict(min_decoding_length=512),
            "min_decoding_length",
            512,
            "min_decoding_length=512; this model has 512 positions (max_positions in bundle.json): choose 0..511",
        ),
        (
            dict(beam_size=5),
            "beam_size",
            5,
            "beam_size=5 needs a target vocabulary of at least 10 pieces, this model has 8: choose a smaller beam",
        ),
    ],
)
def test_the_checks_against_the_model_raise_option_error(kwargs, option, value, message):
    with pytest.raises(OptionError) as e:
        resolve_search_options(dict(kwargs), {}, max_positions=512, tgt_vocab=8)
    _check(e.value, option, value, message)


LANGUAGES = {"de": 7, "fr": 8}


@pytest.mark.parametrize(
    "call, option, value, message",
    [
        (
            lambda: language_id(LANGUAGES, "xx", "source_lang"),
            "source_lang",
            "xx",
            "source_lang='xx' is not a language of this model; choose one of de, fr",
        ),
        (
            lambda: language_id({}, "de", "target_lang"),
            "target_lang",
            "de",
            "target_lang='de' is not a language of this model; this model has no language tokens: leave it out",
        ),
        (
            lambda: language_id(LANGUAGES, 3, "target_lang"),
            "target_lang",
            3,
            "target_lang=3; give a language code (a str)",
        ),
        (
            lambda: target_prefixes([[5]], 2, 50, 2),
            "target_prefix",
            [[5]],
            "target_prefix has 1 entries for 2 sources; give one list of target ids per source",
        ),
        (
            lambda: target_prefixes([[5], [5, True]], 2, 50, 2),
            "target_prefix",
            [[5], [5, True]],
            "target_prefix[1] is [5, True]; give a list of target token ids",
        ),
        (
            lambda: target_prefixes([[5, 99, 2]], 1, 50, 2),
            "target_prefix",
            [[5, 99, 2]],
            "target_prefix[0] has ids [99, 2] outside [0, 50) or the end token 2; give target ids of the text "
            "before the translation",
        ),
        (
            lambda: check_prefix_options(SearchOptions(target_lang="es"), 1, LANGUAGES, 50, 2),
            "target_lang",
            "es",
            None,
        ),
        (
            lambda: check_min_length(5, 5, 3),
            "min_decoding_length",
            5,
            "min_decoding_length=5 is not below this text's maximum length 5 (max_length_a x 3 tokens + "
            "max_length_b in bundle.json, at most max_positions): pass a larger max_decoding_length or a smaller "
            "min_decoding_length",
        ),
        (
            lambda: check_min_length(30, 12, 4, source=1),
            "min_decoding_length",
            30,
            "source 1: min_decoding_length=30 is not below its maximum length 12 (max_length_a x 4 tokens + "
            "max_length_b in bundle.json, at most max_positions): pass a larger max_decoding_length or a smaller "
            "min_decoding_length",
        ),
    ],
    ids=[
        "unknown-language",
        "no-languages",
        "language-not-a-str",
        "prefix-count",
        "prefix-item",
        "prefix-ids",
        "prefix-options",
        "min-length",
        "min-length-of-a-source",
    ],
)
def test_the_vocabulary_and_length_checks_raise_option_error(call, option, value, message):
    with pytest.raises(OptionError) as e:
        call()
    _check(e.value, option, value, message)


def test_named_renders_another_name_for_the_option_without_the_index():
    with pytest.raises(OptionError) as e:
        target_prefixes([[5, 99]], 1, 50, 2)
    assert e.value.named("--target-prefix") == (
        "--target-prefix has ids [99] outside [0, 50) or the end token 2; give target ids of the text before "
        "the translation"
    )
    with pytest.raises(OptionError) as e:
        SearchOptions(length_penalty=NAN)
    assert e.value.named("--length-penalty") == (
        "--length-penalty nan (float): give a number in [-10, 10] (1.0 is the default)"
    )


@pytest.mark.parametrize("module", ["options.py", "model_options.py"])
def test_options_py_raises_no_plain_value_error(module):
    tree = ast.parse((ROOT / "runtime" / module).read_text(encoding="utf-8"))
    raised = [
        node.exc.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Raise)
        and isinstance(node.exc, ast.Call)
        and isinstance(node.exc.func, ast.Name)
    ]
    # TypeError: an unknown keyword, as Python refuses one (runtime/options.py unknown_options)
    assert "OptionError" in raised and set(raised) <= {"OptionError", "TypeError"}, raised


# -- HTTP: the field comes from the option's declaration (Option.http) ---------------------------------


def test_every_served_option_is_a_field_of_the_requests_by_its_http_name():
    from extras import require

    require("fastapi", "serve")
    from seq2onnx.serve.schemas import StreamRequest, TranslateRequest

    served = {name: o.http for name, o in OPTIONS.items() if o.http}
    assert {"beam_size", "target_prefix"} <= set(served) and "return_attention" not in served
    fields = {name: f.alias or name for name, f in TranslateRequest.model_fields.items()}
    assert {k: v for k, v in fields.items() if k != "texts"} == served
    stream = set(StreamRequest.model_fields) - {"text"}
    assert stream == {name for name in served if OPTIONS[name].scope == "stream"}


def test_the_http_field_comes_from_the_declaration_not_the_message(monkeypatch):
    from extras import require

    require("fastapi", "serve")
    from seq2onnx.serve import errors
    from seq2onnx.serve.schemas import StreamRequest, TranslateRequest

    e = OptionError("beam_size", 0, limit="an int >= 1", hint="give an int >= 1")
    answer = errors.engine_error(e, TranslateRequest)
    assert answer.status_code == 422 and b'"field":"beam_size"' in answer.body
    assert b'"field":null' in errors.engine_error(e, StreamRequest).body  # the stream has no beam_size
    renamed = dataclasses.replace(OPTIONS["beam_size"], http="beams")  # the message still says beam_size
    monkeypatch.setitem(errors.OPTIONS, "beam_size", renamed)
    assert b'"field":"beams"' in errors.engine_error(e, TranslateRequest).body
    not_served = dataclasses.replace(OPTIONS["beam_size"], http=None)
    monkeypatch.setitem(errors.OPTIONS, "beam_size", not_served)
    assert b'"field":null' in errors.engine_error(e, TranslateRequest).body


@pytest.mark.parametrize(
    "body, field, message",
    [
        (
            {"texts": ["a"], "beam_size": 0},
            "beam_size",
            "beam_size=0 (int): give an int >= 1 (1 is greedy search)",
        ),
        (
            {"texts": ["a"], "beam_size": 100},
            "beam_size",
            "beam_size=100 needs a target vocabulary of at least 200 pieces",
        ),
        (
            {"texts": ["a"], "max_decoding_length": 100000},
            "max_decoding_length",
            "max_decoding_length=100000; this model has",
        ),
        (
            {"texts": ["a"], "source_lang": "xx"},
            "source_lang",
            "source_lang='xx' is not a language of this model; this model has no language tokens: leave it out",
        ),
        (
            {"texts": ["a"], "target_prefix": [[5, 100000]]},
            "target_prefix",
            "target_prefix[0] has ids [100000] outside",
        ),
        (
            {"texts": ["a", "b"], "target_prefix": [[5]]},
            "target_prefix",
            "target_prefix has 1 entries for 2 sources",
        ),
        (
            {"texts": ["a", "b", "c"], "beam_size": 4},
            "beam_size",
            "beam_size=4, num_hypotheses=1 over 3 texts decoded together make 12 decoder rows; the limit "
            "(--max-rows) is 8 per request",
        ),
    ],
    ids=[
        "range",
        "beam-vs-vocabulary",
        "max-length-vs-positions",
        "language",
        "prefix-ids",
        "prefix-count",
        "max-rows",
    ],
)
def test_http_422_names_the_field_of_the_option(translator, body, field, message):
    from extras import require

    require("fastapi", "serve")
    import httpx

    from seq2onnx.serve.app import create_app
    from seq2onnx.serve.engine import RequestEngine

    engine = RequestEngine(translator, workers=1, max_rows=8)

    async def post():
        transport = httpx.ASGITransport(app=create_app(engine))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            return await client.post("/v1/translate", json=body)

    try:
        r = asyncio.run(post())
    finally:
        engine.close()
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field and r.json()["error"].startswith(message), r.json()


# -- CLI: the flag comes from the option's declaration (Option.cli) -----------------------------------


def test_every_flag_of_an_option_is_a_translate_flag_setting_it():
    from seq2onnx.commands import translate

    sub = argparse.ArgumentParser().add_subparsers()
    translate.add(sub)
    flags = {
        flag: action.dest for action in sub.choices["translate"]._actions for flag in action.option_strings
    }
    declared = {o.cli: name for name, o in OPTIONS.items() if o.cli}
    assert {"--beam", "--n-best", "--length-penalty", "--sampling-temperature"} <= set(declared)
    assert {flag: flags.get(flag) for flag in declared} == declared


def test_the_cli_flag_comes_from_the_declaration_not_the_message(monkeypatch):
    from seq2onnx.commands import translate_flags
    from seq2onnx.runtime import options

    e = OptionError("beam_size", 0, limit="an int >= 1", hint="give an int >= 1", shown="0 (int)")
    assert str(translate_flags.option_error(e)) == "--beam 0 (int): give an int >= 1"
    monkeypatch.setitem(
        options.OPTIONS, "beam_size", dataclasses.replace(OPTIONS["beam_size"], cli="--beams")
    )
    assert str(translate_flags.option_error(e)) == "--beams 0 (int): give an int >= 1"
    monkeypatch.setitem(options.OPTIONS, "beam_size", dataclasses.replace(OPTIONS["beam_size"], cli=None))
    assert str(translate_flags.option_error(e)) == str(e)  # no flag: the runtime's own message


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--target-prefix", "5,100000"], "--target-prefix has ids [100000] outside [0, "),
        (
            ["--target-lang", "xx"],
            "--target-lang 'xx' is not a language of this model; this model has no language tokens",
        ),
        (["--source-lang", "xx"], "--source-lang 'xx' is not a language of this model"),
        (
            ["--length-penalty", "nan"],
            "--length-penalty nan (float): give a number in [-10, 10] (1.0 is the default)",
        ),
        (["--beam", "100"], "--beam 100 needs a target vocabulary of at least 200 pieces"),
        (
            ["--beam", "2", "--length-penalty", "200"],
            "--length-penalty 200.0 (float): give a number in [-10, 10]",
        ),
        (
            ["--sampling-temperature", "0"],
            "--sampling-temperature 0.0 (float): give a number in [0.001, 1000]",
        ),
        (["--seed", "3"], "--seed needs --sampling-temperature (sampling); give it, or drop --seed"),
    ],
    ids=[
        "prefix-ids",
        "target-lang",
        "source-lang",
        "nan",
        "beam-vs-vocabulary",
        "length-penalty-range",
        "temperature-range",
        "seed-without-sampling",
    ],
)
def test_the_cli_names_the_flag_of_the_option(bundle, capsys, flags, message):
    from seq2onnx.commands.main import main

    assert main(["translate", str(bundle), *flags]) == 1  # refused before stdin is read
    err = capsys.readouterr().err
    assert err.startswith(f"seq2onnx translate: error: {message}"), err


# -- no front end reads an error's text ----------------------------------------------------------------

FRONT_ENDS = ["serve/app.py", "serve/errors.py", "serve/checks.py", "commands/translate.py"]


def _uses_of_re(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "re" for a in node.names):
            found.append(f"line {node.lineno}: imports re")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "re":
            found.append(f"line {node.lineno}: re.{node.attr}")
    return found


def _reads_text(scope: ast.AST, error: str) -> list[str]:
    """Methods called, within `scope`, on the text of the exception named `error`: on str(error), on
    error.args, or on a name bound to either (text.replace, str(e).startswith, e.args[0].split...)."""
    names = set()

    def is_text(expr) -> bool:
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in ("str", "repr"):
            return any(isinstance(a, ast.Name) and a.id == error for a in expr.args)
        if isinstance(expr, ast.Attribute) and expr.attr == "args":
            return isinstance(expr.value, ast.Name) and expr.value.id == error
        if isinstance(expr, ast.Subscript):
            return is_text(expr.value)
        return isinstance(expr, ast.Name) and expr.id in names

    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and is_text(node.value):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    calls = [
        node
        for node in ast.walk(scope)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_text(node.func.value)
    ]
    return [f"line {node.lineno}: .{node.func.attr}() on the text of {error}" for node in calls]


def _exceptions(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """(scope, name) of every exception a module handles: `except ... as e`, and a function's parameter
    annotated as an exception (def engine_error(e: BaseException, ...))."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.name:
            found.append((node, node.name))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [
                (node, a.arg)
                for a in node.args.args
                if isinstance(a.annotation, ast.Name) and a.annotation.id.endswith(("Error", "Exception"))
            ]
    return found


def _text_readers(source: str) -> list[str]:
    """Where `source` parses an exception's text: any use of `re`, or a method called on the text of an
    exception it handles."""
    tree = ast.parse(source)
    read = [found for scope, name in _exceptions(tree) for found in _reads_text(scope, name)]
    return _uses_of_re(tree) + read


@pytest.mark.parametrize("path", FRONT_ENDS)
def test_no_front_end_parses_an_error_message(path):
    assert _text_readers((ROOT / path).read_text(encoding="utf-8")) == [], path


@pytest.mark.parametrize(
    "code",
    [
        "import re\ntry:\n    pass\nexcept ValueError as e:\n    name = re.match(r'\\w+', str(e))\n",
        "try:\n    pass\nexcept ValueError as e:\n    text = str(e)\n    text = text.replace('beam_size=', '')\n",
        "try:\n    pass\nexcept ValueError as e:\n    ok = str(e).startswith('source')\n",
        "try:\n    pass\nexcept ValueError as e:\n    ok = e.args[0].split('=')\n",
        "def field(e: BaseException):\n    return 'texts' if str(e).startswith('source') else None\n",
    ],
)
def test_the_scan_finds_the_old_ways(code):
    assert _text_readers(code)


def test_translate_batch_refuses_a_target_prefix_too_long_for_the_model(translator):
    """The Python API as the server and the CLI: a prefix that leaves no position after it is refused, never cut."""
    room = translator.max_positions - 2
    with pytest.raises(OptionError) as e:
        translator.translate_batch(["a b"], target_prefix=[[5] * (room + 1)])
    assert e.value.option == "target_prefix" and f"give at most {room}" in str(e.value)
    assert translator.translate_batch(["a b"], target_prefix=[[5] * 2], max_decoding_length=4)[0].token_ids[
        0
    ][:2] == [5, 5]
