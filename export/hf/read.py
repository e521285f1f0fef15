"""A Hugging Face model directory (Marian / OPUS-MT, M2M100 / NLLB, mBART-50) -> our Transformer with its
weights.

Every architectural value is read from the model's own config and weights, never from a library
default: the activation, the embedding scale, post- or pre-norm with the final norms, the logits
bias, shared or separate embeddings and output projection, the special ids, and the position
table, copied from the model as it computes it (HF Marian's table puts sines then cosines, fairseq's
M2M100 table is offset by padding_idx + 1, mBART's is learned and offset by 2: none is ours, so none is
regenerated). What differs between families (norms, weights beyond the shared layout, refused config
fields) is each family's class (export/hf/family.py).

Weights are taken from the loaded transformers model's modules (not from state-dict names), so a
renamed parameter in a later transformers cannot be silently skipped: every tensor is copied into a
model whose every parameter must be filled (`_copy` counts them).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

import torch

from seq2onnx.model.config import ACTIVATIONS, ModelConfig
from seq2onnx.model.transformer import Transformer

from .checks import (
    ACTIVATION_NAMES,
    HFImportError,
    looks_like_hf,
    read_generation,
    read_json_object,
)
from .family import Family, family_of

WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)
_CONFIG_FIX = "the config.json that save_pretrained writes"


def is_hf_dir(path: str | Path) -> bool:
    """True for a directory that save_pretrained wrote: a config.json with a model_type, or a damaged
    config.json beside the files save_pretrained writes (its error then names config.json; checks.py)."""
    return looks_like_hf(path)


def read_config(model_dir: Path) -> dict:
    """config.json, checked for a model_type this importer knows, then every file the import reads
    (export/hf/checks.py), before transformers reads any.

    Raises:
        HFImportError: naming the file, the field, the value and the fix (config.json's model_type, the
            missing weights, a value of config.json or generation_config.json, vocab.json, the weights'
            header).
    """
    path = model_dir / "config.json"
    config = read_json_object(path, _CONFIG_FIX)
    family = family_of(config, path)  # export/hf/family_*.py: one class per model_type
    if not any((model_dir / name).is_file() for name in WEIGHT_FILES):
        raise HFImportError(
            f"{model_dir}: no weights ({' or '.join(WEIGHT_FILES[:2])}); save the model with "
            "save_pretrained (or copy its weights file) into this directory"
        )
    family.check_directory(model_dir, config)  # family.check_directory, or the family's own fields (T5)
    family.check_config(model_dir, config, read_generation(model_dir))  # its fields, refused by name
    return config


@dataclass
class Imported:
    """An imported model: ours, with what the bundle needs besides the graphs.

    The transformers model it was read from is not kept: an export holds one copy of the weights.

    Attributes:
        model: our Transformer, fp32, eval mode, holding the imported weights.
        kind: config.json's model_type.
        generation: generation_config.json's fields (or {}).
        family: the model_type's family (export/hf/family.py).
    """

    model: Transformer
    kind: str
    generation: dict
    family: Family


def load_hf(model_dir: Path):
    """Loads the transformers model of a directory in fp32, eval mode.

    Raises:
        HFImportError: transformers is missing, or cannot read the directory (naming why).
    """
    try:
        from transformers import AutoModelForSeq2SeqLM
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise HFImportError(
            "importing a Hugging Face model needs transformers: pip install 'seq2onnx[hf]'"
        ) from None
    # our progress and errors are our own lines; its bars and notices are noise here
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model, info = AutoModelForSeq2SeqLM.from_pretrained(
            str(model_dir), dtype=torch.float32, output_loading_info=True
        )
    except Exception as e:  # transformers raises many kinds; one line with its words
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HFImportError(f"{model_dir}: transformers cannot load this model: {first}") from None
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        # transformers fills them at random, differently at each load (e.g. tie_word_embeddings false in 5.x
        # unties the encoder's and decoder's tables too, which a checkpoint saved tied does not hold)
        raise HFImportError(
            f"{model_dir}: the weights lack {len(missing)} tensors the config implies (e.g. "
            f"{missing[:3]}), which transformers would fill at random; restore the "
            "config.json saved with these weights (tie_word_embeddings, the layer counts) or "
            "the weights"
        )
    return model.eval()


def _positions(hf, n: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The position tables as the model computes them, (encoder, decoder): each stack's embed_positions
    output for n tokens, captured by a hook on a forward pass of each stack with its layers taken out
    (only the embeddings run; not the whole model, whose output projection would make n rows of logits
    and read the whole table: 240 MB at OPUS-MT size, the import's peak)."""
    enc, dec = hf.get_encoder(), hf.get_decoder()
    captured: dict[str, torch.Tensor] = {}
    hooks = [
        stack.embed_positions.register_forward_hook(
            lambda m, a, out, side=side: captured.__setitem__(side, out)
        )
        for side, stack in (("encoder", enc), ("decoder", dec))
    ]
    layers = enc.layers, dec.layers
    try:
        enc.layers, dec.layers = torch.nn.ModuleList(), torch.nn.ModuleList()
        ids = torch.full((1, n), 1 if pad_id != 1 else 2, dtype=torch.long)  # any non-pad token
        with torch.no_grad():
            memory = enc(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
            dec(input_ids=ids, encoder_hidden_states=memory, encoder_attention_mask=torch.ones_like(ids))
    finally:
        enc.layers, dec.layers = layers
        for h in hooks:
            h.remove()
    tables = {side: t.detach().reshape(-1, t.shape[-1])[-n:].float() for side, t in captured.items()}
    if set(tables) != {"encoder", "decoder"} or tables["encoder"].shape[0] != n:
        raise HFImportError(
            f"could not read the position table ({sorted(tables)} captured): this model's "
            "embed_positions is not what this importer knows"
        )
    return tables["encoder"], tables["decoder"]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() or (a.shape == b.shape and torch.equal(a, b))


def model_config(
    config: dict, hf, model_dir: Path, generation: dict, family: Family, separate_positions: bool = False
) -> ModelConfig:
    """Our ModelConfig from a transformers model's config and its weights.

    Raises:
        HFImportError: an activation we cannot run, or a config that disagrees with its weights.
    """
    enc, dec = hf.get_encoder(), hf.get_decoder()
    src_embed, tgt_embed = enc.embed_tokens.weight, dec.embed_tokens.weight
    head = hf.get_output_embeddings().weight
    src_vocab, tgt_vocab = src_embed.shape[0], head.shape[0]
    declared = config.get("vocab_size")
    if declared is not None and declared != src_vocab:
        raise HFImportError(
            f"{model_dir / 'config.json'}: vocab_size is {declared} but the weights' embedding has "
            f"{src_vocab} rows; the config does not belong to these weights (fix vocab_size or the weights)"
        )
    activation = ACTIVATION_NAMES.get(str(config.get("activation_function")))
    if activation not in ACTIVATIONS:
        raise HFImportError(
            f"{model_dir / 'config.json'}: activation_function {config.get('activation_function')!r} "
            f"is not supported; supported: {', '.join(sorted(ACTIVATION_NAMES))}"
        )
    layer = enc.layers[0]
    suppressed, renormalize = suppression(generation, model_dir)
    start = generation.get("decoder_start_token_id", config.get("decoder_start_token_id"))
    eos, pad = config["eos_token_id"], config["pad_token_id"]
    bos = config.get("bos_token_id")
    return ModelConfig(
        src_vocab_size=src_vocab,
        tgt_vocab_size=tgt_vocab,
        d_model=config["d_model"],
        n_heads=config["encoder_attention_heads"],
        n_encoder_layers=len(enc.layers),
        n_decoder_layers=len(dec.layers),
        d_ff=layer.fc1.out_features,
        dropout=0.0,
        max_positions=config["max_position_embeddings"],
        **family.model_fields(config),
        tie_embeddings=_same(head, tgt_embed),
        share_vocab=_same(src_embed, tgt_embed),
        layer_norm_eps=layer.self_attn_layer_norm.eps,
        pad_id=pad,
        unk_id=config.get("unk_token_id", pad) or 0,
        bos_id=bos if isinstance(bos, int) and 0 <= bos < min(src_vocab, tgt_vocab) else start,
        eos_id=eos,
        decoder_start_id=start,
        activation=activation,
        scale_embedding=bool(config.get("scale_embedding", False)),
        logits_bias=getattr(hf, "final_logits_bias", None) is not None,
        stored_positions=True,
        separate_positions=separate_positions,
        suppressed_ids=tuple(suppressed),
        renormalize=renormalize,
    )


def suppression(generation: dict, model_dir: Path) -> tuple[list[int], bool]:
    """The ids generate() never picks (bad_words_ids of one token, suppress_tokens), and renormalize_logits.

    Raises:
        HFImportError: bad_words_ids with sequences of several tokens.
    """
    bad_words = generation.get("bad_words_ids") or []
    if any(len(ids) != 1 for ids in bad_words):
        raise HFImportError(
            f"{model_dir / 'generation_config.json'}: bad_words_ids has sequences of several tokens; "
            "only single tokens are supported (remove the longer ones)"
        )
    suppressed = sorted(
        {ids[0] for ids in bad_words if len(ids) == 1} | set(generation.get("suppress_tokens") or [])
    )
    return suppressed, bool(generation.get("renormalize_logits", False))


def _attention(ours, theirs) -> list[tuple]:
    return [
        (ours.w_q, theirs.q_proj),
        (ours.w_k, theirs.k_proj),
        (ours.w_v, theirs.v_proj),
        (ours.w_o, theirs.out_proj),
    ]


def embedding_pairs(model: Transformer, hf) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ours, theirs) of the embedding tables and the output projection, each shared tensor once."""
    enc, dec = hf.get_encoder(), hf.get_decoder()
    pairs = [(model.src_embed.weight, enc.embed_tokens.weight)]
    if model.tgt_embed is not model.src_embed:
        pairs.append((model.tgt_embed.weight, dec.embed_tokens.weight))
    if model.generator.weight is not model.tgt_embed.weight:
        pairs.append((model.generator.weight, hf.get_output_embeddings().weight))
    return pairs


def _copy(model: Transformer, hf, positions: tuple[torch.Tensor, torch.Tensor], family: Family) -> None:
    """Gives every parameter of model its tensor of hf (the same storage, not a copy); every parameter of
    model must be written exactly once."""
    enc, dec = hf.get_encoder(), hf.get_decoder()
    pairs = embedding_pairs(model, hf)
    if model.generator.bias is not None:
        pairs.append((model.generator.bias, hf.final_logits_bias.reshape(-1)))
    pairs.extend(_layer_pairs(model, enc, dec))
    pairs.extend(family.weight_pairs(model, hf))  # the final norms, an embedding norm: the family's own
    assign(model, pairs)
    with torch.no_grad():
        model.positions.copy_(positions[0])
        if model.cfg.separate_positions:
            model.tgt_positions.copy_(positions[1])


def assign(model: Transformer, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Makes each of our tensors hold its transformers tensor (the same storage, not a copy).

    Raises:
        HFImportError: a shape that differs, or a parameter of ours that no pair writes.
    """
    written = set()
    with torch.no_grad():
        for ours, theirs in pairs:
            if ours.shape != theirs.shape:
                raise HFImportError(
                    f"a weight of shape {tuple(theirs.shape)} does not fit ours {tuple(ours.shape)}; "
                    "the config does not describe these weights"
                )
            # ours takes their tensor itself: no second copy of the model while it is imported
            ours.data = theirs.detach()
            written.add(id(ours))
    missed = [name for name, p in model.named_parameters() if id(p) not in written]
    if missed:
        raise HFImportError(
            f"parameters {missed[:5]} were not found in the transformers model; this importer does not "
            "know this variant of the architecture"
        )


