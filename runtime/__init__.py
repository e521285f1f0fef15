"""seq2onnx runtime: decode exported bundles with onnxruntime, numpy and sentencepiece (never torch).

The public surface (docs/python-api.md#the-public-surface): Translator and TranslationResult (loaded lazily:
importing the bundle format alone does not load onnxruntime), the bundle format (Bundle, read_bundle,
BundleError), and the options (SearchOptions, OptionError).
"""

from .bundle import Bundle, BundleError, read_bundle
from .options import OptionError, SearchOptions

__all__ = [
    "Bundle", "BundleError", "OptionError", "SearchOptions", "TranslationResult", "Translator", "read_bundle",
]


def __getattr__(name: str):
    if name in ("Translator", "TranslationResult"):  # onnxruntime is imported with them, not before
        from . import translator

        return getattr(translator, name)
    raise AttributeError(f"module 'seq2onnx.runtime' has no attribute {name!r}")
