"""A tiny multi-target OPUS-MT checkpoint (en -> fr, de with >>fra<< / >>deu<< tokens), for issue 35 item 4.

Published multi-target Marian models (e.g. opus-mt-en-ROMANCE) put the target language as a
`>>xxx<<` token at the start of the SOURCE text, listed in vocab.json; MarianTokenizer finds these
codes itself (supported_language_codes). Built as tests/hf_fixtures.py builds make_marian.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

import hf_fixtures as F
from build_cache import build_once

CODES = {"fr": "fra", "de": "deu"}


def make_marian_multi(directory: str | Path, *, train_steps: int = 300, seed: int = 0) -> Path:
    """Builds the checkpoint in `directory`: sources `>>fra<< text` or `>>deu<< text`, one shared vocabulary.

    Args:
        directory: Where to write; created if missing.
        train_steps: Training steps of 48 pairs; 0 leaves the model random.
        seed: Seeds the initialisation, the final logits bias and the batches.

    Returns:
        The directory.
    """
    from transformers import MarianMTModel, MarianTokenizer

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    english = F.source_sentences(F.MARIAN_PAIRS // 2)
    source_spm = F.train_spm(list(english), out / "source.spm", 64)
    target_spm = F.train_spm(
        [F.translate(s, lang) for lang in CODES for s in english], out / "target.spm", 96
    )
    pieces = F.spm_pieces(source_spm, ordinary=True) + F.spm_pieces(target_spm, ordinary=True)
    vocab = F._marian_vocab(pieces + [f">>{code}<<" for code in CODES.values()])
    (out / "vocab.json").write_text(json.dumps(vocab, indent=2), encoding="utf-8")
    with F._quiet_transformers():
        tokenizer = MarianTokenizer(
            source_spm=str(source_spm),
            target_spm=str(target_spm),
            vocab=str(out / "vocab.json"),
            source_lang="en",
            target_lang="mul",
            model_max_length=512,
        )
    pad = len(vocab) - 1
    config, generation = F.conventions("marian", F._SHAPE, len(vocab))
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(seed + 1))
    examples = []
    for lang, code in CODES.items():
        for source in english:
            encoded = tokenizer(f">>{code}<< {source}", text_target=F.translate(source, lang))
            examples.append((encoded["input_ids"], encoded["labels"]))
    F._fit(model, examples, pad, train_steps, seed, lr=1e-2)
    model.generation_config = generation
    with F._quiet_transformers():
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return out


@functools.lru_cache(maxsize=None)
def cached_marian_multi(train_steps: int = 300) -> Path:
    """make_marian_multi's directory, built once per test run (read-only)."""
    return build_once(
        f"marian-multi-steps={train_steps}",
        lambda out: make_marian_multi(out, train_steps=train_steps),
        keep_by=F.SOURCES,
    )
