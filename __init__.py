"""seq2onnx: train an encoder-decoder Transformer in PyTorch, ship it as two ONNX graphs, decode it
without torch.

`from seq2onnx import Translator` loads only the runtime (onnxruntime, numpy, sentencepiece); the
training and export code (seq2onnx.model, seq2onnx.export) is imported only by whoever asks for it.
This file is the repository root's: pyproject.toml maps the package `seq2onnx` onto the root and its
subpackages onto the folders model/, export/ and runtime/.
"""

import os as _os

__version__ = "0.2.0"

# onnxruntime's official Linux and macOS builds report usage to Microsoft by default (1DS: a device id in
# TMPDIR/.ses, events uploaded from a thread); ORT_DISABLE_TELEMETRY=1, set before onnxruntime loads, turns
# that off. An app that embeds the runtime should not start reporting because of it: off unless the app set
# the variable itself (or loaded onnxruntime first). The JavaScript host does the same (js/src/quiet-ort.js).
_os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

__all__ = ["Translator", "TranslationResult", "BundleError", "OptionError", "__version__"]


def __getattr__(name: str):
    # Lazy, so that `import seq2onnx` (the CLI, `seq2onnx --version`, the training code) does not
    # load onnxruntime until the runtime is used.
    if name in ("Translator", "TranslationResult"):
        from .runtime import translator

        return getattr(translator, name)
    if name in ("BundleError", "OptionError"):
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'seq2onnx' has no attribute {name!r}")
