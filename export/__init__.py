"""Checkpoint -> bundle (two ONNX graphs + bundle.json), parity checks, and the `seq2onnx` CLI.

Kept free of top-level torch imports so that `seq2onnx translate` works on a runtime-only install;
the torch-side modules are imported by the commands that need them.
"""
