"""mBART-50 (many-to-many): pre-norm with final norms and a LayerNorm after embeddings + positions
(layernorm_embedding), learned positions offset by 2, a final logits bias, one SentencePiece model, and
language codes (fr_XX) as the source's first token and forced as the target's first (forced_bos_token_id)."""

from __future__ import annotations


from .family import Family, register


@register
class MBart(Family):
    """MBartForConditionalGeneration with MBart50Tokenizer (sentencepiece.bpe.model, tokenizer.json)."""

    model_type = "mbart"
    title = "mBART-50"
    pre_norm = True
    embedding_norm = True
    spm_files = ("sentencepiece.bpe.model", "sentencepiece.bpe.model")
    # fairseq's switches as MBartForConditionalGeneration computes them (facebook/mbart-large-50's config.json
    # carries exactly these); it reads none of them.
    # every checkpoint shares its SentencePiece file (Family.missing_spm)
    spm_snapshot = "facebook/mbart-large-50-many-to-many-mmt"
    fixed = {
        "normalize_before": True,
        "normalize_embedding": True,
        "static_position_embeddings": False,
        "add_final_layer_norm": True,
        "add_bias_logits": False,
    }

    def weight_pairs(self, model, hf) -> list[tuple]:
        """The final norms, and each stack's layernorm_embedding."""
        pairs = super().weight_pairs(model, hf)
        for ours, stack in (
            (model.encoder_embed_norm, hf.get_encoder()),
            (model.decoder_embed_norm, hf.get_decoder()),
        ):
            pairs += [
                (ours.weight, stack.layernorm_embedding.weight),
                (ours.bias, stack.layernorm_embedding.bias),
            ]
        return pairs

    def languages(self, tokenizer, size: int) -> dict:
        """MBart50Tokenizer's lang_code_to_id (en_XX, fr_XX, ...)."""
        codes = getattr(tokenizer, "lang_code_to_id", None) or {}
        return {
            "languages": {code: int(i) for code, i in codes.items() if 0 <= int(i) < size},
            "target_lang_in": "target_prefix",
        }
