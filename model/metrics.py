"""Corpus BLEU (sacreBLEU), with the tokenizer chosen by the references' script."""

from __future__ import annotations


def bleu(hypotheses: list[str], references: list[str]) -> float:
    """Corpus BLEU of hypotheses against one reference each.

    The tokenisation is 'zh' when the references are Chinese (a CJK character in one of the first 50),
    else '13a'.

    Args:
        hypotheses: the translations to score.
        references: one reference per hypothesis, in the same order.

    Returns:
        sacreBLEU's corpus score (0 to 100).
    """
    import sacrebleu

    cjk = any("\u4e00" <= c <= "\u9fff" for r in references[:50] for c in r)
    return sacrebleu.corpus_bleu(hypotheses, [references], tokenize="zh" if cjk else "13a").score
