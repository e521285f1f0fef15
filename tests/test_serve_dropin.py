"""The DeepL and LibreTranslate drop-in APIs driven by their real clients (the official `deepl` package,
deep-translator's LibreTranslator) against real `seq2onnx serve` processes (tests/serve_process.py).

Two servers: "keyed" serves two tiny bundles (en:fr the plain one, en:de the pre-norm one: two models, so a
wrong route shows) with --api-keys; "open" serves one bundle without keys. Every wait is bounded.
"""

from __future__ import annotations

import signal
import time

import pytest

from extras import require

require("fastapi", "serve")
deepl = require("deepl", "dev")
require("deep_translator", "dev")
import httpx  # noqa: E402
from deep_translator import LibreTranslator  # noqa: E402
from deep_translator.exceptions import AuthorizationException, ServerException  # noqa: E402

from seq2onnx.serve.keys import line_for  # noqa: E402
from serve_process import ServeProcess  # noqa: E402
from tiny import tiny_bundle  # noqa: E402

KEYS = {
    "alice": "alice-key-0123456789",
    "bob": "bob-key-0123456789",
    "tight": "tight-key-0123456789",
    "quota": "quota-key-0123456789",
}
TEXT = "the queen sees young mice with an old box"
TEXTS = ["a black dog ate five brave cats near the car", "the queen sees"]
# The module needs a second trained model (the pre-norm run: ~15 s to build), which no fast test needs.
pytestmark = pytest.mark.slow


def _keys_lines(names) -> str:
    limits = {"tight": {"in_flight": 1, "per_minute": 12}, "quota": {"characters": 10}}
    return "".join(line_for(n, KEYS[n], **limits.get(n, {})) + "\n" for n in names)


