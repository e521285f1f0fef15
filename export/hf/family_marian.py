"""Marian (OPUS-MT): post-norm, sinusoidal positions (sines then cosines), a final logits bias, separate or
shared source and target SentencePiece models, and >>xxx<< target-language tokens in the source text."""

from __future__ import annotations

from pathlib import Path

from .family import Family, register


@register
class Marian(Family):
    """MarianMTModel with MarianTokenizer (source.spm, target.spm, vocab.json)."""

    model_type = "marian"
    title = "Marian (OPUS-MT)"
    pre_norm = False
    spm_files = ("source.spm", "target.spm")
    restore_spaces = True  # Marian puts back the ▁ that DecodePieces keeps in unknown pieces
    # Marian-NMT's switches, carried in every OPUS-MT config.json; transformers' MarianMTModel reads none
    # of them.
    fixed = {
        "normalize_before": False,
        "normalize_embedding": False,
        "static_position_embeddings": True,
        "add_final_layer_norm": False,
        "add_bias_logits": False,
    }

    def spm_paths(self, model_dir: Path, tokenizer) -> tuple[Path, Path]:
        """source.spm, and target.spm only where the vocabularies are separate: transformers 5's
        MarianTokenizer decodes with the SOURCE model otherwise (MarianTokenizer._decode), and the hosts
        decode as batch_decode does."""
        source, target = super().spm_paths(model_dir, tokenizer)
        return source, (target if getattr(tokenizer, "separate_vocabs", False) else source)

    def languages(self, tokenizer, size: int) -> dict:
        """A multi-target model's >>xxx<< tokens, which the hosts put before the source's pieces."""
        codes = getattr(tokenizer, "supported_language_codes", []) or []
        if not codes:
            return {}
        return {
            "languages": {c[2:-2]: int(tokenizer.convert_tokens_to_ids(c)) for c in codes},
            "target_lang_in": "source_prefix",
            "text_language_codes": True,
        }
