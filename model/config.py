"""The one description of a model's shape, written as config.json beside weights and graphs."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

# Special ids are fixed when the SentencePiece models are trained (model/tokenizer.py), so the
# same ids hold on both sides and in every bundle.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
# The feed-forward's nonlinearities (swish is x * sigmoid(x), also called SiLU).
# gelu_tanh is the tanh approximation (transformers' "gelu_new", T5 v1.1's and mT5's).
ACTIVATIONS = ("relu", "swish", "gelu", "gelu_tanh")
NORMS = ("layer", "rms")
# Fields added for imported T5 models (export/hf/family_t5.py), with the defaults that describe every model
# made before them: to_dict leaves them out at their defaults, so older configs and bundles read and
# write exactly as before.
T5_DEFAULTS = {
    "d_kv": 0,
    "norm": "layer",
    "attention_scale": True,
    "linear_bias": True,
    "relative_buckets": 0,
    "relative_max_distance": 128,
    "gated": False,
    "output_scale": 1.0,
}


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Transformer and its special ids, frozen; written as config.json.

    Attributes:
        src_vocab_size: SentencePiece pieces on the source side.
        tgt_vocab_size: ... and on the target side (equal to src when the vocabulary is joint).
        d_model: width of every residual stream.
        n_heads: attention heads; d_model must divide by it.
        n_encoder_layers: encoder layers.
        n_decoder_layers: decoder layers.
        d_ff: inner width of the position-wise feed-forward.
        dropout: on embeddings, attention weights and every sublayer output.
        max_positions: longest source or target sequence, special tokens included.
        pre_norm: False: Add & Norm after each sublayer as in the paper; True: pre-LN.
        tie_embeddings: target embedding shared with the output projection.
        share_vocab: one joint SentencePiece model; the embeddings are shared too.
        layer_norm_eps: LayerNorm's epsilon.
        pad_id, unk_id, bos_id, eos_id: the special ids (fixed when the tokenizers are trained).
        decoder_start_id: first decoder input.
        activation: the feed-forward's nonlinearity, one of ACTIVATIONS ("relu" as in the paper;
            OPUS-MT's Marian models use "swish").
        scale_embedding: multiply embeddings by sqrt(d_model) (the paper); False adds them as they are.
        logits_bias: the output projection has a bias (Marian's final_logits_bias).
        stored_positions: the position table is a weight copied from an imported model (Marian's
            and fairseq's tables differ from ours: never regenerated) instead of our sinusoid.
        suppressed_ids: target ids never generated (transformers' bad_words_ids): their
            log-probabilities are set to -inf after the log-softmax, as transformers does.
        renormalize: suppressed ids are set to -inf before the log-softmax instead, so the others'
            probabilities sum to 1 (transformers' renormalize_logits, which OPUS-MT's generation configs set).
        embedding_norm: a LayerNorm of each stack's own after embeddings + positions (mBART's
            layernorm_embedding, fairseq's layernorm_embedding).
        separate_positions: the decoder has a stored position table of its own (mBART learns one per
            stack); needs stored_positions.
        d_kv: the head size where n_heads x d_kv is not d_model (T5's d_kv: mT5-small has 6 x 64 heads in a
            512-wide stream); 0: d_model // n_heads.
        norm: "layer" (LayerNorm) or "rms" (T5's: a scale only, no mean, no bias).
        attention_scale: scores divided by sqrt(head size); T5 does not divide.
        linear_bias: the attention and feed-forward projections have biases (T5's have none).
        relative_buckets: > 0: T5's relative position bias, a learned per-head bias over this many buckets,
            added to each stack's self-attention scores, instead of a position table.
        relative_max_distance: the distance from which every relative position shares its bucket.
        gated: the feed-forward is act(x W1) * (x W3), then W2 (T5 v1.1's and mT5's gated-gelu).
        output_scale: the decoder's output is multiplied by this before the output projection (T5 with tied
            embeddings: d_model ** -0.5).

    Raises:
        ValueError: d_model does not divide by n_heads, share_vocab with unequal vocabularies,
            or a special id outside the vocabulary.
    """

    src_vocab_size: int  # SentencePiece pieces on the source side
    tgt_vocab_size: int  # ... and on the target side (equal to src when the vocabulary is joint)
    d_model: int = 256  # width of every residual stream
    n_heads: int = 4  # attention heads; d_model must divide by it
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    d_ff: int = 1024  # inner width of the position-wise feed-forward
    dropout: float = 0.1  # on embeddings, attention weights and every sublayer output
    max_positions: int = 256  # longest source or target sequence, special tokens included
    pre_norm: bool = False  # False: Add & Norm after each sublayer as in the paper; True: pre-LN
    tie_embeddings: bool = True  # target embedding shared with the output projection
    share_vocab: bool = False  # one joint SentencePiece model; the embeddings are shared too
    layer_norm_eps: float = 1e-5
    pad_id: int = PAD_ID
    unk_id: int = UNK_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    decoder_start_id: int = BOS_ID  # first decoder input
    # Imported models (export/hf/) set these; our trainer keeps the paper's defaults.
    activation: str = "relu"
    scale_embedding: bool = True
    logits_bias: bool = False
    stored_positions: bool = False
    suppressed_ids: tuple[int, ...] = ()
    renormalize: bool = False
    embedding_norm: bool = False  # mBART's layernorm_embedding: LN(embed + positions), one per stack
    separate_positions: bool = False  # the decoder's own stored position table (mBART's learned ones)
    # T5 (export/hf/family_t5.py); the defaults are T5_DEFAULTS, every earlier model's
    d_kv: int = 0  # head size where n_heads * d_kv != d_model; 0: d_model // n_heads
    norm: str = "layer"  # "rms": T5's scale-only norm
    attention_scale: bool = True  # softmax(QK^T / sqrt(Dh)); False: softmax(QK^T) (T5)
    linear_bias: bool = True  # biases on the attention and feed-forward projections
    relative_buckets: int = 0  # > 0: T5's relative position bias instead of a position table
    relative_max_distance: int = 128
    gated: bool = False  # FFN(x) = (act(x W1) * x W3) W2
    output_scale: float = 1.0  # the decoder output's factor before the output projection

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads and not self.d_kv:
            raise ValueError(
                f"d_model={self.d_model} does not divide by n_heads={self.n_heads}; "
                "choose n_heads among the divisors of d_model"
            )
        if self.share_vocab and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                f"share_vocab needs equal vocabularies, got {self.src_vocab_size} and {self.tgt_vocab_size}"
            )
        if self.separate_positions and not self.stored_positions:
            raise ValueError(
                "separate_positions needs stored_positions (a decoder table is imported, never computed)"
            )
        if self.norm not in NORMS:
            raise ValueError(f"norm={self.norm!r}; choose one of {', '.join(NORMS)}")
        if self.relative_buckets < 0 or self.d_kv < 0:
            raise ValueError(f"relative_buckets={self.relative_buckets}, d_kv={self.d_kv}: need >= 0")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r}; choose one of {', '.join(ACTIVATIONS)}")
        object.__setattr__(self, "suppressed_ids", tuple(int(i) for i in self.suppressed_ids))
        bad = [i for i in self.suppressed_ids if not 0 <= i < self.tgt_vocab_size]
        if bad:
            raise ValueError(
                f"suppressed_ids {bad} lie outside the target vocabulary [0, {self.tgt_vocab_size})"
            )
        for name in ("pad_id", "unk_id", "bos_id", "eos_id", "decoder_start_id"):
            value = getattr(self, name)
            if not 0 <= value < min(self.src_vocab_size, self.tgt_vocab_size):
                raise ValueError(f"{name}={value} is outside the vocabulary")

    @property
    def head_dim(self) -> int:
        """Width of one attention head: d_kv, or d_model // n_heads."""
        return self.d_kv or self.d_model // self.n_heads

    @property
    def inner_dim(self) -> int:
        """Width of the attention's queries, keys and values: n_heads * head_dim (d_model but in T5)."""
        return self.n_heads * self.head_dim

    def parameter_count(self) -> int:
        """Counts the trainable parameters of the Transformer this config describes, shared tensors once.

        Returns:
            The number of parameters.
        """
        d, ff, inner, bias = self.d_model, self.d_ff, self.inner_dim, int(self.linear_bias)
        attention = 4 * d * inner + bias * (3 * inner + d)  # w_q, w_k, w_v, w_o
        feed_forward = (3 if self.gated else 2) * d * ff + bias * ((2 if self.gated else 1) * ff + d)
        norm = 2 * d if self.norm == "layer" else d
        relative = 2 * self.relative_buckets * self.n_heads
        encoder = self.n_encoder_layers * (attention + feed_forward + 2 * norm)
        decoder = self.n_decoder_layers * (2 * attention + feed_forward + 3 * norm)
        embeddings = self.src_vocab_size * d + (0 if self.share_vocab else self.tgt_vocab_size * d)
        generator = (0 if self.tie_embeddings else self.tgt_vocab_size * d) + (
            self.tgt_vocab_size if self.logits_bias else 0
        )
        final_norms = 2 * norm if self.pre_norm else 0
        embedding_norms = 2 * norm if self.embedding_norm else 0
        return encoder + decoder + embeddings + generator + final_norms + embedding_norms + relative

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict."""
        data = dataclasses.asdict(self)
        data["suppressed_ids"] = list(self.suppressed_ids)
        for name, default in T5_DEFAULTS.items():  # as before T5: a model without them writes none of them
            if data[name] == default:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        """Builds a config from `to_dict`'s output.

        Args:
            data: field names and values; missing fields take their defaults.

        Returns:
            The config.

        Raises:
            ValueError: an unknown field (a newer seq2onnx wrote it, or it was edited by hand),
                or values that do not fit together.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"config has unknown fields {unknown}; it was written by a newer seq2onnx or edited by hand"
            )
        return cls(**data)

    def save(self, path: str | Path) -> None:
        """Writes the config as indented JSON with sorted keys.

        Args:
            path: the file (config.json).
        """
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "ModelConfig":
        """Reads a config that `save` wrote.

        Args:
            path: the file (config.json).

        Returns:
            The config.

        Raises:
            ValueError: the JSON is malformed or its fields are not a valid config.
        """
        return cls.from_dict(json.loads(Path(path).read_text()))


