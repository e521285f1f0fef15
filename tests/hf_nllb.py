"""A tiny NLLB-200 style checkpoint as transformers 5 writes it, for the importer's tests (issue 35).

In transformers 5 `NllbTokenizer` is the tokenizers-backed class (there is no slow one), and its
save_pretrained writes tokenizer.json and tokenizer_config.json but no sentencepiece.bpe.model.
The builder trains a BPE SentencePiece model (as NLLB's is), loads it with NllbTokenizer (which
converts it, as from a hub snapshot), trains an M2M100 model eng_Latn -> fra_Latn / deu_Latn on the
toy corpus of tests/hf_fixtures.py, and saves both with save_pretrained. `with_spm` then puts the
SentencePiece file beside them (a hub snapshot) or leaves it out (a fine-tuned model saved by 5.x).
"""

from __future__ import annotations

import functools
import io
import shutil
import tempfile
from pathlib import Path

import torch

import hf_fixtures as F
from build_cache import build_once

# NLLB's codes of the toy corpus' languages.
CODES = {"en": "eng_Latn", "fr": "fra_Latn", "de": "deu_Latn"}
SPM_FILE = "sentencepiece.bpe.model"


def _train_bpe(texts: list[str], vocab_size: int) -> bytes:
    import sentencepiece as spm

    model = io.BytesIO()  # one thread, whole corpus, no path in the file: the same bytes on every run
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


def make_nllb(directory: str | Path, *, with_spm: bool = True, train_steps: int = 300, seed: int = 0) -> Path:
    """Builds a tiny facebook/nllb-200 style checkpoint (eng_Latn -> fra_Latn and deu_Latn) with transformers 5.

    Sources are `[eng_Latn] pieces </s>`, targets `[fra_Latn|deu_Latn] pieces </s>`, the decoder starts from
    </s>, and the caller picks the target with forced_bos_token_id, as the published checkpoints.

    Args:
        directory: Where to write; created if missing.
        with_spm: Leave sentencepiece.bpe.model in the directory (a hub snapshot) or not (save_pretrained alone).
        train_steps: Training steps of 48 pairs; 0 leaves the model random.
        seed: Seeds the initialisation and the batches.

    Returns:
        The directory.
    """
    from transformers import M2M100ForConditionalGeneration, NllbTokenizer
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    english = F.source_sentences(F.M2M_SENTENCES)
    texts = list(english) + [F.translate(s, lang) for lang in F.LANGUAGES for s in english]
    with tempfile.TemporaryDirectory() as snapshot:
        (Path(snapshot) / SPM_FILE).write_bytes(_train_bpe(texts, 160))
        # As from a hub snapshot's sentencepiece.bpe.model: transformers 5 converts it to its BPE backend.
        tokenizer = NllbTokenizer.from_pretrained(
            snapshot, extra_special_tokens=list(FAIRSEQ_LANGUAGE_CODES), src_lang=CODES["en"]
        )
        if with_spm:
            shutil.copyfile(Path(snapshot) / SPM_FILE, out / SPM_FILE)
    config, generation = F.conventions("nllb", F._SHAPE, len(tokenizer))
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config)
    examples = []
    for lang in F.LANGUAGES:
        tokenizer.tgt_lang = CODES[lang]
        for source in english:
            encoded = tokenizer(source, text_target=F.translate(source, lang))
            examples.append((encoded["input_ids"], encoded["labels"]))
    F._fit(model, examples, config.pad_token_id, train_steps, seed, lr=2e-2)
    tokenizer.tgt_lang = None
    model.generation_config = generation
    with F._quiet_transformers():
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return out


@functools.lru_cache(maxsize=None)
def cached_nllb(with_spm: bool = True, train_steps: int = 300) -> Path:
    """make_nllb's directory, built once per test run (read-only: copy it before editing). The one without
    the SentencePiece file is a copy of the other less that file: with_spm changes nothing else, so the same
    model is trained once."""
    if with_spm:
        return build_once(
            f"nllb-spm=True-steps={train_steps}",
            lambda out: make_nllb(out, train_steps=train_steps),
            keep_by=F.SOURCES,
        )
    with_file = cached_nllb(True, train_steps)
    copy = lambda out: shutil.copytree(with_file, out, ignore=shutil.ignore_patterns(SPM_FILE))  # noqa: E731
    return build_once(f"nllb-spm=False-steps={train_steps}", copy)
