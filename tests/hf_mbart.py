"""A tiny mBART-50 many-to-many checkpoint as transformers 5 writes it, for the importer's tests
(issue 35, item 7).

MBart50Tokenizer is tokenizers-backed in transformers 5. The builder trains a unigram SentencePiece
model on the toy corpus of tests/hf_fixtures.py, loads it with MBart50Tokenizer (which converts it,
as from a hub snapshot of facebook/mbart-large-50-many-to-many-mmt), trains an MBartForConditionalGeneration
en_XX -> fr_XX / de_XX, and saves both with save_pretrained, with the .model file beside them.
Sources are `[en_XX] pieces </s>`, targets `[fr_XX|de_XX] pieces </s>`, the decoder starts from
</s>, and the caller picks the target with forced_bos_token_id, as the published checkpoint.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path

import torch

import hf_fixtures as F
from build_cache import build_once

CODES = {"en": "en_XX", "fr": "fr_XX", "de": "de_DE"}  # mBART-50's codes of the toy corpus' languages
SPM_FILE = "sentencepiece.bpe.model"


def make_mbart(directory: str | Path, *, train_steps: int = 300, seed: int = 0, **config) -> Path:
    """Builds a tiny mBART-50 many-to-many checkpoint (en_XX -> fr_XX and de_DE) with transformers 5.

    Args:
        directory: Where to write; created if missing.
        train_steps: Training steps of 48 pairs; 0 leaves the model random.
        seed: Seeds the initialisation and the batches.
        **config: MBartConfig fields over the tiny shape (e.g. activation_function, scale_embedding).

    Returns:
        The directory.
    """
    from transformers import MBart50Tokenizer, MBartForConditionalGeneration

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    english = F.source_sentences(F.M2M_SENTENCES)
    texts = list(english) + [F.translate(s, lang) for lang in F.LANGUAGES for s in english]
    with tempfile.TemporaryDirectory() as snapshot:
        F.train_spm(texts, Path(snapshot) / SPM_FILE, 160)
        tokenizer = MBart50Tokenizer.from_pretrained(snapshot, src_lang=CODES["en"])
        shutil.copyfile(Path(snapshot) / SPM_FILE, out / SPM_FILE)
    model_config, generation = F.conventions("mbart", F._SHAPE, len(tokenizer), **config)
    torch.manual_seed(seed)
    model = MBartForConditionalGeneration(model_config)
    examples = []
    for lang in F.LANGUAGES:
        tokenizer.tgt_lang = CODES[lang]
        for source in english:
            encoded = tokenizer(source, text_target=F.translate(source, lang))
            examples.append((encoded["input_ids"], encoded["labels"]))
    F._fit(model, examples, model_config.pad_token_id, train_steps, seed, lr=2e-2)
    tokenizer.tgt_lang = None
    model.generation_config = generation
    with F._quiet_transformers():
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return out


@functools.lru_cache(maxsize=None)
def cached_mbart(train_steps: int = 300) -> Path:
    """make_mbart's directory, built once per test run (read-only: copy it before editing)."""
    return build_once(
        f"mbart-steps={train_steps}", lambda out: make_mbart(out, train_steps=train_steps), keep_by=F.SOURCES
    )
