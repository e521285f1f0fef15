"""The models of scripts/hf_trained_identity.py: Tatoeba pairs, SentencePiece, each family built with
transformers' own classes, trained, and saved with save_pretrained (split out of that script, issue 61).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TATOEBA = ROOT.parent / "shared" / "data" / "tatoeba-cmn-eng" / "cmn.txt"
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "scripts")]  # the tiny fixtures, and scaffold

MAX_LENGTH = 64  # generation_config.json's max_length: Tatoeba sentences are short
BATCH = 32
VOCAB = 4000
SHAPE = dict(
    d_model=128,
    encoder_layers=3,
    decoder_layers=3,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=512,
    decoder_ffn_dim=512,
    max_position_embeddings=256,
    dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
    encoder_layerdrop=0.0,
    decoder_layerdrop=0.0,
    scale_embedding=True,
    init_std=128**-0.5,
)
# family: (source language code, target language code, learning rate); Marian (post-norm) wants the lower rate
FAMILIES = {
    "marian": (None, None, 1.5e-3),
    "nllb": ("eng_Latn", "zho_Hans", 3e-3),
    "mbart": ("en_XX", "zh_CN", 3e-3),
    "t5": (None, None, 1e-3),
}
from scaffold import T0, log  # noqa: E402, F401  (scripts/ is this module's folder)


# ------------------------------------------------------------------------------------------------ data
def read_pairs(n_test: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(training pairs, test pairs): one pair per distinct English sentence, the test pairs spread evenly."""
    pairs: dict[str, str] = {}
    with open(TATOEBA, encoding="utf-8-sig") as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if len(cols) >= 2 and cols[0].strip() and cols[1].strip():
                pairs.setdefault(cols[0].strip(), cols[1].strip())
    items = list(pairs.items())
    if n_test * 4 > len(items):
        raise SystemExit(
            f"error: --sentences {n_test} leaves too few of {len(items)} pairs to train on; "
            f"ask for {len(items) // 4} or fewer"
        )
    step = len(items) / n_test
    test_idx = {int(i * step + step / 2) for i in range(n_test)}
    return [p for i, p in enumerate(items) if i not in test_idx], [items[i] for i in sorted(test_idx)]


def train_spm(texts: list[str], path: Path, model_type: str, **ids) -> Path:
    """A SentencePiece model of VOCAB pieces; rare Chinese characters (0.05% of the text) become <unk>."""
    import hf_fixtures as F

    sample = dict(input_sentence_size=200000, shuffle_input_sentence=True, num_threads=2)
    return F.train_spm(texts, path, VOCAB, model_type=model_type, character_coverage=0.9995, **sample, **ids)


# ---------------------------------------------------------------------------------------------- models
def build_marian(out: Path, texts: list[str]):
    """(tokenizer, model, generation config) as OPUS-MT's: one SentencePiece model for both sides."""
    from transformers import MarianMTModel, MarianTokenizer

    import hf_fixtures as F

    spm_path = train_spm(texts, out / "source.spm", "unigram")
    shutil.copyfile(spm_path, out / "target.spm")
    vocab = F._marian_vocab(F.spm_pieces(spm_path, ordinary=True))
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    with F._quiet_transformers():
        tok = MarianTokenizer(
            source_spm=str(spm_path),
            target_spm=str(out / "target.spm"),
            vocab=str(out / "vocab.json"),
            source_lang="en",
            target_lang="zh",
            model_max_length=512,
        )
    config, generation = F.conventions("marian", SHAPE, len(vocab))
    return tok, MarianMTModel(config), generation


def build_nllb(out: Path, texts: list[str]):
    """(tokenizer, model, generation config): an NLLB-200 style M2M100, transformers 5's NllbTokenizer."""
    import hf_fixtures as F
    from transformers import M2M100ForConditionalGeneration, NllbTokenizer
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    with tempfile.TemporaryDirectory() as snapshot:
        spm_path = train_spm(texts, Path(snapshot) / "sentencepiece.bpe.model", "bpe")  # NLLB's is BPE
        tok = NllbTokenizer.from_pretrained(
            snapshot, extra_special_tokens=list(FAIRSEQ_LANGUAGE_CODES), src_lang="eng_Latn"
        )
        shutil.copyfile(spm_path, out / spm_path.name)  # as a hub snapshot has it beside tokenizer.json
    config, generation = F.conventions("nllb", SHAPE, len(tok))
    return tok, M2M100ForConditionalGeneration(config), generation


def build_mbart(out: Path, texts: list[str]):
    """(tokenizer, model, generation config) of an mBART-50 many-to-many style model."""
    import hf_fixtures as F
    from transformers import MBart50Tokenizer, MBartForConditionalGeneration

    with tempfile.TemporaryDirectory() as snapshot:
        spm_path = train_spm(texts, Path(snapshot) / "sentencepiece.bpe.model", "unigram")
        # bos_token as the published special_tokens_map.json has it (CTranslate2's converter reads it)
        tok = MBart50Tokenizer.from_pretrained(snapshot, src_lang="en_XX", bos_token="<s>")
        shutil.copyfile(spm_path, out / spm_path.name)
    config, generation = F.conventions("mbart", SHAPE, len(tok), tokenizer_class="MBart50Tokenizer")
    return tok, MBartForConditionalGeneration(config), generation


