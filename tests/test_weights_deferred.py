"""The private copy made in a thread while a Translator loads (runtime/weights.py read_weights' `defer`): what
runs is the file as checked, and a copy or hash that fails is refused before anything made from it is used."""

from __future__ import annotations

import pytest

from seq2onnx.runtime import private_copy
from seq2onnx.runtime.bundle import read_bundle
from seq2onnx.runtime.spec import BundleError
from seq2onnx.runtime.translator import Translator
from tiny import copy_bundle, edit_bundle_json, scratch, tiny_bundle


def test_a_deferred_copy_is_whole_and_checked_before_it_is_used():
    source = tiny_bundle()
    bundle = read_bundle(source, defer_weights_hash=True)
    dest = scratch("deferred") / "weights.bin"
    bundle.weights.copy_to(dest)  # waits for the copy; hashes what it wrote
    bundle.weights.verify()
    assert dest.read_bytes() == (source / "weights.bin").read_bytes()


def test_a_deferred_copy_with_another_sha256_is_refused_by_the_translator():
    path = copy_bundle(tiny_bundle(), "deferred-sha")
    edit_bundle_json(path, lambda meta: meta["files"]["weights"].update(sha256="0" * 64))
    with pytest.raises(BundleError, match="weights.bin: sha256 differs from bundle.json"):
        Translator(path, device="cpu")


def test_a_file_that_changes_size_while_it_is_copied_is_refused_before_a_session_is_made(monkeypatch):
    real = private_copy.copy_bytes
    monkeypatch.setattr(private_copy, "copy_bytes", lambda source, dest, size: real(source, dest, size) - 1)
    with pytest.raises(BundleError, match="changed size while it was read"):
        Translator(tiny_bundle(), device="cpu")
    bundle = read_bundle(tiny_bundle(), defer_weights_hash=True)  # returns: the copy goes on in its thread
    with pytest.raises(BundleError, match="changed size while it was read"):
        bundle.weights.verify()
