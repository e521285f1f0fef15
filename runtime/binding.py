"""The one place that binds the graphs' inputs and outputs: the encoder's, the standard decoder's
(decoder.onnx) and the fused decoder's (decoder_fused.onnx).

decoder.onnx is driven through runtime/standard_graph.py's StandardGraph.run by its three callers: the
search's step (StandardStep), the forced pass that returns attention (runtime/attention.py) and the continuous
batcher's rounds (runtime/standard_rounds.py). Each binds the same inputs in the same way (the graph's names
come from runtime/spec.py through runtime/bundle.py); what differs is where the outputs go, which each caller
says. The outputs of a run come back (binding.get_outputs()) in the order they were bound: the 2 x layers
`present_*` cache values first, then `outputs` in the order given.

decoder_fused.onnx is bound by runtime/fused_graph.py's FusedGraph.bind for both of its callers,
translate_batch's step loop (runtime/fused_step.py) and the serving rounds (runtime/fused_rounds.py): every
array the graph reads and writes is a FusedBuffers' and is bound by pointer (fused_binding, bind_fused), once
per shape rather than per step: a step only writes into the arrays. Its inputs are named in one place
(fused_inputs), and every IO binding of the package is made here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np

from . import bundle as names
from .search import TopK


@lru_cache(maxsize=None)
def _cache_names(n_layers: int) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(past, present, cross) input and output names of a decoder with n_layers layers."""
    return (
        tuple(names.past_names(n_layers)),
        tuple(names.present_names(n_layers)),
        tuple(names.cross_names(n_layers)),
    )


def _bind_value(binding, name: str, value) -> None:
    """A numpy array is copied in from the host; anything else is an OrtValue, bound where it is."""
    if isinstance(value, np.ndarray):
        binding.bind_cpu_input(name, value)
    else:
        binding.bind_ortvalue_input(name, value)


