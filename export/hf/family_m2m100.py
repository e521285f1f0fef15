"""M2M100 and NLLB-200: pre-norm with final norms, fairseq's sinusoidal positions (offset by padding_idx + 1),
one SentencePiece model, language tokens (__fr__, fra_Latn) before the source and forced as the
target's first."""

from __future__ import annotations


from .family import Family, extra_special_tokens, register


@register
class M2M100(Family):
    """M2M100ForConditionalGeneration with M2M100Tokenizer or NllbTokenizer (sentencepiece.bpe.model)."""

    model_type = "m2m_100"
    title = "M2M100 / NLLB-200"
    pre_norm = True
    spm_files = ("sentencepiece.bpe.model", "sentencepiece.bpe.model")
    # fairseq's switches as M2M100ForConditionalGeneration computes them (it reads none of them).
    # every checkpoint shares its SentencePiece file (Family.missing_spm)
    spm_snapshot = "facebook/nllb-200-distilled-600M"
    fixed = {
        "normalize_before": True,
        "normalize_embedding": False,
        "static_position_embeddings": True,
        "add_final_layer_norm": True,
        "add_bias_logits": False,
    }

    def languages(self, tokenizer, size: int) -> dict:
        """M2M100's lang_code_to_id (__fr__), or NLLB's language tokens: its extra special tokens
        (fra_Latn)."""
        codes = getattr(tokenizer, "lang_code_to_id", None) or {}
        if not codes:
            codes = {t: tokenizer.convert_tokens_to_ids(t) for t in extra_special_tokens(tokenizer)}
            named = {
                getattr(tokenizer, f"{n}_token_id", None)
                for n in ("bos", "eos", "unk", "pad", "mask", "sep", "cls")
            }
            codes = {t: i for t, i in codes.items() if i not in named}
        return {
            "languages": {code: int(i) for code, i in codes.items() if 0 <= int(i) < size},
            "target_lang_in": "target_prefix",
        }
