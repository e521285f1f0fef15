"""The drop-in APIs' common ground: the keys at the door, and translating through the same engines
(continuous batching) as the native API. serve/mount.py puts them on the app.

DeepL's /v2/* (serve/deepl.py) and LibreTranslate's endpoints (serve/libretranslate.py) sit behind an outer
ASGI middleware (KeyGate) that, with --api-keys, checks the key of
every request that carries it in a header (DeepL's `Authorization: DeepL-Auth-Key K`, the native API's
`Authorization: Bearer K`) before its body is read or a queue slot taken, and answers a refusal in the
path's own API's shape. LibreTranslate's key is in the body (`api_key`): its endpoints check it themselves.
The native front end's own errors on a DeepL path (413 over --max-body-bytes, 503 queue full, ...) are
rewritten into DeepL's shape, {"message": ...}; LibreTranslate's shape, {"error": ...}, is the native one's.
docs/drop-in-apis.md.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from seq2onnx.runtime.model_options import check_prefix_options
from seq2onnx.serve.app import _bridge, _wait
from seq2onnx.serve.frontend import Frontend
from seq2onnx.serve.engine import Cancelled
from seq2onnx.serve.keys import Gate, Key, Refusal
from seq2onnx.serve.routes import Choice, Routes

log = logging.getLogger("seq2onnx.serve")

KEY = "seq2onnx.key"  # the request scope's Key (None on an open server)
DEEPL, LIBRE = "/v2/", ("/translate", "/languages", "/detect")


@dataclass
class Failure:
    """A translation that failed: its status, message, and Retry-After seconds (or None)."""

    status: int
    message: str
    retry_after: int | None = None


@dataclass
class DropIn:
    """What the drop-in endpoints share (app.state.dropin).

    Attributes:
        frontend: the native app's Frontend (its limits, deadline, metrics and queue);
        routes: the bundles by language (serve/routes.py); gate: the keys (serve/keys.py).
    """

    frontend: Frontend
    routes: Routes
    gate: Gate

    async def translate(self, request: Request, choice: Choice, texts: list[str], options: dict):
        """Translates `texts` on the chosen bundle's engine within the front end's limits and deadline.

        Returns:
            The engine's results (one per text), or a Failure (413 over a limit, 400 a value refused, 503 the
            engine closing, 504 too slow, 500 the engine failed).
        """
        f, engine = self.frontend, choice.route.engine
        for count, what, limit, flag in (
            (len(texts), "texts", f.max_texts, "--max-texts"),
            (sum(map(len, texts)), "characters", f.max_chars, "--max-chars"),
        ):
            if count > limit:
                return Failure(
                    413,
                    f"{count} {what}; the server's limit ({flag}) is {limit} per request: split the request",
                )
        try:
            search = engine.check({**options, **choice.options}, len(texts))
            t = engine.translator
            check_prefix_options(search, len(texts), t.vocabulary.languages, t.tgt_vocab, t.eos_id)
            job = engine.submit(texts, search)
        except (ValueError, TypeError) as e:
            return Failure(400, str(e))
        try:
            answer = await _wait(f, _bridge(job), request, job)
            if answer is not None:  # 504, or the client left
                return Failure(answer.status_code, json.loads(answer.body)["error"])
            results = job.future.result()
        except Cancelled:
            return Failure(503, "the engine dropped the request (it is closing): retry later", 1)
        except (ValueError, TypeError) as e:
            return Failure(400, str(e))
        except Exception as e:  # the engine's own failure
            log.error("the engine failed: %s: %s", type(e).__name__, e, exc_info=e)
            return Failure(500, f"the engine failed ({type(e).__name__}: {e})")
        f.texts.inc(len(results))
        f.tokens.inc(sum(len(ids) for r in results for ids in r.token_ids))
        request.scope["seq2onnx.characters"] = characters = sum(map(len, texts))
        if self.gate.open:  # /v2/usage of an open server: every client's
            self.gate.open_characters += characters
        return results


def api_of(path: str) -> str:
    """deepl, libre or native: whose error shape a path's answers take."""
    return "deepl" if path.startswith(DEEPL) else "libre" if path in LIBRE else "native"


