"""A Hugging Face tokenizer as what every host needs: SentencePiece models, id maps and the tokens section.

The hosts tokenize with SentencePiece alone (no transformers, no tokenizers library), so the
bundle records how the model's ids relate to SentencePiece's (spec/bundle.json's vocab_maps):
- source map: each source piece's model id, asked of the tokenizer itself
  (convert_tokens_to_ids: Marian's vocab.json, M2M100's vocab.json, NLLB's offset ids);
- target map: each model id's piece in the SentencePiece model the tokenizer decodes with, or -1
  for the special tokens that batch_decode(skip_special_tokens=True) leaves out;
- the prefix and suffix the tokenizer puts around a text's pieces, found by encoding a probe text
  and locating its pieces' ids (so no family's convention is written here twice);
- the language tokens (M2M100 __xx__, NLLB xxx_Latn, mBART-50 xx_XX, Marian >>xxx<<), which each
  family finds its own way (export/hf/family_*.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import sentencepiece as spm

from .family import Family
from .read import HFImportError

_PROBE = "The quick brown fox jumps over the lazy dog: 12345 ÆØÅ."


@dataclass
class TokenFiles:
    """What the bundle gets from the tokenizer.

    Attributes:
        source_spm, target_spm: the SentencePiece model files (target: the one the tokenizer decodes with).
        source_map, target_map: int32 arrays (spec/bundle.json's vocab_maps).
        tokens: bundle.json's tokens section.
        texts: vocab_texts ({"source": text -> id, "target": id -> text}), or {} when neither is needed.
        unk_id: the tokenizer's unknown id.
    """

    source_spm: Path
    target_spm: Path
    source_map: np.ndarray
    target_map: np.ndarray
    tokens: dict = field(default_factory=dict)
    texts: dict = field(default_factory=dict)
    unk_id: int = 0


def load_tokenizer(model_dir: Path):
    """The directory's tokenizer (transformers' AutoTokenizer), with a one-line error when it cannot load."""
    import warnings

    from transformers import AutoTokenizer

    try:
        # MarianTokenizer recommends sacremoses, for a normaliser it never calls
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*sacremoses.*")
            return AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HFImportError(
            f"{model_dir}: the tokenizer files cannot be loaded ({first}); save the tokenizer with "
            "tokenizer.save_pretrained into this directory"
        ) from None


def _vocab_size(tokenizer) -> int:
    """Entries of the tokenizer's vocabulary: a slow tokenizer's id -> token dict, else get_vocab() (a
    tokenizers-backed one, e.g. transformers 5's NllbTokenizer, whose .decoder is a Metaspace decoder)."""
    decoder = getattr(tokenizer, "decoder", None)
    return len(decoder) if isinstance(decoder, dict) else len(tokenizer.get_vocab())


def _tokens_of(tokenizer, n: int) -> list[str | None]:
    """convert_ids_to_tokens for ids 0..n-1; None where the tokenizer has no token (Marian falls back to its
    SentencePiece model, which raises for an id beyond it)."""
    try:
        return tokenizer.convert_ids_to_tokens(list(range(n)))
    except (IndexError, KeyError, ValueError):
        out = []
        for i in range(n):
            try:
                out.append(tokenizer.convert_ids_to_tokens(i))
            except (IndexError, KeyError, ValueError):
                out.append(None)
        return out


def _trailing_space(tokenizer, suffix: list[int]) -> list[int]:
    """The ids the tokenizer adds for white space at a text's end (tokens.trailing_space), or [].

    SentencePiece drops it; transformers 5's NLLB tokenizer (Metaspace, split) keeps it as a lone ▁. Recorded
    only when every white-space character and run the hosts test for (runtime/vocab.py's SPACES) gives the
    same ids.
    """
    base = tokenizer(_PROBE).input_ids
    body = base[: len(base) - len(suffix)]
    tails = []
    for space in (" ", "\n", "\t", "\r", "\f", "\r\n", " \n\n", "\t  "):
        ids = tokenizer(_PROBE + space).input_ids
        if ids[: len(body)] != body or ids[len(ids) - len(suffix) :] != suffix:
            return []
        tails.append(ids[len(body) : len(ids) - len(suffix)])
    return tails[0] if all(t == tails[0] for t in tails) else []


def _decodes_as_metaspace(tokenizer) -> bool:
    """Whether the tokenizer decodes as the tokenizers library's Metaspace decoder (tokens.metaspace), which
    keeps the spaces of a lone ▁ first or last that SentencePiece's decoding and a strip drop.

    Asked of the tokenizer on pieces where the two differ, not known per family: transformers 5 decodes T5,
    NLLB and mBART so, Marian as SentencePiece does.
    """
    from seq2onnx.runtime.vocab import metaspace_text

    vocab = tokenizer.get_vocab()
    words = [p for p in ("\u2581the", "\u2581a", "\u2581de") if p in vocab]
    if "\u2581" not in vocab or not words:
        return False
    probes = [["\u2581", words[0]], [words[0], "\u2581"], ["\u2581", "\u2581", words[0], "\u2581"]]
    for pieces in probes:
        text = tokenizer.decode([vocab[p] for p in pieces], skip_special_tokens=True)
        if text != metaspace_text(pieces):
            return False
    return True


def _locate(ids: list[int], inner: list[int]) -> tuple[list[int], list[int]]:
    for start in range(len(ids) - len(inner) + 1):
        if ids[start : start + len(inner)] == inner:
            return ids[:start], ids[start + len(inner) :]
    raise HFImportError(
        "the tokenizer's ids of a probe text do not contain its SentencePiece pieces mapped through "
        "the vocabulary: this tokenizer pre-processes text in a way the hosts cannot repeat"
    )


def token_files(
    model_dir: Path, family: Family, tokenizer, *, src_vocab: int, tgt_vocab: int, generation: dict
) -> TokenFiles:
    """Builds the maps and tokens section of a Marian, M2M100/NLLB or mBART-50 tokenizer.

    Args:
        model_dir: the model directory.
        family: the model's family (its SentencePiece files, its language tokens; export/hf/family.py).
        tokenizer: the directory's transformers tokenizer.
        src_vocab, tgt_vocab: the model's vocabulary sizes (from its weights).
        generation: generation_config.json's fields (forced_bos_token_id is the default target prefix).

    Raises:
        HFImportError: a tokenizer that does not match the model's vocabulary (naming the file and the value).
    """
    source_path, target_path = family.spm_paths(model_dir, tokenizer)
    source = spm.SentencePieceProcessor(model_file=str(source_path))
    target = spm.SentencePieceProcessor(model_file=str(target_path))
    pieces, source_map = _source_map(model_dir, tokenizer, source, source_path, src_vocab)
    special = set(tokenizer.all_special_ids)
    target_map, target_texts = _target_map(model_dir, tokenizer, target, tgt_vocab, special)
    # Vocabulary entries that are no source piece: the text of an unknown piece is looked up among them.
    known = set(pieces)
    vocab = tokenizer.get_vocab()
    unknown = {
        text: int(i)
        for text, i in vocab.items()
        if text not in known and i not in special and 0 <= i < src_vocab
    }
    section = _tokens_section(tokenizer, family, source, source_map, unknown)
    forced = generation.get("forced_bos_token_id")
    if isinstance(forced, int):
        section["target_prefix"] = [forced]
    section.update(family.languages(tokenizer, min(src_vocab, tgt_vocab)))
    return TokenFiles(
        source_spm=source_path,
        target_spm=target_path,
        source_map=source_map.astype(np.int32),
        target_map=target_map.astype(np.int32),
        tokens=section,
        unk_id=int(tokenizer.unk_token_id),
        texts={"source": unknown, "target": target_texts} if unknown or target_texts else {},
    )


def _source_map(
    model_dir: Path, tokenizer, source: spm.SentencePieceProcessor, source_path: Path, src_vocab: int
) -> tuple[list[str], np.ndarray]:
    """The source model's pieces and each one's id in the tokenizer, checked against the model.

    Raises:
        HFImportError: an id outside the model's embeddings, or more than 1% of the pieces unknown to the
            tokenizer's vocabulary.
    """
    pieces = [source.id_to_piece(i) for i in range(source.get_piece_size())]
    source_map = np.array(tokenizer.convert_tokens_to_ids(pieces), dtype=np.int64)
    if source_map.size and (source_map.min() < 0 or source_map.max() >= src_vocab):
        bad = int(source_map[(source_map < 0) | (source_map >= src_vocab)][0])
        raise HFImportError(
            f"{model_dir}: the tokenizer gives id {bad} to a piece of {source_path.name}, outside the "
            f"model's {src_vocab} embeddings: the tokenizer files do not belong to this model"
        )
    unk = tokenizer.unk_token_id
    lost = [
        p
        for p, i in zip(pieces, source_map.tolist())
        if i == unk and p != tokenizer.unk_token and not source.is_control(pieces.index(p))
    ]
    if len(lost) > 0.01 * len(pieces):  # a vocabulary made from this SentencePiece model holds its pieces
        raise HFImportError(
            f"{model_dir}: {len(lost)} of the {len(pieces)} pieces of {source_path.name} are not in the "
            f"tokenizer's vocabulary (e.g. {lost[:3]}): the vocabulary file (vocab.json) does not belong "
            "to this SentencePiece model; restore the files that save_pretrained wrote together"
        )
    return pieces, source_map


def _target_map(
    model_dir: Path, tokenizer, target: spm.SentencePieceProcessor, tgt_vocab: int, special: set[int]
) -> tuple[np.ndarray, dict[str, str]]:
    """Each output id's piece in the decoding model, and the texts of the pieces that model lacks.

    Raises:
        HFImportError: a tokenizer vocabulary larger than the model's output ids.
    """
    tokens = _tokens_of(tokenizer, tgt_vocab)
    # Each id's piece in the decoding model; -1 for what batch_decode(skip_special_tokens=True) leaves out;
    # -2 (its text in vocab_texts) for a piece that model lacks, which DecodePieces keeps as its text.
    target_map = np.full(tgt_vocab, -1, dtype=np.int64)
    target_texts: dict[str, str] = {}
    for i, t in enumerate(tokens):
        if i in special or t is None:
            continue
        piece = target.piece_to_id(t)
        if piece == target.unk_id() and t != target.id_to_piece(target.unk_id()):
            target_map[i], target_texts[str(i)] = -2, t
        else:
            target_map[i] = piece
    if _vocab_size(tokenizer) > tgt_vocab:
        raise HFImportError(
            f"{model_dir}: the tokenizer's vocabulary has {_vocab_size(tokenizer)} entries, more than "
            f"the model's {tgt_vocab} output ids: the tokenizer files do not belong to this model"
        )
    return target_map, target_texts


def _tokens_section(
    tokenizer, family: Family, source: spm.SentencePieceProcessor, source_map: np.ndarray, unknown: dict
) -> dict:
    """The tokens section's text handling and the ids the tokenizer puts around a source sentence."""
    # Marian replaces the ▁ that DecodePieces keeps in unknown pieces; M2M100 does not
    # (convert_tokens_to_string).
    section: dict = {"strip_text": True, "restore_spaces": family.restore_spaces}
    if _decodes_as_metaspace(tokenizer):
        section = {"metaspace": True}
    from seq2onnx.runtime.vocab import Vocabulary

    encoder = Vocabulary(source_map=source_map, unknown_pieces=unknown).encoder(source)
    prefix, suffix = _locate(tokenizer(_PROBE).input_ids, encoder.encode(_PROBE))
    section.update({"source_prefix": prefix, "source_suffix": suffix})
    trailing = _trailing_space(tokenizer, suffix)
    if trailing:
        section["trailing_space"] = trailing
    return section
