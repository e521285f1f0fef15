"""seq2onnx runtime: decode exported bundles with onnxruntime, numpy and sentencepiece (never torch).

What an app uses, all importable from here: `Translator` and its `TranslationResult` (loaded lazily, so that
the bundle format alone does not load onnxruntime; `from seq2onnx import Translator` is the same), the bundle
format (Bundle, read_bundle, BundleError) and the decoding options (SearchOptions, and OPTIONS: each option's
declaration, runtime/options.py's Option; OptionError, the refusal of a value). docs/python-api.md lists the
public surface.
"""

from .bundle import Bundle, BundleError, read_bundle
from .options import OPTIONS, Option, OptionError, SearchOptions

__all__ = ["OPTIONS", "Bundle", "BundleError", "Option", "OptionError", "SearchOptions", "TranslationResult",
           "Translator", "read_bundle"]


def __getattr__(name: str):
    # Lazy: the bundle format and the options load no onnxruntime until a Translator is asked for.
    if name in ("Translator", "TranslationResult"):
        from . import translator

        return getattr(translator, name)
    raise AttributeError(f"module 'seq2onnx.runtime' has no attribute {name!r}")
