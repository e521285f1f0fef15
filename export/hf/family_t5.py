"""T5 (t5, T5 v1.1, flan-T5, MADLAD-400) and mT5: pre-norm with T5's RMS norm (a scale, no mean, no bias), no
biases anywhere, unscaled attention scores plus a relative position bias (buckets learned per head, in each
stack's first layer and shared by the rest) instead of a position table, a ReLU or gated-GELU feed-forward,
one embedding table for both stacks, an output projection tied (with the decoder output scaled by
d_model ** -0.5) or its own, the decoder starting from the pad token, and one SentencePiece unigram model
(spiece.model) with the sentinel <extra_id_N> tokens after its pieces.

Its config.json names its fields its own way (num_layers, num_heads, d_kv, d_ff, feed_forward_proj), and its
weights sit in encoder.block.N.layer.M, so it has its own checks and its own weight map; what our model
computes for it is model/config.py's T5 fields.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from seq2onnx.model.config import ModelConfig

from . import checks as C
from .checks import HFImportError
from .family import Family, check_directory, register

# transformers' dense_act_fn -> ours (model/config.py ACTIVATIONS)
T5_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "silu": "swish", "swish": "swish"}
# A T5 has no position table: the graphs are traced for this many positions unless config.json's n_positions
# says otherwise (t5-small's carries 512), and the hosts refuse longer sources and translations.
DEFAULT_POSITIONS = 512
# MADLAD-400's target-language tags. SentencePiece reads one in a text as "▁" then the tag, where the
# tokenizer reads the tag alone: so the hosts put it from target_lang, not from the text.
_TAG = re.compile(r"<2[^<>\s]+>")


def _feed_forward(v, n: int):
    gated = v.split("-", 1)[1] if isinstance(v, str) and v.startswith("gated-") else v
    ok = gated in T5_ACTIVATIONS
    return None if ok else f"one of {', '.join(sorted(T5_ACTIVATIONS))}, or gated-<one of them>"


def _eos(v, n: int):
    single = v[0] if isinstance(v, list) and len(v) == 1 else v
    return C._token_id(single, n)


T5_RULES = {
    "d_model": (C._count(1), True, C._RESTORE),
    "d_kv": (C._count(1), True, C._RESTORE),
    "d_ff": (C._count(1), True, C._RESTORE),
    "num_layers": (C._count(1), True, C._RESTORE),
    "num_decoder_layers": (C._count(1), False, C._RESTORE),
    "num_heads": (C._count(1), True, C._RESTORE),
    "vocab_size": (C._count(1), True, C._RESTORE),
    "relative_attention_num_buckets": (C._count(2), False, C._RESTORE),
    "relative_attention_max_distance": (C._count(1), False, C._RESTORE),
    "layer_norm_epsilon": (C._finite, False, C._RESTORE),
    "n_positions": (C._count(C.MIN_POSITIONS), False, C._RESTORE + " (the longest input, e.g. 512)"),
    "feed_forward_proj": (_feed_forward, False, "other activations are not supported by this importer"),
    "pad_token_id": (C._token_id, True, C._ID_FIX),
    "eos_token_id": (_eos, True, C._ID_FIX),
}


def check_t5_config(model_dir: Path, config: dict) -> None:
    """config.json's T5 fields (T5_RULES).

    Raises:
        HFImportError: naming config.json, the field, its value and the fix.
    """
    C._check_fields(model_dir / "config.json", config, T5_RULES, config.get("vocab_size") or 1)
    buckets = config.get("relative_attention_num_buckets", 32)
    reach = config.get("relative_attention_max_distance", 128)
    if buckets < 4 or reach <= buckets // 2:
        # the decoder's exact buckets are buckets // 2: a shorter reach makes transformers' logarithmic
        # buckets negative (an IndexError in its compute_bias)
        raise HFImportError(
            f"{model_dir / 'config.json'}: relative_attention_num_buckets {buckets} and "
            f"relative_attention_max_distance {reach}: T5 needs at least 4 buckets and a distance above half "
            f"of them; {C._RESTORE}"
        )


def t5_parameters(config: dict) -> int:
    """The parameters a T5 config.json implies (an output projection of its own counted: the larger case)."""
    d, ff, inner = config["d_model"], config["d_ff"], config["num_heads"] * config["d_kv"]
    gated = str(config.get("feed_forward_proj", "relu")).startswith("gated-")
    encoder, decoder = config["num_layers"], config.get("num_decoder_layers") or config["num_layers"]
    attention, feed_forward = 4 * d * inner, (3 if gated else 2) * d * ff
    return (
        encoder * (attention + feed_forward + 2 * d)
        + decoder * (2 * attention + feed_forward + 3 * d)
        + 2 * config["vocab_size"] * d
    )


def _stack_pairs(model, hf) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ours, theirs) of every layer of both stacks, their relative bias tables and final norms."""
    pairs = []
    for ours, theirs, stack in (
        (model.encoder_layers, hf.encoder.block, "encoder"),
        (model.decoder_layers, hf.decoder.block, "decoder"),
    ):
        first = theirs[0].layer[0].SelfAttention
        pairs.append((getattr(model, f"{stack}_relative").weight, first.relative_attention_bias.weight))
        pairs.append((getattr(model, f"{stack}_norm").weight, getattr(hf, stack).final_layer_norm.weight))
        for layer, block in zip(ours, theirs):
            attentions = [
                (
                    layer.self_attn,
                    block.layer[0].SelfAttention,
                    layer.sub_attn if stack == "encoder" else layer.sub_self,
                    block.layer[0],
                )
            ]
            if stack == "decoder":
                cross = block.layer[1]
                attentions.append((layer.cross_attn, cross.EncDecAttention, layer.sub_cross, cross))
            for mine, attn, sub, their_layer in attentions:
                pairs += [
                    (mine.w_q.weight, attn.q.weight),
                    (mine.w_k.weight, attn.k.weight),
                    (mine.w_v.weight, attn.v.weight),
                    (mine.w_o.weight, attn.o.weight),
                    (sub.norm.weight, their_layer.layer_norm.weight),
                ]
            ff_layer = block.layer[-1]
            dense, ff = ff_layer.DenseReluDense, layer.feed_forward
            if ff.w_3 is not None:
                pairs += [(ff.w_1.weight, dense.wi_0.weight), (ff.w_3.weight, dense.wi_1.weight)]
            else:
                pairs.append((ff.w_1.weight, dense.wi.weight))
            pairs += [
                (ff.w_2.weight, dense.wo.weight),
                (layer.sub_ff.norm.weight, ff_layer.layer_norm.weight),
            ]
    return pairs


