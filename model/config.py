"""The one description of a model's shape, written as config.json beside weights and graphs."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

# Special ids are fixed when the SentencePiece models are trained (model/tokenizer.py), so the
# same ids hold on both sides and in every bundle.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


@dataclass(frozen=True)
class ModelConfig:
    src_vocab_size: int  # SentencePiece pieces on the source side
    tgt_vocab_size: int  # ... and on the target side (equal to src when the vocabulary is joint)
    d_model: int = 256  # width of every residual stream
    n_heads: int = 4  # attention heads; d_model must divide by it
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    d_ff: int = 1024  # inner width of the position-wise feed-forward
    dropout: float = 0.1  # on embeddings, attention weights and every sublayer output
    max_positions: int = 256  # longest source or target sequence, special tokens included
    pre_norm: bool = False  # False: Add & Norm after each sublayer as in the paper; True: pre-LN
    tie_embeddings: bool = True  # target embedding shared with the output projection
    share_vocab: bool = False  # one joint SentencePiece model; the embeddings are shared too
    layer_norm_eps: float = 1e-5
    pad_id: int = PAD_ID
    unk_id: int = UNK_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    decoder_start_id: int = BOS_ID  # first decoder input

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model={self.d_model} does not divide by n_heads={self.n_heads}; "
                "choose n_heads among the divisors of d_model"
            )
        if self.share_vocab and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                f"share_vocab needs equal vocabularies, got {self.src_vocab_size} and "
                f"{self.tgt_vocab_size}"
            )
        for name in ("pad_id", "unk_id", "bos_id", "eos_id", "decoder_start_id"):
            value = getattr(self, name)
            if not 0 <= value < min(self.src_vocab_size, self.tgt_vocab_size):
                raise ValueError(f"{name}={value} is outside the vocabulary")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"config has unknown fields {unknown}; it was written by a newer seq2onnx "
                "or edited by hand"
            )
        return cls(**data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "ModelConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))
