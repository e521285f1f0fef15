"""The int8 graph files of a bundle directory: each graph read, quantized (export/quantize.py's
quantize_model), written back, flushed and checked, and the scheme bundle.json records."""

from __future__ import annotations

from pathlib import Path

import onnx

from .graph_layers import rewrite_graph_file
from .graphs import check_graph_file
from .quantize import SCHEME, TABLES, quantize_model
from .weights import TensorWriter


def quantize_graphs(
    directory: Path,
    files: dict[str, str],
    contrib_labels: tuple[str, ...] = (),
    *,
    tables: bool = True,
    keep_float: frozenset[str] = frozenset(),
    writer: TensorWriter | None = None,
) -> dict:
    """Quantizes the graph files of a bundle directory in place.

    Args:
        directory: the bundle directory.
        files: {label: file name} of the graphs to quantize.
        contrib_labels: the labels whose graphs use com.microsoft operators.
        tables: the embedding tables (and a tied output projection) in int8 per row too (quantize_model).
        keep_float: layer groups left fp32 (quantize_model; default none); recorded as `fp32_groups`.
        writer: where the int8 tensors go (export/weights.py's staging file); None: inside each graph.

    Returns:
        bundle.json's `quantization_scheme`: SCHEME plus, per graph, the layers quantized and the
        operator that multiplies.

    Raises:
        QuantizeError: a graph without linear layers.
        onnx.checker.ValidationError: a rewritten graph that does not check (a standard graph: full check).
        onnx.shape_inference.InferenceError: a rewritten standard graph fails strict shape inference.
    """
    layers = {}
    for label, name in files.items():
        contrib = label in contrib_labels
        count = _quantize_file(Path(directory), name, contrib, tables, keep_float, writer)
        product = "MatMulIntegerToFloat" if contrib else "MatMulInteger"
        layers[label] = {"linear_layers": count, "product": product}
    return _scheme(layers, tables, keep_float)


def _quantize_file(
    directory: Path,
    name: str,
    contrib: bool,
    tables: bool,
    keep_float: frozenset[str],
    writer: TensorWriter | None,
) -> int:
    """Reads one graph file, quantizes it, writes it back (its int8 tensors flushed to the writer) and
    checks it; returns how many layers were quantized."""

    def rewrite(proto):
        return quantize_model(
            proto, contrib=contrib, tables=tables, keep_float=keep_float, directory=directory, writer=writer
        )

    # contrib ops have no ONNX schema: structure and types only
    check = (lambda path: onnx.checker.check_model(str(path))) if contrib else check_graph_file
    return rewrite_graph_file(directory, name, rewrite, writer, check)


def _scheme(layers: dict, tables: bool, keep_float: frozenset[str]) -> dict:
    """bundle.json's `quantization_scheme` for the quantized graphs' `layers`."""
    extra = {"fp32_groups": sorted(keep_float)} if keep_float else {}
    if not tables or "embeddings" in keep_float:
        return {**SCHEME, "tables": "fp32", "graphs": layers, **extra}
    return {
        **SCHEME,
        "tables": TABLES,
        "fp32": SCHEME["fp32"].replace("embeddings, ", ""),
        "graphs": layers,
        **extra,
    }
