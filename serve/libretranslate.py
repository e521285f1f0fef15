"""LibreTranslate's API, as its clients call it: POST /translate, GET /languages, POST /detect (refused).

Parameters from the query string (deep-translator sends them there), a form or a JSON body; the key as
`api_key`. Answers and errors in LibreTranslate's shapes: {"translatedText": ...}, and {"error": ...} with
400 (a missing, bad or unsupported parameter, named), 403 (a wrong key), 429 (Retry-After), 500. `source`
may be `auto` only where one language can be meant (the bundles writing the target read one language):
this server has no language detector, so /detect is refused, and so is `auto` elsewhere, by name.
`format=html` is refused (the models translate plain text). docs/drop-in-apis.md.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from seq2onnx.serve.dropin import DropIn, Failure, hold
from seq2onnx.serve.languages import name
from seq2onnx.serve.routes import Unsupported

SUPPORTED = ("q", "source", "target", "format", "api_key", "alternatives")
MAX_ALTERNATIVES = 8


def error(status: int, text: str, retry_after: int | None = None) -> JSONResponse:
    """LibreTranslate's error answer: {"error": text}."""
    return JSONResponse({"error": text}, status, {"Retry-After": str(retry_after)} if retry_after else None)


async def params(request: Request) -> dict:
    """The request's parameters: the query string, then the body (JSON object or form) over it."""
    found = {k: v[-1] for k, v in parse_qs(request.url.query, keep_blank_values=True).items()}
    body = await request.body()
    if body:
        if request.headers.get("content-type", "").startswith("application/json"):
            data = json.loads(body)
            if not isinstance(data, dict):
                raise ValueError(
                    'the JSON body must be an object such as {"q": "Hello", "source": "en", "target": "fr"}'
                )
            found.update(data)
        else:
            form = parse_qs(body.decode("utf-8"), keep_blank_values=True)
            found.update({k: v[-1] for k, v in form.items()})
    return found


def problem(given: dict) -> str | None:
    """The message refusing a missing, bad or unsupported parameter (named); else None."""
    for key in given:
        if key not in SUPPORTED:
            return (
                f"Invalid request: parameter {key!r} is not supported by this server (seq2onnx, a "
                f"self-hosted model); supported: {', '.join(SUPPORTED)}"
            )
    for key in ("q", "source", "target"):
        if given.get(key) in (None, "", []):
            return f"Invalid request: missing {key} parameter"
    q = given["q"]
    if not isinstance(q, str) and not (isinstance(q, list) and all(isinstance(t, str) for t in q)):
        return "Invalid request: q must be a string or a list of strings"
    if given.get("format", "text") != "text":
        return (
            f"Invalid request: format={given['format']!r} is not supported: the models served here "
            "translate plain text; use format=text"
        )
    alternatives = str(given.get("alternatives", 0))
    if not alternatives.isdigit() or int(alternatives) > MAX_ALTERNATIVES:
        return (
            f"Invalid request: alternatives={given['alternatives']!r}: give an int from 0 to "
            f"{MAX_ALTERNATIVES}"
        )
    return None


def _answer(results, texts_given, choice, alternatives: int, auto: bool) -> dict:
    """LibreTranslate's answer for one text (values) or a list (lists)."""
    best = [r.hypotheses[0] for r in results]
    others = [r.hypotheses[1 : alternatives + 1] for r in results]
    one = isinstance(texts_given, str)
    out: dict = {"translatedText": best[0] if one else best}
    if alternatives:
        out["alternatives"] = others[0] if one else others
    if auto:  # the one language the bundles writing the target read: certain, not detected
        detected = {"confidence": 100.0, "language": choice.source}
        out["detectedLanguage"] = detected if one else [detected] * len(best)
    return out


async def _translate(drop: DropIn, request: Request, given: dict):
    """POST /translate's answer to the read parameters `given`: refused, or the translations."""
    refused = problem(given)
    if refused:
        return error(400, refused)
    auto = given["source"] == "auto"
    try:
        choice = drop.routes.choose(None if auto else given["source"], given["target"], ("source", "target"))
    except Unsupported as e:
        return error(400, f"Invalid request: {e}")
    alternatives = int(given.get("alternatives", 0))
    options = {}
    if alternatives:
        beam = choice.route.engine.translator.search_options().beam_size
        options = {"beam_size": max(beam, alternatives + 1), "num_hypotheses": alternatives + 1}
    q = given["q"]
    results = await drop.translate(request, choice, [q] if isinstance(q, str) else q, options)
    if isinstance(results, Failure):
        return error(results.status, results.message, results.retry_after)
    return _answer(results, q, choice, alternatives, auto)


def router(drop: DropIn) -> APIRouter:
    """LibreTranslate's endpoints over the drop-in context."""
    r = APIRouter(tags=["LibreTranslate API"])

    @r.post("/translate", summary="LibreTranslate: translate q (a string or a list)")
    async def translate(request: Request):
        try:
            given = await params(request)
        except (ValueError, UnicodeDecodeError) as e:
            return error(400, f"Invalid request: the body cannot be read: {e}")
        return await hold(
            drop, request, given.get("api_key"), "libre", lambda key: _translate(drop, request, given)
        )

    @r.get("/languages", summary="LibreTranslate: the languages and each one's targets")
    async def languages():
        routes = drop.routes
        every = sorted({*routes.sources(), *routes.targets()})
        return [
            {"code": c, "name": name(c), "targets": [t for t in routes.targets(c) if t != c]} for c in every
        ]

    @r.post("/detect", summary="LibreTranslate: language detection (refused: this server has no detector)")
    async def detect(request: Request):
        try:
            given = await params(request)
        except (ValueError, UnicodeDecodeError) as e:
            return error(400, f"Invalid request: the body cannot be read: {e}")

        async def work(key):
            sources = ", ".join(drop.routes.sources()) or "none declared"
            return error(
                400,
                "Invalid request: /detect is not supported: this server has no language "
                f"detector; give source explicitly (the languages it reads: {sources})",
            )

        return await hold(drop, request, given.get("api_key"), "libre", work)

    return r
