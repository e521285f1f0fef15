"""The encoder-decoder Transformer of "Attention Is All You Need", written out by hand.

Shape legend: B batch (sentences), R decoder rows (B x live beams), H heads, S source length,
T target length, P past (cached) length, D d_model, Dh head size, V vocabulary.

Attention is plain MatMul/Softmax rather than nn.MultiheadAttention (model/blocks.py): the fused eval fast
path of the latter fixes sequence lengths in exported graphs. Three entry points map onto the two ONNX
graphs: `encode` + `cross_kv` (encoder.onnx) and `decode_step` (decoder.onnx); `forward` is the
teacher-forced pass used for training.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .blocks import KV, DecoderLayer, EncoderLayer, make_norm
from .config import ModelConfig
from .layers import (  # noqa: F401 (sinusoid_table: API)
    Dropout,
    LayerNorm,
    bucket_table,
    causal_bias,
    own_past_bias,
    padding_bias,
    sinusoid_table,
    wide,
)


class Transformer(nn.Module):
    """The encoder-decoder Transformer (see the module docstring for its entry points and shapes).

    Args:
        cfg: the model's shape, kept as `self.cfg`.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.src_embed = nn.Embedding(cfg.src_vocab_size, d, padding_idx=cfg.pad_id)
        self.tgt_embed = (
            self.src_embed if cfg.share_vocab else nn.Embedding(cfg.tgt_vocab_size, d, padding_idx=cfg.pad_id)
        )
        # Stored positions (an imported model's own table) travel with the weights; ours are recomputed.
        # T5 has none: a learned per-head bias over buckets of relative positions, one table per stack
        # (transformers keeps it in each stack's first layer and shares it with the others).
        if cfg.relative_buckets:
            self.encoder_relative = nn.Embedding(cfg.relative_buckets, cfg.n_heads)
            self.decoder_relative = nn.Embedding(cfg.relative_buckets, cfg.n_heads)
            for side, both_ways in (("encoder", True), ("decoder", False)):
                self.register_buffer(
                    f"{side}_buckets",
                    bucket_table(
                        both_ways, cfg.relative_buckets, cfg.relative_max_distance, cfg.max_positions
                    ),
                    persistent=False,
                )
        else:
            self.register_buffer(
                "positions", sinusoid_table(cfg.max_positions, d), persistent=cfg.stored_positions
            )
        if cfg.separate_positions:  # mBART learns a table per stack: the decoder's, beside the encoder's
            self.register_buffer("tgt_positions", sinusoid_table(cfg.max_positions, d))
        self.embed_dropout = Dropout(cfg.dropout)
        # mBART normalises embeddings + positions before the first layer, each stack with its own norm.
        eps = cfg.layer_norm_eps
        self.encoder_embed_norm = LayerNorm(d, eps=eps) if cfg.embedding_norm else nn.Identity()
        self.decoder_embed_norm = LayerNorm(d, eps=eps) if cfg.embedding_norm else nn.Identity()
        self.output_scale = cfg.output_scale  # T5 with tied embeddings: d_model ** -0.5
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        # Pre-LN leaves the residual stream unnormalised: one more norm at the top of each stack.
        self.encoder_norm = make_norm(cfg) if cfg.pre_norm else nn.Identity()
        self.decoder_norm = make_norm(cfg) if cfg.pre_norm else nn.Identity()
        self.generator = nn.Linear(d, cfg.tgt_vocab_size, bias=cfg.logits_bias)
        if cfg.tie_embeddings:
            self.generator.weight = self.tgt_embed.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialises the weights: Xavier-uniform matrices, zero biases, N(0, d_model^-0.5) embeddings,
        zero pad row."""
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name:
                nn.init.xavier_uniform_(p)
            elif "bias" in name:
                nn.init.zeros_(p)
        # A list, not a set: a set's order follows object ids and would make initialisation,
        # and so whole runs, irreproducible under a fixed seed.
        tables = [self.src_embed] if self.tgt_embed is self.src_embed else [self.src_embed, self.tgt_embed]
        for emb in tables:
            nn.init.normal_(emb.weight, std=self.cfg.d_model**-0.5)
            with torch.no_grad():
                emb.weight[self.cfg.pad_id].zero_()

    def relative_bias(self, side: str, relative: Tensor) -> Tensor:
        """T5's position bias (1, H, *relative.shape) of relative positions (key - query), int64 of any
        shape, each inside +-(max_positions - 1): its bucket (layers.bucket_table), the stack's learned value
        per bucket and head.

        Args:
            side: "encoder" (bidirectional buckets) or "decoder".
            relative: the relative positions.
        """
        table, buckets = getattr(self, f"{side}_relative"), getattr(self, f"{side}_buckets")
        bucket = buckets[relative + (self.cfg.max_positions - 1)]  # (...,)
        values = table(bucket)  # (..., H)
        n = values.dim() - 1  # a permutation of non-negative axes: the exporter writes movedim's -1 as is
        return values.permute(n, *range(n)).unsqueeze(0)  # (1, H, ...)

    def _self_bias(self, side: str, length: int, device: torch.device) -> Tensor | None:
        """The (1, H, L, L) relative bias of a stack's self-attention over L positions; None without T5's."""
        if not self.cfg.relative_buckets:
            return None
        position = torch.arange(length, device=device)
        return self.relative_bias(side, position[None, :] - position[:, None])  # (1, H, L, L)

    @property
    def target_positions(self) -> Tensor:
        """The decoder's position table: its own (cfg.separate_positions), else the one both stacks share."""
        return self.tgt_positions if self.cfg.separate_positions else self.positions

    def embed(
        self, table: nn.Embedding, ids: Tensor, positions: Tensor | None, norm: nn.Module | None = None
    ) -> Tensor:
        """table(ids) * sqrt(d_model) (unless not cfg.scale_embedding) + positions (None: T5's, none),
        through `norm` (the stack's embedding norm; None: the target's), then dropout."""
        x = table(ids) * math.sqrt(self.cfg.d_model) if self.cfg.scale_embedding else table(ids)
        norm = self.decoder_embed_norm if norm is None else norm
        return self.embed_dropout(norm(x if positions is None else x + positions))

    def project(self, x: Tensor) -> Tensor:
        """The logits of the decoder's last layer output x: final norm, T5's output scale, projection."""
        x = self.decoder_norm(x)
        if self.output_scale != 1.0:
            x = x * self.output_scale
        return self.generator(x)

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """Returns the encoder's memory (B, S, D) for a batch of sources.

        Args:
            src: (B, S) ids.
            src_mask: (B, S), True for real tokens.
        """
        relative = self.cfg.relative_buckets > 0
        positions = None if relative else self.positions[: src.shape[1]]
        x = self.embed(self.src_embed, src, positions, self.encoder_embed_norm)
        bias = padding_bias(src_mask)  # (B, 1, 1, S)
        if relative:  # computed once, shared by every layer (T5)
            bias = bias + self._self_bias("encoder", src.shape[1], src.device)  # (B, H, S, S)
        for layer in self.encoder_layers:
            x = layer(x, bias)
        return self.encoder_norm(x)

    def cross_kv(self, memory: Tensor) -> list[KV]:
        """Returns each decoder layer's cross-attention keys and values, 2 x (B, H, S, Dh): once per source.

        Args:
            memory: (B, S, D) from `encode`.
        """
        return [layer.cross_attn.project_kv(memory) for layer in self.decoder_layers]

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Returns the logits (B, T, V) of the teacher-forced pass used for training.

        Args:
            src: (B, S) source ids.
            src_mask: (B, S), True for real tokens.
            tgt_in: (B, T) target ids starting with decoder_start_id.
        """
        cross = self.cross_kv(self.encode(src, src_mask))
        t = tgt_in.shape[1]
        relative = self._self_bias("decoder", t, src.device)  # (1, H, T, T) or None
        x = self.embed(self.tgt_embed, tgt_in, None if relative is not None else self.target_positions[:t])
        self_bias, cross_bias = causal_bias(t, src.device), padding_bias(src_mask)
        if relative is not None:
            self_bias = self_bias + relative
        for layer, kv in zip(self.decoder_layers, cross):
            x = layer(x, self_bias, kv, cross_bias)
        return self.project(x)

    def decode_step(
        self,
        tokens: Tensor,
        step: Tensor,
        cache_indices: Tensor,
        past: list[KV],
        cross: list[KV],
        src_mask: Tensor,
        return_attention: bool = False,
    ) -> tuple[Tensor, list[KV]] | tuple[Tensor, list[KV], Tensor]:
        """One decoding step for R rows grouped by sentence (R = B x beams, beams contiguous).

        Args:
            tokens: (R, 1) the newest token of each row.
            step: (1,) its position, or (R,) each row's (a serving batch: rows at different steps, each
                with its step[r] cached positions at the end of the P slots; layers.own_past_bias).
            cache_indices: (R,) the row of `past` each new row continues (beam reordering, dropping
                finished rows).
            past: per layer 2 x (R_prev, H, P, Dh).
            cross: per layer 2 x (B, H, S, Dh).
            src_mask: (B, S).
            return_attention: also return the cross-attention.

        Returns:
            Log-probabilities (R, V) in fp32 and the new cache, per layer 2 x (R, H, P+1, Dh); with
            return_attention also the last layer's cross-attention averaged over heads (R, S) in
            fp32 (CTranslate2's return_attention convention), what the decoder graph outputs.
        """
        past_len = past[0][0].shape[2]
        relative = self.cfg.relative_buckets > 0
        positions = None if relative else self.target_positions.index_select(0, step)  # (1 or R, D)
        x = self.embed(self.tgt_embed, tokens.reshape(-1), positions)  # (R, D)
        cross_bias = padding_bias(src_mask)
        self_bias = own_past_bias(step, past_len)  # (1 or R, 1, 1, P+1): 0 but in a serving batch
        if relative:
            # T5: the new position (slot P) against every slot; a row's own positions end at slot P, so
            # slot j lies j - P positions from the query in every row
            slots = torch.arange(past_len + 1, device=tokens.device)
            relative_bias = self.relative_bias("decoder", slots - past_len)  # (1, H, P+1)
            self_bias = self_bias + relative_bias[:, :, None, :]  # (1, H, 1, P+1)
        present: list[KV] = []
        for layer, (pk, pv), kv in zip(self.decoder_layers, past, cross):
            reordered = (pk.index_select(0, cache_indices), pv.index_select(0, cache_indices))
            x, new, attention = layer.step(x, reordered, kv, cross_bias, self_bias)
            present.append(new)
        logits = self.project(x)  # (R, V)
        if self.cfg.renormalize:  # transformers' renormalize_logits: the log-softmax over the allowed ids
            log_probs = F.log_softmax(self.suppress(wide(logits)), dim=-1).float()
        else:
            log_probs = self.suppress(F.log_softmax(wide(logits), dim=-1).float())
        if return_attention:
            return log_probs, present, attention.float()
        return log_probs, present

    def suppress(self, log_probs: Tensor) -> Tensor:
        """Adds -inf to the entries of cfg.suppressed_ids (log-probabilities, or logits when cfg.renormalize).

        Args:
            log_probs: (..., V).
        """
        if not self.cfg.suppressed_ids:
            return log_probs
        mask = torch.zeros(log_probs.shape[-1], dtype=log_probs.dtype, device=log_probs.device)
        mask[list(self.cfg.suppressed_ids)] = float("-inf")
        return log_probs + mask

    def empty_cache(self, rows: int, device: torch.device | None = None) -> list[KV]:
        """Returns the past before the first step: per layer 2 x (rows, H, 0, Dh), in the parameters' dtype.

        Args:
            rows: R.
            device: where it goes; None: the parameters' device.
        """
        p = next(self.parameters())
        shape = (rows, self.cfg.n_heads, 0, self.cfg.head_dim)  # head_dim: d_kv where T5 sets it
        z = torch.zeros(shape, dtype=p.dtype, device=device or p.device)
        return [(z, z) for _ in self.decoder_layers]
