"""The serving rounds of a Translator: what runs a round's graph over the rows of every search in flight.

translate_batch's step loop (runtime/fused_step.py) and the rounds drive the same graph objects
(runtime/fused_graph.py, runtime/standard_graph.py). The rounds are the continuous scheduler's
(serve/scheduler.py): each runs the decoder ONCE over rows that sit at different steps, on the fused decoder's
in-place cache (runtime/fused_rounds.py) or on decoder.onnx, which takes each row's own step
(runtime/standard_rounds.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import bundle as names
from .fused_graph import FusedGraph
from .fused_rounds import FusedRounds
from .standard_rounds import NoServingDecoder, StandardRounds, check_decoder

if TYPE_CHECKING:
    from .translator import Translator

__all__ = ["NoServingDecoder", "arena_release", "rounds_runner"]


def rounds_runner(translator: Translator, decoder: str = "auto") -> FusedRounds | StandardRounds:
    """What runs a Translator's serving rounds: the fused decoder's in-place rounds where the Translator
    drives the fused decoder and its graph takes `row_start`, else decoder.onnx's.

    Args:
        translator: the Translator served.
        decoder: "auto", "fused" or "standard" (the rounds' graph; "fused" raises where it cannot run).

    Raises:
        NoServingDecoder: the standard rounds on a decoder.onnx exported before continuous batching.
        ValueError: decoder="fused" where the fused rounds cannot run, or an unknown `decoder`.
    """
    graphs = translator.graphs
    fused = isinstance(graphs.decoder_graph, FusedGraph) and graphs.decoder_graph.row_start
    if decoder not in ("auto", "fused", "standard"):
        raise ValueError(f"decoder={decoder!r}: give 'auto', 'fused' or 'standard'")
    if decoder == "fused" and not fused:
        raise ValueError(
            f"{translator.bundle.path}: the fused serving rounds need the fused decoder driven "
            f"({translator.decoder_variant} is) and a decoder_fused.onnx with input {names.ROW_START!r} "
            "(export the bundle again); or serve with the standard rounds"
        )
    if fused and decoder != "standard":
        return FusedRounds(graphs.decoder_graph, graphs.shrink_encoder_arena)
    standard = graphs.standard_graph
    check_decoder(standard.session, translator.bundle.path)
    return StandardRounds(standard, graphs.shrink_encoder_arena)


def arena_release(translator: Translator):
    """Returns what gives a Translator's onnxruntime arenas back once nothing decodes (serve/memory.py's
    IdleRelease, for `--batching request`): its serving rounds' shrink_arena (a one-row run of the decoder
    under shrinkage, then the encoder's), or the encoder's alone where those rounds would load decoder.onnx
    beside a fused decoder without `row_start`, or where that decoder takes no per-row steps."""
    graphs = translator.graphs
    if isinstance(graphs.decoder_graph, FusedGraph) and not graphs.decoder_graph.row_start:
        return graphs.shrink_encoder_arena
    try:
        return rounds_runner(translator).shrink_arena
    except NoServingDecoder:
        return graphs.shrink_encoder_arena
