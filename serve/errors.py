"""The HTTP front end's error answers (serve/app.py): JSON {"error": message, "field": name or null}.

Which field an error names is decided from the error's type and attributes, never from its text: pydantic's
errors carry their location, the runtime's OptionError its option, mapped to the request's field by the
option's declaration (runtime/options.py's Option.http).
"""

from __future__ import annotations

import json
import logging

from fastapi.responses import JSONResponse
from pydantic import BaseModel

from seq2onnx.runtime.options import OPTIONS, OptionError

log = logging.getLogger("seq2onnx.serve")

RETRY_AFTER_S = 1  # what a 503 asks a client to wait: a queue slot frees as soon as one request is answered
CLOSE = {"Connection": "close"}  # after an answer sent before the body was read: the rest is not a request


def error(
    status: int, message: str, field: str | None = None, retry: bool = False, close: bool = False
) -> JSONResponse:
    """The JSON error answer; `retry` adds Retry-After, `close` ends the connection after it (CLOSE)."""
    headers = ({"Retry-After": str(RETRY_AFTER_S)} if retry else {}) | (CLOSE if close else {})
    return JSONResponse({"error": message, "field": field}, status, headers or None)


def invalid(errors: list[dict], model: type[BaseModel]) -> JSONResponse:
    """The first of pydantic's errors as one message naming the field, the value and the fix."""
    # an unknown name first: it explains the rest
    e = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    loc = [str(p) for p in e["loc"]][1 if e["loc"][:1] == ("body",) else 0 :]
    if e["type"] == "json_invalid":
        reason = e.get("ctx", {}).get("error", e["msg"])
        return error(
            400,
            f"the body is not valid JSON ({reason}, at character "
            f"{loc[0] if loc else 0}): send one JSON object",
        )
    if not loc:
        example = '{"texts": ["Hello"]}' if "texts" in model.model_fields else '{"text": "Hello"}'
        return error(
            422,
            f"the body must be a JSON object such as {example} (Content-Type: application/json): {e['msg']}",
        )
    names = ", ".join(sorted(model.model_fields, key=lambda name: name not in ("text", "texts")))
    field, where = loc[0], loc[0] + "".join(f"[{p}]" for p in loc[1:])
    if e["type"] == "extra_forbidden":
        if field == "return_attention":
            return error(
                422,
                "return_attention is not served over HTTP (an array per hypothesis): "
                "use the Python runtime's Translator.translate_batch(return_attention=True)",
                field,
            )
        return error(422, f"unknown field {field!r}: this endpoint takes {names}", field)
    if e["type"] == "missing":
        return error(422, f"{where} is missing: this endpoint takes {names}{more}", field)
    shown = json.dumps(e.get("input"), default=repr)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return error(422, f"{where}={shown}: {e['msg']}{more}", field)


def option_field(e: OptionError, model: type[BaseModel]) -> str | None:
    """The request field of `model` that the OptionError's option maps to (Option.http, runtime/options.py);
    None where it has none (an option not served, or not a field of this request)."""
    option = OPTIONS.get(e.option)
    return option.http if option and e.option in model.model_fields else None  # fields by the option's name


def engine_error(e: BaseException, model: type[BaseModel]) -> JSONResponse:
    """The runtime's refusal as 422 (its message names the value, the limit and the fix); anything else: 500.

    An OptionError names its option's field; the runtime's other ValueErrors and TypeErrors are a source's
    (too many tokens, ids outside the vocabulary: "source 3 has ..."), so they name the texts.
    """
    if isinstance(e, OptionError):
        return error(422, str(e), option_field(e, model))
    if isinstance(e, (ValueError, TypeError)):
        return error(422, str(e), "texts" if "texts" in model.model_fields else "text")
    log.error("the engine failed: %s: %s", type(e).__name__, e, exc_info=e)
    return error(500, f"the engine failed ({type(e).__name__}: {e}); the server log has the traceback")
