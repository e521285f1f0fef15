"""The request and response bodies of `seq2onnx serve`'s own API, as FastAPI's /docs and /openapi.json show
them (serve/app.py's endpoints take and answer these)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Options(BaseModel):
    # strict: "4" is no beam size and 1 no boolean; the runtime checks the ranges (engine.check)
    model_config = ConfigDict(extra="forbid", strict=True)

    max_decoding_length: int | None = Field(
        None, description="default max_length_a x source tokens + max_length_b")
    min_decoding_length: int | None = Field(
        None, description="the end token is forbidden before this many tokens")
    truncate: bool = Field(
        False, description="cut a source longer than the model's positions instead of refusing it")
    source_lang: str | None = Field(None, description="a multilingual model's source language code")
    target_lang: str | None = Field(None, description="a multilingual model's target language code")


class TranslateRequest(_Options):
    """POST /v1/translate: texts and Translator.translate_batch's options by name. Options that contradict
    each other are refused (422 naming both): beam_size > 1 with sampling_temperature; seed, sampling_topk
    or sampling_topp without it. A key given twice in the JSON is refused (422)."""
    texts: list[str] = Field(description="the source texts; an empty text translates to \"\"",
                             examples=[["the queen sees"]])
    beam_size: int | None = Field(None, description="1 is greedy search; default bundle.json's "
                                  "decoding.beam_size; with sampling_temperature only 1 (else 422: "
                                  "sampling has no beams)")
    num_hypotheses: int = Field(1, description="the n-best returned per text (at most beam_size, or samples)")
    length_penalty: float | None = Field(
        None, description="alpha in score / length^alpha; default bundle.json's")
    return_scores: bool = Field(
        False, description="return each hypothesis's score (sum of log-probabilities)")
    sampling_temperature: float | None = Field(None, description="> 0 samples instead of searching")
    sampling_topk: int = Field(0, description="sample among the k likeliest tokens (0: all); other than 0 "
                               "only with sampling_temperature (else 422)")
    sampling_topp: float = Field(1.0, description="... within this probability mass (1.0: all); other than "
                                 "1.0 only with sampling_temperature (else 422)")
    seed: int | None = Field(None, description="sampling seed: a text's sample depends only on (seed, text); "
                             "only with sampling_temperature (else 422)")
    target_prefix: list[list[int]] | None = Field(None, description="per text, target ids forced first")


class StreamRequest(_Options):
    """POST /v1/translate/stream: one text, translated greedily, sent piece by piece."""
    text: str = Field(description="the source text", examples=["the queen sees young mice with an old box"])


class Translation(BaseModel):
    """One text's n-best, best first."""
    hypotheses: list[str]
    token_ids: list[list[int]] = Field(description="each hypothesis's target ids, end token excluded")
    scores: list[float | None] | None = Field(
        description="with return_scores (null for a non-finite score), else null")


class TranslateResponse(BaseModel):
    translations: list[Translation] = Field(description="one per text, in order")


class ErrorResponse(BaseModel):
    error: str = Field(description="what is wrong, the limit and the fix")
    field: str | None = Field(None, description="the request's field at fault, if one is")


ERRORS = {status: {"model": ErrorResponse, "description": text} for status, text in (
    (400, "malformed JSON, too deep, too long an integer, or not UTF-8"), (408, "the body came too slowly"),
    (413, "over a limit (bytes, texts, characters)"),
    (422, "a wrong field, type or option value"), (500, "the engine failed"),
    (503, "queue full (Retry-After), or draining"),
    (504, "no answer within the timeout: the job was cancelled"))}