def _affine(ours, theirs) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A linear or norm layer's (ours, theirs) pairs: its weight, then its bias."""
    return [(ours.weight, theirs.weight), (ours.bias, theirs.bias)]


def _layer_pairs(model: Transformer, enc, dec) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The (ours, theirs) pairs of every encoder layer, then every decoder layer.

    Args:
        model: our model.
        enc: the transformers model's encoder (hf.get_encoder()).
        dec: its decoder (hf.get_decoder()).

    Returns:
        Attention projections, feed-forward layers and norms, layer by layer.
    """
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    for ours, theirs in zip(model.encoder_layers, enc.layers):
        for a, b in _attention(ours.self_attn, theirs.self_attn):
            pairs += _affine(a, b)
        pairs += _affine(ours.feed_forward.w_1, theirs.fc1)
        pairs += _affine(ours.feed_forward.w_2, theirs.fc2)
        pairs += _affine(ours.sub_attn.norm, theirs.self_attn_layer_norm)
        pairs += _affine(ours.sub_ff.norm, theirs.final_layer_norm)
    for ours, theirs in zip(model.decoder_layers, dec.layers):
        for a, b in _attention(ours.self_attn, theirs.self_attn) + _attention(
            ours.cross_attn, theirs.encoder_attn
        ):
            pairs += _affine(a, b)
        pairs += _affine(ours.feed_forward.w_1, theirs.fc1)
        pairs += _affine(ours.feed_forward.w_2, theirs.fc2)
        pairs += _affine(ours.sub_self.norm, theirs.self_attn_layer_norm)
        pairs += _affine(ours.sub_cross.norm, theirs.encoder_attn_layer_norm)
        pairs += _affine(ours.sub_ff.norm, theirs.final_layer_norm)
    return pairs


def empty_model(cfg: ModelConfig) -> Transformer:
    """Our Transformer of cfg on the CPU, eval mode, its parameters allocated but not initialised (assign
    fills them); buffers computed from the config (T5's bucket tables) are computed."""
    with torch.device("meta"):  # shapes only: each parameter takes the transformers model's own tensor
        model = Transformer(cfg)
    tied = model.generator.weight is model.tgt_embed.weight
    model = model.to_empty(device="cpu").eval()
    if tied:  # to_empty makes each module's tensor its own: tie them again, as Transformer does
        model.generator.weight = model.tgt_embed.weight
    if cfg.relative_buckets:  # to_empty left them uninitialised: compute them again
        from seq2onnx.model.layers import bucket_table

        for side, both_ways in (("encoder", True), ("decoder", False)):
            getattr(model, f"{side}_buckets").copy_(
                bucket_table(both_ways, cfg.relative_buckets, cfg.relative_max_distance, cfg.max_positions)
            )
    return model


def import_hf(model_dir: str | Path) -> Imported:
    """Reads a Hugging Face Marian, M2M100/NLLB or mBART-50 directory into our Transformer.

    Args:
        model_dir: a directory as save_pretrained writes it.

    Returns:
        The imported model with the transformers model and the generation config.

    Raises:
        HFImportError: an unsupported or damaged directory (one line: the file, the value, the fix).
    """
    model_dir = Path(model_dir)
    config = read_config(model_dir)  # every file checked before transformers reads one (export/hf/checks.py)
    hf = load_hf(model_dir)
    generation = read_generation(model_dir)
    family = family_of(config, model_dir / "config.json")
    own = family.read_model(hf, config, model_dir, generation)  # T5: a layout of its own (family_t5.py)
    if own is not None:
        del hf
        gc.collect()
        return Imported(model=own, kind=config["model_type"], generation=generation, family=family)
    n = int(config["max_position_embeddings"])
    positions = _positions(hf, n, int(config["pad_token_id"]))
    # One table where both stacks compute the same (Marian's, fairseq's sinusoids), else one each (mBART's
    # learned ones)
    cfg = model_config(config, hf, model_dir, generation, family, not torch.equal(*positions))
    model = empty_model(cfg)  # uninitialised until _copy fills them
    _copy(model, hf, positions, family)
    del hf
    gc.collect()
    return Imported(model=model, kind=config["model_type"], generation=generation, family=family)
