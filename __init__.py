"""seq2onnx: train an encoder-decoder Transformer in PyTorch, ship it as two ONNX graphs, decode it
without torch.

`from seq2onnx import Translator` loads only the runtime (onnxruntime, numpy, sentencepiece); the
training and export code (seq2onnx.model, seq2onnx.export) is imported only by whoever asks for it.
This file is the repository root's: pyproject.toml maps the package `seq2onnx` onto the root and its
subpackages onto the folders model/, export/ and runtime/.
"""

__version__ = "0.2.0"

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
