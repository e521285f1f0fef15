"""The Transformer as two ONNX graphs: encoder.onnx (encode + cross_kv) and decoder.onnx (decode_step).

Traced with the TorchScript exporter at sizes that are all distinct and >= 2 (sizes traced at 0
or 1 are specialised to constants), opset 17, attention as explicit MatMul/Softmax.

The tracer writes the graphs without their weights (export_params=False: the parameters are graph
inputs) and without constant folding, so no copy of the model is made; then each parameter input
becomes an initializer written straight from the model's tensor through export/weights.py's
TensorWriter, and the nodes computed from parameters alone (a Linear's weight transposed, an Identity
of a tied or equal tensor) are folded here, one tensor at a time. A graph file is then a few hundred
KB whatever the model's size, and the weights are streamed to disk: past protobuf's 2 GiB too.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import Tensor, nn

from seq2onnx.model.transformer import Transformer
from seq2onnx.runtime import bundle as names

from .top_k import top_k_nodes
from .weights import STAGING_FILE, TensorWriter

OPSET = 17
# The IR version every graph is written with: opset 17's (onnx 1.12), what torch.onnx writes. onnx's
# helper.make_model stamps its own newest IR instead (14 for onnx 1.23), which onnxruntime 1.31 refuses
# ("Unsupported model IR version: 14, max supported IR version: 13"): the GPU check found it.
IR_VERSION = 8


class EncoderGraph(nn.Module):
    """The encoder graph: (src_ids (B, S), src_lengths (B,)) -> src_mask (B, S), then per layer key,
    value (B, H, S, Dh).

    Args:
        model: the model to trace.
    """

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, src_ids: Tensor, src_lengths: Tensor) -> tuple[Tensor, ...]:
        """Returns (src_mask, key_0, value_0, key_1, ...): the mask from the lengths, then encode + cross_kv.

        Args:
            src_ids: (B, S) source ids, padded.
            src_lengths: (B,) each source's length.
        """
        positions = torch.arange(src_ids.shape[1], device=src_ids.device)
        src_mask = positions[None, :] < src_lengths[:, None]  # (B, S)
        cross = self.model.cross_kv(self.model.encode(src_ids, src_mask))
        return (src_mask, *[t for kv in cross for t in kv])


class DecoderGraph(nn.Module):
    """The decoder graph, one step: decode_step with its lists flattened in the order of runtime.bundle's
    names.

    It also outputs the last layer's head-averaged cross-attention (computed anyway: one ReduceMean more).

    Args:
        model: the model to trace.
    """

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model
        self.n_layers = model.cfg.n_decoder_layers

    def forward(
        self, tokens: Tensor, step: Tensor, cache_indices: Tensor, *rest: Tensor
    ) -> tuple[Tensor, ...]:
        """Runs decode_step on flat inputs.

        Args:
            tokens: (R, 1) the newest tokens.
            step: (1,) their position, or (R,) each row's (a serving batch, Transformer.decode_step).
            cache_indices: (R,) the past row each row continues.
            *rest: per layer past key, value; per layer cross key, value; then src_mask.

        Returns:
            (log_probs, present key_0, value_0, ..., cross_attention).
        """
        n = self.n_layers
        past = [(rest[2 * i], rest[2 * i + 1]) for i in range(n)]
        cross = [(rest[2 * n + 2 * i], rest[2 * n + 2 * i + 1]) for i in range(n)]
        src_mask = rest[4 * n]
        log_probs, present, attention = self.model.decode_step(
            tokens, step, cache_indices, past, cross, src_mask, return_attention=True
        )
        return (log_probs, *[t for kv in present for t in kv], attention)


def example_inputs(model: Transformer, dtype: torch.dtype) -> tuple[tuple, tuple]:
    """Returns tracing inputs with every dynamic size distinct and >= 2: batch 2, src 5, rows 6, prev 4,
    past 3.

    Args:
        model: the model (its encoder is run to make the decoder's cross inputs).
        dtype: the cache's dtype.

    Returns:
        (encoder inputs, decoder inputs).
    """
    cfg = model.cfg
    batch, src_len, rows, prev_rows, past = 2, 5, 6, 4, 3
    src_ids = torch.randint(4, cfg.src_vocab_size, (batch, src_len))
    src_lengths = torch.tensor([src_len, src_len - 2])
    enc = (src_ids, src_lengths)
    with torch.no_grad():
        src_mask, *cross = EncoderGraph(model)(*enc)
    cache = torch.randn(prev_rows, cfg.n_heads, past, cfg.head_dim, dtype=dtype)
    dec = (
        torch.randint(4, cfg.tgt_vocab_size, (rows, 1)),
        # (rows,): traced per row, so that a serving batch runs too
        torch.tensor([past, past, 1, past, 0, 2]),
        torch.tensor([0, 1, 1, 2, 3, 3]),
        *[cache.clone() for _ in range(2 * cfg.n_decoder_layers)],
        *cross,
        src_mask,
    )
    return enc, dec


def export_graphs(
    model: Transformer,
    out_dir: Path,
    *,
    dtype: torch.dtype = torch.float32,
    writer: TensorWriter | None = None,
) -> tuple[Path, Path]:
    """Writes encoder.onnx and decoder.onnx into out_dir, their weights through `writer`.

    Args:
        model: the model; it is cast to dtype and put in eval mode.
        out_dir: an existing directory.
        dtype: the graphs' float type.
        writer: where the weights go (export/weights.py); None: a TensorWriter of its own on
            out_dir/STAGING_FILE, which the graphs then refer to.

    Returns:
        (encoder path, decoder path).

    Raises:
        RuntimeError: a graph holds training-only nodes (check_graph_file).
    """
    model = model.to(dtype).eval()
    n = model.cfg.n_decoder_layers
    enc_inputs, dec_inputs = example_inputs(model, dtype)
    enc_path, dec_path = out_dir / names.ENCODER_FILE, out_dir / names.DECODER_FILE
    own = writer is None
    writer = TensorWriter(Path(out_dir) / STAGING_FILE) if own else writer
    with torch.no_grad(), contextlib.ExitStack() as stack:
        if own:
            stack.enter_context(writer)
        _export(EncoderGraph(model), enc_inputs, enc_path, writer, **_encoder_io(n))
        with _gemm_linears(model) as zero_biases:
            _export(DecoderGraph(model), dec_inputs, dec_path, writer, **_decoder_io(n), no_bias=zero_biases)
    return enc_path, dec_path


def _cross_axes(n: int) -> dict:
    return {name: {0: "batch", 2: "src_len"} for name in names.cross_names(n)}


def _encoder_io(n: int) -> dict:
    """The encoder graph's input and output names and their dynamic axes (`n` decoder layers)."""
    return {
        "inputs": [names.SRC_IDS, names.SRC_LENGTHS],
        "outputs": [names.SRC_MASK, *names.cross_names(n)],
        "axes": {
            names.SRC_IDS: {0: "batch", 1: "src_len"},
            names.SRC_LENGTHS: {0: "batch"},
            names.SRC_MASK: {0: "batch", 1: "src_len"},
            **_cross_axes(n),
        },
    }


def _decoder_io(n: int) -> dict:
    """The decoder graph's input and output names and their dynamic axes (`n` layers)."""
    return {
        "inputs": [
            names.TOKENS,
            names.STEP,
            names.CACHE_INDICES,
            *names.past_names(n),
            *names.cross_names(n),
            names.SRC_MASK,
        ],
        "outputs": [names.LOG_PROBS, *names.present_names(n), names.CROSS_ATTENTION],
        "axes": {
            names.TOKENS: {0: "rows"},
            names.STEP: {0: "step_rows"},
            names.CACHE_INDICES: {0: "rows"},
            names.LOG_PROBS: {0: "rows"},
            **{p: {0: "prev_rows", 2: "past"} for p in names.past_names(n)},
            **{p: {0: "rows", 2: "past_plus_1"} for p in names.present_names(n)},
            names.CROSS_ATTENTION: {0: "rows", 1: "src_len"},
            **_cross_axes(n),
            names.SRC_MASK: {0: "batch", 1: "src_len"},
        },
    }


@contextlib.contextmanager
def _gemm_linears(model: Transformer):
    """The decoder's linear layers traced as Gemm(x, W, transB=1) on their own (out, in) initializers.

    Traced as it is, a Linear without bias (the output projection; every layer of T5) becomes
    MatMul(x, Transpose(W)), and folding stores W transposed: a tied table would be held twice (NLLB-600M's
    decoder would pass the 2 GB of one ONNX file), and the bundle's weights file could not share W with
    the fused decoder, which multiplies by W itself (a T5 bundle held each decoder layer twice: 1.41x the
    weights at MADLAD-3B shape, docs/t5.md). With a bias, the exporter makes one Gemm with transB on the
    step's (R, D) rows; so each gets a zero bias while traced. The output projection keeps its zero C
    (adding 0 changes no value); the layers' are dropped again by _export (Gemm's C is optional).

    Yields:
        The names of the layers' zero biases, as the traced DecoderGraph's inputs name them.
    """
    gen = model.generator
    added = [gen] if gen.bias is None else []
    layers = {
        f"model.decoder_layers.{name}.bias": module
        for name, module in model.decoder_layers.named_modules()
        if isinstance(module, nn.Linear) and module.bias is None
    }
    added += layers.values()
    for linear in added:
        w = linear.weight
        linear.bias = nn.Parameter(torch.zeros(linear.out_features, dtype=w.dtype, device=w.device))
    try:
        yield frozenset(layers)
    finally:
        for linear in added:
            linear.bias = None


def _export(
    module: nn.Module,
    args: tuple,
    path: Path,
    writer: TensorWriter,
    *,
    inputs: list[str],
    outputs: list[str],
    axes: dict,
    no_bias: frozenset[str] = frozenset(),
) -> None:
    # The TorchScript exporter on purpose: its dynamic_axes give the named axes of bundle.json
    # directly, and it emits plain MatMul/Softmax at opset 17. It warns that it is legacy. Without the
    # parameters (they become inputs) and without constant folding, which would copy every weight it
    # transposes: _place_weights does both, streaming.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        trace = _tracer_without_shape_inference()
        if trace is not None:
            trace(
                module,
                args,
                str(path),
                False,
                False,
                torch.onnx.TrainingMode.EVAL,
                inputs,
                outputs,
                opset_version=OPSET,
                do_constant_folding=False,
                dynamic_axes=axes,
                keep_initializers_as_inputs=False,
                onnx_shape_inference=False,
            )
        else:
            torch.onnx.export(
                module,
                args,
                str(path),
                input_names=inputs,
                output_names=outputs,
                dynamic_axes=axes,
                opset_version=OPSET,
                do_constant_folding=False,
                export_params=False,
                dynamo=False,
            )
    proto = onnx.load(str(path))
    for node in proto.graph.node:  # the zero biases _gemm_linears gave the layers: no C, as the model
        if node.op_type == "Gemm" and len(node.input) == 3 and node.input[2] in no_bias:
            del node.input[2]
    _place_weights(proto, module.state_dict(keep_vars=True), writer)
    if names.LOG_PROBS in outputs:
        add_top_k(proto, module.model.cfg.tgt_vocab_size)
    onnx.save(proto, str(path))
    del proto
    writer.flush()
    check_graph_file(path)


def _tracer_without_shape_inference():
    """The TorchScript exporter's own entry with its ONNX shape inference off, where this torch has it.

    Why: that inference serializes, for each node, the values of the parameters it reads; for the
    embedding table's lookup and the tied projection that is a transient copy of the table each
    (2 GB at NLLB-600M size: the export's peak, docs/optimisation-notes.md row 37). Our graphs do not
    need it: the nodes and their attributes come out the same (tests/test_export.py), and
    _place_weights, check_graph_file and onnxruntime infer shapes on the finished graph. Where torch
    no longer has this private entry, the public torch.onnx.export runs as before (more memory).

    Returns:
        The function, or None.
    """
    import inspect

    try:
        from torch.onnx._internal.torchscript_exporter import utils

        trace = utils._export
        if "onnx_shape_inference" in inspect.signature(trace).parameters:
            return trace
    except (ImportError, AttributeError, TypeError, ValueError):
        pass
    return None


FOLDED = ("Identity", "Transpose", "Cast")  # the nodes on parameters alone that the tracer writes unfolded


def _place_weights(proto: onnx.ModelProto, params: dict[str, Tensor], writer: TensorWriter) -> None:
    """Makes the graph's parameter inputs initializers written by `writer`, folding the nodes computed
    from parameters alone (FOLDED), one tensor at a time.

    Args:
        proto: a graph traced with export_params=False, changed in place.
        params: the traced module's parameters and buffers by name (state_dict(keep_vars=True)).
        writer: where the tensors go.

    Raises:
        RuntimeError: a node on parameters alone that is not folded here (a model change this export
            does not know: fold it here, as the tracer's constant folding would).
    """
    graph = proto.graph
    values: dict = {i.name: params[i.name] for i in graph.input if i.name in params}
    kept_inputs = [i for i in graph.input if i.name not in values]
    renamed: dict[str, str] = {}
    nodes = []
    for node in graph.node:
        for k, name in enumerate(node.input):
            node.input[k] = renamed.get(name, name)
        if not node.input or not all(name in values for name in node.input):
            nodes.append(node)
        elif node.op_type == "Identity":
            renamed[node.output[0]] = node.input[0]
        elif node.op_type in FOLDED:  # computed when written: one tensor at a time
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            values[node.output[0]] = (node.op_type, node.input[0], attrs)
        else:
            raise RuntimeError(
                f"{graph.name}: node {node.name!r} ({node.op_type}) computes from parameters "
                f"alone; export/graphs.py folds only {', '.join(FOLDED)}"
            )
    for output in graph.output:
        if output.name in renamed or output.name in values:
            raise RuntimeError(f"{graph.name}: output {output.name!r} is a parameter")
    used = {name for node in nodes for name in node.input}
    del graph.input[:]
    graph.input.extend(kept_inputs)
    del graph.node[:]
    graph.node.extend(nodes)
    for name in sorted(used & set(values)):
        graph.initializer.append(writer.tensor(name, _value(values, name)))


def _value(values: dict, name: str) -> np.ndarray:
    """A parameter as numpy (its own memory: no copy), or one computed from it (one copy, while written):
    transposed, or cast as a float16 graph's norms are."""
    value = values[name]
    if not isinstance(value, tuple):
        return value.detach().cpu().numpy()
    op, source, attrs = value
    array = _value(values, source)
    if op == "Transpose":
        return np.ascontiguousarray(np.transpose(array, attrs.get("perm")))
    return array.astype(onnx.helper.tensor_dtype_to_np_dtype(attrs["to"]))


def add_top_k(proto: onnx.ModelProto, vocab: int) -> None:
    """Appends the top k of log_probs to the decoder (export/top_k.py): outputs topk_log_probs and topk_ids.

    Written as ONNX nodes rather than traced, because tracing torch.topk freezes k to the
    traced value. Ties go to the lower id, the search's own rule.

    Args:
        proto: the decoder graph, changed in place (a top_k input and two outputs more).
        vocab: the target vocabulary's size.
    """
    from onnx import TensorProto, helper

    graph = proto.graph
    graph.input.append(helper.make_tensor_value_info(names.TOP_K, TensorProto.INT64, [1]))
    graph.node.extend(top_k_nodes(names.LOG_PROBS, names.TOP_K, names.TOPK_LOG_PROBS, names.TOPK_IDS, vocab))
    graph.output.append(helper.make_tensor_value_info(names.TOPK_LOG_PROBS, TensorProto.FLOAT, ["rows", "k"]))
    graph.output.append(helper.make_tensor_value_info(names.TOPK_IDS, TensorProto.INT64, ["rows", "k"]))


def check_graph_file(path: Path) -> None:
    """Checks a graph file: onnx.checker with full check, strict shape inference, and no training-only nodes.

    The checker and shape inference read the file in C++: no Python copy of a large graph.

    Args:
        path: the graph file.

    Raises:
        RuntimeError: training-only nodes (Dropout, losses) in the graph.
        onnx.checker.ValidationError: the checker fails.
        onnx.shape_inference.InferenceError: strict shape inference fails.
    """
    import os
    import tempfile

    onnx.checker.check_model(str(path), full_check=True)
    fd, inferred = tempfile.mkstemp(suffix=".onnx", dir=path.parent)
    os.close(fd)
    try:
        onnx.shape_inference.infer_shapes_path(str(path), inferred, check_type=True, strict_mode=True)
    finally:
        os.unlink(inferred)
    proto = onnx.load(str(path), load_external_data=False)
    found = sorted({node.op_type for node in proto.graph.node} & TRAINING_NODES)
    if found:
        raise RuntimeError(f"{path.name}: training-only nodes {found} in the exported graph")


TRAINING_NODES = {"Dropout", "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"}