# fp32 weights, their gradients and Adam's two moments: four copies of every parameter.
TRAINING_BYTES_PER_PARAMETER = 4 * 4


def training_memory(cfg: ModelConfig, max_tokens: int) -> tuple[int, int]:
    """Estimates a rough lower bound on training memory in bytes.

    Activations are those kept for the backward pass of one batch of max_tokens tokens per side:
    per token and layer a dozen or so d_model-wide tensors, two d_ff-wide ones and the attention
    weights (one row of up to max_positions per head), plus the logits over the target vocabulary
    (logits, log-softmax and its gradient). Rough on purpose: it catches sizes that cannot fit
    anywhere near, not a few percent.

    Args:
        cfg: the model's shape.
        max_tokens: tokens per batch.

    Returns:
        (parameters' share, activations' share): weights, gradients and Adam's moments; activations.
    """
    d, ff, h = cfg.d_model, cfg.d_ff, cfg.n_heads
    row = min(cfg.max_positions, max_tokens)
    per_token = (
        cfg.n_encoder_layers * (12 * d + 2 * ff + h * row)
        + cfg.n_decoder_layers * (18 * d + 2 * ff + 2 * h * row)
        + 3 * cfg.tgt_vocab_size
    )
    return cfg.parameter_count() * TRAINING_BYTES_PER_PARAMETER, 4 * max_tokens * per_token


def available_memory() -> int | None:
    """Bytes of memory this process may use.

    Returns:
        Physical memory, or a smaller cgroup (v2) limit; None if unknown.
    """
    import os

    try:
        limit = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not every platform names these
        limit = None
    try:  # a container's limit (cgroup v2) is what the kernel enforces
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if text.isdigit():
            limit = min(int(text), limit) if limit else int(text)
    except OSError:
        pass
    return limit


def gib(n: float) -> str:
    """Returns a byte count in GiB with one decimal, e.g. "1.5 GiB".

    Args:
        n: bytes.
    """
    return f"{n / 2**30:,.1f} GiB"
