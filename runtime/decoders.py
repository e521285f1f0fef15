"""Which decoder graph a Translator drives: the fused one (decoder_fused.onnx, onnxruntime's com.microsoft
kernels: docs/fused-decoder.md) where the bundle has it and this onnxruntime runs it on the CPU, else the
standard-opset decoder.onnx."""

from __future__ import annotations

from . import bundle as names


class DecoderUnavailable(RuntimeError):
    """SessionTuning(decoder="fused") where the fused decoder cannot run: the message says why."""


def pick_decoder(bundle: names.Bundle, device: str, wanted: str, load) -> tuple[str, object, str]:
    """Picks the decoder a Translator drives and loads its session.

    Args:
        bundle: the bundle read.
        device: "cpu" or "cuda", the device picked.
        wanted (str): SessionTuning.decoder: "auto", "standard" or "fused".
        load (Callable[[str], onnxruntime.InferenceSession]): load(label) creates the session of the
            bundle's graph `label` and raises where onnxruntime cannot.

    Returns:
        (variant, session, reason): the fused decoder where the bundle has it, the provider is the
        CPU and this onnxruntime can create its session; otherwise the standard decoder, with why.

    Raises:
        DecoderUnavailable: (a RuntimeError) "fused" is asked for and cannot run.
    """
    if wanted == names.STANDARD:
        return (
            names.STANDARD,
            load(names.DECODER_LABELS[names.STANDARD]),
            "asked for the standard decoder (SessionTuning)",
        )
    why = None
    if names.FUSED not in bundle.decoder_variants:
        why = (
            "the bundle has no fused decoder (exported with --decoder standard, or float16: the CPU kernels "
            "are float32-only, so fp16 bundles have only the standard one)"
        )
    elif device != "cpu":
        # The CUDA kernel of DecoderMaskedMultiHeadAttention wants another key layout in the cache.
        why = (
            f"the fused decoder's cache layout is the CPU kernels'; the {device} provider runs the standard "
            "one"
        )
    else:
        try:
            return (
                names.FUSED,
                load(names.DECODER_LABELS[names.FUSED]),
                ("the bundle has a fused decoder and this onnxruntime runs its com.microsoft operators"),
            )
        except Exception as e:  # onnxruntime's own exception types: an operator it lacks, a damaged file
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            why = f"this onnxruntime cannot run the fused decoder ({first[:300]})"
    if wanted == names.FUSED:
        raise DecoderUnavailable(f"SessionTuning(decoder='fused') cannot be honoured: {why}")
    return names.STANDARD, load(names.DECODER_LABELS[names.STANDARD]), why
