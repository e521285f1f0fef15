"""Checks of a Hugging Face model directory before transformers reads a byte of it (issue 37).

transformers fills what a config lacks with its class defaults, initialises at random the layers a
config has and the weights lack, and leaves a damaged file to fail deep inside torch or safetensors.
So every value the importer takes is checked here first, from the files themselves, and each
refusal is one line naming the file, the field, the value and the fix:

- config.json and generation_config.json: each field against its rule (the tables CONFIG_RULES and
  GENERATION_RULES), then the rules between fields;
- vocab.json (and Marian's target_vocab.json): one token per id, ids inside the embeddings, the pad token;
- model.safetensors: the 8-byte length and the JSON header read by hand (safetensors' own format),
  every tensor's offsets inside the file, then the config against the tensors' shapes;
- the parameters the config implies against this machine's memory, before anything is allocated.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

from seq2onnx.model.config import available_memory, gib

# transformers' activation names -> ours
ACTIVATION_NAMES = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
# Files that save_pretrained writes beside a Hugging Face config.json, and files only our checkpoints have.
HF_MARKERS = (
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "vocab.json",
    "source.spm",
    "sentencepiece.bpe.model",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)
OUR_MARKERS = ("source.spm.model", "target.spm.model", "train_state.json")
# The graphs are traced with a 5-token source (export.graphs.example_inputs): a shorter position table
# fails there, or earlier in transformers (Marian's IndexError), and would hold no sentence anyway.
MIN_POSITIONS = 5
_RESTORE = "restore the config.json that save_pretrained wrote with these weights"
_ID_FIX = "set it to the id that save_pretrained wrote (an id of the model's vocabulary)"
_IDS_FIX = "list only ids of the model's vocabulary, or remove it"
_VOCAB_FIX = "restore the vocabulary files that tokenizer.save_pretrained wrote with this model"


class HFImportError(ValueError):
    """A model directory this importer refuses: one line naming the file, the value and the fix."""


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# A rule takes (value, vocabulary size) and returns what was expected, or None for a good value.
def _count(low: int):
    return lambda v, n: None if _is_int(v) and v >= low else f"an integer >= {low}"


def _beams(v, n: int):
    ok = _is_int(v) and 1 <= v <= n
    return None if ok else f"an integer from 1 to {n} (no beam can be wider than the model's {n} ids)"


def _early_stopping(v, n: int):
    return None if isinstance(v, bool) or v == "never" else 'true, false or "never" (transformers\' values)'


def _token_id(v, n: int):
    return None if _is_int(v) and 0 <= v < n else f"a token id from 0 to {n - 1} (the model has {n} ids)"


def _token_ids(v, n: int):
    ok = isinstance(v, list) and all(_token_id(i, n) is None for i in v)
    return None if ok else f"a list of token ids from 0 to {n - 1}"


def _bad_words(v, n: int):
    ok = isinstance(v, list) and all(ids and _token_ids(ids, n) is None for ids in v)
    return None if ok else f"a list of lists of token ids from 0 to {n - 1}"


def _finite(v, n: int):
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return None if ok else "a finite number"


def _boolean(v, n: int):
    return None if isinstance(v, bool) else "true or false"


def _activation(v, n: int):
    return None if v in ACTIVATION_NAMES else f"one of {', '.join(sorted(ACTIVATION_NAMES))}"


# config.json: field -> (rule, required, fix). A required field is one that transformers would otherwise
# fill with its class default (d_model 1024, ...), which then disagrees with the weights.
CONFIG_RULES = {
    "d_model": (_count(1), True, _RESTORE),
    "encoder_layers": (_count(1), True, _RESTORE),
    "decoder_layers": (_count(1), True, _RESTORE),
    "encoder_attention_heads": (_count(1), True, _RESTORE),
    "decoder_attention_heads": (_count(1), True, _RESTORE),
    "encoder_ffn_dim": (_count(1), True, _RESTORE),
    "decoder_ffn_dim": (_count(1), True, _RESTORE),
    "vocab_size": (_count(1), True, _RESTORE),
    "decoder_vocab_size": (_count(1), False, _RESTORE),
    "max_position_embeddings": (_count(MIN_POSITIONS), True, _RESTORE + " (the longest input, e.g. 512)"),
    "activation_function": (_activation, True, "other activations are not supported by this importer"),
    "scale_embedding": (_boolean, False, _RESTORE),
    "pad_token_id": (_token_id, True, _ID_FIX),
    "eos_token_id": (_token_id, True, _ID_FIX),
    "unk_token_id": (_token_id, False, _ID_FIX),
}
# generation_config.json (or, where it is silent, config.json): field -> (rule, fix). transformers'
# max_length and min_length count the decoder start token: a max_length below 2 generates nothing.
GENERATION_RULES = {
    "max_length": (
        _count(2),
        "set it to the longest translation in tokens + 1 (OPUS-MT ships 512), or "
        "remove it (transformers' default is 20)",
    ),
    "min_length": (_count(0), "set it to 0, or remove it"),
    "num_beams": (_beams, "set it to 1 (greedy search) or the model's beam size (e.g. 4), or remove it"),
    "early_stopping": (_early_stopping, "set one of them, or remove it"),
    "length_penalty": (_finite, "set it to 1.0, or remove it"),
    "decoder_start_token_id": (_token_id, _ID_FIX),
    "forced_bos_token_id": (_token_id, _ID_FIX + ", or remove it"),
    "bad_words_ids": (_bad_words, _IDS_FIX),
    "suppress_tokens": (_token_ids, _IDS_FIX),
    "renormalize_logits": (_boolean, "set it to true or false, or remove it"),
}


MAX_JSON_BYTES = 16 << 20  # a config.json or generation_config.json is a few kB: nothing near this is one


def read_json_object(path: Path, what: str) -> dict:
    """A JSON file that must hold an object.

    Args:
        path: the file.
        what: what a good one is, for the fix (e.g. "the config.json that save_pretrained writes").

    Raises:
        HFImportError: unreadable, invalid JSON, or not an object.
    """
    try:
        # checked before reading: a link to /dev/zero would never end, a FIFO would wait for a writer
        with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                kind = "a directory" if stat.S_ISDIR(info.st_mode) else "a device, pipe or socket"
                raise HFImportError(f"{path}: not a regular file ({kind}); restore {what}")
            if info.st_size > MAX_JSON_BYTES:
                raise HFImportError(
                    f"{path}: {info.st_size} bytes, more than the {MAX_JSON_BYTES} such a "
                    f"file can be; restore {what}"
                )
            data = json.loads(f.read().decode("utf-8"))
    except IsADirectoryError:
        raise HFImportError(f"{path}: not a regular file (a directory); restore {what}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise HFImportError(f"{path}: cannot be read ({e}); restore {what}") from None
    except ValueError as e:
        raise HFImportError(f"{path}: not valid JSON ({e}); restore {what}") from None
    if not isinstance(data, dict):
        raise HFImportError(f"{path}: holds a JSON {type(data).__name__}, not an object; restore {what}")
    return data


def looks_like_hf(path: str | Path) -> bool:
    """True for a directory that save_pretrained wrote, even when its config.json is damaged.

    A config.json with a model_type is one. So is a config.json that is unreadable, not an object or
    without a model_type, beside files that save_pretrained writes and none that only our checkpoints
    have: its error then names config.json rather than the files of our own checkpoints.
    """
    path = Path(path)
    config = path / "config.json"
    if not config.is_file():
        return False
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    if isinstance(data, dict) and ("model_type" in data or "src_vocab_size" in data):  # src_vocab_size: ours
        return "model_type" in data
    return any((path / name).exists() for name in HF_MARKERS) and not any(
        (path / name).exists() for name in OUR_MARKERS
    )


def _check_fields(path: Path, data: dict, rules: dict, vocab: int) -> None:
    for field, (rule, *rest) in rules.items():
        required, fix = rest if len(rest) == 2 else (False, rest[0])
        if data.get(field) is None:  # transformers reads null as absent
            if required:
                raise HFImportError(f"{path}: has no {field}; {fix}")
            continue
        expected = rule(data[field], vocab)
        if expected:
            raise HFImportError(f"{path}: {field} is {_show(data[field])}, expected {expected}; {fix}")


def check_config(model_dir: Path, config: dict) -> None:
    """config.json's fields (CONFIG_RULES) and the rules between them.

    Raises:
        HFImportError: naming config.json, the field, its value and the fix.
    """
    path = model_dir / "config.json"
    sizes = [s for s in (config.get("vocab_size"), config.get("decoder_vocab_size")) if _is_int(s) and s >= 1]
    # vocab_size's own rule comes before the ids' rules, which it bounds
    _check_fields(path, config, CONFIG_RULES, min(sizes) if sizes else 1)
    d, heads = config["d_model"], config["encoder_attention_heads"]
    if d % heads:
        raise HFImportError(
            f"{path}: d_model {d} is not a multiple of encoder_attention_heads {heads}; {_RESTORE}"
        )
    pairs = ("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")
    for a, b in pairs:
        if config[a] != config[b]:
            raise HFImportError(
                f"{path}: {a} is {config[a]} but {b} is {config[b]}; this importer's model "
                f"has one value for both stacks: not supported (or {_RESTORE})"
            )


def check_generation(model_dir: Path, config: dict, generation: dict) -> None:
    """The decoding values the bundle takes (GENERATION_RULES), from generation_config.json or config.json.

    Raises:
        HFImportError: naming the file the value came from, the field, the value and the fix.
    """
    vocab = config.get("decoder_vocab_size") or config["vocab_size"]
    _check_fields(model_dir / "generation_config.json", generation, GENERATION_RULES, vocab)
    fallback = {k: v for k, v in config.items() if k in GENERATION_RULES and generation.get(k) is None}
    _check_fields(model_dir / "config.json", fallback, GENERATION_RULES, vocab)
    if generation.get("decoder_start_token_id", config.get("decoder_start_token_id")) is None:
        raise HFImportError(
            f"{model_dir / 'config.json'}: has no decoder_start_token_id (nor has "
            f"generation_config.json); {_ID_FIX}"
        )
    low, high = (generation.get(k, config.get(k)) for k in ("min_length", "max_length"))
    if low is not None and high is not None and low > high:
        where = "generation_config.json" if "min_length" in generation else "config.json"
        raise HFImportError(
            f"{model_dir / where}: min_length {low} is above max_length {high}; lower "
            "min_length (0 lets a translation end anywhere) or raise max_length"
        )


def pad_token(model_dir: Path) -> str:
    """tokenizer_config.json's pad_token (a string or {"content": ...}), or "<pad>" (Marian's, M2M100's)."""
    path = model_dir / "tokenizer_config.json"
    value = (
        read_json_object(path, "the file that tokenizer.save_pretrained wrote").get("pad_token")
        if path.is_file()
        else None
    )
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else "<pad>"


