"""The runtime's options, each checked once by type and range: SearchOptions (how to search),
SessionTuning (measuring knobs for onnxruntime sessions), the intra-op thread count, and the options
checked against a model (lengths, beam against the vocabulary, languages, target prefixes).

Every refusal is an OptionError naming the option by its Python name; a front end names it its own way
(serve/app.py's JSON field, commands/translate.py's --flag) from .option, never from the message's text.

bool is not accepted where an int is meant (True is an int to Python, never a beam size here),
and NaN is refused wherever a float is compared (NaN compares false with every bound).
"""
from __future__ import annotations

import numbers
import os
import re
from dataclasses import dataclass

from .spec import OPTION_RANGES


class OptionError(ValueError):
    """An option's value refused; str(e) is the message in the Python API's names.

    The message reads "{option}={value}{says}{hint}", e.g. "beam_size=0 (int): give an int >= 1 (1 is
    greedy search)". A front end that calls the option otherwise renders it with named(), not by editing
    the text.

    Attributes:
        option: the option's name in the Python API (translate_batch's keyword, or Translator's), e.g.
            "beam_size".
        value: the value refused, as given.
        limit: what the option accepts, in words, e.g. "an int >= 1", "(0, 1]", "one of auto, standard,
            fused".
        hint: the fix, e.g. "give an int >= 1 (1 is greedy search)".
    """

    def __init__(self, option: str, value, *, limit: str, hint: str, says: str = ": ", shown: str | None = "",
                 index: int | None = None, before: str = ""):
        """Args:
            option, value, limit, hint: the attributes.
            says: what the message says between the value and the hint (the reason, with its punctuation).
            shown: the value as the message shows it: "" its repr, None not at all ("target_prefix has 3
                entries...").
            index: the item of a list-valued option at fault ("target_prefix[1] ..."); a front end drops it.
            before: what the message says before the option, e.g. "source 2: ".
        """
        self.option, self.value, self.limit, self.hint = option, value, limit, hint
        self.says, self.index, self.before = says, index, before
        self.shown = repr(value) if shown == "" else shown
        super().__init__(self.named(option if index is None else f"{option}[{index}]", "="))

    def named(self, name: str, sep: str = " ") -> str:
        """The message with the option called `name`, its value after `sep`.

        named("--beam") is "--beam 0 (int): give an int >= 1 ..." where str(e) is "beam_size=0 (int): ...".
        """
        return f"{self.before}{name}{'' if self.shown is None else sep + self.shown}{self.says}{self.hint}"


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _describe(value) -> str:
    return f"{value!r} ({type(value).__name__})"


def _int(name: str, value, low: int, fix: str) -> int:
    if not _is_int(value) or value < low:
        raise OptionError(name, value, limit=f"an int >= {low}", hint=fix, shown=_describe(value))
    return int(value)


def _ranged(name: str, value, note: str) -> float:
    """A real-valued option inside its closed range of spec/bundle.json's option_ranges (NaN is outside)."""
    low, high = OPTION_RANGES[name]
    if not _is_real(value) or not low <= value <= high:
        raise OptionError(name, value, limit=f"[{low:g}, {high:g}]", shown=_describe(value),
                          hint=f"give a number in [{low:g}, {high:g}] ({note})")
    return float(value)


def _bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise OptionError(name, value, limit="True or False", hint="give True or False",
                          shown=_describe(value))
    return value