def refusal_answer(api: str, refusal: Refusal) -> Response:
    """A key refusal in the API's own shape: DeepL 403/429/456 {"message"}; LibreTranslate 400 (missing),
    403/429 {"error"}; native 401 (missing, with WWW-Authenticate)/403/429 {"error", "field"}."""
    status = {
        "missing": 403 if api == "deepl" else 400 if api == "libre" else 401,
        "wrong": 403,
        "characters": 456 if api == "deepl" else 429,
    }.get(refusal.why, 429)
    hint = {
        "deepl": "send the header `Authorization: DeepL-Auth-Key KEY`",
        "libre": "send the key as api_key",
        "native": "send the header `Authorization: Bearer KEY`",
    }[api]
    message = f"{refusal.message}: {hint}" if refusal.why in ("missing", "wrong") else refusal.message
    headers = {"Retry-After": str(refusal.retry_after)} if refusal.retry_after else {}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    body = {"deepl": {"message": message}, "libre": {"error": message}}.get(
        api, {"error": message, "field": None}
    )
    return JSONResponse(body, status, headers or None)


def header_key(scope, api: str) -> str | None:
    """The key in the Authorization header: `DeepL-Auth-Key K` (DeepL) or `Bearer K` (native)."""
    value = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1").strip()
    scheme, _, key = value.partition(" ")
    wanted = "deepl-auth-key" if api == "deepl" else "bearer"
    return key.strip() if scheme.lower() == wanted else None


class KeyGate:
    """ASGI middleware, outside the native admission: keys in headers checked and held per key; DeepL's
    error shape for the native front end's errors on /v2/ paths."""

    def __init__(self, app, drop: DropIn):
        self.app, self.drop = app, drop

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        api = api_of(scope["path"])
        if api == "deepl":
            send = _deepl_errors(send)
        gate = self.drop.gate
        if gate.open or api == "libre" or not scope["path"].startswith(("/v1/", DEEPL)):
            scope[KEY] = None
            return await self.app(scope, receive, send)
        key = gate.identify(header_key(scope, api))
        refusal = key if isinstance(key, Refusal) else gate.admit(key)
        if refusal is not None:
            return await refusal_answer(api, refusal)(scope, receive, send)
        scope[KEY] = key
        try:
            await self.app(scope, receive, send)
        finally:
            gate.release(key, scope.get("seq2onnx.characters", 0))


async def hold(drop: DropIn, request: Request, key_text, api: str, work):
    """Runs `await work(key)` under the key `key_text` (LibreTranslate's, from the body), holding the key's
    slot meanwhile; returns the refusal's answer, or work's."""
    gate = drop.gate
    if gate.open:
        return await work(None)
    key = gate.identify(key_text if isinstance(key_text, str) else None)
    refusal = key if isinstance(key, Refusal) else gate.admit(key)
    if refusal is not None:
        return refusal_answer(api, refusal)
    try:
        return await work(key)
    finally:
        gate.release(key, request.scope.get("seq2onnx.characters", 0))


def _deepl_errors(send):
    """Wraps `send` so that a JSON error of the native shape ({"error": ...}) goes out as DeepL's
    ({"message": ...}); every other answer passes unchanged."""
    held: list[dict] = []
    chunks: list[bytes] = []

    async def wrapped(message):
        if message["type"] == "http.response.start" and message["status"] >= 400:
            held.append(message)
            return None
        if not held or message["type"] != "http.response.body":
            return await send(message)
        chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return None
        body = b"".join(chunks)
        try:
            data = json.loads(body)
            if isinstance(data, dict) and "error" in data and "message" not in data:
                body = json.dumps({"message": data["error"]}).encode()
        except ValueError:
            pass
        start = held.pop()
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return wrapped


def key_of(request: Request) -> Key | None:
    """The request's key, as KeyGate found it (None on an open server)."""
    return request.scope.get(KEY)
