"""DeepL's API v2, as the official clients call it: POST /v2/translate, GET|POST /v2/languages and /v2/usage.

Bodies as JSON or form (`text` repeated), or the query string; the key in `Authorization: DeepL-Auth-Key K`
(serve/dropin.py checks it). Answers and errors in DeepL's shapes: {"translations": [...]}, and
{"message": ...} with 400 (a bad or unsupported parameter, named), 403 (key), 413, 429 (Retry-After), 456
(the key's character quota), 500, 503, 504. A parameter this server cannot honour is refused by name, never
ignored: formality other than default/prefer_*, tag handling, glossaries, context and the rest of
UNSUPPORTED. docs/drop-in-apis.md lists them.
"""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from seq2onnx.serve.dropin import DropIn, Failure, key_of
from seq2onnx.serve.languages import deepl_code, name
from seq2onnx.serve.routes import Unsupported

SUPPORTED = (
    "text",
    "source_lang",
    "target_lang",
    "formality",
    "split_sentences",
    "preserve_formatting",
    "show_billed_characters",
)
# prefer_*: DeepL itself falls back to the default where a language has no formality
FORMALITY = ("default", "prefer_more", "prefer_less")
SPLIT = {"0": None, "1": r"(?<=[.!?])\s+|\s*\n\s*", "nonewlines": r"(?<=[.!?])\s+"}
NO_QUOTA = 10**12  # DeepL's character_limit of an account without one
BOOLEANS = {"0": False, "1": True, "false": False, "true": True}


def message(status: int, text: str, retry_after: int | None = None) -> JSONResponse:
    """DeepL's error answer: {"message": text}, with Retry-After when given."""
    headers = {"Retry-After": str(retry_after)} if retry_after else None
    return JSONResponse({"message": text}, status, headers)


async def params(request: Request) -> dict:
    """The request's parameters: the query string, then the body (JSON object or form) over it. `text`
    stays a list; any other parameter given twice keeps its last value."""
    found: dict = {k: v for k, v in parse_qs(request.url.query, keep_blank_values=True).items()}
    body = await request.body()
    if body:
        if request.headers.get("content-type", "").startswith("application/json"):
            data = json.loads(body)
            if not isinstance(data, dict):
                raise ValueError(
                    'the JSON body must be an object such as {"text": ["Hello"], "target_lang": "DE"}'
                )
            found.update({k: v if isinstance(v, list) else [v] for k, v in data.items()})
        else:
            found.update(parse_qs(body.decode("utf-8"), keep_blank_values=True))
    return {k: v if k == "text" else v[-1] for k, v in found.items()}


def refusal(given: dict) -> str | None:
    """The message refusing a parameter this server cannot honour or does not know, naming it; else None."""
    for key in given:
        if key not in SUPPORTED:
            return (
                f"parameter {key!r} is not supported by this server (seq2onnx, a self-hosted model); "
                f"supported: {', '.join(SUPPORTED)}"
            )
    formality = given.get("formality", "default")
    if formality not in FORMALITY:
        return (
            f"formality={formality!r} is not supported: the models served here have no formality "
            f"(supports_formality is false for every target language); use one of {', '.join(FORMALITY)}"
        )
    split = str(given.get("split_sentences", "1"))
    if split not in SPLIT:
        return f"split_sentences={split!r}: give one of {', '.join(SPLIT)}"
    for flag in ("preserve_formatting", "show_billed_characters"):
        value = given.get(flag, False)
        if not isinstance(value, bool) and str(value).lower() not in BOOLEANS:
            return f"{flag}={value!r}: give 0 or 1 (or a JSON boolean)"
    texts = given.get("text")
    if not texts or not all(isinstance(t, str) for t in texts):
        return "parameter 'text' not specified: give one or more texts (strings)"
    if not isinstance(given.get("target_lang"), str):
        return "parameter 'target_lang' not specified: give a target language code such as DE"
    return None


def split(texts: list[str], mode: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Each text cut into sentences by split_sentences' mode: (every sentence in order, per text (how many
    sentences, the separators between them))."""
    pieces, shapes = [], []
    pattern = SPLIT[mode]
    for text in texts:
        parts = re.split(f"({pattern})", text) if pattern else [text]
        pieces.extend(parts[0::2])
        shapes.append((len(parts[0::2]), parts[1::2]))
    return pieces, shapes


def joined(translated: list[str], shapes: list[tuple[int, list[str]]]) -> list[str]:
    """The sentences' translations joined back into one per text, by the original separators."""
    out, at = [], 0
    for count, separators in shapes:
        mine = translated[at : at + count]
        at += count
        out.append("".join(p + s for p, s in zip(mine, [*separators, ""], strict=True)))
    return out


def router(drop: DropIn) -> APIRouter:
    """The /v2 endpoints over the drop-in context."""
    r = APIRouter(tags=["DeepL API v2"])

    @r.post("/v2/translate", summary="DeepL: translate texts (form or JSON body)")
    async def translate(request: Request):
        try:
            given = await params(request)
        except (ValueError, UnicodeDecodeError) as e:
            return message(400, f"the body cannot be read: {e}")
        problem = refusal(given)
        if problem:
            return message(400, problem)
        try:
            choice = drop.routes.choose(
                given.get("source_lang"), given["target_lang"], ("source_lang", "target_lang")
            )
        except Unsupported as e:
            return message(400, str(e))
        texts = given["text"]
        pieces, shapes = split(texts, str(given.get("split_sentences", "1")))
        results = await drop.translate(request, choice, pieces, {})
        if isinstance(results, Failure):
            return message(results.status, results.message, results.retry_after)
        out = joined([r.hypotheses[0] for r in results], shapes)
        source = deepl_code(choice.source)
        return {
            "translations": [
                {"detected_source_language": source, "text": text, "billed_characters": len(original)}
                for text, original in zip(out, texts, strict=True)
            ]
        }

    @r.api_route("/v2/languages", methods=["GET", "POST"], summary="DeepL: source or target languages")
    async def languages(request: Request):
        try:
            kind = (await params(request)).get("type", "source")
        except (ValueError, UnicodeDecodeError) as e:
            return message(400, f"the body cannot be read: {e}")
        if kind not in ("source", "target"):
            return message(400, f"type={kind!r}: give source or target")
        if kind == "source":
            return [{"language": deepl_code(c), "name": name(c)} for c in drop.routes.sources()]
        return [
            {"language": deepl_code(c), "name": name(c), "supports_formality": False}
            for c in drop.routes.targets()
        ]

    @r.api_route("/v2/usage", methods=["GET", "POST"], summary="DeepL: characters translated and the limit")
    async def usage(request: Request):
        count, limit = drop.gate.usage(key_of(request))
        return {"character_count": count, "character_limit": NO_QUOTA if limit is None else limit}

    return r
