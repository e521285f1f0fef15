"""A checkpoint -> CTranslate2 model, through ctranslate2's model-spec API.

Two users: `seq2onnx export --format ctranslate2` (export_ctranslate2: a deployable directory,
written atomically, with the tokenizers and DEPLOY_JSON saying how to drive it) and `seq2onnx
bench` (convert_checkpoint: the bare model, the peer the ONNX runtime is measured against, so it
must run the very same weights). docs/ctranslate2.md describes the directory. The mapping, checked against
ctranslate2's own converters (opennmt_py.py, fairseq.py):

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

The conversion itself needs ctranslate2 and torch (the `[bench]` extra); this module imports
neither at its top, so that ct2_available() can say what is missing.
"""

from __future__ import annotations

import json
import platform
import shutil
from importlib import metadata
from pathlib import Path

import numpy as np

CT2_MISSING = "ctranslate2 not installed: pip install 'seq2onnx[bench]'"


def ct2_available() -> tuple[bool, str]:
    """Tells whether ctranslate2 can be imported here.

    A broken install (missing shared libraries) counts as none.

    Returns:
        (available, the message to show when not; "" when available).
    """
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return False, CT2_MISSING
    except Exception as e:  # a broken install (missing shared libraries) is as good as none
        return (
            False,
            f"ctranslate2 cannot be imported ({type(e).__name__}: {e}): pip install 'seq2onnx[bench]'",
        )
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
    """Builds the ctranslate2 TransformerSpec of our Transformer (weights copied, nothing quantized).

    Args:
        model (Transformer): the model (mapping in the module docstring).
        tokenizer (Tokenizer): its tokenizer: the special tokens and both vocabularies.

    Returns:
        ctranslate2.specs.TransformerSpec: the spec, not yet validated or optimized.
    """
    from ctranslate2.specs import transformer_spec

    cfg = model.cfg
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.n_encoder_layers, cfg.n_decoder_layers), cfg.n_heads, pre_norm=cfg.pre_norm
    )
    positions = _np(model.positions)

    _encoder(spec.encoder, model, positions)
    _decoder(spec.decoder, model, positions)
    _vocabulary(spec, cfg, tokenizer)
    return spec


def _encoder(enc, model, positions) -> None:
    """Copies the encoder: embeddings, positions, each layer's attention and feed-forward, final norm."""
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
    if model.cfg.pre_norm:
        _norm(enc.layer_norm, model.encoder_norm)


def _decoder(dec, model, positions) -> None:
    """Copies the decoder: embeddings, positions, each layer's self- and cross-attention and
    feed-forward, final norm, output projection."""
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
    if model.cfg.pre_norm:
        _norm(dec.layer_norm, model.decoder_norm)
    _linear(dec.projection, model.generator)


def _vocabulary(spec, cfg, tokenizer) -> None:
    """The special tokens, the epsilon, and both vocabularies."""
    spec.config.layer_norm_epsilon = float(cfg.layer_norm_eps)
    spec.config.unk_token = tokenizer.source.id_to_piece(cfg.unk_id)
    spec.config.bos_token = tokenizer.target.id_to_piece(cfg.bos_id)
    spec.config.eos_token = tokenizer.target.id_to_piece(cfg.eos_id)
    spec.config.decoder_start_token = tokenizer.target.id_to_piece(cfg.decoder_start_id)
    spec.config.add_source_bos = False
    spec.config.add_source_eos = False  # our source ids already end with </s>
    spec.register_source_vocabulary(source_pieces(tokenizer))
    spec.register_target_vocabulary(target_pieces(tokenizer))


def source_pieces(tokenizer) -> list[str]:
    """Returns the source vocabulary: the pieces in id order.

    Args:
        tokenizer (Tokenizer): the tokenizer.
    """
    return [tokenizer.source.id_to_piece(i) for i in range(tokenizer.src_vocab_size)]


def target_pieces(tokenizer) -> list[str]:
    """Returns the target vocabulary: the pieces in id order.

    Args:
        tokenizer (Tokenizer): the tokenizer.
    """
    return [tokenizer.target.id_to_piece(i) for i in range(tokenizer.tgt_vocab_size)]


# -- the deployable directory (`seq2onnx export --format ctranslate2`) -------------------------------

