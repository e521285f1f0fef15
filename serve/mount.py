"""Puts the drop-in APIs (DeepL, LibreTranslate) and the key middleware on an app of serve/app.py's
create_app: a small hook, so that serve/app.py stays the native front end. docs/drop-in-apis.md."""

from __future__ import annotations

from fastapi import FastAPI

from seq2onnx.serve import deepl, libretranslate
from seq2onnx.serve.frontend import Frontend
from seq2onnx.serve.dropin import LIBRE, DropIn, KeyGate
from seq2onnx.serve.keys import Gate
from seq2onnx.serve.routes import Routes


def mount(app: FastAPI, routes: Routes, gate: Gate) -> DropIn:
    """Adds the DeepL and LibreTranslate endpoints and the key middleware to an app of create_app.

    Call before the app serves (Starlette builds its middleware at the first request).
    """
    f: Frontend = app.state.frontend
    drop = app.state.dropin = DropIn(f, routes, gate)
    f.admitted.update({"/v2/translate", "/translate", "/detect"})  # body limits, queue and deadline
    f.endpoints.update({"/v2/translate", "/v2/languages", "/v2/usage", *LIBRE})
    app.include_router(deepl.router(drop))
    app.include_router(libretranslate.router(drop))
    app.add_middleware(KeyGate, drop=drop)
    return drop
