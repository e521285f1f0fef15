"""The drop-in APIs' pieces without a server: language codes (langcodes), routing by (source, target), the keys
file and the per-key gate, DeepL's sentence splitting. The real clients against real servers are in
tests/test_serve_dropin.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from extras import require

require("langcodes", "serve")
from prometheus_client import CollectorRegistry  # noqa: E402

from seq2onnx.serve import keys as K  # noqa: E402
from seq2onnx.serve.deepl import joined, split  # noqa: E402
from seq2onnx.serve.languages import Side, UnknownCode, sides, tag  # noqa: E402
from seq2onnx.serve.routes import Route, Routes, Unsupported  # noqa: E402


@pytest.mark.parametrize(
    "code, want",
    [
        ("deu_Latn", "de"),
        ("zho_Hans", "zh-Hans"),
        (">>fra<<", "fr"),
        ("fra", "fr"),
        ("EN-US", "en-US"),
        ("pt-BR", "pt-BR"),
        ("de", "de"),
    ],
)
def test_every_spelling_of_a_code_becomes_its_standard_tag(code, want):
    assert tag(code) == want


def test_a_code_that_is_no_language_is_refused_by_name():
    with pytest.raises(UnknownCode, match="'xx-!!'"):
        tag("xx-!!")


def test_a_request_code_finds_the_nearest_bundle_code_and_never_another_script():
    side = Side({"en": None, "pt-BR": "por_Latn", "zh-Hans": "zho_Hans"})
    assert side.find("EN-US") == ("en", None)
    assert side.find("pt") == ("pt-BR", "por_Latn")
    assert side.find("ZH-HANS") == ("zh-Hans", "zho_Hans")
    assert side.find("zh-Hant") is None
    assert side.find("de") is None


def test_sides_from_the_bundle_tokens_or_the_declaration():
    nllb = {"eng_Latn": 1, "fra_Latn": 2, "deu_Latn": 3}
    source, target = sides(None, nllb, "target_prefix")
    assert source.codes == target.codes == {"en": "eng_Latn", "fr": "fra_Latn", "de": "deu_Latn"}
    source, target = sides("en:*", {"fra": 5, "deu": 6}, "source_prefix")  # Marian: target tokens only
    assert source.codes == {"en": None} and target.codes == {"fr": "fra", "de": "deu"}
    source, target = sides("en:fr,de", {}, "target_prefix")
    assert source.codes == {"en": None} and target.codes == {"fr": None, "de": None}
    assert sides(None, {}, "target_prefix") == (Side({}), Side({}))
    for bad, match in (("en", "SOURCE:TARGET"), ("en:*", "has none"), ("en:xx-!!", "xx-!!")):
        with pytest.raises(ValueError, match=match):
            sides(bad, {}, "target_prefix")
    with pytest.raises(ValueError, match="targets only"):
        sides("*:*", {"fra": 5}, "source_prefix")


def _routes() -> Routes:
    def engine(codes, where="target_prefix"):
        return SimpleNamespace(
            translator=SimpleNamespace(vocabulary=SimpleNamespace(languages=codes, target_lang_in=where))
        )

    nllb = Route.of(engine({"eng_Latn": 1, "fra_Latn": 2}), None)
    de = Route.of(engine({}), "en:de")
    es = Route.of(engine({}), "fr:es")
    return Routes([nllb, de, es])


def test_routes_choose_by_source_and_target_and_pass_the_bundle_codes():
    routes = _routes()
    choice = routes.choose("EN", "FR", ("source_lang", "target_lang"))
    assert choice.route is routes.routes[0]
    assert choice.options == {"source_lang": "eng_Latn", "target_lang": "fra_Latn"}
    choice = routes.choose("en-GB", "de", ("s", "t"))
    assert choice.route is routes.routes[1] and choice.options == {}
    assert (choice.source, choice.target) == ("en", "de")
    # no source: the one language that the bundles writing the target read
    assert routes.choose(None, "es", ("s", "t")).source == "fr"


def test_routes_refuse_by_name_and_list_what_works():
    routes = _routes()
    with pytest.raises(Unsupported, match=r"target_lang='IT': no bundle .*; supported: de, en, es, fr") as e:
        routes.choose("EN", "IT", ("source_lang", "target_lang"))
    assert e.value.param == "target_lang"
    with pytest.raises(Unsupported, match=r"source='de': .* into es; supported: fr"):
        routes.choose("de", "es", ("source", "target"))
    with pytest.raises(Unsupported, match="detects no language .* read several"):
        routes.choose(None, "fr", ("source", "target"))  # en and fr both read by the NLLB-like bundle


def _keys_file(tmp_path, *lines: str):
    path = tmp_path / "keys.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_the_keys_file_is_read_and_a_bad_line_is_refused_naming_it(tmp_path):
    good = K.line_for("alice", "secret-a", per_minute=5)
    path = _keys_file(tmp_path, "# a comment", good, K.line_for("bob", "secret-b") + "  # bob")
    alice, bob = K.read_keys(path, 3, 100)
    assert (alice.name, alice.per_minute, alice.in_flight, alice.characters) == ("alice", 5, 3, None)
    assert bob.per_minute == 100 and bob.hash == K.digest("secret-b")
    assert "secret" not in path.read_text()
    for bad, match in (
        ("alice secret-a", ":1: not a key line; give `NAME sha256:HEX"),
        (good + " speed=3", "'speed=3'"),
        (f"{good}\n{good}", ":2: the name 'alice' is used twice"),
    ):
        with pytest.raises(ValueError, match=match):
            K.read_keys(_keys_file(tmp_path, bad), 3, 100)


def _gate(tmp_path, *lines):
    return K.Gate(_keys_file(tmp_path, *lines), 2, 100, CollectorRegistry())


def test_the_gate_knows_a_key_only_by_its_hash_and_bounds_each_key_alone(tmp_path):
    gate = _gate(tmp_path, K.line_for("a", "key-a", in_flight=1, per_minute=12), K.line_for("b", "key-b"))
    assert isinstance(gate.identify("key-c"), K.Refusal) and gate.identify("key-c").why == "wrong"
    assert gate.identify(None).why == "missing"
    a, b = gate.identify("key-a"), gate.identify("key-b")
    assert a.name == "a" and b.name == "b"
    assert gate.admit(a) is None
    assert gate.admit(a).why == "in_flight"  # one in flight is a's limit
    assert gate.admit(b) is None  # b is not held back by a
    gate.release(a, characters=7)
    assert gate.admit(a) is None
    gate.release(a)
    over = gate.admit(a)  # its bucket holds 10 s of 12 per minute: 2, both spent
    assert over.why == "per_minute" and over.retry_after == 5
    assert gate.usage(a) == (7, None)


def test_a_character_quota_is_refused_once_used_up(tmp_path):
    gate = _gate(tmp_path, K.line_for("a", "key-a", characters=10))
    a = gate.identify("key-a")
    assert gate.admit(a) is None
    gate.release(a, characters=12)
    assert gate.admit(a).why == "characters"


def test_reload_swaps_the_keys_and_a_broken_file_keeps_the_old_ones(tmp_path):
    gate = _gate(tmp_path, K.line_for("a", "key-a"))
    _keys_file(tmp_path, K.line_for("b", "key-b"))
    gate.reload()
    assert gate.identify("key-a").why == "wrong" and gate.identify("key-b").name == "b"
    _keys_file(tmp_path, "not a key line")
    gate.reload()
    assert gate.identify("key-b").name == "b"


def test_identify_compares_every_hash_in_constant_time(tmp_path, monkeypatch):
    gate = _gate(tmp_path, *(K.line_for(f"k{i}", f"key-{i}") for i in range(5)))
    calls = []
    real = K.hmac.compare_digest
    monkeypatch.setattr(K.hmac, "compare_digest", lambda x, y: calls.append(1) or real(x, y))
    gate.identify("key-0")
    assert len(calls) == 5  # found first, yet every stored hash was compared


def test_deepl_sentence_splitting_keeps_the_separators():
    texts = ["One. Two!\nThree", "no split here"]
    pieces, shapes = split(texts, "1")
    assert pieces == ["One.", "Two!", "Three", "no split here"]
    assert joined([p.upper() for p in pieces], shapes) == ["ONE. TWO!\nTHREE", "NO SPLIT HERE"]
    assert split(texts, "0")[0] == texts
    assert split(["a. b\nc"], "nonewlines")[0] == ["a.", "b\nc"]


def test_the_keys_command_prints_a_line_for_a_new_key(capsys):
    assert K.main(["carol", "per_minute=9"]) == 0
    out, err = capsys.readouterr()
    key = err.strip().rsplit(" ", 1)[1]
    assert out.strip() == K.line_for("carol", key, per_minute="9")
    assert len(key) >= 40
