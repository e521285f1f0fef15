"""The request and response bodies of `seq2onnx serve`'s own API, as FastAPI's /docs and /openapi.json show
them (serve/app.py's endpoints take and answer these). The requests' option fields are made from the options'
one declaration (runtime/options.py): their names, types, defaults and descriptions."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, create_model

from seq2onnx.runtime.option_spec import api_default, names
from seq2onnx.runtime.options import OPTIONS


_TYPES = {"int": int, "number": float, "bool": bool, "lang": str, "ids": list[list[int]]}


def _fields(scope: str) -> dict:
    """The request fields of the served options of `scope` (runtime/options.py's Options: its http name, kind,
    doc and default; None where the bundle gives the default). A field named otherwise than its option is
    an alias, so that model_dump() gives translate_batch's names."""
    found = {}
    for name in names(scope):
        o = OPTIONS[name]
        if o.http is None:
            continue
        default = api_default(name)
        kind = _TYPES[o.kind] | None if default is None else _TYPES[o.kind]
        alias = None if o.http == name else o.http
        found[name] = (kind, Field(default, description=o.doc, alias=alias))
    return found


class _Options(BaseModel):
    # strict: "4" is no beam size and 1 no boolean; the runtime checks the ranges (engine.check)
    model_config = ConfigDict(extra="forbid", strict=True)


TranslateRequest = create_model(
    "TranslateRequest",
    __base__=_Options,
    __module__=__name__,
    __doc__="POST /v1/translate: texts and Translator.translate_batch's options by name. Options that "
    "contradict each other are refused (422 naming both): beam_size > 1 with sampling_temperature; seed, "
    "sampling_topk or sampling_topp without it. A key given twice in the JSON is refused (422).",
    texts=(
        list[str],
        Field(description='the source texts; an empty text translates to ""', examples=[["the queen sees"]]),
    ),
    **_fields("batch"),
)

StreamRequest = create_model(
    "StreamRequest",
    __base__=_Options,
    __module__=__name__,
    __doc__="POST /v1/translate/stream: one text, translated greedily, sent piece by piece.",
    text=(str, Field(description="the source text", examples=["the queen sees young mice with an old box"])),
    **_fields("stream"),
)


class Translation(BaseModel):
    """One text's n-best, best first."""

    hypotheses: list[str]
    token_ids: list[list[int]] = Field(description="each hypothesis's target ids, end token excluded")
    scores: list[float | None] | None = Field(
        description="with return_scores (null for a non-finite score), else null"
    )


class TranslateResponse(BaseModel):
    translations: list[Translation] = Field(description="one per text, in order")


class ErrorResponse(BaseModel):
    error: str = Field(description="what is wrong, the limit and the fix")
    field: str | None = Field(None, description="the request's field at fault, if one is")


ERRORS = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in (
        (400, "malformed JSON, too deep, too long an integer, or not UTF-8"),
        (408, "the body came too slowly"),
        (413, "over a limit (bytes, texts, characters)"),
        (422, "a wrong field, type or option value"),
        (500, "the engine failed"),
        (503, "queue full (Retry-After), or draining"),
        (504, "no answer within the timeout: the job was cancelled"),
    )
}
