"""Tiny Hugging Face translation checkpoints (Marian and M2M100) built from configs, for the importer's tests.

There is no model hub in the test environment, so each builder trains SentencePiece models on a
generated toy corpus, trains a 2+2-layer model for a few hundred steps, and writes the directory
with the model's and tokenizer's own `save_pretrained`, so the files are exactly what transformers
writes. The conventions (special token ids, generation settings) follow the published OPUS-MT and
facebook/m2m100 checkpoints. `cached_model` builds each variant once per process; `damage` breaks
a copy for the error tests.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import random
import warnings
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence
from build_cache import build_once

# Tiny models run fastest on one thread, and on a shared 2-core machine more threads thrash.
torch.set_num_threads(1)

# The toy corpus: English-like sentences NP V [NP] [P NP], translated word by word into two
# made-up languages with different lexicons and a different reordering each, so that forcing
# the target language of the M2M100 model visibly changes its output.

DETERMINERS = ("the", "a", "this", "every")
ADJECTIVES = ("red", "big", "small", "old", "happy", "young", "green", "quiet")
NOUNS = tuple(
    "cat dog bird fish horse man woman child tree house river garden teacher farmer apple boat".split()
)
VERBS = ("sees", "eats", "likes", "finds", "follows", "helps", "paints", "watches", "carries", "knows")
PREPOSITIONS = ("near", "under", "with", "behind")
ENGLISH = DETERMINERS + ADJECTIVES + NOUNS + VERBS + PREPOSITIONS
_LEXICONS = {  # word i translates ENGLISH[i]
    "fr": """le un ce chaque rouge grand petit vieux content jeune vert calme chat chien oiseau poisson cheval homme
             femme enfant arbre maison riviere jardin professeur fermier pomme bateau voit mange aime trouve suit
             aide peint regarde porte connait pres sous avec derriere""".split(),
    "de": """der ein dieser jeder rot gross klein alt froh jung gruen ruhig katze hund vogel fisch pferd mann frau kind
             baum haus fluss garten lehrer bauer apfel boot sieht isst mag findet folgt hilft malt beobachtet traegt
             kennt bei unter mit hinter""".split(),
}
WORD_MAPS = {lang: dict(zip(ENGLISH, words, strict=True)) for lang, words in _LEXICONS.items()}
LANGUAGES = tuple(WORD_MAPS)

MARIAN_PAIRS = 600  # training pairs for the Marian model (en -> fr)
M2M_SENTENCES = 500  # English sentences for M2M100, each trained into both fr and de


def _noun_phrase(rng: random.Random) -> list[str]:
    words = [rng.choice(DETERMINERS)] if rng.random() < 0.8 else []
    if rng.random() < 0.4:
        words.append(rng.choice(ADJECTIVES))
    return words + [rng.choice(NOUNS)]


def _sentence(rng: random.Random) -> str:
    while True:
        words = _noun_phrase(rng) + [rng.choice(VERBS)]
        if rng.random() < 0.7:
            words += _noun_phrase(rng)
        if rng.random() < 0.3:
            words += [rng.choice(PREPOSITIONS)] + _noun_phrase(rng)
        if 2 <= len(words) <= 10:
            return " ".join(words)


def translate(sentence: str, lang: str) -> str:
    """The reference translation of an English sentence of the toy corpus.

    Args:
        sentence: Words of the toy lexicon separated by single spaces.
        lang: "fr" (adjectives follow their noun) or "de" (the verb goes last).

    Raises:
        KeyError: For a language or word outside the toy lexicon.
    """
    words = sentence.split()
    if lang == "fr":
        for i in range(len(words) - 1):
            if words[i] in ADJECTIVES and words[i + 1] in NOUNS:
                words[i], words[i + 1] = words[i + 1], words[i]
    elif lang == "de":
        verbs = [w for w in words if w in VERBS]
        words = [w for w in words if w not in VERBS] + verbs
    mapping = WORD_MAPS[lang]
    return " ".join(mapping[w] for w in words)


@functools.lru_cache(maxsize=None)
def source_sentences(n: int, seed: int = 0) -> tuple[str, ...]:
    """`n` distinct training sentences in English (deterministic for a seed)."""
    rng, seen = random.Random(seed), {}
    while len(seen) < n:
        seen.setdefault(_sentence(rng), None)
    return tuple(seen)


def parallel_corpus(lang: str = "fr", n: int = MARIAN_PAIRS, seed: int = 0) -> list[tuple[str, str]]:
    """`n` (English, translation) training pairs into `lang`."""
    return [(s, translate(s, lang)) for s in source_sentences(n, seed)]


def test_sentences(n: int = 20) -> list[str]:
    """`n` held-out English sentences: none is in any training corpus the builders use."""
    held = set(source_sentences(max(MARIAN_PAIRS, M2M_SENTENCES)))
    rng, out = random.Random(12345), []
    while len(out) < n:
        s = _sentence(rng)
        if s not in held and s not in out:
            out.append(s)
    return out


test_sentences.__test__ = False  # a helper, not a test, though pytest would collect the name


# SentencePiece and training, shared by both builders.
def train_spm(texts: list[str], path: Path, vocab_size: int, **options) -> Path:
    """Trains a unigram SentencePiece model on `texts` and writes it to `path` (any file name); returns `path`.

    `options` are SentencePieceTrainer's, over these (scripts/ train their models with this too).

    Raises:
        RuntimeError: From SentencePiece, when `texts` cannot fill `vocab_size` pieces.
    """
    import io

    import sentencepiece as spm

    # One thread and the whole corpus (no sampling) make the model the same on every run; a writer
    # rather than a model_prefix keeps the directory's path out of the file, so the bytes are too.
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        vocab_size=vocab_size,
        **{"model_type": "unigram", "character_coverage": 1.0, "num_threads": 1, "minloglevel": 2, **options},
    )
    path.write_bytes(model.getvalue())
    return path


def spm_pieces(path: str | Path, *, ordinary: bool = False) -> list[str]:
    """The pieces of a SentencePiece model in its own id order.

    Args:
        path: The model file.
        ordinary: Leave out <unk>, <s> and </s>; otherwise entry i is the piece of id i.
    """
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(path))
    return [
        processor.id_to_piece(i)
        for i in range(processor.get_piece_size())
        if not (ordinary and (processor.is_control(i) or processor.is_unknown(i)))
    ]


def _fit(
    model, examples: list[tuple[list[int], list[int]]], pad_id: int, steps: int, seed: int, lr: float
) -> None:
    """Teacher-forced training: the model shifts `labels` right after its decoder start itself."""
    if steps <= 0:
        return
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    warmup = max(1, steps // 10)
    # Warm up (such high rates diverge on the first steps otherwise), then decay to a tenth.
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.1, 1 - s / steps))
    )
    model.train()
    for _ in range(steps):
        batch = [examples[i] for i in torch.randint(len(examples), (48,), generator=generator).tolist()]
        source = pad_sequence([torch.tensor(src) for src, _ in batch], batch_first=True, padding_value=pad_id)
        # -100: ignored by the loss (and made pad where the model shifts labels into decoder inputs).
        labels = pad_sequence([torch.tensor(tgt) for _, tgt in batch], batch_first=True, padding_value=-100)
        loss = model(input_ids=source, attention_mask=source.ne(pad_id).long(), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()


@contextlib.contextmanager
def _quiet_transformers():
    """Hides save_pretrained's progress bar and MarianTokenizer's sacremoses warning, then restores both."""
    from transformers.utils import logging

    bar = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Recommended: pip install sacremoses")
            yield
    finally:
        if bar:
            logging.enable_progress_bar()


# The shape both architectures share: small enough to train in seconds on one CPU thread.
_SHAPE = dict(
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=128,
    dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
    encoder_layerdrop=0.0,
    decoder_layerdrop=0.0,
    scale_embedding=True,
    # fairseq's embedding init, d_model ** -0.5 rather than HF's 0.02: with 0.02 the scaled
    # embeddings are a tenth of the sinusoidal positions and 300 steps learn little.
    init_std=32**-0.5,
)
MAX_LENGTH = 64  # generation_config.json's max_length


def _marian_vocab(pieces: list[str]) -> dict[str, int]:
    # OPUS-MT's vocab.json: "</s>" 0, "<unk>" 1, the pieces, "<pad>" last. Sorting the pieces
    # makes Marian ids differ from SentencePiece's ids, as they do in the published models.
    tokens = ["</s>", "<unk>"] + sorted(set(pieces)) + ["<pad>"]
    return {token: i for i, token in enumerate(tokens)}


# The published checkpoints' conventions (special ids, layout switches, generation settings): one source for
# the builders here, in hf_marian_multi.py, hf_nllb.py and hf_mbart.py, and in scripts/ (hf_identity_models.py,
# hf_sizes_jobs.py), which import this module from the checkout.
_MBART_PUBLISHED = dict(  # facebook/mbart-large-50-many-to-many-mmt's switches (transformers reads none)
    normalize_before=True,
    normalize_embedding=True,
    static_position_embeddings=False,
    add_final_layer_norm=True,
    add_bias_logits=False,
)


def conventions(family: str, shape: dict, vocab_size: int, max_length: int = MAX_LENGTH, **config):
    """(model config, generation config) of a family as its published checkpoints have them.

    Args:
        family: "marian" (OPUS-MT: </s> 0, <pad> = decoder start = the last id, swish, post-norm), "m2m100"
            (facebook/m2m100: <s> 0 <pad> 1 </s> 2, beam 5), "nllb" (the same, beam 4) or "mbart" (mBART-50:
            gelu, pre-norm, </s> forced at the end).
        shape: the config's size fields (d_model, layers, heads, ffn, ...).
        vocab_size: the embedding rows (Marian: also its decoder's, unless config says decoder_vocab_size).
        max_length: generation_config.json's max_length.
        **config: fields over the family's (e.g. activation_function, share_encoder_decoder_embeddings).
    """
    from transformers import GenerationConfig, M2M100Config, MarianConfig, MBartConfig

    if family == "marian":
        pad = vocab_size - 1
        ids = dict(
            pad_token_id=pad,
            decoder_start_token_id=pad,
            eos_token_id=0,
            forced_eos_token_id=0,
            bos_token_id=0,
        )
        layout = dict(normalize_before=False, normalize_embedding=False, static_position_embeddings=True)
        fields = dict(
            decoder_vocab_size=vocab_size, share_encoder_decoder_embeddings=True, activation_function="swish"
        )
        model = MarianConfig(
            **shape,
            **ids,
            **layout,
            **{**fields, **config},
            vocab_size=vocab_size,
            tie_word_embeddings=True,
            add_final_layer_norm=False,
        )
        return model, GenerationConfig(
            **ids, bad_words_ids=[[pad]], max_length=max_length, num_beams=4, renormalize_logits=True
        )
    ids = dict(bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)
    search = dict(early_stopping=True, max_length=max_length, num_beams=4 if family == "nllb" else 5)
    if family == "mbart":
        ids["forced_eos_token_id"] = 2
        fields = {**shape, "activation_function": "gelu", **_MBART_PUBLISHED, **config}
        return MBartConfig(
            **fields, **ids, vocab_size=vocab_size, tie_word_embeddings=True
        ), GenerationConfig(**ids, **search)
    fields = {**shape, "activation_function": "relu", **config}
    return M2M100Config(**fields, **ids, vocab_size=vocab_size, tie_word_embeddings=True), GenerationConfig(
        **ids, **search
    )


def make_marian(
    directory: str | Path,
    *,
    shared_vocab: bool = True,
    activation: str = "swish",
    train_steps: int = 300,
    seed: int = 0,
) -> Path:
    """Builds a tiny en->fr OPUS-MT style checkpoint, as MarianMTModel and MarianTokenizer save it.

    The directory holds config.json, model.safetensors, generation_config.json, source.spm,
    target.spm, vocab.json (and target_vocab.json when `shared_vocab` is False) and
    tokenizer_config.json (transformers 5 writes no special_tokens_map.json).

    Args:
        directory: Where to write; created if missing, files in it are overwritten.
        shared_vocab: One vocab.json for both sides (tied encoder and decoder embeddings), or a
            source vocab.json and a target_vocab.json of the same size (separate embeddings).
        activation: config.activation_function, "swish" as in OPUS-MT or "relu".
        train_steps: Training steps of 48 pairs; 0 leaves the model random (and quick to build).
        seed: Seeds the initialisation, the final logits bias and the batches.

    Returns:
        The directory.
    """
    from transformers import MarianMTModel, MarianTokenizer

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    pairs = parallel_corpus("fr", MARIAN_PAIRS)
    source_spm = train_spm([s for s, _ in pairs], out / "source.spm", 64)
    target_spm = train_spm([t for _, t in pairs], out / "target.spm", 64)
    source_pieces, target_pieces = (
        spm_pieces(source_spm, ordinary=True),
        spm_pieces(target_spm, ordinary=True),
    )
    files = dict(source_spm=str(source_spm), target_spm=str(target_spm), vocab=str(out / "vocab.json"))
    if shared_vocab:
        vocab = _marian_vocab(source_pieces + target_pieces)
        target_vocab = vocab
    else:
        vocab, target_vocab = _marian_vocab(source_pieces), _marian_vocab(target_pieces)
        # The converter of OPUS-MT models assumes both sides have one size (pad is one id for both).
        if len(vocab) != len(target_vocab):
            raise RuntimeError(f"separate vocabularies differ in size: {len(vocab)} and {len(target_vocab)}")
        (out / "target_vocab.json").write_text(json.dumps(target_vocab, indent=2), encoding="utf-8")
        files["target_vocab_file"] = str(out / "target_vocab.json")
    (out / "vocab.json").write_text(json.dumps(vocab, indent=2), encoding="utf-8")
    with _quiet_transformers():
        tokenizer = MarianTokenizer(
            **files,
            separate_vocabs=not shared_vocab,
            source_lang="en",
            target_lang="fr",
            model_max_length=512,
        )

    pad = len(vocab) - 1
    config, generation = conventions(
        "marian",
        _SHAPE,
        len(vocab),
        decoder_vocab_size=len(target_vocab),
        share_encoder_decoder_embeddings=shared_vocab,
        activation_function=activation,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    with torch.no_grad():
        # The output bias (Marian's trained decoder_ff_logit_out_b) is a buffer in HF, so _fit leaves
        # it as set here: random, so that an importer that drops it fails parity.
        model.final_logits_bias.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(seed + 1))
    examples = []
    for source, target in pairs:
        encoded = tokenizer(source, text_target=target)
        examples.append((encoded["input_ids"], encoded["labels"]))
    # Measured over seeds 0-2: 1e-2 gives 55-65% exact translations; post-norm diverges at 2e-2 for some.
    _fit(model, examples, pad, train_steps, seed, lr=1e-2)

    model.generation_config = generation
    with _quiet_transformers():
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return out


# M2M100Tokenizer puts one token per language (100) after vocab.json, then the checkpoint keeps
# `num_madeup_words` unused rows: the published config's vocab_size is len(vocab.json) + 100 + 8.
M2M_MADEUP_WORDS = 8


def make_m2m100(
    directory: str | Path, *, activation: str = "relu", train_steps: int = 300, seed: int = 0
) -> Path:
    """Builds a tiny facebook/m2m100 style checkpoint that translates en->fr and en->de.

    The directory holds config.json, model.safetensors, generation_config.json, vocab.json,
    sentencepiece.bpe.model (a unigram SentencePiece model under M2M100's file name),
    tokenizer_config.json and added_tokens.json (the 100 language tokens, with their ids).
    Sources are `[__en__] pieces </s>`, targets `[__fr__|__de__] pieces </s>`, and the decoder
    starts from </s>, as fairseq trained M2M100.

    Args:
        directory: Where to write; created if missing, files in it are overwritten.
        activation: config.activation_function ("relu" as published, or "swish", "gelu").
        train_steps: Training steps of 48 pairs; 0 leaves the model random (and quick to build).
        seed: Seeds the initialisation and the batches.

    Returns:
        The directory.
    """
    from transformers import M2M100ForConditionalGeneration, M2M100Tokenizer
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    english = source_sentences(M2M_SENTENCES)
    texts = list(english) + [translate(s, lang) for lang in LANGUAGES for s in english]
    spm_path = train_spm(texts, out / "sentencepiece.bpe.model", 160)
    # fairseq's dictionary order: <s> <pad> </s> <unk>, then the pieces (sorted here, so that
    # ids differ from SentencePiece's own).
    tokens = ["<s>", "<pad>", "</s>", "<unk>"] + sorted(spm_pieces(spm_path, ordinary=True))
    vocab = {token: i for i, token in enumerate(tokens)}
    (out / "vocab.json").write_text(json.dumps(vocab, indent=2), encoding="utf-8")
    # The published tokenizer files list the language tokens as special; M2M100Tokenizer's own
    # default list comes out empty (a chained `not in` in its __init__), and without the list
    # decode(skip_special_tokens=True) would keep "__fr__".
    languages = FAIRSEQ_LANGUAGE_CODES["m2m100"]
    tokenizer = M2M100Tokenizer(
        vocab_file=str(out / "vocab.json"),
        spm_file=str(spm_path),
        src_lang="en",
        tgt_lang="fr",
        num_madeup_words=M2M_MADEUP_WORDS,
        model_max_length=1024,
        additional_special_tokens=[f"__{code}__" for code in languages],
    )

    vocab_size = len(vocab) + len(languages) + M2M_MADEUP_WORDS
    config, generation = conventions("m2m100", _SHAPE, vocab_size, activation_function=activation)
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config)
    examples = []
    for lang in LANGUAGES:
        tokenizer.tgt_lang = lang
        for source in english:
            encoded = tokenizer(source, text_target=translate(source, lang))
            examples.append((encoded["input_ids"], encoded["labels"]))
    # Pre-norm trains stably at twice Marian's rate, which it needs for two target languages.
    _fit(model, examples, config.pad_token_id, train_steps, seed, lr=2e-2)

    tokenizer.tgt_lang = None  # as published: the caller picks the target with forced_bos_token_id
    model.generation_config = generation
    with _quiet_transformers():
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return out


# Sharing builds, and breaking copies of them.
_BUILDERS = {"marian": make_marian, "m2m100": make_m2m100}
# What decides the bytes of every checkpoint built here and in the other hf_*.py builders (with the
# libraries' versions): build_cache.py keeps them between test runs while these files are unchanged.
SOURCES = tuple(sorted(Path(__file__).resolve().parent.glob("hf_*.py")))


def cached_model(kind: str, **options) -> Path:
    """The directory of `make_<kind>(**options)`, built once per process and shared read-only.

    Copy the directory (shutil.copytree) before editing it, e.g. with `damage`.

    Args:
        kind: "marian" or "m2m100".
        **options: Keyword options of make_marian or make_m2m100; the defaults are filled in
            first, so that `cached_model("marian")` and `cached_model("marian", seed=0)` share one build.

    Raises:
        ValueError: For another kind.
        TypeError: For an option the builder does not take.
    """
    if kind not in _BUILDERS:
        raise ValueError(f"unknown model kind {kind!r}; expected one of {sorted(_BUILDERS)}")
    bound = inspect.signature(_BUILDERS[kind]).bind(None, **options)  # TypeError for an unknown option
    bound.apply_defaults()
    return _cached(kind, tuple(sorted(bound.kwargs.items())))


@functools.lru_cache(maxsize=None)
def _cached(kind: str, options: tuple) -> Path:
    name = "-".join([kind] + [f"{key}={value}" for key, value in options])
    return build_once(name, lambda out: _BUILDERS[kind](out, **dict(options)), keep_by=SOURCES)


def export_cache(tmp_path_factory):
    """export(model_dir, **export_hf_bundle options) -> its bundle, exported once per directory and options
    for whoever holds this (a module-scoped fixture): tests that only read a bundle share it, read-only."""
    from seq2onnx.export.hf.bundle import export_hf_bundle

    made: dict[tuple, Path] = {}

    def export(model_dir: Path, **options) -> Path:
        key = (str(model_dir), tuple(sorted(options.items())))
        if key not in made:
            made[key] = export_hf_bundle(model_dir, tmp_path_factory.mktemp("bundle") / "b", **options)
        return made[key]

    return export


# verify's token rows that a trained tiny model passes at 100%
TOKEN_CHECKS = (
    "source ids identical to the tokenizer's",
    "greedy ids identical to generate()",
    "beam 4 ids identical to generate()",
    "texts identical to batch_decode",
)


def verify_command(capsys, model_dir: Path, bundle: Path, data: Path, *options: str) -> str:
    """`seq2onnx verify MODEL_DIR BUNDLE --data DATA --sentences 30 --tensor-sentences 3 OPTIONS` in this
    process (a child would spend most of its time importing torch and transformers again); asserts that it
    exits 0 with PASSED and returns its report (stdout)."""
    from seq2onnx.commands.main import main

    counts = ["--sentences", "30", "--tensor-sentences", "3"]
    code = main(["verify", str(model_dir), str(bundle), "--data", str(data), *counts, *options])
    printed = capsys.readouterr()
    assert code == 0 and printed.out.rstrip().endswith("PASSED"), printed.out + printed.err
    return printed.out


def random_model(kind: str, **options) -> Path:
    """An untrained (random weights) model of `kind`, cached like `cached_model`; about a second to build."""
    return cached_model(kind, train_steps=0, **options)


DAMAGES = ("unknown_model_type", "missing_weights", "vocab_mismatch", "tokenizer_mismatch")


def _edit_json(path: Path, edit) -> Path:
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def _break_vocab(vocab: dict[str, int]) -> None:
    pieces = [token for token in vocab if not (token.startswith("<") and token.endswith(">"))]
    for token in pieces[-5:]:
        del vocab[token]
    for i, token in enumerate(pieces[:2]):
        vocab[f"\u2581qzx{i}"] = vocab.pop(token)  # pieces no SentencePiece model here has


def damage(directory: str | Path, how: str) -> Path:
    """Breaks a checkpoint directory in place, for the importer's error tests.

    Args:
        directory: A directory written by make_marian or make_m2m100 (a copy: it is edited).
        how: "unknown_model_type" (config.json says "bart"), "missing_weights" (the weights file
            is deleted), "vocab_mismatch" (config.json's vocab_size is 7 more than the embeddings'
            rows) or "tokenizer_mismatch" (vocab.json loses 5 pieces and 2 more are renamed to
            pieces the SentencePiece model does not have).

    Returns:
        The path of the file damaged (for "missing_weights", the path deleted).

    Raises:
        ValueError: For another `how`.
    """
    directory = Path(directory)
    if how == "unknown_model_type":
        return _edit_json(directory / "config.json", lambda config: config.update(model_type="bart"))
    if how == "vocab_mismatch":
        return _edit_json(
            directory / "config.json", lambda config: config.update(vocab_size=config["vocab_size"] + 7)
        )
    if how == "tokenizer_mismatch":
        return _edit_json(directory / "vocab.json", _break_vocab)
    if how == "missing_weights":
        for name in ("model.safetensors", "pytorch_model.bin"):
            if (directory / name).exists():
                (directory / name).unlink()
                return directory / name
        raise FileNotFoundError(f"{directory} has no weights file to delete")
    raise ValueError(f"unknown damage {how!r}; expected one of {DAMAGES}")
