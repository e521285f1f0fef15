"""The nodes of the fused decoder step (export/fused.py says what it computes and why), added one
sublayer at a time by StepBuilder to a Graph of nodes and initializers."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from seq2onnx.export.top_k import top_k_nodes
from seq2onnx.export.weights import TensorWriter
from seq2onnx.model.transformer import Transformer
from seq2onnx.runtime import bundle as names

MS_DOMAIN = names.MS_DOMAIN


class Graph:
    """Collects nodes and initializers; a node's outputs are named after the node unless given."""

    def __init__(self, writer: TensorWriter | None = None):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.writer = writer

    def const(self, name: str, value) -> str:
        """An initializer: in the proto, or through the writer (the weights streamed to its file)."""
        array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        if self.writer is not None:
            self.inits.append(self.writer.tensor(name, array))
        else:
            self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(
        self,
        op: str,
        inputs: list[str],
        n_out: int = 1,
        *,
        name: str,
        outputs: list[str] | None = None,
        ms: bool = False,
        **attrs,
    ) -> list[str]:
        outs = outputs or [f"{name}/out{i}" for i in range(n_out)]
        domain = MS_DOMAIN if ms else ""
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, domain=domain, **attrs))
        return outs


class StepBuilder:
    """Adds the fused step's nodes to one Graph, sublayer by sublayer, in the graph's order.

    Post-LN: x <- LN(x + f(x)). Pre-LN: h <- h + f(y), y = LN_next(h). Each residual is an Add and a
    LayerNormalization (residual() says why), the sublayer's bias inside its Gemm. Each sublayer
    method takes and returns (x, h): the next sublayer's input and the residual stream.
    """

    def __init__(self, model: Transformer, writer: TensorWriter | None = None):
        self.model, self.cfg, self.g = model, model.cfg, Graph(writer)
        self.eps = float(model.cfg.layer_norm_eps)

    def embedding(self) -> str:
        """0. table(ids) * sqrt(D) + PE[step]: the residual stream (R, D).

        GatherND on tokens (R, 1) gives (R, D) without a Reshape. The table is the model's own
        (out, in) tensor, never a scaled or transposed copy: the same bytes as the standard
        decoder's table (and the tied output projection's, a Gemm transB below), so the bundle's
        weights file stores it once (export/weights.py), for one Mul per step.
        """
        g, cfg, model = self.g, self.cfg, self.model
        scale = cfg.d_model**0.5 if cfg.scale_embedding else 1.0
        (tok,) = g.node("GatherND", [g.const("embed", model.tgt_embed.weight), names.TOKENS], name="embed")
        if scale != 1.0:
            scale_const = g.const("embed_scale", np.array(scale, np.float32))
            (tok,) = g.node("Mul", [tok, scale_const], name="embed_scale")
        if cfg.relative_buckets:  # T5: no position table (its relative bias: relative_bias())
            return tok
        pos = g.const("positions", model.target_positions)  # the decoder's own table where it has one (mBART)
        # each row's position in its sentence: step - row_start (R,)
        (at,) = g.node(
            "Sub", [names.STEP, names.ROW_START], name="row_position", outputs=[names.ROW_POSITION]
        )
        (pe,) = g.node("Gather", [pos, at], name="position", axis=0)  # (R, D)
        (x,) = g.node("Add", [tok, pe], name="embed_add")  # (R, D), the residual stream
        if cfg.embedding_norm:  # mBART's layernorm_embedding: LN(embedding + position) feeds the layers
            norm = model.decoder_embed_norm
            gamma, beta = g.const("embed_norm_g", norm.weight), g.const("embed_norm_b", norm.bias)
            (x,) = g.node(
                "LayerNormalization", [x, gamma, beta], name="embed_norm", axis=-1, epsilon=self.eps
            )
        return x

    def shared_constants(self) -> None:
        """The shapes, split sizes and int32 mask every layer uses, made once per step.

        Cross-attention queries a sentence's keys with its W beams as one (B, W, D) query: the
        target shape [B, -1, D], made from the mask's batch.
        """
        g, d = self.g, self.cfg.inner_dim  # queries, keys, values: H x Dh wide (d_model but in T5)
        (batch,) = g.node("Shape", [names.SRC_MASK], name="batch", start=0, end=1)
        bwd = g.const("minus1_d", np.array([-1, d], np.int64))
        (self.q_shape,) = g.node("Concat", [batch, bwd], name="cross_q_shape", axis=0)
        self.rows_qkv = g.const("rows_1_3d", np.array([-1, 1, 3 * d], np.int64))
        self.rows_d = g.const("rows_d", np.array([-1, d], np.int64))
        self.split3 = g.const("split_d", np.array([d, d, d], np.int64))
        (self.mask,) = g.node("Cast", [names.SRC_MASK], name="mask_int32", to=TensorProto.INT32)
        self.own_past = self.own_past_mask()
        self.zeros_kv = np.zeros(2 * self.cfg.inner_dim, np.float32)
        self.relative = self.relative_bias() if self.cfg.relative_buckets else ""
        # T5 does not divide its scores; 0 is the kernels' default, 1/sqrt(head size)
        self.scale = {} if self.cfg.attention_scale else {"scale": 1.0}

    def relative_bias(self) -> str:
        """T5's self-attention bias (1, H, 1, step + 1): position `step` against every cached position t,
        relative position t - step, looked up in the bucket table, then in the learned (buckets, H) table
        (Transformer.relative_bias)."""
        g, model = self.g, self.model
        (now,) = g.node("Cast", [names.STEP], name="rel_step_i64", to=TensorProto.INT64)  # (1,)
        zero, one = g.const("rel_zero", np.array(0, np.int64)), g.const("rel_one", np.array(1, np.int64))
        (now0,) = g.node("Squeeze", [now], name="rel_step_scalar")
        (total,) = g.node("Add", [now0, one], name="rel_positions_now")
        (t,) = g.node("Range", [zero, total, one], name="rel_positions")  # (step + 1,)
        (relative,) = g.node("Sub", [t, now], name="rel_relative")  # t - step, all <= 0
        reach = g.const("rel_reach", np.array(self.cfg.max_positions - 1, np.int64))
        (index,) = g.node("Add", [relative, reach], name="rel_index")  # layers.bucket_table's index
        buckets = g.const("decoder_buckets", model.decoder_buckets)
        (bucket,) = g.node("Gather", [buckets, index], name="rel_bucket", axis=0)
        (values,) = g.node(
            "Gather",
            [g.const("decoder_relative", model.decoder_relative.weight), bucket],
            name="rel_values",
            axis=0,
        )  # (step + 1, H)
        (heads,) = g.node("Transpose", [values], name="rel_heads", perm=[1, 0])  # (H, step + 1)
        axes = g.const("axes_0_2", np.array([0, 2], np.int64))
        (bias,) = g.node("Unsqueeze", [heads, axes], name="rel_bias")  # (1, H, 1, step + 1)
        return bias

    def own_past_mask(self) -> str:
        """The self-attention mask (R, step + 1) int32: 1 where position t >= row_start[r].

        Positions before a row's start belong to whoever held the row before (a serving round's
        rows join at different steps: runtime/fused_step.py, runtime/fused_rounds.py); the kernel
        scores them with mask_filter_value, which underflows to exactly 0 (docs/fused-decoder.md).
        """
        g = self.g
        (now,) = g.node("Squeeze", [names.STEP], name="step_scalar")  # () int32
        one, zero = g.const("one_i32", np.array(1, np.int32)), g.const("zero_i32", np.array(0, np.int32))
        (total,) = g.node("Add", [now, one], name="positions_now")
        (t,) = g.node("Range", [zero, total, one], name="positions")  # (step + 1,)
        (start,) = g.node(
            "Unsqueeze", [names.ROW_START, g.const("axis_1", np.array([1], np.int64))], name="row_start_2d"
        )  # (R, 1)
        (seen,) = g.node("GreaterOrEqual", [t, start], name="own_past")  # (R, step + 1)
        (mask,) = g.node("Cast", [seen], name="own_past_int32", to=TensorProto.INT32)
        return mask

    def norm_args(self, i: int, which: str) -> list[str]:
        """The gamma and beta inputs of layer i's norm `which` ("sub_self", ...; "final": the stack's); T5's
        RMS norm: gamma alone."""
        model = self.model
        ln = getattr(model.decoder_layers[i], which).norm if which != "final" else model.decoder_norm
        gamma = self.g.const(f"ln{i}_{which}_g", ln.weight)
        return [gamma] if self.cfg.norm == "rms" else [gamma, self.g.const(f"ln{i}_{which}_b", ln.bias)]

    def first_norm(self, x: str) -> tuple[str, str]:
        """Pre-LN's norm before layer 0 (none for post-LN): the first (x, h)."""
        h = x
        if self.cfg.pre_norm and self.cfg.norm == "rms":
            x = self.rms_norm(h, *self.norm_args(0, "sub_self"))
        elif self.cfg.pre_norm:
            (x,) = self.g.node(
                "LayerNormalization",
                [h, *self.norm_args(0, "sub_self")],
                name="ln0_first",
                axis=-1,
                epsilon=self.eps,
            )
        return x, h

    def rms_norm(self, x: str, gamma: str) -> str:
        """T5's norm of x (R, D) in standard operators, once per step: x / sqrt(mean(x^2) + eps) * gamma
        (the ONNX domain has no RMS norm at opset 17; the residuals' are SkipSimplifiedLayerNormalization)."""
        g = self.g
        (square,) = g.node("Mul", [x, x], name="rms0_square")
        (mean,) = g.node("ReduceMean", [square], name="rms0_mean", axes=[-1], keepdims=1)
        eps = g.const("rms0_eps", np.array(self.eps, np.float32))
        (var,) = g.node("Add", [mean, eps], name="rms0_eps_add")
        (root,) = g.node("Sqrt", [var], name="rms0_sqrt")
        (normed,) = g.node("Div", [x, root], name="rms0_div")
        (y,) = g.node("Mul", [normed, gamma], name="rms0_scale")
        return y

    def residual(
        self, i: int, out: str, skip: str, label: str, next_norm: tuple[int, str]
    ) -> tuple[str, str]:
        """The residual and its norm: h = skip + out (the sublayer's output, its bias included), y = LN(h).

        Add and LayerNormalization, not com.microsoft's SkipLayerNormalization: onnxruntime 1.32's CPU kernel
        of that one took 3.5-5.7x their time from 32 rows on (docs/optimisation-notes.md row 87). T5's RMS
        norm keeps SkipSimplifiedLayerNormalization: the ONNX domain has no RMS norm at opset 17.
        """
        g, eps = self.g, self.eps
        norm = self.norm_args(*next_norm) if self.cfg.pre_norm else self.norm_args(i, label)
        if self.cfg.norm == "rms":  # pre-LN: output 3, the sum, is the residual stream
            op, n_out = "SkipSimplifiedLayerNormalization", 4 if self.cfg.pre_norm else 1
            outs = g.node(op, [out, skip, *norm], n_out, name=f"l{i}_{label}_sln", ms=True, epsilon=eps)
            return outs[0], outs[-1]
        (h,) = g.node("Add", [skip, out], name=f"l{i}_{label}_residual")
        (y,) = g.node("LayerNormalization", [h, *norm], name=f"l{i}_{label}_norm", axis=-1, epsilon=eps)
        return y, h if self.cfg.pre_norm else y

    def biases(self, name: str, linear) -> list[str]:
        """A Gemm's optional C: [the bias], or [] where the layer has none."""
        return [] if linear.bias is None else [self.g.const(name, linear.bias)]

    def self_attention(self, i: int, x: str, h: str) -> tuple[str, str]:
        """1. layer i's self-attention over the in-place cache.

        One QKV Gemm (R, 3D), bias included, viewed (R, 1, 3D) and split in three: the CPU kernel
        rejects packed QKV, and its bias input breaks on it. Every weight is nn.Linear's (out, in)
        tensor under Gemm transB: W_q, W_k, W_v stacked are three (D, D) blocks one after another,
        which the weights file stores once for both decoders.
        """
        g, sa = self.g, self.model.decoder_layers[i].self_attn
        present = names.present_names(self.cfg.n_decoder_layers)
        w_qkv = g.const(f"l{i}_w_qkv", torch.cat([sa.w_q.weight, sa.w_k.weight, sa.w_v.weight], dim=0))
        b_qkv = (
            []
            if sa.w_q.bias is None
            else [g.const(f"l{i}_b_qkv", torch.cat([sa.w_q.bias, sa.w_k.bias, sa.w_v.bias]))]
        )
        (qkv,) = g.node("Gemm", [x, w_qkv, *b_qkv], name=f"l{i}_qkv", transB=1)
        (qkv3,) = g.node("Reshape", [qkv, self.rows_qkv], name=f"l{i}_qkv_3d")
        q, k, v = g.node("Split", [qkv3, self.split3], 3, name=f"l{i}_qkv_split", axis=2)  # 3 x (R, 1, D)
        cache = [
            names.past_key(i),
            names.past_value(i),
            names.STEP,
            names.BEAM_WIDTH,
            names.CACHE_INDIRECTION,
        ]
        ctx, _, _ = g.node(
            "DecoderMaskedMultiHeadAttention",
            [q, k, v, self.own_past, self.relative, *cache],
            name=f"l{i}_self_attn",
            ms=True,
            outputs=[f"l{i}_self_ctx", present[2 * i], present[2 * i + 1]],
            num_heads=self.cfg.n_heads,
            past_present_share_buffer=1,
            **self.scale,
        )  # (R, 1, D)
        (ctx2,) = g.node("Reshape", [ctx, self.rows_d], name=f"l{i}_self_ctx_2d")
        wo = g.const(f"l{i}_self_wo", sa.w_o.weight)
        (o,) = g.node(
            "Gemm", [ctx2, wo, *self.biases(f"l{i}_self_bo", sa.w_o)], name=f"l{i}_self_out", transB=1
        )
        return self.residual(i, o, h, "sub_self", (i, "sub_cross"))

    def cross_attention(self, i: int, x: str, h: str) -> tuple[str, str]:
        """2. layer i's cross-attention: q (R, D) -> (B, W, D); keys/values (B, H, S, Dh) as the
        encoder made them. The q bias rides in the kernel's bias input [b_q, 0, 0]."""
        g, ca = self.g, self.model.decoder_layers[i].cross_attn
        (q,) = g.node("Gemm", [x, g.const(f"l{i}_cross_wq", ca.w_q.weight)], name=f"l{i}_cross_q", transB=1)
        (q3,) = g.node("Reshape", [q, self.q_shape], name=f"l{i}_cross_q_3d")
        b_q = (
            ""
            if ca.w_q.bias is None
            else g.const(f"l{i}_cross_bq", np.concatenate([ca.w_q.bias.detach().numpy(), self.zeros_kv]))
        )
        (cctx,) = g.node(
            "MultiHeadAttention",
            [q3, names.key_cross(i), names.value_cross(i), b_q, self.mask],
            name=f"l{i}_cross_attn",
            ms=True,
            num_heads=self.cfg.n_heads,
            **self.scale,
        )  # (B, W, D)
        (cctx2,) = g.node("Reshape", [cctx, self.rows_d], name=f"l{i}_cross_ctx_2d")
        wo = g.const(f"l{i}_cross_wo", ca.w_o.weight)
        bo = self.biases(f"l{i}_cross_bo", ca.w_o)
        (o,) = g.node("Gemm", [cctx2, wo, *bo], name=f"l{i}_cross_out", transB=1)
        return self.residual(i, o, h, "sub_cross", (i, "sub_ff"))

    def feed_forward(self, i: int, x: str, h: str) -> tuple[str, str]:
        """3. layer i's feed-forward: act(x W1 + b1) W2 + b2.

        Relu fuses into the Gemm; swish is QuickGelu with alpha 1 (x * sigmoid(x)), gelu the
        contrib Gelu (erf).
        """
        g, cfg, ff = self.g, self.cfg, self.model.decoder_layers[i].feed_forward
        w1 = [g.const(f"l{i}_ff_w1", ff.w_1.weight), *self.biases(f"l{i}_ff_b1", ff.w_1)]
        if cfg.activation == "relu":
            (f1,) = g.node("FusedGemm", [x, *w1], name=f"l{i}_ff_1", ms=True, activation="Relu", transB=1)
        else:
            (pre,) = g.node("Gemm", [x, *w1], name=f"l{i}_ff_1", transB=1)
            op, attrs = {
                "swish": ("QuickGelu", {"alpha": 1.0}),
                "gelu": ("Gelu", {}),
                "gelu_tanh": ("FastGelu", {}),
            }[cfg.activation]  # FastGelu: GELU's tanh form
            (f1,) = g.node(op, [pre], name=f"l{i}_ff_act", ms=True, **attrs)
        if ff.w_3 is not None:  # gated (T5 v1.1, mT5): times the linear half
            w3 = [g.const(f"l{i}_ff_w3", ff.w_3.weight), *self.biases(f"l{i}_ff_b3", ff.w_3)]
            (lin,) = g.node("Gemm", [x, *w3], name=f"l{i}_ff_3", transB=1)
            (f1,) = g.node("Mul", [f1, lin], name=f"l{i}_ff_gate")
        w2 = [g.const(f"l{i}_ff_w2", ff.w_2.weight), *self.biases(f"l{i}_ff_b2", ff.w_2)]
        (o,) = g.node("Gemm", [f1, *w2], name=f"l{i}_ff_2", transB=1)
        n = cfg.n_decoder_layers
        nxt = (i + 1, "sub_self") if i + 1 < n else (n, "final")
        return self.residual(i, o, h, "sub_ff", nxt)

    def generator(self, x: str) -> None:
        """4. generator, log-softmax over the target vocabulary, top-k (ties: lower id first)."""
        g, cfg, model = self.g, self.cfg, self.model
        tied = model.generator.weight is model.tgt_embed.weight
        table = "embed" if tied else g.const("generator", model.generator.weight)  # (V, D)
        never = np.zeros(cfg.tgt_vocab_size, np.float32)
        never[list(cfg.suppressed_ids)] = -np.inf
        bias = model.generator.bias  # Marian's final_logits_bias, or None
        bias = None if bias is None else bias.detach().cpu().numpy()
        if cfg.suppressed_ids and cfg.renormalize:  # -inf before the log-softmax (renormalize_logits)
            bias = never if bias is None else bias + never  # exact: b + 0 is b, b - inf is -inf
        if cfg.output_scale != 1.0:  # T5 with tied embeddings
            (x,) = g.node(
                "Mul",
                [x, g.const("output_scale", np.array(cfg.output_scale, np.float32))],
                name="output_scale",
            )
        inputs = [x, table]
        if bias is not None:  # Gemm's C, not one more pass over (R, V) per addend (optimisation-notes row 50)
            inputs.append(g.const("generator_bias", bias))
        (logits,) = g.node("Gemm", inputs, name="generator", transB=1)
        if cfg.suppressed_ids and not cfg.renormalize:  # -inf after the log-softmax, as bad_words_ids
            (lsm,) = g.node("LogSoftmax", [logits], name="log_softmax", axis=-1)
            g.node("Add", [lsm, g.const("suppressed", never)], name="suppress", outputs=[names.LOG_PROBS])
        else:
            g.node("LogSoftmax", [logits], name="log_softmax", axis=-1, outputs=[names.LOG_PROBS])
        g.nodes += top_k_nodes(
            names.LOG_PROBS, names.TOP_K, names.TOPK_LOG_PROBS, names.TOPK_IDS, cfg.tgt_vocab_size
        )
