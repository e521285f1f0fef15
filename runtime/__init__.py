"""seq2onnx runtime: decode exported bundles with onnxruntime, numpy and sentencepiece (never torch)."""

from .bundle import Bundle, BundleError, read_bundle
from .options import SearchOptions

__all__ = ["Bundle", "BundleError", "SearchOptions", "read_bundle"]
