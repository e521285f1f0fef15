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

import numpy as np

from .vocab import Vocabulary, all_pieces

_MAX_WORD = 1 << 16  # a space must lie within this many characters of the cut, else it is cut mid-word
_MARGIN = 64  # ids kept out of reach of a mid-word cut


def word_bounded(processor) -> bool:
    """Tells whether no piece holds "▁" after its first character (then pieces never cross a space).

    Args:
        processor (sentencepiece.SentencePieceProcessor): the source tokenizer.

    Returns:
        True when pieces never cross a space.
    """
    return not any("\u2581" in piece[1:] for piece in all_pieces(processor))


def _clean(text: str) -> str:
    # Lone surrogates cannot be encoded as UTF-8: replace them rather than fail inside spm.
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


def encode_limited(processor, text: str, limit: int, *, bounded: bool) -> tuple[list[int], bool]:
    """Tokenises only as much of `text` as needed for `limit` ids.

    See the module docstring for why the ids are the same as the whole text's.

    Args:
        processor (sentencepiece.SentencePieceProcessor): the source tokenizer.
        text: the source text.
        limit: the ids wanted.
        bounded: word_bounded(processor): a cut at a space is exact.

    Returns:
        (ids, complete): the ids of `text` if it has at most `limit`, else (its first limit + 1 ids,
        False); complete is True when ids are all of the text's ids.
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


class Sources:
    """A model's source side: texts or ids -> the encoder's ids and padded batches.

    Args:
        tokenizer: the source SentencePiece processor.
        pad_id: padding id.
        eos_id: the end token.
        vocab: the source vocabulary's size (ids given directly must be below it).
        max_positions: the model's positions, prefix and suffix included.
        vocabulary: the bundle's maps and tokens (runtime/vocab.py); None: SentencePiece's ids, the end token
            as suffix.
    """

    def __init__(
        self,
        tokenizer,
        *,
        pad_id: int,
        eos_id: int,
        vocab: int,
        max_positions: int,
        vocabulary: Vocabulary | None = None,
    ):
        self.tokenizer, self.pad_id, self.eos_id = tokenizer, pad_id, eos_id
        self.vocab, self.max_positions = vocab, max_positions
        self.vocabulary = vocabulary or Vocabulary(source_suffix=[eos_id])
        self.suffix = self.vocabulary.source_suffix
        self.bounded = word_bounded(tokenizer)

    def _encode(self, text: str, prefix: list[int] | None) -> tuple[list[int], list[int], bool]:
        """(prefix, the text's model ids, complete) with at most as many ids as fit, plus one."""
        code, text = self.vocabulary.split_code(text)
        prefix = code or (self.vocabulary.source_prefix if prefix is None else prefix)
        room = self.max_positions - len(prefix) - len(self.suffix)
        encoder = self.vocabulary.encoder(self.tokenizer)  # text -> the model's ids (cheap: made per text)
        ids, complete = encode_limited(encoder, text, max(room, 0), bounded=self.bounded)
        return prefix, ids, complete

    def prepare(self, text: str, truncate: bool, prefix: list[int] | None = None) -> tuple[list[int], bool]:
        """Encodes a non-empty text with its prefix and suffix (Translator.prepare_source).

        Args:
            text: the source text.
            truncate: cut it to the model's positions instead of refusing it.
            prefix: the ids before the text (None: the bundle's tokens.source_prefix).

        Returns:
            (ids, whether they were cut).

        Raises:
            ValueError: too many tokens without truncate.
        """
        prefix, ids, complete = self._encode(text, prefix)
        return self.fit(ids, complete, truncate, prefix)

    def fit(
        self, ids: list[int], complete: bool, truncate: bool, prefix: list[int] = ()
    ) -> tuple[list[int], bool]:
        """Puts the prefix before ids and the suffix after them, cut to the model's positions when truncate.

        Args:
            ids: the source ids, prefix and suffix excluded.
            complete: False when a huge text was tokenised only in part.
            truncate: cut instead of refusing.
            prefix: ids before the text.

        Returns:
            (the ids, whether they were cut).

        Raises:
            ValueError: too many tokens without truncate.
        """
        prefix = list(prefix)
        limit = self.max_positions - len(prefix) - len(self.suffix)  # text ids that fit
        if len(ids) <= limit:
            return prefix + ids + self.suffix, False
        if not truncate:
            extra = len(prefix) + len(self.suffix)
            count = f"{len(ids) + extra}" if complete else f"more than {self.max_positions}"
            raise ValueError(
                f"{count} tokens; this model was exported for at most {self.max_positions} positions "
                "(max_positions in bundle.json): shorten it or pass truncate=True"
            )
        return prefix + ids[: max(limit, 0)] + self.suffix, True

    def ids(self, index: int, item, truncate: bool, prefix: list[int] | None = None) -> list[int] | None:
        """translate_batch's source `index` (a text or token ids) as the encoder's ids, prefix and suffix
        included.

        Args:
            index: the source's place in the batch, for messages.
            item: a str, or a sequence of ints: the whole row but the suffix, added when missing (no prefix is
                added).
            truncate: cut a source longer than the model's positions instead of refusing it.
            prefix: the ids before a text (None: the bundle's tokens.source_prefix).

        Returns:
            The ids, or None for an empty source.

        Raises:
            TypeError: item is neither a str nor ids.
            ValueError: ids outside the vocabulary, or too many tokens without truncate.
        """
        if isinstance(item, str):
            if not item.strip():
                return None
            prefix, ids, complete = self._encode(item, prefix)
        elif isinstance(item, (list, tuple, np.ndarray)) and all(
            isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in item
        ):
            ids, complete, prefix = [int(x) for x in item], True, []
            if not ids:
                return None
            bad = [x for x in ids if not 0 <= x < self.vocab]
            if bad:
                raise ValueError(
                    f"source {index}: token ids {bad[:5]} are outside the source vocabulary [0, {self.vocab})"
                )
            if self.suffix and ids[-len(self.suffix) :] == self.suffix:
                del ids[-len(self.suffix) :]
        else:
            raise TypeError(f"source {index} is {type(item).__name__}; give a str or a list of token ids")
        try:
            return self.fit(ids, complete, truncate, prefix)[0]
        except ValueError as e:
            raise ValueError(f"source {index} has {e}") from None

    def pad(self, sources: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Pads B sources into one batch.

        Args:
            sources: B id lists.

        Returns:
            ([B, longest] ids padded with pad_id, [B] lengths).
        """
        lengths = np.array([len(s) for s in sources], dtype=np.int64)
        src = np.full((len(sources), int(lengths.max())), self.pad_id, dtype=np.int64)
        for row, s in enumerate(sources):
            src[row, : len(s)] = s
        return src, lengths