def build_t5(out: Path, texts: list[str]):
    """(tokenizer, model, generation config) of a MADLAD-400 / T5 v1.1 shaped model (issue 61): gated-GELU,
    an lm_head of its own, relative position bias, RMS norm, no score scaling; t5-small's width and heads
    at 2+2 layers, so that one core trains it in minutes."""
    import torch
    from transformers import GenerationConfig, T5Config, T5ForConditionalGeneration, T5Tokenizer

    with tempfile.TemporaryDirectory() as snapshot:  # T5's ids: <pad> 0, </s> 1, <unk> 2
        spm_path = train_spm(
            texts, Path(snapshot) / "spiece.model", "unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1
        )
        tok = T5Tokenizer.from_pretrained(snapshot)
        shutil.copyfile(spm_path, out / spm_path.name)
    config = T5Config(
        vocab_size=len(tok),
        d_model=256,
        d_kv=64,
        num_heads=4,
        d_ff=1024,
        num_layers=2,
        num_decoder_layers=2,
        feed_forward_proj="gated-gelu",
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        tie_word_embeddings=False,
    )
    model = T5ForConditionalGeneration(config)
    # transformers 5 ties lm_head at construction (tie_word_embeddings False only turns the output scale off);
    # MADLAD's checkpoint has its own, drawn here at d_model^-0.5 (T5's std 1: logits of std sqrt(d_model))
    model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight) * config.d_model**-0.5)
    # as google/madlad400-*'s and t5-small's generation_config.json: no early_stopping (False); conventions()
    # adds the early_stopping True copy
    generation = GenerationConfig(
        decoder_start_token_id=0, eos_token_id=1, max_length=MAX_LENGTH, pad_token_id=0
    )
    return tok, model, generation


def conventions(family: str, model_dir: Path) -> list[tuple[str, Path]]:
    """(row label, model directory) for each beam convention measured: the trained model as saved, and for
    t5 a copy whose generation_config.json says early_stopping true (the `transformers` convention; the
    saved one, without it, is `transformers_heuristic`), so that T5 is held to generate() under both."""
    if family != "t5":
        return [(family, model_dir)]
    other = model_dir.with_name(model_dir.name + "-early-stopping")
    shutil.rmtree(other, ignore_errors=True)
    shutil.copytree(model_dir, other)
    path = other / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "early_stopping": True}, indent=2))
    return [("t5", model_dir), ("t5 early_stopping", other)]


BUILDERS = {"marian": build_marian, "nllb": build_nllb, "mbart": build_mbart, "t5": build_t5}


def encode(tok, family: str, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """Training examples (source ids, label ids), those over 64 tokens left out."""
    source_lang, target_lang, _ = FAMILIES[family]
    if source_lang:
        tok.src_lang, tok.tgt_lang = source_lang, target_lang
    out = []
    for i in range(0, len(pairs), 1000):
        chunk = pairs[i : i + 1000]
        enc = tok([s for s, _ in chunk], text_target=[t for _, t in chunk])
        out += [(s, t) for s, t in zip(enc["input_ids"], enc["labels"]) if len(s) <= 64 and len(t) <= 64]
    if source_lang:
        tok.tgt_lang = None  # as published: the caller picks the target with forced_bos_token_id
    return out


def fit(model, examples, pad_id: int, seconds: float, lr: float) -> dict:
    """Teacher-forced AdamW for `seconds` of wall time: warm-up over the first 5%, then decay to a tenth."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    start, steps, loss = time.perf_counter(), 0, float("nan")
    while (done := (time.perf_counter() - start) / seconds) < 1.0:
        for group in optimizer.param_groups:
            group["lr"] = lr * min(done / 0.05, max(0.1, 1.0 - done)) + lr * 1e-3
        batch = [examples[i] for i in torch.randint(len(examples), (64,), generator=generator).tolist()]
        source = pad_sequence([torch.tensor(s) for s, _ in batch], batch_first=True, padding_value=pad_id)
        labels = pad_sequence([torch.tensor(t) for _, t in batch], batch_first=True, padding_value=-100)
        out = model(input_ids=source, attention_mask=source.ne(pad_id).long(), labels=labels)
        optimizer.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        steps, loss = steps + 1, out.loss.item()
        if steps % 100 == 0:
            log(f"  step {steps}: loss {loss:.3f}")
    model.eval()
    return {"steps": steps, "final_loss": loss, "seconds": time.perf_counter() - start}


def train_family(family: str, model_dir: Path, train: list[tuple[str, str]], minutes: float) -> dict:
    """Builds, trains and saves (save_pretrained) one family's model into model_dir; returns its facts."""
    import torch

    import hf_fixtures as F

    # One thread: on the shared 2-core machine two threads trained 5x slower (0.6 steps/s against 3.0).
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model_dir.mkdir(parents=True, exist_ok=True)
    tok, model, generation = BUILDERS[family](model_dir, [t for pair in train for t in pair])
    examples = encode(tok, family, train)
    log(
        f"{family}: {len(examples)} training pairs, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
        f"parameters, vocabulary {model.config.vocab_size}; training {minutes} min"
    )
    facts = fit(model, examples, model.config.pad_token_id, minutes * 60, FAMILIES[family][2])
    if family == "marian":
        # OPUS-MT's <pad> row is zero (Marian has no <pad>; its decoder starts from a zero embedding, which
        # CTranslate2's converter assumes); the tied output projection trained it, so it is zeroed here.
        with torch.no_grad():
            model.get_input_embeddings().weight[model.config.pad_token_id].zero_()
    model.generation_config = generation
    with F._quiet_transformers():
        model.save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
    return {
        **facts,
        "pairs": len(examples),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": model.config.vocab_size,
    }