def output_scale(hf) -> float:
    """The factor transformers puts on the decoder's output before lm_head: d_model ** -0.5 or 1, found by
    running the model (transformers 5 decides it by T5Config.scale_decoder_outputs, 4.x by
    tie_word_embeddings, MT5 5.x never): each candidate's logits against the model's own.

    Raises:
        HFImportError: neither candidate gives the model's logits.
    """
    ids = torch.tensor([[4, 5, 6, hf.config.eos_token_id if isinstance(hf.config.eos_token_id, int) else 1]])
    start = torch.tensor([[hf.config.decoder_start_token_id, 4]])
    with torch.no_grad():
        logits = hf(input_ids=ids, decoder_input_ids=start).logits
        memory = hf.encoder(input_ids=ids).last_hidden_state
        hidden = hf.decoder(input_ids=start, encoder_hidden_states=memory).last_hidden_state
        candidates = (1.0, hf.config.d_model**-0.5)
        gaps = {s: (hf.lm_head(hidden * s) - logits).abs().max().item() for s in candidates}
    scale = min(gaps, key=gaps.get)
    if gaps[scale] > 1e-4 * max(1.0, logits.abs().max().item()):
        raise HFImportError(
            f"the model's logits are not lm_head(decoder output x 1 or x d_model ** -0.5) "
            f"(differences {gaps}): a T5 variant this importer does not know"
        )
    return scale