def bind_decoder(
    decoder,
    *,
    tokens: np.ndarray,
    steps: np.ndarray,
    cache_indices: np.ndarray,
    top_k: np.ndarray,
    past: Sequence,
    cross: Sequence,
    src_mask,
    present,
    outputs: Mapping[str, object],
):
    """Returns an IO binding of one run of decoder.onnx, not run yet.

    Args:
        decoder (onnxruntime.InferenceSession): the standard decoder's session.
        tokens: (R, 1) int64, each row's last token.
        steps: int64, the step: (1,) for every row, or (R,) one per row (the continuous batcher).
        cache_indices: (R,) int64, the previous step's cache row each row continues.
        top_k: (1,) int64, the candidates the graph's TopK outputs give per row.
        past: the 2 x layers past keys and values (OrtValues), layer by layer, keys first.
        cross: the 2 x layers cross keys and values (OrtValues, or numpy arrays copied in), in the same order.
        src_mask: the encoder's mask (an OrtValue, or a numpy array copied in).
        present: where the present keys and values go: a device ("cpu", "cuda": onnxruntime allocates them
            there), or 2 x layers OrtValues that they are written into.
        outputs: the other outputs wanted, in order: {name: "cpu" or "cuda", or an OrtValue written into}.

    Returns:
        The onnxruntime IOBinding; after the run its outputs are the presents, then `outputs`, in order.
    """
    past_names, present_names, cross_names = _cache_names(len(past) // 2)
    b = decoder.io_binding()
    b.bind_cpu_input(names.TOKENS, tokens)
    b.bind_cpu_input(names.STEP, steps)
    b.bind_cpu_input(names.CACHE_INDICES, cache_indices)
    b.bind_cpu_input(names.TOP_K, top_k)
    for name, value in zip(past_names, past):
        b.bind_ortvalue_input(name, value)
    for name, value in zip(cross_names, cross):
        _bind_value(b, name, value)
    _bind_value(b, names.SRC_MASK, src_mask)
    if isinstance(present, str):
        for name in present_names:
            b.bind_output(name, present)  # the cache stays where the graph runs
    else:
        for name, value in zip(present_names, present):
            b.bind_ortvalue_output(name, value)
    for name, where in outputs.items():
        if isinstance(where, str):
            b.bind_output(name, where)
        else:
            b.bind_ortvalue_output(name, where)
    return b


def fused_inputs(
    *,
    tokens: np.ndarray,
    step: np.ndarray,
    top_k: np.ndarray,
    beam_width: np.ndarray,
    indirection: np.ndarray,
    row_start: np.ndarray | None = None,
    src_mask=None,
    cross: Sequence = (),
) -> dict:
    """The fused decoder's inputs by name (decoder_fused.onnx: docs/fused-decoder.md), for bind_fused: the one
    place that spells them for translate_batch's step loop and the serving rounds alike.

    Args:
        tokens: (R, 1) int64, each row's last token.
        step: (1,) int32, the step (the rounds: the slot written).
        top_k: (1,) int64, the candidates the TopK outputs give per row.
        beam_width: (1,) int32, the rows of a group (the indirection's second axis).
        indirection: (R / beam_width, beam_width, positions) int32, the kernel's cache indirection.
        row_start: (R,) int32, each row's first position; None where the graph lacks the input (exported
            before row_start: every row begins at 0).
        src_mask: the encoder's mask (an array or an OrtValue); None: not bound here (bound apart).
        cross: the 2 x layers cross keys and values, layer by layer, keys first (arrays or OrtValues).
    """
    inputs = {
        names.TOKENS: tokens,
        names.STEP: step,
        names.TOP_K: top_k,
        names.BEAM_WIDTH: beam_width,
        names.CACHE_INDIRECTION: indirection,
    }
    if row_start is not None:
        inputs[names.ROW_START] = row_start
    if src_mask is not None:
        inputs[names.SRC_MASK] = src_mask
    inputs.update(zip(_cache_names(len(cross) // 2)[2], cross))
    return inputs


def bind_fused(
    binding,
    held: dict,
    inputs: Mapping[str, object],
    cache: Sequence[np.ndarray] = (),
    outputs: Mapping[str, np.ndarray] | None = None,
) -> None:
    """Binds arrays of the caller's to a fused decoder's IO binding by pointer (onnxruntime reads and writes
    them in place); rebinding some inputs of a complete binding is the same call with those inputs alone.

    Args:
        binding: the session's IOBinding (fused_binding's).
        held: name -> the OrtValue bound under it: the caller keeps it while the binding points at the array.
        inputs: name -> a contiguous numpy array (a slice of one: the first rows), or an OrtValue bound as it
            is (the encoder's outputs).
        cache: the 2 x layers cache buffers, layer by layer, keys first: each is bound as `past_*` and as
            `present_*` alike, so the kernel writes the new position in place.
        outputs: name -> a numpy array that the run writes into.
    """
    import onnxruntime  # imported, and its install checked, by runtime/sessions.py before any session exists

    wrap = onnxruntime.OrtValue.ortvalue_from_numpy
    for name, array in inputs.items():
        held[name] = value = wrap(array) if isinstance(array, np.ndarray) else array
        binding.bind_ortvalue_input(name, value)
    past_names, present_names, _ = _cache_names(len(cache) // 2)
    for past, present, array in zip(past_names, present_names, cache):
        held[past] = value = wrap(array)
        binding.bind_ortvalue_input(past, value)
        binding.bind_ortvalue_output(present, value)
    for name, array in (outputs or {}).items():
        held[name] = value = wrap(array)
        binding.bind_ortvalue_output(name, value)


def fused_binding(
    session,
    inputs: Mapping[str, object],
    cache: Sequence[np.ndarray] = (),
    outputs: Mapping[str, np.ndarray] | None = None,
) -> tuple[object, dict]:
    """Returns (a new IO binding of a fused decoder session with every input and output bound by pointer,
    the OrtValues it points at: keep them while the binding is used), as bind_fused binds them.

    Args:
        session (onnxruntime.InferenceSession): the fused decoder's session.
        inputs, cache, outputs: as bind_fused's (fused_inputs names the inputs).
    """
    binding, held = session.io_binding(), {}
    bind_fused(binding, held, inputs, cache, outputs)
    return binding, held


def wanted_outputs(top_ks: Sequence[int | None]) -> tuple[int, list[str]]:
    """What a decoder run must give rows whose searches want these top-k's (None: every log-probability):
    (the largest top-k, 0 for none; the outputs' names, the full log-probabilities first). Every step and
    round asks here, and reads its rows back with rows_answer."""
    k = max((x for x in top_ks if x is not None), default=0)
    wanted = [names.LOG_PROBS] if None in top_ks else []
    return k, wanted + ([names.TOPK_LOG_PROBS, names.TOPK_IDS] if k else [])


def rows_answer(got: Mapping[str, np.ndarray], top_k: int | None, rows, vocab: int):
    """A search's rows (a slice or indices) of a run's outputs by name: their log-probabilities, or a TopK of
    their top_k best candidates (the run may have given more for another search)."""
    if top_k is None:
        return got[names.LOG_PROBS][rows]
    return TopK(got[names.TOPK_LOG_PROBS][rows, :top_k], got[names.TOPK_IDS][rows, :top_k], vocab)


def bind_encoder(
    encoder, *, src: np.ndarray, lengths: np.ndarray, n_layers: int, device: str, into: list | None = None
):
    """Returns an IO binding of one run of encoder.onnx, not run yet: its outputs (src_mask, then the cross
    keys and values, layer by layer) stay on `device` ("cpu", "cuda") as OrtValues, or go into `into`.

    Args:
        encoder (onnxruntime.InferenceSession): the encoder's session.
        src: (B, S) int64 source ids, padded.
        lengths: (B,) int64 source lengths.
        n_layers: the decoder's layers (one cross key and value each).
        device: where the outputs stay.
        into: numpy arrays of the outputs' shapes and types, in their order, written by the run (on the CPU);
            None: onnxruntime allocates them.
    """
    b = encoder.io_binding()
    b.bind_cpu_input(names.SRC_IDS, src)
    b.bind_cpu_input(names.SRC_LENGTHS, lengths)
    for i, name in enumerate((names.SRC_MASK, *_cache_names(n_layers)[2])):
        if into is None:
            b.bind_output(name, device)
        else:
            b.bind_output(name, "cpu", 0, into[i].dtype, list(into[i].shape), into[i].ctypes.data)
    return b
