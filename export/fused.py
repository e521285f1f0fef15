"""The decoder step as one FUSED ONNX graph of onnxruntime's `com.microsoft` contrib operators.

Built node by node with `onnx.helper` from the weights of a `Transformer` (not traced), so that each
sublayer is a handful of kernels: one QKV Gemm -> Split -> DecoderMaskedMultiHeadAttention (cache
updated in place) -> Gemm -> SkipLayerNormalization; Gemm -> MultiHeadAttention over the sentence's
cross keys/values -> Gemm -> SkipLayerNormalization; FusedGemm(Relu) -> Gemm -> SkipLayerNormalization.
Every weight is the model's own (out, in) tensor under transB, as in decoder.onnx, so that the
bundle's one weights file holds each once for both decoders (export/weights.py).
docs/fused-decoder.md gives the inputs, layouts, masks and pitfalls.

Shape legend: R rows (B sentences x W beams, beams contiguous), B sentences, W = R / B, H heads,
Dh head size, D d_model, F d_ff, M max_length (the cache buffer's positions), S source, V vocab.

The step's semantics differ from decoder.onnx (export/graphs.py) in three places:
- the self-attention cache is ONE preallocated buffer per layer and kind, [R, H, M, Dh], bound both
  as the `past_*` input and the `present_*` output (IO binding, same OrtValue): the kernel writes
  the new position in place, nothing is copied per step;
- `step` is int32 and is also the kernel's past_sequence_length (positions 0..step-1 are cached);
- `cache_indices` is replaced by `beam_width` and `cache_indirection` [B, W, M] int32: entry
  [b, w, t] is the beam of sentence b whose cache row holds position t for beam w (beam reorder
  without copying). Rows are fixed for the buffer's life: dropping finished sentences is the
  caller's (a compaction copy, once per finished sentence, not per step).
Only fp32: onnxruntime's CPU DecoderMaskedMultiHeadAttention is registered for float alone.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import torch
from onnx import TensorProto, helper

from seq2onnx.export.fused_builder import Graph, StepBuilder
from seq2onnx.export.graphs import IR_VERSION, OPSET
from seq2onnx.export.weights import STAGING_FILE, TensorWriter
from seq2onnx.model.transformer import Transformer
from seq2onnx.runtime import bundle as names
from seq2onnx.runtime.signature import fused_signature  # defined once, with every graph name

MS_DOMAIN = names.MS_DOMAIN
FUSED_DECODER_FILE = names.FUSED_DECODER_FILE
BEAM_WIDTH, CACHE_INDIRECTION = names.BEAM_WIDTH, names.CACHE_INDIRECTION


def graph_domains(proto: onnx.ModelProto) -> list[str]:
    """Lists the operator domains a graph's nodes use.

    What bundle.json's graphs.<label>.domains records, so that a host knows what its runtime must run.

    Args:
        proto: the graph.

    Returns:
        The domains, sorted ("" is the default ONNX domain, "ai.onnx" included).
    """
    return sorted({"" if n.domain in ("", "ai.onnx") else n.domain for n in proto.graph.node})


def build_fused_decoder(
    model: Transformer, *, check: bool = True, writer: TensorWriter | None = None
) -> onnx.ModelProto:
    """Builds the fused decoder-step graph of `model`, checked by onnx.checker.

    Args:
        model: the model, fp32 and in eval mode.
        check: run onnx.checker on the proto (export_fused_decoder checks the file instead: no
            second copy).
        writer: where the weights go (export/weights.py), so that the proto holds none; None: inside
            the proto.

    Returns:
        The graph (inputs and outputs as runtime.signature.fused_signature gives them).

    Raises:
        ValueError: the model's weights are not fp32 (the CPU kernels are fp32-only).
    """
    if model.generator.weight.dtype != torch.float32:
        raise ValueError(
            f"the fused decoder is fp32-only; the model's weights are "
            f"{model.generator.weight.dtype}: call model.float() first"
        )
    with torch.no_grad():
        builder = StepBuilder(model, writer)
        x = builder.embedding()
        builder.shared_constants()
        x, h = builder.first_norm(x)
        for i in range(model.cfg.n_decoder_layers):
            x, h = builder.self_attention(i, x, h)
            x, h = builder.cross_attention(i, x, h)
            x, h = builder.feed_forward(i, x, h)
        builder.generator(x)
    proto = _model_proto(builder.g, model.cfg)
    if check:
        onnx.checker.check_model(proto)  # contrib ops have no ONNX schema: structure and types only
    return proto


def _model_proto(g: Graph, cfg) -> onnx.ModelProto:
    """The ModelProto of g's nodes and initializers, with fused_signature's inputs and outputs."""
    sig = fused_signature(cfg.n_decoder_layers, cfg.n_heads, cfg.head_dim, cfg.tgt_vocab_size)
    types = {
        "float32": TensorProto.FLOAT,
        "int64": TensorProto.INT64,
        "int32": TensorProto.INT32,
        "bool": TensorProto.BOOL,
    }

    def value_info(spec: dict) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(spec["name"], types[spec["dtype"]], spec["shape"])

    graph = helper.make_graph(
        g.nodes,
        "decoder_step_fused",
        [value_info(s) for s in sig["inputs"]],
        [value_info(s) for s in sig["outputs"]],
        initializer=g.inits,
    )
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)]
    return helper.make_model(
        graph, opset_imports=opsets, producer_name="seq2onnx.export.fused", ir_version=IR_VERSION
    )


def export_fused_decoder(model: Transformer, out_dir: Path, writer: TensorWriter | None = None) -> Path:
    """Writes decoder_fused.onnx into out_dir, its weights through `writer`.

    Args:
        model: the model (put in eval mode).
        out_dir: an existing directory.
        writer: where the weights go (export/weights.py); None: a TensorWriter of its own on
            out_dir/STAGING_FILE, which the graph then refers to.

    Returns:
        The file's path.

    Raises:
        ValueError: as build_fused_decoder.
    """
    path = Path(out_dir) / FUSED_DECODER_FILE
    own = writer is None
    writer = TensorWriter(Path(out_dir) / STAGING_FILE) if own else writer
    try:
        onnx.save(build_fused_decoder(model.eval(), check=False, writer=writer), str(path))
    finally:
        if own:
            writer.close()
        else:
            writer.flush()
    onnx.checker.check_model(str(path))  # from the file, in C++, following the external data
    return path
