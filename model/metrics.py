"""Corpus BLEU (sacreBLEU), with the tokenizer chosen by the references' script."""
from __future__ import annotations


def bleu(hypotheses: list[str], references: list[str]) -> float:
    """Corpus BLEU of hypotheses against one reference each ('zh' tokenisation for Chinese references, else '13a')."""
    import sacrebleu

    cjk = any("\u4e00" <= c <= "\u9fff" for r in references[:50] for c in r)
    return sacrebleu.corpus_bleu(hypotheses, [references], tokenize="zh" if cjk else "13a").score