@pytest.fixture(scope="module")
def servers(bundle, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(_keys_lines(["alice", "tight", "quota"]), encoding="utf-8")
    running = {}
    try:
        running["keyed"] = ServeProcess(
            bundle,
            "--languages",
            "en:fr",
            "--route",
            f"en:de={tiny_bundle(pre_norm=True)}",
            "--api-keys",
            str(keys),
        )
        running["open"] = ServeProcess(bundle, "--languages", "en:fr")
        yield {name: p.listening() for name, p in running.items()} | {"keys": keys}
    finally:
        for p in running.values():
            p.stop()


@pytest.fixture(scope="module")
def keyed(servers) -> ServeProcess:
    return servers["keyed"]


@pytest.fixture(scope="module")
def other_translator():
    from seq2onnx.runtime.translator import Translator

    return Translator(tiny_bundle(pre_norm=True), device="cpu")


def _deepl(server, key="alice"):
    return deepl.Translator(KEYS.get(key, key), server_url=server.url)


def _libre(server, target="fr", key="alice", source="en"):
    return LibreTranslator(
        source=source, target=target, api_key=KEYS.get(key, key), custom_url=server.url + "/"
    )


# -- DeepL -----------------------------------------------------------------------------------------


def test_deepl_client_translates_one_text_and_a_list_each_on_its_bundle(keyed, translator, other_translator):
    client = _deepl(keyed)
    one = client.translate_text(TEXT, target_lang="FR")
    assert one.text == translator.translate(TEXT) and one.detected_source_lang == "EN"
    assert one.billed_characters == len(TEXT)
    many = client.translate_text(TEXTS, source_lang="EN", target_lang="DE")
    assert [r.text for r in many] == [other_translator.translate(t) for t in TEXTS]  # the en:de bundle's


def test_deepl_splits_sentences_unless_told_not_to(keyed, translator):
    client, text = _deepl(keyed), "the queen sees. a black dog"
    split = client.translate_text(text, target_lang="FR").text
    assert split == translator.translate("the queen sees.") + " " + translator.translate("a black dog")
    assert client.translate_text(text, target_lang="FR", split_sentences="0").text == translator.translate(
        text
    )


def test_deepl_client_lists_languages_and_usage(keyed):
    client = _deepl(keyed, "quota")
    assert [(x.code, x.name) for x in client.get_source_languages()] == [("EN", "English")]
    targets = client.get_target_languages()
    assert [(x.code, x.supports_formality) for x in targets] == [("DE", False), ("FR", False)]
    before = client.get_usage().character
    client.translate_text("a dog", target_lang="FR")
    after = client.get_usage().character
    assert (before.count, after.count, after.limit) == (0, 5, 10)


def test_deepl_client_gets_its_errors_named(keyed):
    with pytest.raises(deepl.AuthorizationException, match="the API key is not valid here"):
        _deepl(keyed, "not-a-key").translate_text(TEXT, target_lang="FR")
    client = _deepl(keyed)
    with pytest.raises(deepl.DeepLException, match=r"target_lang='ES': no bundle .*supported: de, fr"):
        client.translate_text(TEXT, target_lang="ES")
    with pytest.raises(deepl.DeepLException, match="formality='more' is not supported"):
        client.translate_text(TEXT, target_lang="FR", formality="more")
    with pytest.raises(deepl.DeepLException, match="parameter 'tag_handling' is not supported"):
        client.translate_text(TEXT, target_lang="FR", tag_handling="html")
    assert client.translate_text(TEXT, target_lang="FR", formality="prefer_less").text


def test_deepl_quota_is_456_and_the_native_limits_answer_in_deepl_shape(keyed):
    headers = {"Authorization": f"DeepL-Auth-Key {KEYS['quota']}"}
    for _ in range(3):  # 10 characters: spent by now whatever ran before
        r = keyed.client.post(
            "/v2/translate", headers=headers, data={"text": "the queen sees", "target_lang": "FR"}
        )
    assert r.status_code == 456 and "quota of 10 characters" in r.json()["message"]
    alice = {"Authorization": f"DeepL-Auth-Key {KEYS['alice']}"}
    r = keyed.client.post("/v2/translate", headers=alice, data={"text": ["a"] * 65, "target_lang": "FR"})
    assert r.status_code == 413 and set(r.json()) == {"message"} and "--max-texts" in r.json()["message"]
    r = keyed.client.get("/v2/nothing", headers=alice)
    assert r.status_code == 404 and set(r.json()) == {"message"}


# -- keys: limits, 429, the native API, reload, metrics ----------------------------------------------


def test_a_key_over_its_limits_gets_429_with_retry_after_and_others_are_served(keyed):
    tight = {"Authorization": f"DeepL-Auth-Key {KEYS['tight']}"}
    answers = [
        keyed.client.post("/v2/translate", headers=tight, data={"text": "a", "target_lang": "FR"})
        for _ in range(3)
    ]
    assert [r.status_code for r in answers] == [200, 200, 429]
    assert (
        int(answers[2].headers["Retry-After"]) >= 1
        and "12 requests per minute" in answers[2].json()["message"]
    )
    assert _deepl(keyed).translate_text("a", target_lang="FR").text  # alice is still served
    r = keyed.client.post(
        "/translate", data={"q": "a", "source": "en", "target": "fr", "api_key": KEYS["tight"]}
    )
    assert r.status_code == 429 and set(r.json()) == {"error"}


def test_the_native_api_takes_a_bearer_key(keyed):
    r = keyed.client.post("/v1/translate", json={"texts": ["a"]})
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    r = keyed.client.post("/v1/translate", json={"texts": ["a"]}, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 403 and "not valid" in r.json()["error"]
    r = keyed.client.post(
        "/v1/translate", json={"texts": ["a"]}, headers={"Authorization": f"Bearer {KEYS['alice']}"}
    )
    assert r.status_code == 200, r.text


def test_sighup_reloads_the_keys_file(servers, keyed):
    bob = {"Authorization": f"DeepL-Auth-Key {KEYS['bob']}"}
    assert keyed.client.get("/v2/usage", headers=bob).status_code == 403
    servers["keys"].write_text(_keys_lines(["alice", "tight", "quota", "bob"]), encoding="utf-8")
    keyed.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while keyed.client.get("/v2/usage", headers=bob).status_code != 200:
        assert time.monotonic() < deadline, keyed.log()
        time.sleep(0.05)
    assert "reloaded" in keyed.log()


def test_metrics_count_per_key_by_a_hash_label_never_the_key(keyed):
    label = line_for("alice", KEYS["alice"]).split(":")[1][:12]
    admitted = keyed.metric("seq2onnx_key_requests_total", key=label, outcome="admitted")
    wrong = keyed.metric("seq2onnx_key_refusals_total", why="wrong")
    _deepl(keyed).translate_text("a", target_lang="FR")
    keyed.client.get("/v2/usage", headers={"Authorization": "DeepL-Auth-Key wrong"})
    assert keyed.metric("seq2onnx_key_requests_total", key=label, outcome="admitted") == admitted + 1
    assert keyed.metric("seq2onnx_key_refusals_total", why="wrong") == wrong + 1
    text = keyed.client.get("/metrics").text
    assert "alice" not in text and KEYS["alice"] not in text


# -- LibreTranslate -------------------------------------------------------------------------------


def test_libretranslate_client_translates_one_text_and_a_list(keyed, translator, other_translator):
    assert _libre(keyed).translate(TEXT) == translator.translate(TEXT)
    assert _libre(keyed, "de").translate_batch(TEXTS) == [other_translator.translate(t) for t in TEXTS]


def test_libretranslate_client_errors_and_their_messages(keyed):
    with pytest.raises(AuthorizationException):
        _libre(keyed, key="not-a-key").translate(TEXT)
    with pytest.raises(ServerException):
        _libre(keyed, "es").translate(TEXT)
    # deep-translator shows only the status: the message, in LibreTranslate's shape, read directly
    r = httpx.post(
        keyed.url + "/translate", params={"q": TEXT, "source": "en", "target": "es", "api_key": KEYS["alice"]}
    )
    assert r.status_code == 400
    assert r.json() == {
        "error": "Invalid request: target='es': no bundle served here translates into it; supported: de, fr"
    }
    r = httpx.post(
        keyed.url + "/translate",
        data={"q": TEXT, "source": "en", "target": "fr", "format": "html", "api_key": KEYS["alice"]},
    )
    assert r.status_code == 400 and "format='html' is not supported" in r.json()["error"]
    r = httpx.post(keyed.url + "/detect", data={"q": TEXT, "api_key": KEYS["alice"]})
    assert r.status_code == 400 and "/detect is not supported" in r.json()["error"]
    r = httpx.post(keyed.url + "/translate", data={"q": TEXT, "source": "en", "target": "fr"})
    assert r.status_code == 400 and "no API key was given" in r.json()["error"]


def test_libretranslate_languages_auto_and_alternatives(keyed, translator):
    langs = keyed.client.get("/languages").json()
    assert {x["code"]: x["targets"] for x in langs} == {"de": [], "en": ["de", "fr"], "fr": []}
    r = keyed.client.post(
        "/translate",
        json={"q": [TEXT], "source": "auto", "target": "fr", "alternatives": 1, "api_key": KEYS["alice"]},
    )
    assert r.status_code == 200, r.text
    want = translator.translate_batch(
        [TEXT], beam_size=max(2, translator.search_options().beam_size), num_hypotheses=2
    )[0].hypotheses
    assert r.json() == {
        "translatedText": [want[0]],
        "alternatives": [[want[1]]],
        "detectedLanguage": [{"confidence": 100.0, "language": "en"}],
    }


# -- without --api-keys ---------------------------------------------------------------------------


def test_an_open_server_says_so_and_takes_any_key(servers, translator):
    server = servers["open"]
    assert "no --api-keys: the server is open" in server.log()
    assert _deepl(server, "anything").translate_text(TEXT, target_lang="FR").text == translator.translate(
        TEXT
    )
    assert _libre(server, key="anything").translate(TEXT) == translator.translate(TEXT)
    assert server.client.post("/v1/translate", json={"texts": [TEXT]}).status_code == 200


# -- a multilingual bundle: routed by its own language tokens -------------------------------------------


@pytest.mark.slow
def test_a_multilingual_bundle_is_routed_by_its_own_codes(tmp_path):
    """A tiny NLLB bundle (tokens eng_Latn, fra_Latn, deu_Latn) served without --languages: both APIs name
    its languages by BCP 47 and translate as the runtime does with NLLB's codes."""
    import hf_nllb as N

    from seq2onnx.export.hf.bundle import export_hf_bundle
    from seq2onnx.runtime.translator import Translator

    bundle = export_hf_bundle(N.cached_nllb(with_spm=True), tmp_path / "bundle", decoder="standard")
    translator = Translator(bundle, device="cpu", intra_threads=1)
    with ServeProcess(bundle) as server:
        client = _deepl(server, "anything")
        codes = [x.code for x in client.get_target_languages()]
        assert {"DE", "EN", "FR", "ZH-HANS", "ZH-HANT"} <= set(codes) and len(codes) > 150  # NLLB's 200
        for code, nllb in (("FR", "fra_Latn"), ("DE", "deu_Latn")):
            got = client.translate_text(TEXTS, source_lang="EN", target_lang=code, split_sentences="0")
            want = translator.translate_batch(TEXTS, source_lang="eng_Latn", target_lang=nllb)
            assert [r.text for r in got] == [w.hypotheses[0] for w in want]
        assert _libre(server, "de", key="anything").translate(TEXT) == translator.translate(
            TEXT, source_lang="eng_Latn", target_lang="deu_Latn"
        )
        with pytest.raises(deepl.DeepLException, match="source_lang=None: this server detects no language"):
            client.translate_text(TEXT, target_lang="FR")  # the bundle reads three languages


@pytest.mark.slow
def test_sighup_to_a_process_group_reloads_the_keys_file_in_every_process(bundle, tmp_path):
    """With --processes 2 the parent passes SIGHUP on: afterwards no connection, whichever process the kernel
    hands it to, refuses the new key (fresh connections: each may land on either process)."""
    keys = tmp_path / "keys.txt"
    keys.write_text(_keys_lines(["alice"]), encoding="utf-8")
    bob = {"Authorization": f"DeepL-Auth-Key {KEYS['bob']}"}
    with ServeProcess(bundle, "--processes", "2", "--languages", "en:fr", "--api-keys", str(keys)) as server:
        server.listening()

        def statuses(n: int) -> set[int]:
            return {
                httpx.get(f"{server.url}/v2/usage", headers=bob, timeout=30).status_code for _ in range(n)
            }

        assert statuses(8) == {403}
        keys.write_text(_keys_lines(["alice", "bob"]), encoding="utf-8")
        server.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while (seen := statuses(16)) != {200}:
            assert time.monotonic() < deadline, (seen, server.log())
            time.sleep(0.1)
        assert server.log().count("reloaded") >= 2, server.log()  # each process re-read the file
