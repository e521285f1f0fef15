"""The onnxruntime sessions of a Translator: each graph's session options, the decoder driven, the standard
one loaded late, and the optimized graphs kept between loads (runtime/devices.py picks the device)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from .bundle import DECODER_LABELS, STANDARD, Bundle, BundleError
from .decoders import pick_decoder
from .devices import ort, pick_device, providers_for
from .session_tuning import SessionTuning, default_intra_threads, spin_settings
from .session_cache import SessionCache, entry_key
from . import exact_int8
from .u8s8_probe import precision_entries

_LEVELS = {
    "all": "ORT_ENABLE_ALL",
    "extended": "ORT_ENABLE_EXTENDED",
    "basic": "ORT_ENABLE_BASIC",
    "none": "ORT_DISABLE_ALL",
}


def session_options(
    tuning: SessionTuning,
    intra_threads: int,
    graph: str,
    device: str = "cpu",
    quantized: bool = False,
    entries: dict[str, str] | None = None,
) -> ort.SessionOptions:
    """Makes the session options of one graph (warnings kept off stderr).

    On the CPU, onnxruntime's memory patterns are off for float graphs. A pattern plans one block for all
    of a run's intermediate tensors of one set of input shapes; a decoder's shapes change at every step
    (the cache grows, rows leave), so each step plans and takes a block of another size from the arena.
    Without them the OPUS-MT-size peak is 61 MB lower and the recipe model's fair bench 0.99-1.21x as
    fast. int8 graphs keep them: their many small quantizing tensors, each taken from the arena under its
    lock, made two threads sharing a session 25-30% slower at one row (docs/optimisation-notes.md row 41).

    Args:
        tuning: the optimisation level and thread spinning (SessionTuning's defaults are the runtime's).
        intra_threads: threads inside each operator (0: default_intra_threads()).
        graph: "encoder" or "decoder" (they spin differently; runtime/session_tuning.py says why).
        device: "cpu" or "cuda", where the session runs.
        quantized: the graph is an int8 bundle's (bundle.json's `quantization`).
        entries: the config entries (None: session_entries').

    Returns:
        Options for ort.InferenceSession; where this CPU's u8 x s8 kernel saturates, also
        onnxruntime's exact u8 x u8 products for int8 graphs (runtime/u8s8_probe.py).
    """
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[tuning.optimization])
    options.intra_op_num_threads = intra_threads or default_intra_threads()
    if device == "cpu" and not quantized:
        options.enable_mem_pattern = False
    for key, value in (session_entries(tuning, graph, quantized) if entries is None else entries).items():
        options.add_session_config_entry(key, value)
    options.log_severity_level = 3  # no warnings about provider fallbacks on stderr
    return options


def session_entries(tuning: SessionTuning, graph: str, quantized: bool = False) -> dict[str, str]:
    """The config entries session_options sets: thread spinning, for an int8 graph (`quantized`; a float
    one runs no probe: optimisation-notes row 92) on x86 without VNNI the exact u8 x u8 products
    (runtime/u8s8_probe.py), and no packing where tuning.prepack is off."""
    entries = spin_settings(tuning.thread_spinning, graph, ort.__version__)
    entries |= precision_entries(ort) if quantized else {}
    if not tuning.prepack:
        entries["session.disable_prepacking"] = "1"
    return entries


@dataclass
class Sessions:
    """A bundle's graphs loaded for one Translator.

    Attributes:
        device: "cuda" or "cpu", where they run.
        device_reason: why.
        encoder: the encoder's session.
        decoder: the session of the decoder the search drives.
        variant: "fused" or "standard", the decoder driven.
        reason: why that one.
        standard: the standard decoder's session (the same as decoder when that is the one driven), what
            return_attention and the continuous batcher run. Where the fused decoder is driven and the
            bundle keeps its weights in a weights file, it is loaded (and checked) the first time it is
            asked for: most translators never need it, and it would hold a copy of the decoder's weights.
    """

    device: str
    device_reason: str
    encoder: object
    decoder: object
    variant: str
    reason: str
    _standard: object = None
    _load_standard: Callable[[], object] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def standard(self):
        """The standard decoder's session, loaded now if it was not yet."""
        if self._standard is None:
            with self._lock:
                if self._standard is None:
                    self._standard = self._load_standard()
                    self._load_standard = None  # its bytes may go
        return self._standard

    def by_label(self) -> dict:
        """Returns {file key: session} of every graph loaded so far."""
        loaded = {"encoder": self.encoder, DECODER_LABELS[self.variant]: self.decoder}
        if self._standard is not None:
            loaded[DECODER_LABELS[STANDARD]] = self._standard
        return loaded


def _drop_model_copy(session) -> None:
    """Makes a CPU session forget the serialized model it was made from.

    onnxruntime's Python InferenceSession keeps the bytes it was given (its `_model_bytes`) for as long
    as it lives, so that set_providers(), or the fallback of a run whose execution provider failed, can
    make the session again: a second copy of every graph next to the session's own weights (48 MB for
    the Tatoeba model's three fp32 graphs; docs/optimisation-notes.md, row 19). A CPU session has no
    provider to fall back to (the fallback is the CPU provider itself), so the runtime turns the fallback
    off and lets the copy go. Where onnxruntime has no such attribute nothing happens.
    """
    if isinstance(getattr(session, "_model_bytes", None), bytes) and session.get_providers() == [
        "CPUExecutionProvider"
    ]:
        session.disable_fallback()
        session._model_bytes = None


def open_sessions(
    bundle: Bundle,
    device: str,
    tuning: SessionTuning,
    intra_threads: int,
    *,
    release_bytes: bool = False,
    check_late: Callable[[str, object], None] | None = None,
    cache: SessionCache | None = None,
    graphs: dict | None = None,
) -> Sessions:
    """Loads a bundle's encoder, its standard decoder and the decoder to drive, from the bytes read.

    Args:
        bundle: the read bundle, with its files' bytes (read_bundle).
        device: "auto", "cuda" or "cpu" (pick_device).
        tuning: optimisation level, spinning and which decoder (SessionTuning).
        intra_threads: threads inside each operator (0: default_intra_threads()).
        release_bytes: the caller owns `bundle` and needs no graph's bytes after this: on the CPU each
            graph's bytes leave bundle.data as soon as its session is made, so that the load's peak
            memory holds the graphs not yet loaded rather than all of them (on CUDA they stay: a provider
            that does not start means loading every graph again on the CPU).
        check_late: check_late(label, session) checks a session loaded after this returns (the standard
            decoder, loaded when first asked for: Sessions.standard) as the caller checked the others.
        cache: on the CPU, where bundle's hashes were checked, sessions are made from this cache's
            optimized graphs with pre-packed weights, made and saved there where missing
            (runtime/session_cache.py). None: every load optimizes and packs.
        graphs: every graph of the bundle as read (runtime/checks.py: read_graphs): on the CPU, where the u8 x
            s8 kernel saturates, the int8 weights they allow are flipped to uint8 in the weights' copy rather
            than rewritten by onnxruntime (runtime/exact_int8.py). None: onnxruntime rewrites them all.

    Returns:
        The sessions. With device "auto", a CUDA provider that did not start falls back to the CPU
        (and the decoder is picked again: on the CPU the fused one may run).

    Raises:
        BundleError: onnxruntime cannot load a graph (the message names the file).
        RuntimeError: device="cuda" where CUDA cannot run or its provider did not start.
        DecoderUnavailable: tuning forces the fused decoder where it cannot run.
        ValueError: an int8 bundle with optimisations below 'extended' where onnxruntime's u8 x s8 kernel
            saturates (its exact rewrite is an extended-level optimisation).
    """
    _refuse_inexact_int8(bundle, tuning)
    with bundle.weights.kept_linked() if bundle.weights is not None else contextlib.nullcontext():
        return _open(bundle, device, tuning, intra_threads, release_bytes, check_late, cache, graphs)


def _open(
    bundle: Bundle,
    device: str,
    tuning: SessionTuning,
    intra_threads: int,
    release_bytes: bool,
    check_late: Callable[[str, object], None] | None,
    cache: SessionCache | None,
    graphs: dict | None,
) -> Sessions:
    """open_sessions' work, while every session it makes maps one link of the weights file."""
    picked, why = pick_device(device)
    checked = _session_loader(
        bundle, tuning, intra_threads, picked, release_bytes=release_bytes, cache=cache, graphs=graphs
    )
    variant, decoder, reason, encoder = _decoder_then_encoder(bundle, picked, tuning, checked)
    if picked == "cuda" and decoder.get_providers()[0] != "CUDAExecutionProvider":
        if device == "cuda":
            raise RuntimeError(
                "onnxruntime's CUDA provider did not start (check the CUDA and cuDNN libraries)"
            )
        picked, why = "cpu", "the CUDA provider did not start; using the CPU"
        checked = _session_loader(
            bundle, tuning, intra_threads, picked, release_bytes=release_bytes, cache=cache, graphs=graphs
        )
        variant, decoder, reason = pick_decoder(bundle, picked, tuning.decoder, checked)
        encoder = checked("encoder")
    return _sessions(picked, why, encoder, decoder, variant, reason, bundle, checked, check_late)


def _decoder_then_encoder(bundle: Bundle, picked: str, tuning: SessionTuning, checked) -> tuple:
    """(variant, decoder session, why that variant, encoder session) on the `picked` device.

    The decoder first: packing its largest weight (a tied projection, 1 GB at NLLB-600M size) maps
    the table while its packed copy is made; done before the encoder's weights are packed, the
    load's peak holds the table twice beside the decoder alone (docs/optimisation-notes.md row 37).
    A small bundle makes its encoder's session beside (BESIDE_MAX_BYTES).
    """
    small = picked == "cpu" and _packs_small(bundle)
    encoder_beside = Beside(lambda: checked("encoder"), "encoder") if small else None
    try:
        variant, decoder, reason = pick_decoder(bundle, picked, tuning.decoder, checked)
    except BaseException:
        if encoder_beside is not None:
            encoder_beside.wait()  # no session goes on being made after a failed load returns
        raise
    encoder = checked("encoder") if encoder_beside is None else encoder_beside.result()
    return variant, decoder, reason, encoder


def _sessions(
    picked, why, encoder, decoder, variant, reason, bundle: Bundle, checked, check_late
) -> Sessions:
    """The Sessions, with the standard decoder: the one driven, loaded now, or loaded when first asked for."""
    standard_label = DECODER_LABELS[STANDARD]
    if variant == STANDARD:
        return Sessions(picked, why, encoder, decoder, variant, reason, decoder)
    if bundle.weights is None:  # its weights are inside its graph file: load it now and let the bytes go
        return Sessions(picked, why, encoder, decoder, variant, reason, checked(standard_label))

    def load_standard():
        session = checked(standard_label)
        if check_late is not None:
            check_late(standard_label, session)
        return session

    return Sessions(picked, why, encoder, decoder, variant, reason, None, load_standard)


# A bundle whose weights file is smaller makes its encoder's session beside its decoder's, in a thread of
# its own: onnxruntime lets go of the GIL while it packs weights, so on two cores or more the load takes
# about the longer of the two (OPUS-MT size: 0.34 -> 0.26 s, docs/optimisation-notes.md row 43). A larger
# one makes them one after the other, the decoder first: there the decoder's tied table, mapped while it
# is packed, would otherwise sit beside the encoder's packed weights at the load's peak (row 37).
BESIDE_MAX_BYTES = 1 << 30


def _packs_small(bundle: Bundle) -> bool:
    """Whether the bundle's weights file (where it has none, the files read) is under BESIDE_MAX_BYTES."""
    if bundle.weights is not None:
        return bundle.weights.size < BESIDE_MAX_BYTES
    return sum(len(data) for data in bundle.data.values()) < BESIDE_MAX_BYTES


class Beside:
    """fn() run in a thread of its own while the caller does something else (onnxruntime lets go of the
    GIL while it makes a session)."""

    def __init__(self, fn: Callable[[], object], name: str):
        self._outcome: dict = {}

        def run():
            try:
                self._outcome["value"] = fn()
            except BaseException as e:  # raised in the caller's thread by result()
                self._outcome["error"] = e

        self._thread = threading.Thread(target=run, name=f"seq2onnx-load-{name}", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Waits for the thread, whatever it made or raised."""
        self._thread.join()

    def result(self):
        """What fn() returned, once it has.

        Raises:
            What fn() raised.
        """
        self.wait()
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome["value"]


def _refuse_inexact_int8(bundle: Bundle, tuning: SessionTuning) -> None:
    """Refuses an int8 bundle with optimisations below 'extended' where the u8 x s8 kernel saturates.

    Raises:
        ValueError: naming the optimisation level and the fix.
    """
    if (
        bundle.meta.get("quantization")
        and precision_entries(ort)
        and tuning.optimization in ("basic", "none")
    ):
        # onnxruntime rewrites int8 weights for its exact kernel in an extended-level optimisation only
        raise ValueError(
            f"optimization={tuning.optimization!r} with an int8 bundle on this CPU: its int8 products "
            "are exact only through onnxruntime's 'extended' or 'all' optimisations "
            "(runtime/u8s8_probe.py); use one of those, or a float32 bundle"
        )


def _session_loader(
    bundle: Bundle,
    tuning: SessionTuning,
    intra_threads: int,
    picked: str,
    *,
    release_bytes: bool,
    cache: SessionCache | None = None,
    graphs: dict | None = None,
) -> Callable[[str], object]:
    """A function that makes the session of one of the bundle's graphs on the picked device.

    Args:
        bundle: the read bundle, with its files' bytes.
        tuning: the session options' settings.
        intra_threads: threads inside each operator (0: default_intra_threads()).
        picked: "cuda" or "cpu".
        release_bytes: on the CPU, drop each graph's bytes from bundle.data once its session is made.
        cache: where sessions' optimized graphs are kept (open_sessions), or None.
        graphs: the bundle's graphs as read, for flipping int8 weights (open_sessions), or None.

    Returns:
        checked(label) -> session (BundleError, naming the file, where onnxruntime cannot load the graph).
    """
    providers, weights = providers_for(picked, tuning.tf32), bundle.weights
    quantized = bool(bundle.meta.get("quantization"))
    # a cache entry is keyed by the weights' checked hash: none where hashes were not checked
    if picked != "cpu" or (weights is not None and weights.sha256 is None):
        cache = None
    if picked == "cpu" and quantized and precision_entries(ort):
        exact_int8.flip(weights, graphs)  # before any session of this load (or of another on this bundle)

    def load(label: str):
        graph = "encoder" if label == "encoder" else "decoder"
        entries = session_entries(tuning, graph, quantized)
        data, entries = exact_int8.as_flipped(weights, label, bundle.bytes(label), entries)

        # one SessionOptions per session: the weights file's option is per session
        def create(*configures):
            options = session_options(tuning, intra_threads, graph, picked, quantized, entries)
            for configure in configures:
                configure(options)
            return ort.InferenceSession(data, options, providers=providers)

        def make(*configures):  # build's configure saves the optimized graph (runtime/session_cache.py)
            if weights is None:
                return create(*configures)
            return weights.open_session(lambda configure: create(configure, *configures))

        args = (tuning, intra_threads, graph, weights, quantized, entries)
        session = make() if cache is None else _from_cache(cache, data, make, *args)
        if picked == "cpu":
            _drop_model_copy(session)
            if release_bytes:
                bundle.data.pop(label, None)  # made: these bytes are needed no more
        return session

    return lambda label: _named(bundle, label, load)


def _named(bundle: Bundle, label: str, load):
    """load(label), its failure named: onnxruntime's as a graph it cannot load (BundleError, the file and
    the fix); a BundleError (a damaged weights file found by the cache's wait for its hash) as it is."""
    try:
        return load(label)
    except BundleError:
        raise
    except Exception as e:  # onnxruntime raises its own types for unreadable graphs
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BundleError(
            f"{bundle.file(label)}: onnxruntime cannot load this graph ({first[:300]}); "
            f"re-export the bundle (files.{label})"
        ) from e


def _from_cache(cache, data, make, tuning, intra_threads, graph, weights, quantized, entries):
    """The session of one graph from the cache's entry, or made (and the entry saved) where it has none.

    The entry is saved only once the weights file's deferred hash has passed: an entry made from a
    damaged file would otherwise outlive it under the good file's key.
    """
    key = entry_key(
        data, None if weights is None else weights.sha256, ort.__version__, tuning.optimization, entries
    )
    path = cache.model(key)
    if path is not None:
        options = session_options(tuning, intra_threads, graph, "cpu", quantized, entries)
        # the entry is the optimized graph: optimizing it again would only cost time
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception:  # onnxruntime's own types: a damaged entry is made again
            cache.discard(key)
    return cache.build(key, make, before_saving=None if weights is None else weights.verify)


def graph_session(bundle: Bundle, label: str, providers: list[str], entries: dict[str, str] | None = None):
    """Makes an onnxruntime session of one of a bundle's graphs, its external data from the bundle's weights
    file.

    For callers that make their own sessions (`seq2onnx verify`); a Translator's sessions are open_sessions'.

    Args:
        bundle: the bundle read (its graph's bytes kept).
        label: the graph's file key.
        providers: onnxruntime's providers.
        entries: session config entries (onnxruntime's defaults otherwise; the threads are
            default_intra_threads()).
    """

    data, entries = exact_int8.as_flipped(bundle.weights, label, bundle.bytes(label), entries or {})

    def create(configure=None):
        options = ort.SessionOptions()
        options.intra_op_num_threads = default_intra_threads()
        for key, value in entries.items():
            options.add_session_config_entry(key, value)
        if configure is not None:
            configure(options)
        return ort.InferenceSession(data, options, providers=providers)

    return create() if bundle.weights is None else bundle.weights.open_session(create)
