"""The knobs of the runtime's onnxruntime sessions, each checked once: SessionTuning (measuring knobs:
optimisation level, thread spinning, which decoder, TF32, prepacking), the spin settings it makes for
each onnxruntime version, and the intra-op thread count. Refusals are runtime/options.py's OptionError.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .option_error import OptionError, _bool, _choice, _describe, _is_int

SPINNING = ("bounded", "none", "unbounded")  # SessionTuning.thread_spinning
ENCODER_SPIN_US, DECODER_SPIN_US = 100, 1000  # "bounded" spinning, per session (microseconds)
SPIN_DURATION_SINCE = (1, 26)  # the first onnxruntime that reads session.intra_op.spin_duration_us


@dataclass(frozen=True)
class SessionTuning:
    """Knobs for measuring what the runtime's defaults bring (scripts/ablate.py).

    Pass as Translator(..., _tuning=SessionTuning(...)). Not part of the public API.

    Attributes:
        optimization: onnxruntime graph optimization level, "all", "extended", "basic" or "none".
        top_k_from_graph: download each step's candidates from the decoder's TopK outputs rather
            than the full [rows, vocab] log-probabilities.
        thread_spinning: how idle intra-op threads wait for the next operator: "bounded" (the
            default), "none" (they sleep at once) or "unbounded" (onnxruntime's own default: every
            session's threads spin ~2^20 pauses before sleeping). A step runs dozens of small
            operators, each split over the threads; a sleeping thread is woken for each (tens of
            microseconds), a spinning one starts at once: a step's weight products at one row took
            half the time. "bounded" lets the decoder's threads spin for DECODER_SPIN_US and the
            encoder's for ENCODER_SPIN_US, so that the two sessions' spinning threads and the search's
            Python do not outnumber the cores, and an idle translator stops burning a core within a
            millisecond. onnxruntime before SPIN_DURATION_SINCE cannot bound a spin: there only the
            decoder spins (docs/optimisation-notes.md, rows 5 and 12).
        decoder: which decoder graph to drive: "auto" (the fused one where the bundle has it and this
            onnxruntime can run it on the chosen provider, else the standard one), "standard" or
            "fused" (an error where the fused one cannot run), for measuring and testing both.
        tf32: let onnxruntime's CUDA provider use TF32 for float32 products (faster on Ampere and later,
            ~1e-3 relative error: token parity with the checkpoint no longer holds). Off by default.
        prepack: let onnxruntime pack each weight into its GEMM kernels' layout when a session is made
            (the default). Off (`session.disable_prepacking`), a session reads the weights file's mapped
            pages as they are: slower products, but no second copy of every weight. The export's check
            of a bundle turns it off: one short decode needs no fast products, and the exporter's
            memory peaks there (docs/optimisation-notes.md row 44).

    Raises:
        OptionError: a value outside its choices.
    """

    optimization: str = "all"
    top_k_from_graph: bool = True
    thread_spinning: str = "bounded"
    decoder: str = "auto"
    tf32: bool = False
    prepack: bool = True

    def __post_init__(self) -> None:
        _choice("optimization", self.optimization, ("all", "extended", "basic", "none"))
        _bool("top_k_from_graph", self.top_k_from_graph)
        _bool("tf32", self.tf32)
        _bool("prepack", self.prepack)
        _choice("thread_spinning", self.thread_spinning, SPINNING)
        _choice("decoder", self.decoder, ("auto", "standard", "fused"))


def spin_settings(spinning: str, graph: str, ort_version: str) -> dict[str, str]:
    """Returns the session config entries for SessionTuning.thread_spinning.

    Args:
        spinning: "bounded", "none" or "unbounded".
        graph: "encoder" or "decoder".
        ort_version: onnxruntime's version string (a bound needs SPIN_DURATION_SINCE).

    Returns:
        {config key: value} for SessionOptions.add_session_config_entry.
    """
    if spinning == "none":
        return {"session.intra_op.allow_spinning": "0"}
    if spinning == "unbounded":
        return {"session.intra_op.allow_spinning": "1"}
    if _version(ort_version) < SPIN_DURATION_SINCE:  # a spin cannot be bounded: only the decoder's
        return {"session.intra_op.allow_spinning": "1" if graph == "decoder" else "0"}
    return {
        "session.intra_op.allow_spinning": "1",
        "session.intra_op.spin_duration_us": str(DECODER_SPIN_US if graph == "decoder" else ENCODER_SPIN_US),
    }


def _version(text: str) -> tuple[int, int]:
    """(major, minor) from the leading digits of a version string ("1.32.0+cpu", "1.27.0.dev20260401");
    (0, 0) where it does not start with them."""
    m = re.match(r"(\d+)(?:\.(\d+))?", text, re.ASCII)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else (0, 0)


def default_intra_threads() -> int:
    """What intra_threads=0 stands for: OMP_NUM_THREADS where it is a positive int, as torch reads it (at most
    the cores), else 0, onnxruntime's own default (one per core)."""
    try:
        threads = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:  # unset, or not an int ("4,2"): ignored, as OpenMP ignores it
        return 0
    return min(threads, os.cpu_count() or 1) if threads > 0 else 0


def check_intra_threads(value) -> int:
    """Checks intra_threads: an int in [0, os.cpu_count()]; 0 is default_intra_threads() (OMP_NUM_THREADS
    where set, else the core count).

    A larger number only adds threads that wait for a core (and memory for each thread's stack).

    Args:
        value (int): the thread count asked for.

    Returns:
        The count, as an int.

    Raises:
        OptionError: not an int in that range (a bool is not an int here).
    """
    cores = os.cpu_count() or 1
    if not _is_int(value) or not 0 <= value <= cores:
        raise OptionError(
            "intra_threads",
            value,
            limit=f"an int in [0, {cores}]",
            shown=_describe(value),
            says=f": this machine has {cores} cores (os.cpu_count()); ",
            hint=f"give an int from 0 (OMP_NUM_THREADS where set, else one per core) to {cores}",
        )
    return int(value)
