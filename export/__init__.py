"""Checkpoint -> bundle: the two ONNX graphs, bundle.json and the tokenizers (export/bundle.py), the
fused and int8 variants, the parity proof against PyTorch (export/parity.py) and the CTranslate2
model directory (export/ctranslate2/).

Imports torch; the commands import it only when they run.
"""
