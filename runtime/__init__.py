"""seq2onnx runtime: decode exported bundles with onnxruntime, numpy and sentencepiece (never torch).

An app imports `Translator` and `TranslationResult` from the package (`from seq2onnx import Translator`:
loaded lazily there, so that the bundle format alone does not load onnxruntime); here are the bundle format
(Bundle, read_bundle, BundleError) and the decoding options (SearchOptions; OPTIONS, each option's
declaration, runtime/options.py's Option; OptionError, the refusal of a value). docs/python-api.md lists the
public surface.
"""

from .bundle import Bundle, BundleError, read_bundle
from .options import OPTIONS, Option, OptionError, SearchOptions

__all__ = ["OPTIONS", "Bundle", "BundleError", "Option", "OptionError", "SearchOptions", "read_bundle"]