# How to drive the model with ctranslate2 + sentencepiece alone, beside model.bin (docs/ctranslate2.md).
DEPLOY_JSON = "seq2onnx-ct2.json"
DEPLOY_FORMAT, DEPLOY_FORMAT_VERSION = "seq2onnx-ctranslate2", 1
MODEL_BIN = "model.bin"  # what marks a directory as a CTranslate2 model (ctranslate2 writes it)


def is_ct2_dir(path: str | Path) -> bool:
    """Tells whether `path` is a CTranslate2 model directory (rather than an ONNX bundle), whole or not.

    Args:
        path: a directory.

    Returns:
        True when it holds model.bin or DEPLOY_JSON.
    """
    return (Path(path) / MODEL_BIN).is_file() or (Path(path) / DEPLOY_JSON).is_file()


def load_ct2(model_dir: str | Path, **options):
    """Opens ctranslate2.Translator(model_dir, **options), with errors that name the file and the fix.

    Args:
        model_dir (str | Path): the CTranslate2 model directory.
        **options: passed to ctranslate2.Translator (device, compute_type, intra_threads, ...).

    Returns:
        ctranslate2.Translator: the loaded model.

    Raises:
        ExportError: model.bin is missing, or CTranslate2 cannot read it (damaged or truncated).
    """
    import ctranslate2

    from seq2onnx.export.bundle import ExportError

    model = Path(model_dir) / MODEL_BIN
    fix = f"export it again: seq2onnx export CHECKPOINT {model_dir} --format ctranslate2 --force"
    if not model.is_file():
        raise ExportError(
            f"{model}: missing; {model_dir} is an incomplete CTranslate2 model directory: {fix}"
        )
    try:
        return ctranslate2.Translator(str(model_dir), **options)
    except (RuntimeError, ValueError) as e:
        raise ExportError(
            f"{model}: CTranslate2 cannot load it ({e}); the file is damaged or incomplete: {fix}"
        ) from e


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def deploy_recipe(model, tokenizer, ckpt_dir: Path) -> dict:
    """Builds DEPLOY_JSON: how CTranslate2 decodes as the PyTorch reference does.

    It gives the tokenization, options and length rule (the convention of docs/decoding.md).
    translate_batch holds only what must differ from CTranslate2's defaults: its beam_size is 2 and
    its min_decoding_length 1 (the end token forbidden at the first step), ours 4 and 0; its
    max_input_length is 1024, ours the model's positions. Its length penalty already counts the end
    token (it strips the token after ranking), and it stops early only when length_penalty is 0.

    Args:
        model (Transformer): the model.
        tokenizer (Tokenizer): its tokenizer (the special pieces).
        ckpt_dir: the checkpoint directory (its name is recorded).

    Returns:
        The recipe, ready for json.dumps.
    """
    from seq2onnx.export.bundle import DECODING_DEFAULTS as dd
    from seq2onnx.model.tokenizer import SOURCE_MODEL

    cfg = model.cfg
    eos = tokenizer.source.id_to_piece(cfg.eos_id)
    return {
        "format": DEPLOY_FORMAT,
        "format_version": DEPLOY_FORMAT_VERSION,
        "source": {
            "tokenizer": SOURCE_MODEL,
            "append": [eos],
            "how": "pieces = source SentencePiece encode(text, out_type=str) + append",
        },
        "target": _target(tokenizer, cfg),
        "translate_batch": {
            "beam_size": dd["beam_size"],
            "length_penalty": dd["length_penalty"],
            "min_decoding_length": dd["min_length"],
            "max_input_length": cfg.max_positions,
        },
        "max_decoding_length": {
            "a": dd["max_length_a"],
            "b": dd["max_length_b"],
            "max": cfg.max_positions,
            "rule": "per sentence: min(floor(a * n) + b, max), n = its pieces with the appended "
            "end token, at most max_input_length",
        },
        "compute_type": "the weights are float32; pick the precision at load: ctranslate2.Translator(dir, "
        "compute_type='int8') on the CPU, 'float16' or 'int8_float16' on CUDA (verify checks float32)",
        "model": cfg.to_dict(),
        "source_checkpoint": ckpt_dir.name,
        "producer": _producer(),
    }