def check_vocab(model_dir: Path, config: dict, pad: str) -> None:
    """vocab.json (and target_vocab.json): an object of token -> id, one token per id, ids inside the
    embeddings, and the pad token at config.json's pad_token_id (what the tokenizer pads with and the
    model masks).

    Args:
        model_dir: the model directory.
        config: its config.json, checked by check_config.
        pad: the tokenizer's pad token (pad_token()).

    Raises:
        HFImportError: naming the file, the tokens or ids and the fix.
    """
    target = config.get("decoder_vocab_size") or config["vocab_size"]
    for name, size in (("vocab.json", config["vocab_size"]), ("target_vocab.json", target)):
        path = model_dir / name
        if not path.is_file():
            continue
        vocab = read_json_object(path, "the file that tokenizer.save_pretrained wrote")
        owners: dict[int, str] = {}
        for token, i in vocab.items():
            if not _is_int(i) or not 0 <= i < size:
                raise HFImportError(
                    f"{path}: token {_show(token)} has id {_show(i)}, outside the model's "
                    f"{size} embeddings (0 to {size - 1}); {_VOCAB_FIX}"
                )
            if i in owners:
                raise HFImportError(
                    f"{path}: tokens {_show(owners[i])} and {_show(token)} both have id {i}; "
                    f"an id must name one token, or decoding picks one of them; {_VOCAB_FIX}"
                )
            owners[i] = token
        pad_id = config["pad_token_id"]
        if pad not in vocab:
            raise HFImportError(
                f"{path}: has no pad token {pad!r} (tokenizer_config.json's pad_token; "
                f"config.json's pad_token_id is {pad_id}); {_VOCAB_FIX}"
            )
        if vocab[pad] != pad_id:
            raise HFImportError(
                f"{path}: the pad token {pad!r} has id {vocab[pad]} but config.json's "
                f"pad_token_id is {pad_id}; {_VOCAB_FIX} (or set pad_token_id to "
                f"{vocab[pad]})"
            )