def _choice(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        listed = ", ".join(choices)
        raise OptionError(name, value, limit=f"one of {listed}", hint=f"choose one of {listed}", says="; ")


@dataclass(frozen=True)
class SearchOptions:
    """How translate_batch searches; every field is checked when the object is made.

    The checks that need the model (max_decoding_length <= max_positions, the default maximum of
    each source) are the Translator's.

    Attributes:
        beam_size: 1 is greedy search.
        num_hypotheses: n-best size: at most beam_size, or any number of samples.
        length_penalty: n-best ranked by score / length^length_penalty.
        max_decoding_length: None: max_length_a x source length + max_length_b.
        min_decoding_length: the end token is forbidden before this many tokens.
        return_scores: return each hypothesis's score.
        return_attention: each hypothesis's [target pieces, source pieces] cross-attention.
        truncate: cut sources longer than the model's positions instead of refusing them.
        max_batch_size: sources decoded together.
        sampling_temperature: None: beam/greedy search; > 0: random sampling.
        sampling_topk: sample among the k likeliest tokens (0: all).
        sampling_topp: ... and among the smallest set whose probability reaches p.
        seed: sampling seed: a sentence's sample depends only on (seed, sentence).
        source_lang, target_lang: language codes of a multilingual model (bundle.json's tokens.languages).
        target_prefix: per source, the target ids forced first (docs/decoding.md).

    Raises:
        OptionError: naming the field, its value and the accepted range.
    """

    beam_size: int = 4  # 1 is greedy search
    num_hypotheses: int = 1  # n-best size: at most beam_size, or any number of samples
    length_penalty: float = 1.0  # n-best ranked by score / length^length_penalty
    max_decoding_length: int | None = None  # None: max_length_a x source length + max_length_b
    min_decoding_length: int = 0  # the end token is forbidden before this many tokens
    return_scores: bool = False
    return_attention: bool = False  # each hypothesis's [target pieces, source pieces] cross-attention
    truncate: bool = False  # cut sources longer than the model's positions instead of refusing them
    max_batch_size: int = 32  # sources decoded together
    sampling_temperature: float | None = None  # None: beam/greedy search; > 0: random sampling
    sampling_topk: int = 0  # sample among the k likeliest tokens (0: all)
    sampling_topp: float = 1.0  # ... and among the smallest set whose probability reaches p
    seed: int | None = None  # sampling seed: a sentence's sample depends only on (seed, sentence)
    # Multilingual models (bundle.json's tokens; checked against the bundle by runtime/vocab.py)
    source_lang: str | None = None  # the source language's code: its token leads the source
    target_lang: str | None = None  # the target language's code: its token is forced (or leads the source)
    target_prefix: list | None = None  # per source, target ids forced first (replaces target_lang's)

    def __post_init__(self) -> None:
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        put("beam_size", _int("beam_size", self.beam_size, 1, "give an int >= 1 (1 is greedy search)"))
        put("num_hypotheses", _int("num_hypotheses", self.num_hypotheses, 1, "give an int >= 1"))
        if self.sampling_temperature is None and self.num_hypotheses > self.beam_size:
            raise OptionError("num_hypotheses", self.num_hypotheses, limit=f"[1, beam_size={self.beam_size}]",
                              says=f" must lie in [1, beam_size={self.beam_size}]: ",
                              hint="raise beam_size or lower num_hypotheses")
        put("length_penalty", _ranged("length_penalty", self.length_penalty, "1.0 is the default"))
        if self.max_decoding_length is not None:
            put("max_decoding_length", _int("max_decoding_length", self.max_decoding_length, 1,
                                            "give an int >= 1, at most the model's max_positions, or None"))
        put("min_decoding_length",
            _int("min_decoding_length", self.min_decoding_length, 0, "give an int >= 0"))
        if self.max_decoding_length is not None and self.min_decoding_length >= self.max_decoding_length:
            raise OptionError("min_decoding_length", self.min_decoding_length,
                              limit=f"below max_decoding_length={self.max_decoding_length}",
                              says=f" must be below max_decoding_length={self.max_decoding_length}: ",
                              hint="lower the minimum or raise the maximum")
        put("return_scores", _bool("return_scores", self.return_scores))
        put("return_attention", _bool("return_attention", self.return_attention))
        put("truncate", _bool("truncate", self.truncate))
        put("max_batch_size", _int("max_batch_size", self.max_batch_size, 1, "give an int >= 1"))
        t = self.sampling_temperature
        if t is not None:
            put("sampling_temperature", _ranged("sampling_temperature", t,
                                                "or None for beam search (beam_size=1 is greedy)"))
        put("sampling_topk",
            _int("sampling_topk", self.sampling_topk, 0, "give an int >= 0 (0 keeps every token)"))
        p = self.sampling_topp
        if not _is_real(p) or not 0 < p <= 1:  # NaN fails the range test
            raise OptionError("sampling_topp", p, limit="(0, 1]", shown=_describe(p),
                              hint="give a number in (0, 1] (1 keeps every token)")
        put("sampling_topp", float(p))
        for name in ("source_lang", "target_lang"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise OptionError(name, value, limit="a str or None", shown=_describe(value),
                                  hint="give a language code (a str) or None")
        if self.seed is not None:
            put("seed",
                _int("seed", self.seed, 0, "give an int >= 0, or None for a different sample each call"))

    @property
    def sampling(self) -> bool:
        """True when sampling_temperature is set: random sampling instead of beam/greedy search."""
        return self.sampling_temperature is not None


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
    return {"session.intra_op.allow_spinning": "1",
            "session.intra_op.spin_duration_us":
                str(DECODER_SPIN_US if graph == "decoder" else ENCODER_SPIN_US)}


def _version(text: str) -> tuple[int, int]:
    """(major, minor) from the leading digits of a version string ("1.32.0+cpu", "1.27.0.dev20260401");
    (0, 0) where it does not start with them."""
    m = re.match(r"(\d+)(?:\.(\d+))?", text, re.ASCII)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else (0, 0)


def check_intra_threads(value) -> int:
    """Checks intra_threads: an int in [0, os.cpu_count()]; 0 is onnxruntime's default (the core count).

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
        raise OptionError("intra_threads", value, limit=f"an int in [0, {cores}]", shown=_describe(value),
                          says=f": this machine has {cores} cores (os.cpu_count()); ",
                          hint=f"give an int from 0 (onnxruntime's default: one per core) to {cores}")
    return int(value)


def resolve_search_options(
    options: dict, decoding: dict, max_positions: int, tgt_vocab: int
) -> SearchOptions:
    """Makes SearchOptions with a bundle's defaults for the options given as None or left out.

    Args:
        options: translate_batch's keyword options by name (the defaults are filled into it).
        decoding: bundle.json's `decoding` (beam_size, length_penalty, min_length defaults).
        max_positions: the model's positions; decoding lengths must fit in them.
        tgt_vocab: the target vocabulary's size; a beam needs at least 2 x beam_size pieces.

    Returns:
        The checked options.

    Raises:
        OptionError: a value of the wrong type or range (the message names it, its limit and the fix).
        TypeError: an unknown option name.
    """
    defaults = decoding
    for name, key, fallback in (("beam_size", "beam_size", 4), ("length_penalty", "length_penalty", 1.0),
                                ("min_decoding_length", "min_length", 0)):
        if options.get(name) is None:
            options[name] = defaults.get(key, fallback)
    resolved = SearchOptions(**options)
    limit = max_positions
    positions = f"; this model has {limit} positions (max_positions in bundle.json): "
    if resolved.max_decoding_length is not None and resolved.max_decoding_length > limit:
        raise OptionError("max_decoding_length", resolved.max_decoding_length, limit=f"[1, {limit}]",
                          says=positions, hint="choose 1..that")
    if resolved.min_decoding_length >= limit:
        raise OptionError("min_decoding_length", resolved.min_decoding_length, limit=f"[0, {limit - 1}]",
                          says=positions, hint=f"choose 0..{limit - 1}")
    beam = resolved.beam_size
    if not resolved.sampling and beam > 1 and 2 * beam > tgt_vocab:  # each step keeps 2 x beam candidates
        raise OptionError("beam_size", beam, limit=f"at most {tgt_vocab // 2}", hint="choose a smaller beam",
                          says=f" needs a target vocabulary of at least {2 * beam} pieces, "
                               f"this model has {tgt_vocab}: ")
    return resolved
