"""A bundle's ids as text: vocabulary maps, prefixes, suffix and language tokens (bundle.json's `tokens`).

Our own exports use SentencePiece's ids directly: no maps, no prefix, the end token as suffix.
Models imported from Hugging Face (export/hf/) number their pieces their own way (Marian's
vocab.json; NLLB's SentencePiece ids plus an offset and language tokens), so such a bundle carries
one int32 array per side (spec/bundle.json's `vocab_maps`; docs/bundle-format.md#tokenization):
source piece id -> model id, and model target id -> target piece id or -1 (never written as text).
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .model_options import language_id, target_prefixes
from .spec import SPEC, TARGET_LANG_IN, BundleError

_SKIP, _TEXT = SPEC["vocab_maps"]["skip"], SPEC["vocab_maps"]["text"]
_CODE = re.compile(r">>([^<>\s]+)<<")  # Marian's leading target-language code, e.g. >>fra<<
# the white space of tokens.trailing_space (ASCII: every host agrees on it; NLLB drops \v)
SPACES = " \t\n\r\f"
_PIECES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # processor -> its pieces, read once


def all_pieces(processor) -> list[str]:
    """Every piece of a SentencePiece processor, in id order, read once per processor (the load's checks and
    the sources' word boundaries both read them: ~10 ms at 58k pieces each time).

    Args:
        processor (sentencepiece.SentencePieceProcessor): the tokenizer.
    """
    pieces = _PIECES.get(processor)
    if pieces is None:  # one call for every id: a Python call per piece cost ~15 ms at 58k pieces
        pieces = _PIECES[processor] = processor.id_to_piece(list(range(processor.get_piece_size())))
    return pieces


def load_tokenizers(bundle) -> tuple:
    """Returns the bundle's (source, target) SentencePieceProcessors; one object for both where their models
    are the same bytes (NLLB, M2M100, mBART: read once, 0.2 s for 256k pieces).

    Raises:
        BundleError: a model that SentencePiece cannot read (naming the bundle).
    """
    import sentencepiece as spm

    try:
        source, target = bundle.bytes("source_tokenizer"), bundle.bytes("target_tokenizer")
        source_tokenizer = spm.SentencePieceProcessor(model_proto=source)
        same = target == source
        return source_tokenizer, source_tokenizer if same else spm.SentencePieceProcessor(model_proto=target)
    except BundleError:
        raise
    except Exception as e:
        raise BundleError(f"{bundle.path}: a SentencePiece model cannot be read: {e}") from e


def read_map(data: bytes, where: str, length: int, low: int, high: int) -> np.ndarray:
    """Reads one vocabulary map: little-endian int32, `length` entries in [low, high).

    Args:
        data: the file's bytes.
        where: the file, for messages.
        length: the entries it must have.
        low, high: the range of every entry.

    Returns:
        The map as an int64 array.

    Raises:
        BundleError: naming the file, the value found and the limit.
    """
    fix = "re-export the bundle with `seq2onnx export`"
    if len(data) % 4:
        raise BundleError(f"{where}: {len(data)} bytes is not a whole number of int32 entries; {fix}")
    array = np.frombuffer(data, dtype="<i4").astype(np.int64)
    if array.size != length:
        raise BundleError(f"{where}: {array.size} entries, expected {length}; {fix}")
    bad = np.flatnonzero((array < low) | (array >= high))
    if bad.size:
        i = int(bad[0])
        raise BundleError(f"{where}: entry {i} is {int(array[i])}, expected an id in [{low}, {high}); {fix}")
    return array


def metaspace_text(pieces: Sequence[str]) -> str:
    """The tokenizers library's Metaspace decoding of piece texts: joined, each ▁ a space, one leading space
    dropped (tokens.metaspace)."""
    text = "".join(pieces).replace("\u2581", " ")
    return text[1:] if text.startswith(" ") else text


@dataclass
class Vocabulary:
    """What turns text into a model's source ids and its target ids back into text.

    Attributes:
        source_map: source piece id -> model id, or None (the same ids).
        target_map: model target id -> target piece id or -1 (left out of text), or None.
        source_prefix, source_suffix, target_prefix: bundle.json's tokens.* (defaults [], [eos], []).
        languages: language code -> token id.
        target_lang_in: where target_lang's token goes ("target_prefix" or "source_prefix").
        text_language_codes: a source text's leading >>code<< is a language token (Marian).
        strip_text: strip the decoded text.
        restore_spaces: ▁ left in the decoded text become spaces (before stripping).
        metaspace: the text is the pieces' texts joined, each ▁ a space, one leading space dropped, nothing
            stripped: the tokenizers library's Metaspace decoder, which transformers 5 decodes T5, NLLB and
            mBART with (SentencePiece drops every leading space; a lone ▁ first or last shows the difference).
        unk_id: the model's unknown id (for a >>code<< that is no language).
        unknown_pieces: the text of a piece SentencePiece marks unknown -> its model id (vocab_texts' source).
        target_texts: model target id -> its piece text, for ids the target map marks -2 (vocab_texts'
            target).
        trailing_space: ids after a text that ends in white space (tokens.trailing_space: NLLB's tokenizer
            gives a lone ▁ where SentencePiece drops the space).
    """

    source_map: np.ndarray | None = None
    target_map: np.ndarray | None = None
    source_prefix: list[int] = field(default_factory=list)
    source_suffix: list[int] = field(default_factory=list)
    target_prefix: list[int] = field(default_factory=list)
    languages: dict[str, int] = field(default_factory=dict)
    target_lang_in: str = TARGET_LANG_IN[0]
    text_language_codes: bool = False
    strip_text: bool = False
    restore_spaces: bool = False
    metaspace: bool = False
    unk_id: int = 1
    unknown_pieces: dict[str, int] = field(default_factory=dict)
    target_texts: dict[int, str] = field(default_factory=dict)
    trailing_space: list[int] = field(default_factory=list)

    @classmethod
    def of_bundle(cls, bundle, source_pieces: int, target_pieces: int) -> "Vocabulary":
        """Reads a bundle's maps and tokens section (validate_meta has checked the section's types and
        ranges).

        Args:
            bundle (runtime.bundle.Bundle): the bundle read, with its files' bytes.
            source_pieces, target_pieces: the SentencePiece models' piece counts.

        Raises:
            BundleError: a map of the wrong size or with ids out of range.
        """
        model, ids = bundle.model, bundle.special_ids
        tokens = bundle.meta.get("tokens", {})
        files = bundle.meta["files"]
        source_map = target_map = None
        if "source_vocab" in files:
            source_map = read_map(
                bundle.bytes("source_vocab"),
                str(bundle.file("source_vocab")),
                source_pieces,
                0,
                model["src_vocab_size"],
            )
        if "target_vocab" in files:
            target_map = read_map(
                bundle.bytes("target_vocab"),
                str(bundle.file("target_vocab")),
                model["tgt_vocab_size"],
                _TEXT,
                target_pieces,
            )
        unknown, texts = _read_texts(bundle, target_map) if "vocab_texts" in files else ({}, {})
        return cls(
            source_map=source_map,
            target_map=target_map,
            source_prefix=list(tokens.get("source_prefix", [])),
            source_suffix=list(tokens.get("source_suffix", [ids["eos"]])),
            target_prefix=list(tokens.get("target_prefix", [])),
            languages=dict(tokens.get("languages", {})),
            target_lang_in=tokens.get("target_lang_in", TARGET_LANG_IN[0]),
            text_language_codes=bool(tokens.get("text_language_codes", False)),
            strip_text=bool(tokens.get("strip_text", False)),
            restore_spaces=bool(tokens.get("restore_spaces", False)),
            metaspace=bool(tokens.get("metaspace", False)),
            unk_id=ids["unk"],
            unknown_pieces=unknown,
            target_texts=texts,
            trailing_space=list(tokens.get("trailing_space", [])),
        )

    @property
    def mapped(self) -> bool:
        """True when either side's ids are not SentencePiece's own."""
        return self.source_map is not None or self.target_map is not None

    def split_code(self, text: str) -> tuple[list[int], str]:
        """Cuts a leading >>code<< off a source text where the bundle says so (Marian's multilingual models).

        Returns:
            (the code's token id as a one-id list, or [], the rest of the text).
        """
        if not self.text_language_codes or not text.startswith(">>"):
            return [], text
        found = _CODE.match(text)
        if not found:
            return [], text
        return [self.languages.get(found.group(1), self.unk_id)], text[found.end() :]

    def encoder(self, processor) -> "_Encoder":
        """The source SentencePiece model `processor`, as an object whose encode(text) gives model ids."""
        return _Encoder(processor, self)

    def to_pieces(self, ids: Sequence[int]) -> list[int]:
        """Model target ids -> target piece ids, leaving out those that are never text."""
        if self.target_map is None:
            return list(ids)
        pieces = self.target_map[np.asarray(ids, dtype=np.int64)] if len(ids) else np.zeros(0, np.int64)
        return pieces[pieces >= 0].tolist()

    def decoder(self, processor):
        """Returns decode(ids) -> text for the target SentencePiece model `processor`."""
        if self.metaspace:
            return lambda ids: metaspace_text(self.to_texts(processor, ids))
        if not self.mapped and not self.strip_text and not self.restore_spaces:
            return processor.decode
        if not self.target_texts:
            decode = lambda ids: processor.decode(self.to_pieces(ids))  # noqa: E731
        else:  # pieces the model lacks are kept as their text, as SentencePiece's DecodePieces keeps them
            decode = lambda ids: processor.decode_pieces(self.to_texts(processor, ids))  # noqa: E731
        if self.restore_spaces:
            decode = (lambda inner: lambda ids: inner(ids).replace("\u2581", " "))(decode)
        return (lambda ids: decode(ids).strip()) if self.strip_text else decode

    def to_texts(self, processor, ids: Sequence[int]) -> list[str]:
        """Model target ids -> piece texts, leaving out those that are never text."""
        if self.target_map is None:
            return [processor.id_to_piece(int(i)) for i in ids]
        out = []
        for i in ids:
            m = int(self.target_map[i])
            if m >= 0:
                out.append(processor.id_to_piece(m))
            elif m == _TEXT:
                out.append(self.target_texts.get(int(i), ""))
        return out

    def language(self, code, option: str) -> int:
        """A language code's token id.

        Raises:
            OptionError: a code this model does not have, naming it and the known ones.
        """
        return language_id(self.languages, code, option)

    def prefixes(
        self, n: int, *, source_lang=None, target_lang=None, target_prefix=None, tgt_vocab: int, eos_id: int
    ) -> tuple[list[int], list[list[int]]]:
        """The source prefix and each of n sentences' forced target prefix for one call.

        Args:
            n: the sentences.
            source_lang, target_lang: language codes, or None.
            target_prefix: None, or one list of target ids per sentence (it replaces the bundle's and
                target_lang's).
            tgt_vocab: the target vocabulary's size.
            eos_id: the end token, which a prefix may not hold.

        Returns:
            (source prefix, n target prefixes).

        Raises:
            OptionError: an unknown language, a prefix list of the wrong length, ids out of range or the end
                token.
        """
        source = list(self.source_prefix)
        target = list(self.target_prefix)
        if source_lang is not None:
            source = [self.language(source_lang, "source_lang")]
        if target_lang is not None:
            token = self.language(target_lang, "target_lang")
            if self.target_lang_in == "source_prefix":
                source = [token]
            else:
                target = [token]
        if target_prefix is None:
            return source, [target] * n
        return source, target_prefixes(target_prefix, n, tgt_vocab, eos_id)


def _read_texts(bundle, target_map) -> tuple[dict[str, int], dict[int, str]]:
    """vocab_texts: (piece text -> source id, target id -> piece text), checked against the maps."""
    import json

    where = bundle.file("vocab_texts")
    fix = "re-export the bundle with `seq2onnx export`"
    try:
        data = json.loads(bundle.bytes("vocab_texts").decode("utf-8"))
        source = {str(k): int(v) for k, v in data.get("source", {}).items()}
        target = {int(k): str(v) for k, v in data.get("target", {}).items()}
    except (ValueError, TypeError, AttributeError) as e:
        raise BundleError(f"{where}: not the vocabulary texts the spec describes ({e}); {fix}") from None
    src_vocab = bundle.model["src_vocab_size"]
    if any(not 0 <= v < src_vocab for v in source.values()):
        raise BundleError(f"{where}: a source id outside [0, {src_vocab}); {fix}")
    wanted = set(np.flatnonzero(target_map == _TEXT).tolist()) if target_map is not None else set()
    if wanted - set(target):
        raise BundleError(
            f"{where}: no text for target id {min(wanted - set(target))}, which target_vocab marks {_TEXT}; "
            f"{fix}"
        )
    return source, target


class _Encoder:
    """encode(text) -> the model's source ids: SentencePiece's ids through the source map, and an unknown
    piece through tokens.unknown_pieces by its text (as transformers' tokenizers look pieces up by text)."""

    def __init__(self, processor, vocabulary: Vocabulary):
        self.processor, self.map, self.unknown = processor, vocabulary.source_map, vocabulary.unknown_pieces
        self.unk_piece = processor.unk_id()
        self.trailing = vocabulary.trailing_space

    def encode(self, text: str) -> list[int]:
        ids = self.processor.encode(text)
        out = ids if self.map is None else self._mapped(text, ids)
        # SentencePiece dropped the space; transformers does not
        if self.trailing and ids and text[-1] in SPACES:
            out = out + self.trailing
        return out

    def _mapped(self, text: str, ids: list[int]) -> list[int]:
        out = self.map[np.asarray(ids, dtype=np.int64)].tolist() if ids else []
        if self.unknown and self.unk_piece in ids:
            for i, piece in enumerate(self.processor.encode(text, out_type=str)):
                if ids[i] == self.unk_piece and piece in self.unknown:
                    out[i] = self.unknown[piece]
        return out