def parameter_estimate(config: dict) -> int:
    """The parameters config.json implies (with the position tables), from fields check_config passed."""
    d, ff = config["d_model"], max(config["encoder_ffn_dim"], config["decoder_ffn_dim"])
    source, target = config["vocab_size"], config.get("decoder_vocab_size") or config["vocab_size"]
    embeddings = source + (target if config.get("share_encoder_decoder_embeddings") is False else 0)
    embeddings += 0 if config.get("tie_word_embeddings", True) else target  # an output projection of its own
    attention, feed_forward = 4 * d * d + 4 * d, 2 * d * ff + ff + d
    return (
        config["encoder_layers"] * (attention + feed_forward + 4 * d)
        + config["decoder_layers"] * (2 * attention + feed_forward + 6 * d)
        + embeddings * d
        + target
        + 2 * config["max_position_embeddings"] * d
    )


IMPORT_MEMORY = 1.5  # an export's peak resident memory over the fp32 weights (check_memory)


def check_memory(model_dir: Path, config: dict, limit: int | None = None, estimate=None) -> None:
    """Refuses, before anything is allocated, a config whose model cannot fit in this machine's memory.

    Args:
        model_dir: the model directory.
        config: config.json, checked by check_config.
        limit: bytes there are (default: seq2onnx.model.config.available_memory(), physical or cgroup).
        estimate: config -> parameters (default parameter_estimate: BART-style fields; T5 has its own).

    Raises:
        HFImportError: naming config.json's sizes, the bytes needed and the memory there is.
    """
    limit = available_memory() if limit is None else limit
    params = (estimate or parameter_estimate)(config)
    encoder = config.get("encoder_layers", config.get("num_layers"))
    decoder = config.get("decoder_layers", config.get("num_decoder_layers") or encoder)
    # One float32 copy: ours takes the transformers model's own tensors (export/hf/read.py) and the export
    # streams them to disk; half again for what runs beside it (the validation's sessions, a table's int8
    # codes being made): 1.49x and 1.67x the fp32 weights measured at NLLB-1.3B size
    need = IMPORT_MEMORY * 4 * params
    if limit is not None and need > limit:
        raise HFImportError(
            f"{model_dir / 'config.json'}: d_model {config['d_model']}, {encoder}+"
            f"{decoder} layers and vocab_size {config['vocab_size']} make about {params:,} "
            f"parameters, which need about {gib(need)} to import, more than this machine's {gib(limit)}; "
            "check those fields (or export on a machine with more memory)"
        )


def read_generation(model_dir: Path) -> dict:
    """generation_config.json as an object ({} when the directory has none).

    Raises:
        HFImportError: unreadable, invalid JSON, or not an object.
    """
    path = model_dir / "generation_config.json"
    if not os.path.lexists(path):  # present but not a file (a directory, a link to a device): refused by name
        return {}
    return read_json_object(path, "the file that save_pretrained wrote (or delete it)")
