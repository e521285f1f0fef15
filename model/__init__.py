"""PyTorch side of seq2onnx: the Transformer, tokenization, data, training and reference decoding."""

from .config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ModelConfig

__all__ = ["ModelConfig", "PAD_ID", "UNK_ID", "BOS_ID", "EOS_ID"]