def _target(tokenizer, cfg) -> dict:
    """The recipe's target side: its tokenizer, start and end tokens, and how to decode."""
    from seq2onnx.model.tokenizer import TARGET_MODEL

    return {
        "tokenizer": TARGET_MODEL,
        "start_token": tokenizer.target.id_to_piece(cfg.decoder_start_id),
        "end_token": tokenizer.target.id_to_piece(cfg.eos_id),
        "target_prefix": None,
        "how": "the start token is in config.json (decoder_start_token): give no target_prefix; "
        "decode the result's pieces with the target SentencePiece model",
    }


def _producer() -> dict:
    """The versions that wrote the directory."""
    return {
        "seq2onnx": _version("seq2onnx"),
        "ctranslate2": _version("ctranslate2"),
        "torch": _version("torch"),
        "python": platform.python_version(),
    }


def max_decoding_length(recipe: dict, n_pieces: int) -> int:
    """Applies the recipe's length rule: min(floor(a * n) + b, max).

    Args:
        recipe: a DEPLOY_JSON dict.
        n_pieces: the source's pieces (end token included); at most max_input_length count.

    Returns:
        The max_decoding_length for that source.
    """
    rule = recipe["max_decoding_length"]
    n = min(n_pieces, recipe["translate_batch"]["max_input_length"])
    return min(int(rule["a"] * n) + rule["b"], rule["max"])


def export_ctranslate2(ckpt: str | Path, out: str | Path, *, force: bool = False) -> Path:
    """Writes the CTranslate2 model directory of a checkpoint.

    It holds model.bin, config.json and the two vocabularies (ctranslate2's), the SentencePiece
    models and DEPLOY_JSON. Built in a temporary sibling of `out`, checked (a fresh
    ctranslate2.Translator decodes a short sentence through the recipe), then renamed into place,
    under the same lock as ONNX exports.

    Args:
        ckpt: the checkpoint (or run) directory.
        out: the directory to write.
        force: replace an existing `out` (only an empty directory or an export's).

    Returns:
        The directory, `out`.

    Raises:
        ExportError: ctranslate2 is missing, `out` exists without force, another export is writing
            `out` or the place is not writable.
        CheckpointError: a bad checkpoint.
    """
    from seq2onnx.export.bundle import ExportError, building
    from seq2onnx.model import checkpoint
    from seq2onnx.model.tokenizer import SOURCE_MODEL, TARGET_MODEL

    ok, why = ct2_available()
    if not ok:
        raise ExportError(f"--format ctranslate2: {why}")
    out = Path(out)
    with building(out, force, "model", ckpt) as tmp:
        model, tokenizer, ckpt_dir = checkpoint.load(ckpt)
        spec = build_spec(model, tokenizer)
        spec.validate()
        spec.optimize(quantization=None)  # float32: compute_type chooses the precision at load
        spec.save(str(tmp))
        for name in (SOURCE_MODEL, TARGET_MODEL):
            shutil.copyfile(ckpt_dir / name, tmp / name)
        recipe = deploy_recipe(model, tokenizer, ckpt_dir)
        (tmp / DEPLOY_JSON).write_text(json.dumps(recipe, indent=2, sort_keys=True) + "\n")
        _validate(tmp, recipe)
    return out


def _validate(directory: Path, recipe: dict) -> None:
    """The directory loads in a fresh Translator and decodes one short sentence through the recipe."""
    import sentencepiece as spm

    source = spm.SentencePieceProcessor(model_file=str(directory / recipe["source"]["tokenizer"]))
    pieces = source.encode("a", out_type=str) + recipe["source"]["append"]
    translator = load_ct2(directory, device="cpu", compute_type="float32", intra_threads=1)
    translator.translate_batch(
        [pieces], **{**recipe["translate_batch"], "beam_size": 2}, max_decoding_length=3
    )


# -- the bare model (`seq2onnx bench`) ----------------------------------------------------------------


def convert_checkpoint(ckpt: str | Path, out: str | Path, quantization: str | None = None) -> Path:
    """Writes the bare CTranslate2 model of a checkpoint into `out`.

    Args:
        ckpt: the checkpoint (or run) directory.
        out: the directory, created; must not exist or be empty (not checked here).
        quantization: ctranslate2's weight quantization; None keeps float32 weights: load them with
            compute_type "int8" to quantize on load.

    Returns:
        The directory, `out`.

    Raises:
        CheckpointError: a bad checkpoint.
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
