"""Source text -> the encoder's ids, without tokenising more of a huge line than the model can use.

SentencePiece holds a lattice over the whole text: a 55 MB line cost 2 GB to tokenise, only for
all but the first max_positions ids to be dropped. So the text is tokenised by prefixes that
grow geometrically until they give more ids than the model has positions.

Why the ids of a prefix are exactly the first ids of the whole text: the prefix is cut just
before an ASCII space, and no piece of the vocabulary holds the whitespace mark "▁" except as its
first character (checked once per tokenizer: `word_bounded`). Every segmentation therefore
starts a new piece at each space: the segmentation (unigram Viterbi or BPE merges) of the words
before the cut does not depend on anything after it, and the normaliser treats a space as a
boundary too (NFKC never composes across it; runs of spaces collapse the same way). The text
before the cut tokenises to exactly the first ids of the whole text.

How much text to take: every piece covers at least one character (a byte-fallback piece covers
part of one, so one character can give up to 4 ids, which only helps), so n characters give at
most n ids, never more pieces than needed from fewer characters: the first try takes 8 characters
per position and each retry doubles it. Where no space lies within _MAX_WORD characters before the
cut (one "word" that long, e.g. text in a script written without spaces), or the tokenizer is not
word_bounded, the text is cut mid-word: the ids of the last pieces before such a cut may differ
from the full text's, so the prefix must give _MARGIN ids more than are kept. That is exact in
practice (a unigram or BPE segmentation only changes near where the text changes) but, unlike
the cut at a space, not by construction.
"""
from __future__ import annotations

_MAX_WORD = 1 << 16  # a space must lie within this many characters of the cut, else it is cut mid-word
_MARGIN = 64  # ids kept out of reach of a mid-word cut


def word_bounded(processor) -> bool:
    """Whether no piece holds "▁" after its first character (then pieces never cross a space)."""
    return all("\u2581" not in processor.id_to_piece(i)[1:] for i in range(processor.get_piece_size()))


def _clean(text: str) -> str:
    # Lone surrogates cannot be encoded as UTF-8: replace them rather than fail inside spm.
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


def encode_limited(processor, text: str, limit: int, *, bounded: bool) -> tuple[list[int], bool]:
    """The ids of `text` if it has at most `limit`, else (its first limit + 1 ids, False).

    Returns (ids, complete): complete is True when ids are all of the text's ids. Only as much
    text is tokenised as needed (see the module docstring for why the ids are the same).
    """
    n = max(8 * (limit + 1), 64)
    while True:
        if n >= len(text):
            return processor.encode(_clean(text)), True
        cut = text.rfind(" ", max(0, n - _MAX_WORD), n + 1) if bounded else -1
        exact = cut > 0
        ids = processor.encode(_clean(text[:cut] if exact else text[:n]))
        # A mid-word cut keeps a margin of _MARGIN ids before it: segmentations of a word and of
        # its prefix, if they differ, differ only in the last few pieces before the cut.
        if len(ids) > limit + (0 if exact else _MARGIN):
            return ids[: limit + 1], False
        n *= 2