@register
class T5(Family):
    """T5ForConditionalGeneration (t5, T5 v1.1, flan-T5, MADLAD-400) with T5Tokenizer (spiece.model)."""

    model_type = "t5"
    title = "T5 (T5 v1.1, flan-T5, MADLAD-400)"
    pre_norm = True
    spm_files = ("spiece.model", "spiece.model")
    # transformers 5's save_pretrained writes tokenizer.json alone (Family.missing_spm)
    spm_snapshot = "google-t5/t5-small"

    def languages(self, tokenizer, size: int) -> dict:
        """MADLAD-400's target-language tags (<2fr>, <2de>, ...: the tokenizer's added tokens of that form) as
        the languages the hosts put before the source's pieces (a target_lang of "fr" puts <2fr>); {} for a
        model without them (t5's task prefixes are text)."""
        tags = {
            token[2:-1]: int(i)
            for token, i in tokenizer.get_vocab().items()
            if _TAG.fullmatch(token) and 0 <= int(i) < size
        }
        return {"languages": tags, "target_lang_in": "source_prefix"} if tags else {}

    def check_directory(self, model_dir: Path, config: dict) -> None:
        """family.check_directory with T5's field names (T5_RULES) and parameter count."""
        check_directory(model_dir, config, fields=check_t5_config, estimate=t5_parameters)

    def read_model(self, hf, config: dict, model_dir: Path, generation: dict):
        """Our Transformer of T5's fields (model/config.py), holding hf's own tensors.

        Raises:
            HFImportError: a T5 whose stacks do not share their embedding, or whose parts this importer
                does not know.
        """
        from .read import assign, embedding_pairs, empty_model

        cfg = _model_config(hf, config, model_dir, generation, _checked_activation(hf, model_dir))
        model = empty_model(cfg)
        assign(model, embedding_pairs(model, hf) + _stack_pairs(model, hf))
        return model


@register
class MT5(T5):
    """MT5ForConditionalGeneration (mT5) with T5Tokenizer (spiece.model); T5's layout."""

    model_type = "mt5"
    title = "mT5"
    spm_snapshot = "google/mt5-small"


def _checked_activation(hf, model_dir: Path) -> str:
    """The feed-forward's activation, after checking that the stacks share one embedding.

    Raises:
        HFImportError: the encoder's and decoder's embeddings differ, or an activation this importer does
            not know.
    """
    c = hf.config
    shared = hf.encoder.embed_tokens.weight
    if not _same(shared, hf.decoder.embed_tokens.weight):
        raise HFImportError(
            f"{model_dir}: the encoder's and decoder's embeddings differ; T5 shares one "
            "table (restore the weights save_pretrained wrote)"
        )
    activation = T5_ACTIVATIONS.get(c.dense_act_fn)
    if activation is None:
        raise HFImportError(
            f"{model_dir / 'config.json'}: the feed-forward's activation {c.dense_act_fn!r} is not "
            f"supported; supported: {', '.join(sorted(T5_ACTIVATIONS))}"
        )
    return activation


def _model_config(hf, config: dict, model_dir: Path, generation: dict, activation: str) -> ModelConfig:
    """Our ModelConfig of T5's fields: hf's config and tensors, config.json and generation_config.json."""
    from .read import suppression

    c = hf.config
    shared, head = hf.encoder.embed_tokens.weight, hf.get_output_embeddings().weight
    suppressed, renormalize = suppression(generation, model_dir)
    start = generation.get("decoder_start_token_id", config.get("decoder_start_token_id"))
    eos = c.eos_token_id[0] if isinstance(c.eos_token_id, list) else c.eos_token_id
    inner = c.num_heads * c.d_kv
    return ModelConfig(
        src_vocab_size=shared.shape[0],
        tgt_vocab_size=head.shape[0],
        d_model=c.d_model,
        n_heads=c.num_heads,
        n_encoder_layers=len(hf.encoder.block),
        n_decoder_layers=len(hf.decoder.block),
        d_ff=c.d_ff,
        dropout=0.0,
        max_positions=int(config.get("n_positions") or DEFAULT_POSITIONS),
        pre_norm=True,
        tie_embeddings=_same(head, shared),
        share_vocab=True,
        layer_norm_eps=c.layer_norm_epsilon,
        pad_id=c.pad_token_id,
        unk_id=c.pad_token_id,
        bos_id=start,
        eos_id=eos,
        decoder_start_id=start,
        activation=activation,
        scale_embedding=False,
        logits_bias=False,
        stored_positions=False,
        suppressed_ids=tuple(suppressed),
        renormalize=renormalize,
        d_kv=0 if inner == c.d_model else c.d_kv,  # 0: as every host computed it before T5
        norm="rms",
        attention_scale=False,
        linear_bias=False,
        relative_buckets=c.relative_attention_num_buckets,
        relative_max_distance=c.relative_attention_max_distance,
        gated=bool(c.is_gated_act),
        output_scale=output_scale(hf),
    )


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() or (a.shape == b.shape and torch.equal(a, b))
