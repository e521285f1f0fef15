"""seq2onnx runtime: decode exported bundles with onnxruntime, numpy and sentencepiece (never torch)."""
from .bundle import Bundle, BundleError, read_bundle

__all__ = ["Bundle", "BundleError", "read_bundle"]
