"""SentencePiece models trained on the training split, with the special ids of ModelConfig."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Iterable

import sentencepiece as spm

from .config import BOS_ID, EOS_ID, PAD_ID, UNK_ID

# File names inside a checkpoint (and copied into bundles under the same names).
SOURCE_MODEL, TARGET_MODEL = "source.spm.model", "target.spm.model"


def train_sentencepiece(texts: Iterable[str], vocab_size: int) -> bytes:
    """Trains a unigram SentencePiece model in memory.

    The vocabulary may come out smaller than asked when the text is too small to fill it;
    the special ids are fixed: pad 0, unk 1, bos 2, eos 3.

    Args:
        texts: the training sentences; empty ones are ignored.
        vocab_size: the pieces wanted.

    Returns:
        The model's serialized bytes.

    Raises:
        ValueError: no non-empty text (the training split is empty).
    """
    texts = [t for t in texts if t]
    if not texts:
        raise ValueError("no text to train a SentencePiece model on; the training split is empty")
    chars = {c for t in texts for c in t}
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=out,
        vocab_size=vocab_size,
        model_type="unigram",
        # Chinese and similar scripts have thousands of rare characters: leave the rarest to unk.
        character_coverage=1.0 if len(chars) < 1000 else 0.9995,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        hard_vocab_limit=False,
        num_threads=1,  # deterministic
        shuffle_input_sentence=False,
        minloglevel=2,
    )
    return out.getvalue()


class Tokenizer:
    """Source and target SentencePiece processors (one shared model when the vocabulary is joint).

    Args:
        source_model: the source side's serialized SentencePiece model.
        target_model: the target side's (the same bytes when the vocabulary is joint).

    Attributes:
        source_model, target_model: the serialized models, as given.
        source, target: their SentencePiece processors.
    """

    def __init__(self, source_model: bytes, target_model: bytes):
        self.source_model, self.target_model = source_model, target_model
        self.source = spm.SentencePieceProcessor(model_proto=source_model)
        self.target = spm.SentencePieceProcessor(model_proto=target_model)

    @classmethod
    def train(cls, pairs: list[tuple[str, str]], vocab_size: int, joint: bool = False) -> "Tokenizer":
        """Trains the source and target models on (source, target) pairs.

        Args:
            pairs: the training pairs.
            vocab_size: pieces per side (a joint model has this many for both sides).
            joint: one model trained on both sides' text.

        Returns:
            The new tokenizer.

        Raises:
            ValueError: the pairs hold no text.
        """
        if joint:
            model = train_sentencepiece([t for p in pairs for t in p], vocab_size)
            return cls(model, model)
        return cls(
            train_sentencepiece([s for s, _ in pairs], vocab_size),
            train_sentencepiece([t for _, t in pairs], vocab_size),
        )

    @property
    def src_vocab_size(self) -> int:
        """Pieces in the source model."""
        return self.source.get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        """Pieces in the target model."""
        return self.target.get_piece_size()

    def encode_source(self, text: str) -> list[int]:
        """Encodes source text into ids with the end token, as the encoder sees them.

        Args:
            text: the source sentence.

        Returns:
            The piece ids followed by EOS_ID.
        """
        return self.source.encode(text) + [EOS_ID]

    def encode_target(self, text: str) -> list[int]:
        """Encodes target text into ids without special tokens.

        Args:
            text: the target sentence.

        Returns:
            The piece ids.
        """
        return self.target.encode(text)

    def decode_target(self, ids: list[int]) -> str:
        """Decodes target ids into text, cut at the first end token; special ids dropped.

        Args:
            ids: target ids, as search produces them.

        Returns:
            The text.
        """
        if EOS_ID in ids:
            ids = ids[: ids.index(EOS_ID)]
        return self.target.decode([i for i in ids if i not in (PAD_ID, BOS_ID)])

    def save(self, directory: str | Path) -> None:
        """Writes both models into `directory` (SOURCE_MODEL and TARGET_MODEL).

        Args:
            directory: an existing directory (a checkpoint's).
        """
        directory = Path(directory)
        (directory / SOURCE_MODEL).write_bytes(self.source_model)
        (directory / TARGET_MODEL).write_bytes(self.target_model)

    @classmethod
    def load(cls, directory: str | Path) -> "Tokenizer":
        """Reads the models that `save` wrote.

        Args:
            directory: the directory holding SOURCE_MODEL and TARGET_MODEL.

        Returns:
            The tokenizer.
        """
        directory = Path(directory)
        return cls((directory / SOURCE_MODEL).read_bytes(), (directory / TARGET_MODEL).read_bytes())
