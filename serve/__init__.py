"""`seq2onnx serve`: the runtime behind HTTP (serve/app.py) with continuous batching (serve/batcher.py).

This layer imports only runtime/ and the leaves (never torch, model/ or export/): a service installs
`seq2onnx[serve,cpu]`. docs/serving.md explains it.
"""
