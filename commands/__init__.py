"""The `seq2onnx` command: main.py builds the parser; each other module is one command (or its helper).

Commands are the top layer: they may import seq2onnx.runtime, seq2onnx.export, seq2onnx.model and
seq2onnx.bench, and nothing imports them.
"""
