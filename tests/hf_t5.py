"""Tiny T5-family checkpoints as transformers 5 writes them, for the importer's tests (issue 61).

Three shapes, each a few thousand parameters, with the published models' conventions:
- "t5": t5-small's (model_type t5, ReLU feed-forward, lm_head tied to the embedding, so transformers
  scales the decoder output by d_model ** -0.5);
- "mt5": mT5-small's (model_type mt5, gated-GELU, an lm_head of its own, and n_heads x d_kv unequal to
  d_model: mT5-small has 6 x 64 heads in a 512-wide stream), with a short relative_attention_max_distance
  so that sentences reach the shared far bucket;
- "madlad": MADLAD-400's (model_type t5, gated-GELU, an lm_head of its own, no output scale), translating
  into the language a <2xx> tag at the start of the source names, as MADLAD does.

The SentencePiece unigram model is trained here with T5's ids (pad 0, </s> 1, <unk> 2; MADLAD's tags as
user-defined pieces), loaded with T5Tokenizer (which converts it, as from a hub snapshot, and adds the 100
<extra_id_N> sentinels after its pieces), and saved with save_pretrained beside the model; transformers 5
writes tokenizer.json only, so spiece.model is copied beside them, as one copies it from the snapshot.
The model's vocabulary is larger than the tokenizer's (T5 pads 32100 to 32128): rows no token names.
"""

from __future__ import annotations

import functools
import io
import tempfile
from pathlib import Path

import torch

import hf_fixtures as F
from build_cache import build_once

SPM_FILE = "spiece.model"
KINDS = ("t5", "mt5", "madlad")
TAGS = {"fr": "<2fr>", "de": "<2de>"}  # MADLAD's target-language tags, the source's first piece
PADDED_ROWS = 28  # embedding rows beyond the tokenizer's ids (t5's 32128 - 32100)
_SHAPES = {
    "t5": dict(d_model=32, d_kv=8, num_heads=4, d_ff=64, feed_forward_proj="relu", tie_word_embeddings=True),
    "mt5": dict(
        d_model=32,
        d_kv=8,
        num_heads=6,
        d_ff=48,
        feed_forward_proj="gated-gelu",
        relative_attention_num_buckets=8,
        relative_attention_max_distance=10,
    ),
    "madlad": dict(
        d_model=32, d_kv=8, num_heads=4, d_ff=48, feed_forward_proj="gated-gelu", tie_word_embeddings=False
    ),
}


def _train_spm(texts: list[str], path: Path, vocab_size: int, tags: list[str]) -> Path:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        user_defined_symbols=tags or None,
    )
    path.write_bytes(model.getvalue())
    return path


def source_text(sentence: str, kind: str, lang: str = "fr") -> str:
    """The source as the model reads it: MADLAD's tag first, the sentence alone otherwise (into French)."""
    return f"{TAGS[lang]} {sentence}" if kind == "madlad" else sentence


def make_t5(
    directory: str | Path,
    kind: str = "t5",
    *,
    train_steps: int = 300,
    seed: int = 0,
    early_stopping: bool = True,
) -> Path:
    """Builds a tiny T5-family checkpoint (en -> fr; MADLAD: en -> fr and de by tag) with transformers 5.

    Args:
        directory: Where to write; created if missing.
        kind: "t5", "mt5" or "madlad" (see the module docstring).
        train_steps: Training steps of 48 pairs; 0 leaves the model random.
        seed: Seeds the initialisation and the batches.
        early_stopping: generation_config.json's early_stopping (True: stop a sentence's beam when it has
            num_beams finished hypotheses; False: transformers' heuristic), the two conventions.

    Returns:
        The directory.
    """
    from transformers import GenerationConfig, MT5Config, MT5ForConditionalGeneration, T5Config
    from transformers import T5ForConditionalGeneration, T5Tokenizer

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    english = F.source_sentences(F.M2M_SENTENCES)
    langs = F.LANGUAGES if kind == "madlad" else ("fr",)
    tags = [TAGS[lang] for lang in langs] if kind == "madlad" else []
    texts = list(english) + [F.translate(s, lang) for lang in langs for s in english]
    with tempfile.TemporaryDirectory() as snapshot:
        _train_spm(texts, Path(snapshot) / SPM_FILE, 160 if kind == "madlad" else 110, tags)
        tokenizer = T5Tokenizer.from_pretrained(snapshot)
        (out / SPM_FILE).write_bytes((Path(snapshot) / SPM_FILE).read_bytes())
    shape = dict(_SHAPES[kind])
    untied = shape.pop("tie_word_embeddings", None) is False or kind == "mt5"
    config_class, model_class = (
        (MT5Config, MT5ForConditionalGeneration) if kind == "mt5" else (T5Config, T5ForConditionalGeneration)
    )
    config = config_class(
        **shape,
        vocab_size=len(tokenizer) + PADDED_ROWS,
        num_layers=2,
        num_decoder_layers=2,
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        **({"tie_word_embeddings": False} if untied else {}),
    )
    torch.manual_seed(seed)
    model = model_class(config)
    if (
        untied
    ):  # transformers 5 ties at construction; a published v1.1/mT5/MADLAD checkpoint has its own lm_head
        model.lm_head.weight = torch.nn.Parameter(
            torch.randn_like(model.lm_head.weight) * config.d_model**-0.5
        )
    examples = []
    for lang in langs:
        for source in english:
            encoded = tokenizer(source_text(source, kind, lang), text_target=F.translate(source, lang))
            examples.append((encoded["input_ids"], encoded["labels"]))
    F._fit(model, examples, config.pad_token_id, train_steps, seed, lr=1e-2)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
        max_length=F.MAX_LENGTH,
        num_beams=4,
        early_stopping=early_stopping,
    )
    with F._quiet_transformers():
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return out


@functools.lru_cache(maxsize=None)
def cached_t5(kind: str = "t5", train_steps: int = 300, early_stopping: bool = True) -> Path:
    """make_t5's directory, built once per test run (read-only: copy it before editing)."""
    return build_once(
        f"{kind}-steps={train_steps}-early={early_stopping}",
        lambda out: make_t5(out, kind, train_steps=train_steps, early_stopping=early_stopping),
        keep_by=F.SOURCES,
    )
