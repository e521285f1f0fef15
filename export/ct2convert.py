"""A checkpoint -> CTranslate2 model, through ctranslate2's model-spec API (for `seq2onnx bench`).

CTranslate2 is the peer the ONNX runtime is measured against, so it must run the very same weights.
The mapping, checked against ctranslate2's own converters (opennmt_py.py, fairseq.py):

    ours                                     CTranslate2 spec
    src_embed / tgt_embed                    encoder.embeddings[0] / decoder.embeddings (scaled by sqrt(d))
    positions (our sinusoid table)           {encoder,decoder}.position_encodings.encodings
    self_attn w_q, w_k, w_v                  self_attention.linear[0] (fused along the output dim)
    self_attn w_o                            self_attention.linear[1]
    cross_attn w_q / w_k, w_v / w_o          attention.linear[0] / linear[1] (fused) / linear[2]
    sub_self / sub_attn norm                 self_attention.layer_norm
    sub_cross norm                           attention.layer_norm
    sub_ff norm                              ffn.layer_norm
    feed_forward w_1 / w_2                   ffn.linear_0 / ffn.linear_1
    encoder_norm / decoder_norm (pre-LN)     encoder.layer_norm / decoder.layer_norm
    generator (no bias)                      decoder.projection

Post-LN (`pre_norm=False`) maps onto CTranslate2's post-norm layers, which compute norm(x + f(x))
as ours do. Vocabularies are our SentencePiece pieces in id order (ids 0..3 are <pad>, <unk>, <s>,
</s>), so CTranslate2 tokens map back to our ids one to one. The caller feeds source pieces with
'</s>' appended (add_source_eos stays False) and CTranslate2 starts the decoder with '<s>'.

Only imported where ctranslate2 and torch are installed (the `[bench]` extra).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

CT2_MISSING = "ctranslate2 not installed: pip install 'seq2onnx[bench]'"


def ct2_available() -> tuple[bool, str]:
    """Whether ctranslate2 can be imported here, and the message to show when not."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return False, CT2_MISSING
    except Exception as e:  # a broken install (missing shared libraries) is as good as none
        return False, f"ctranslate2 cannot be imported ({type(e).__name__}: {e}): pip install 'seq2onnx[bench]'"
    return True, ""


def _np(t) -> np.ndarray:
    """A float32 copy: ModelSpec.optimize converts and quantizes its arrays in place."""
    return np.array(t.detach().cpu().float().numpy(), dtype=np.float32, copy=True)


def _linear(spec, *layers) -> None:
    """Sets a LinearSpec from one or more nn.Linear fused along the output dimension."""
    spec.weight = np.concatenate([_np(l.weight) for l in layers], axis=0)
    if all(l.bias is not None for l in layers):
        spec.bias = np.concatenate([_np(l.bias) for l in layers], axis=0)


def _norm(spec, norm) -> None:
    spec.gamma = _np(norm.weight)
    spec.beta = _np(norm.bias)


def build_spec(model, tokenizer):
    """The ctranslate2 TransformerSpec of our Transformer (weights copied, nothing quantized)."""
    from ctranslate2.specs import transformer_spec

    cfg = model.cfg
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.n_encoder_layers, cfg.n_decoder_layers), cfg.n_heads, pre_norm=cfg.pre_norm)
    positions = _np(model.positions)

    enc, dec = spec.encoder, spec.decoder
    enc.embeddings[0].weight = _np(model.src_embed.weight)
    enc.scale_embeddings = True
    enc.position_encodings.encodings = positions.copy()
    for layer_spec, layer in zip(enc.layer, model.encoder_layers):
        attn = layer.self_attn
        _linear(layer_spec.self_attention.linear[0], attn.w_q, attn.w_k, attn.w_v)
        _linear(layer_spec.self_attention.linear[1], attn.w_o)
        _norm(layer_spec.self_attention.layer_norm, layer.sub_attn.norm)
        _linear(layer_spec.ffn.linear_0, layer.feed_forward.w_1)
        _linear(layer_spec.ffn.linear_1, layer.feed_forward.w_2)
        _norm(layer_spec.ffn.layer_norm, layer.sub_ff.norm)
    if cfg.pre_norm:
        _norm(enc.layer_norm, model.encoder_norm)

    dec.embeddings.weight = _np(model.tgt_embed.weight)
    dec.scale_embeddings = True
    dec.position_encodings.encodings = positions.copy()
    for layer_spec, layer in zip(dec.layer, model.decoder_layers):
        sa, ca = layer.self_attn, layer.cross_attn
        _linear(layer_spec.self_attention.linear[0], sa.w_q, sa.w_k, sa.w_v)
        _linear(layer_spec.self_attention.linear[1], sa.w_o)
        _norm(layer_spec.self_attention.layer_norm, layer.sub_self.norm)
        _linear(layer_spec.attention.linear[0], ca.w_q)
        _linear(layer_spec.attention.linear[1], ca.w_k, ca.w_v)
        _linear(layer_spec.attention.linear[2], ca.w_o)
        _norm(layer_spec.attention.layer_norm, layer.sub_cross.norm)
        _linear(layer_spec.ffn.linear_0, layer.feed_forward.w_1)
        _linear(layer_spec.ffn.linear_1, layer.feed_forward.w_2)
        _norm(layer_spec.ffn.layer_norm, layer.sub_ff.norm)
    if cfg.pre_norm:
        _norm(dec.layer_norm, model.decoder_norm)
    _linear(dec.projection, model.generator)

    spec.config.layer_norm_epsilon = float(cfg.layer_norm_eps)
    spec.config.unk_token = tokenizer.source.id_to_piece(cfg.unk_id)
    spec.config.bos_token = tokenizer.target.id_to_piece(cfg.bos_id)
    spec.config.eos_token = tokenizer.target.id_to_piece(cfg.eos_id)
    spec.config.decoder_start_token = tokenizer.target.id_to_piece(cfg.decoder_start_id)
    spec.config.add_source_bos = False
    spec.config.add_source_eos = False  # our source ids already end with </s>
    spec.register_source_vocabulary(source_pieces(tokenizer))
    spec.register_target_vocabulary(target_pieces(tokenizer))
    return spec


def source_pieces(tokenizer) -> list[str]:
    return [tokenizer.source.id_to_piece(i) for i in range(tokenizer.src_vocab_size)]


def target_pieces(tokenizer) -> list[str]:
    return [tokenizer.target.id_to_piece(i) for i in range(tokenizer.tgt_vocab_size)]


def convert_checkpoint(ckpt: str | Path, out: str | Path, quantization: str | None = None) -> Path:
    """Writes the CTranslate2 model of a checkpoint into `out` (created; must not exist or be empty).

    quantization None keeps float32 weights; load them with compute_type "int8" to quantize on load.
    """
    from seq2onnx.model import checkpoint

    model, tokenizer, _ = checkpoint.load(ckpt)
    spec = build_spec(model, tokenizer)
    spec.validate()
    spec.optimize(quantization=quantization)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    spec.save(str(out))
    return out
