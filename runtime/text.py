"""Text from target ids as it grows: what each new token adds to the detokenised text (streaming)."""

from __future__ import annotations

from typing import Callable, Iterable, Iterator


def text_increments(decode: Callable[[list[int]], str], tokens: Iterable[int]) -> Iterator[str]:
    """Yields what each new token adds to the detokenised text: the pieces join to decode(all tokens).

    The whole prefix is decoded again at each token: SentencePiece makes spaces from the pieces'
    "▁" and drops the text's first one, and byte-fallback pieces make one character from up to 4
    ids, so a piece alone does not say what it adds. Text ending in U+FFFD (a character whose
    bytes are still to come) is held back; what remains comes out once the tokens end.

    Args:
        decode: target ids -> text (the target SentencePiece model's decode).
        tokens: the target ids as they come.

    Yields:
        Non-empty pieces of text, in order.

    Raises:
        RuntimeError: the final text does not continue what was yielded (never seen with SentencePiece).
    """
    seen: list[int] = []
    emitted = ""
    for token in tokens:
        seen.append(token)
        text = decode(seen).rstrip("\ufffd")
        if len(text) > len(emitted) and text.startswith(emitted):
            yield text[len(emitted) :]
            emitted = text
    final = decode(seen)
    if not final.startswith(emitted):  # never seen: SentencePiece's decode of a prefix is a prefix
        raise RuntimeError(f"the detokenised text {final!r} does not continue {emitted!r}")
    if len(final) > len(emitted):
        yield final[len(emitted) :]
