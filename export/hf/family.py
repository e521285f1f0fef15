"""One small class per Hugging Face model family, registered by config.json's model_type (issue 35, item 6).

A family holds what differs between the encoder-decoders the importer reads: its config's fields
(which it honours, and which it refuses by name), how its weights map onto ours, which
SentencePiece files its tokenizer needs, its language tokens, and its decoding defaults. What all
families share stays in read.py (weights, positions), tokens.py (the id maps) and bundle.py.

Each family lives in its own module, export/hf/family_<name>.py, and registers itself with
@register; `families()` imports every such module, so adding a family is one new file. This is how
CTranslate2's converters register one loader per config class.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import ClassVar

from . import checks as C
from .checks import HFImportError
from .weights_check import check_weights, weight_headers

_REGISTRY: dict[str, type[Family]] = {}
# generation_config.json (or config.json) fields that change generate()'s output and that no host emulates:
# field -> the value that leaves generate() as the bundle decodes (refused by name when set otherwise).
NEUTRAL_GENERATION = {
    "do_sample": False,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "encoder_repetition_penalty": 1.0,
    "exponential_decay_length_penalty": None,
    "sequence_bias": None,
    "begin_suppress_tokens": None,
    "max_new_tokens": None,
    "min_new_tokens": None,
    "forced_decoder_ids": None,
    "constraints": None,
    "force_words_ids": None,
}


def register(cls: type[Family]) -> type[Family]:
    """Class decorator: makes `cls` the family of its model_type."""
    _REGISTRY[cls.model_type] = cls
    return cls


def families() -> dict[str, type[Family]]:
    """model_type -> family class, every export/hf/family_*.py module imported once."""
    package = __name__.rpartition(".")[0]
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name.startswith("family_"):
            importlib.import_module(f"{package}.{info.name}")
    return dict(sorted(_REGISTRY.items()))


def family_of(config: dict, path: Path) -> Family:
    """The family of a config.json.

    Raises:
        HFImportError: no model_type, or one no family reads (naming the ones that exist).
    """
    known = families()
    if "model_type" not in config:
        names = ", ".join(f'"{k}" for {c.title}' for k, c in known.items())
        raise HFImportError(
            f"{path}: has no model_type; restore the config.json that save_pretrained writes ({names})"
        )
    kind = config["model_type"]
    if kind not in known:
        names = ", ".join(f"{k} ({c.title})" for k, c in known.items())
        raise HFImportError(
            f"{path}: model_type {kind!r} is not supported; this importer reads {names} "
            "(other encoder-decoders: train with `seq2onnx train` or convert elsewhere)"
        )
    return known[kind]()


class Family:
    """What one model family does its own way; a subclass per family sets the class attributes.

    Attributes:
        model_type: config.json's model_type.
        title: what the family is, for messages ("Marian (OPUS-MT)").
        pre_norm: the layers' norms: False after each sublayer, True before it (with a final norm per stack).
        embedding_norm: a LayerNorm after embeddings + positions (mBART's layernorm_embedding).
        spm_files: the source and target SentencePiece files the tokenizer reads.
        restore_spaces: the tokenizer turns the ▁ of unknown pieces back into spaces when decoding (Marian).
        fixed: config.json fields that transformers' modelling code never reads (fairseq's and Marian's
            switches, carried in published configs), each with the value that code computes. A config that
            says otherwise describes a model transformers runs differently from its own description: refused.
    """

    model_type: ClassVar[str]
    title: ClassVar[str]
    pre_norm: ClassVar[bool]
    embedding_norm: ClassVar[bool] = False
    spm_files: ClassVar[tuple[str, str]]
    restore_spaces: ClassVar[bool] = False
    fixed: ClassVar[dict[str, object]] = {}
    # A hub snapshot whose SentencePiece file every checkpoint of the family shares: where transformers 5
    # saved tokenizer.json alone, the error says to copy the file from there (it is fetched, not rebuilt).
    spm_snapshot: ClassVar[str | None] = None

    def check_directory(self, model_dir: Path, config: dict) -> None:
        """Every file's checks before transformers reads one (check_directory below: BART-style fields).

        Raises:
            HFImportError: the first value refused, in one line.
        """
        check_directory(model_dir, config)

    def read_model(self, hf, config: dict, model_dir: Path, generation: dict):
        """Our Transformer holding hf's weights, for a family whose layout is not the BART-style one that
        read.py reads (T5); None: read.py reads it."""
        return None

    def check_config(self, model_dir: Path, config: dict, generation: dict) -> None:
        """Refuses, by name, each field whose value this family's transformers class does not compute,
        and each generation field that changes generate()'s output in a way no host emulates.

        Raises:
            HFImportError: naming the file, the field, its value and the fix.
        """
        for field, computed in self.fixed.items():
            value = config.get(field)
            if value is not None and value != computed:
                raise HFImportError(
                    f"{model_dir / 'config.json'}: {field} is {value!r}, but transformers' {self.title} "
                    f"code never reads it and computes {field}={computed!r}: the weights were made for "
                    "another implementation; "
                    f"not supported (set {field} to {computed!r} if generate()'s output is the one you want)"
                )
        for field, neutral in NEUTRAL_GENERATION.items():
            source = "generation_config.json" if generation.get(field) is not None else "config.json"
            value = generation.get(field, config.get(field)) if source == "config.json" else generation[field]
            if value not in (None, neutral, [] if neutral is None else neutral):
                raise HFImportError(
                    f"{model_dir / source}: {field} is {value!r}, which changes generate()'s output "
                    f"and is not emulated by the bundle's search; set it to {neutral!r} or remove it"
                )

    def model_fields(self, config: dict) -> dict:
        """The ModelConfig fields this family decides (the rest are read from the weights in read.py)."""
        return {"pre_norm": self.pre_norm, "embedding_norm": self.embedding_norm}

    def weight_pairs(self, model, hf) -> list[tuple]:
        """(our tensor, transformers' tensor) for every weight outside the layers and the embedding tables
        that this family has beyond the shared layout (read.py copies the shared ones): here the final
        norms."""
        if not self.pre_norm:
            return []
        enc, dec = hf.get_encoder(), hf.get_decoder()
        return [
            (model.encoder_norm.weight, enc.layer_norm.weight),
            (model.encoder_norm.bias, enc.layer_norm.bias),
            (model.decoder_norm.weight, dec.layer_norm.weight),
            (model.decoder_norm.bias, dec.layer_norm.bias),
        ]

    def spm_paths(self, model_dir: Path, tokenizer) -> tuple[Path, Path]:
        """The SentencePiece models the hosts tokenize with: (source, the one the tokenizer decodes with).

        Raises:
            HFImportError: a missing file, naming it and where it comes from.
        """
        source, target = (model_dir / name for name in self.spm_files)
        for path in (source, target):
            if not path.is_file():
                raise HFImportError(self.missing_spm(model_dir, path))
        return source, target

    def missing_spm(self, model_dir: Path, path: Path) -> str:
        """The one-line error for a missing SentencePiece file."""
        if self.spm_snapshot and (model_dir / "tokenizer.json").is_file():
            return (
                f"{path}: missing (transformers 5's save_pretrained writes tokenizer.json only); the hosts "
                f"tokenize with SentencePiece: copy {path.name} from the hub snapshot this model was "
                f"fine-tuned from, e.g. hf_hub_download('{self.spm_snapshot}', '{path.name}'), into "
                f"{model_dir}"
            )
        return (
            f"{path}: missing; the tokenizer's SentencePiece model is needed (save the tokenizer with "
            "save_pretrained into the model directory)"
        )

    def languages(self, tokenizer, size: int) -> dict:
        """The tokens section's language entries (languages, target_lang_in, ...); {} for a one-pair model.

        Args:
            tokenizer: the directory's transformers tokenizer.
            size: ids below this are the model's (min of the source and target vocabularies).
        """
        return {}

    def decoding_defaults(self, generation: dict, config: dict, max_positions: int) -> dict:
        """The bundle's decoding defaults from generation_config.json (transformers' own defaults where it
        is silent).

        transformers' max_length and min_length count the decoder start token; ours count generated
        tokens (docs/decoding.md), hence the - 1. Its early_stopping (True, False: transformers' default and
        OPUS-MT's, or "never") names the beam_convention, which stops sentences as generate() does
        (runtime/search.py EARLY_STOPPING). Its forced_eos_token_id (OPUS-MT and mBART set the end token) is
        recorded as forced_eos: every host then forces the end token at a sentence's last allowed step, as
        generate() does.

        Raises:
            HFImportError: a forced_eos_token_id other than the end token, or an early_stopping other than
                True, False or "never".
        """

        def get(key, fallback):
            value = generation.get(key, config.get(key))
            return fallback if value is None else value

        max_length = int(get("max_length", 20))
        decoding = {
            "beam_size": int(get("num_beams", 1)),
            "length_penalty": float(get("length_penalty", 1.0)),
            "max_length_a": 0.0,
            "max_length_b": max(1, min(max_length - 1, max_positions)),
            "min_length": max(int(get("min_length", 0)) - 1, 0),
            "beam_convention": _beam_convention(get("early_stopping", False)),
        }  # generate()'s finished hypotheses and stopping (docs/decoding.md)
        forced = get("forced_eos_token_id", None)
        if isinstance(forced, list) and len(forced) == 1:
            forced = forced[0]
        if forced is not None:
            # transformers' ForcedEOSTokenLogitsProcessor: the end token at the last allowed position
            # (runtime/prefix.py)
            if forced != config.get("eos_token_id"):
                raise HFImportError(
                    f"generation_config.json: forced_eos_token_id {forced!r} is not the end token "
                    f"{config.get('eos_token_id')!r}; only the end token can be forced (remove the "
                    "field or set it to eos_token_id)"
                )
            decoding["forced_eos"] = True
        return decoding


def _beam_convention(early_stopping) -> str:
    """The beam_convention that stops sentences as generate() with this early_stopping does
    (docs/decoding.md).
    """
    conventions = {True: "transformers", False: "transformers_heuristic", "never": "transformers_never"}
    if isinstance(early_stopping, bool) or early_stopping == "never":
        return conventions[early_stopping]
    raise HFImportError(
        f'generation_config.json: early_stopping {early_stopping!r} is not one of true, false, "never" '
        "(transformers' values); set one of them"
    )


def extra_special_tokens(tokenizer) -> list[str]:
    """transformers 5's extra_special_tokens (a list, or a dict of named ones), or 4.x's
    additional_special_tokens."""
    extra = getattr(tokenizer, "extra_special_tokens", None)
    if extra is None:
        extra = getattr(tokenizer, "additional_special_tokens", None) or []
    return [str(t) for t in (extra.values() if isinstance(extra, dict) else extra)]


def check_directory(model_dir: Path, config: dict, *, fields=None, estimate=None) -> None:
    """Every check of export/hf/checks.py and weights_check.py, in an order that names the first cause:
    config.json, generation_config.json, the vocabularies, the weights' headers against config.json, then
    memory.

    Args:
        model_dir: a directory whose config.json names a model_type the importer knows.
        config: its config.json.
        fields: (model_dir, config) -> None, config.json's own checks (default check_config: BART-style
            fields; T5's family has its own).
        estimate: config -> parameters, for check_memory.

    Raises:
        HFImportError: the first value refused, in one line.
    """
    (fields or C.check_config)(model_dir, config)
    C.check_generation(model_dir, config, C.read_generation(model_dir))
    C.check_vocab(model_dir, config, C.pad_token(model_dir))
    tensors = weight_headers(model_dir)
    if tensors:
        check_weights(model_dir, config, tensors)
    C.check_memory(model_dir, config, estimate=estimate)
