"""The runtime's decoding options, each checked once by type and range: SearchOptions (how to search)
and the options checked against a model (lengths, beam against the vocabulary). The sessions' knobs
(SessionTuning, the intra-op thread count) are runtime/session_tuning.py's.

Each decoding option is declared once, as a SearchOptions field with its Option (OPTIONS[name]): its doc,
kind and limits, the methods that take it, and its names elsewhere (the CLI flag, the HTTP field). The
Translator's signatures, the CLI's flags, the HTTP request models and spec/capabilities.json (the JS host's
names and limits) are made from those (runtime/option_spec.py; docs/options.md).

Every refusal is an OptionError (runtime/option_error.py) naming the option by its Python name; a front
end names it its own way (the HTTP field, the --flag: Option.http, Option.cli) from .option, never from
the message's text.

bool is not accepted where an int is meant (True is an int to Python, never a beam size here),
and NaN is refused wherever a float is compared (NaN compares false with every bound).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from .option_error import OptionError, _describe, _is_int, _is_real


@dataclass(frozen=True)
class Option:
    """One decoding option's metadata: the one place that states its limits, its doc and its names elsewhere.

    The argparse flags of `seq2onnx translate`, the HTTP request models (serve/schemas.py), the options'
    docstring section and signature on Translator, and spec/capabilities.json (the JS host's names and
    limits: runtime/option_spec.py writes it) are all made from these.

    Attributes:
        kind: "int", "number" (a real number), "bool", "lang" (a language code) or "ids" (target ids per
            source: checked against the model, runtime/model_options.py).
        doc: what it does, one sentence.
        low, high: the range of an int or a number (None: unbounded); `low_open`: low itself is outside.
        nullable: None is a value of SearchOptions (where the doc says what it means).
        note: words after the fix of a refused value, e.g. " (1 is greedy search)".
        scope: the methods that take it: "stream" (generate_tokens, translate and translate_batch), "text"
            (translate and translate_batch) or "batch" (translate_batch only).
        bundle: the bundle.json decoding key whose value the option takes where a call gives None or leaves
            it out (so a call's None is a value even where SearchOptions's is not), e.g. "min_length".
        cli: `seq2onnx translate`'s flag, or None (not a flag of it).
        http: the HTTP request's field, or None (not served).
    """

    kind: str
    doc: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    nullable: bool = False
    note: str = ""
    scope: str = "batch"
    bundle: str | None = None
    cli: str | None = None
    http: str | None = None

    @property
    def limit(self) -> str:
        """What the option accepts, in words: "an int >= 1", "[-10, 10]", "(0, 1]", "True or False"."""
        if self.kind == "number":
            return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        return {
            "int": f"an int >= {self.low}",
            "bool": "True or False",
            "lang": "a str or None",
            "ids": "lists of target ids",
        }[self.kind]

    @property
    def hint(self) -> str:
        """The fix of a refused value, as every host says it: "give an int >= 1 (1 is greedy search)"."""
        given = {
            "int": f"give {self.limit}",
            "number": f"give a number in {self.limit}",
            "bool": "give True or False",
            "lang": "give a language code (a str) or None",
            "ids": "give a list of target token ids",
        }[self.kind]
        return given + self.note


def _option(default, **meta):
    """A SearchOptions field and its Option."""
    return field(default=default, metadata={"option": Option(**meta)})


_STREAM, _TEXT = "stream", "text"


@dataclass(frozen=True)
class SearchOptions:
    """How translate_batch searches; every field is checked when the object is made, against its Option.

    Each field's Option (`OPTIONS[name]`) holds its doc, limits and names elsewhere. The checks that need
    the model (max_decoding_length <= max_positions, the default maximum of each source, languages and
    target prefixes) are resolve_search_options's and runtime/model_options.py's.

    Raises:
        OptionError: naming the field, its value and the accepted range.
    """

    beam_size: int = _option(
        4,
        kind="int",
        low=1,
        note=" (1 is greedy search)",
        bundle="beam_size",
        scope=_TEXT,
        cli="--beam",
        http="beam_size",
        doc="the beams searched; 1 is greedy search; with sampling_temperature only 1",
    )
    num_hypotheses: int = _option(
        1,
        kind="int",
        low=1,
        cli="--n-best",
        http="num_hypotheses",
        doc="the n-best returned per source: at most beam_size, or any number of samples",
    )
    length_penalty: float = _option(
        1.0,
        kind="number",
        low=-10,
        high=10,
        note=" (1.0 is the default)",
        bundle="length_penalty",
        scope=_TEXT,
        cli="--length-penalty",
        http="length_penalty",
        doc="the n-best are ranked by score / length^length_penalty (docs/decoding.md); the range keeps "
        "length^length_penalty finite (1e308 at length 1,024 from about 102)",
    )
    max_decoding_length: int | None = _option(
        None,
        kind="int",
        low=1,
        note=", at most the model's max_positions, or None",
        nullable=True,
        scope=_STREAM,
        cli="--max-length",
        http="max_decoding_length",
        doc="the most target tokens; default max_length_a x source tokens + max_length_b (bundle.json), "
        "capped by the model's positions",
    )
    min_decoding_length: int = _option(
        0,
        kind="int",
        low=0,
        bundle="min_length",
        scope=_STREAM,
        cli="--min-length",
        http="min_decoding_length",
        doc="the end token is forbidden before this many target tokens",
    )
    return_scores: bool = _option(
        False,
        kind="bool",
        http="return_scores",
        doc="return each hypothesis's score (its sum of log-probabilities, end token included)",
    )
    return_attention: bool = _option(
        False,
        kind="bool",
        doc="return each hypothesis's [target pieces, source pieces] cross-attention, computed after the "
        "search (hypotheses and scores are unchanged)",
    )
    truncate: bool = _option(
        False,
        kind="bool",
        scope=_STREAM,
        http="truncate",
        doc="cut a source longer than the model's positions instead of refusing it",
    )
    max_batch_size: int = _option(
        32, kind="int", low=1, cli="--batch-size", doc="the most sources decoded together (sorted by length)"
    )
    sampling_temperature: float | None = _option(
        None,
        kind="number",
        low=0.001,
        high=1000,
        note=" (or None for beam search (beam_size=1 is greedy))",
        nullable=True,
        scope=_TEXT,
        cli="--sampling-temperature",
        http="sampling_temperature",
        doc="sample from softmax(log-probabilities / T) instead of searching (under 0.001 they divide to "
        "infinities); None: beam or greedy search",
    )
    sampling_topk: int = _option(
        0,
        kind="int",
        low=0,
        note=" (0 keeps every token)",
        scope=_TEXT,
        cli="--sampling-topk",
        http="sampling_topk",
        doc="sample among the k likeliest tokens (0: all); only with sampling_temperature",
    )
    sampling_topp: float = _option(
        1.0,
        kind="number",
        low=0,
        high=1,
        low_open=True,
        note=" (1 keeps every token)",
        scope=_TEXT,
        cli="--sampling-topp",
        http="sampling_topp",
        doc="... and among the smallest set whose probability reaches p (1: all); only with "
        "sampling_temperature",
    )
    seed: int | None = _option(
        None,
        kind="int",
        low=0,
        note=", or None for a different sample each call",
        nullable=True,
        scope=_TEXT,
        cli="--seed",
        http="seed",
        doc="the sampling seed: a source's sample depends only on (seed, source); only with "
        "sampling_temperature",
    )
    source_lang: str | None = _option(
        None,
        kind="lang",
        nullable=True,
        scope=_STREAM,
        cli="--source-lang",
        http="source_lang",
        doc="a multilingual model's source language code (bundle.json's tokens.languages): its token leads "
        "the source",
    )
    target_lang: str | None = _option(
        None,
        kind="lang",
        nullable=True,
        scope=_STREAM,
        cli="--target-lang",
        http="target_lang",
        doc="a multilingual model's target language code: its token is forced first (or leads the source, "
        "multilingual Marian)",
    )
    target_prefix: list | None = _option(
        None,
        kind="ids",
        nullable=True,
        cli="--target-prefix",
        http="target_prefix",
        doc="per source, the target ids forced first (CTranslate2's target_prefix; replaces target_lang's "
        "token; docs/decoding.md)",
    )

    def __post_init__(self) -> None:
        for name, option in OPTIONS.items():
            object.__setattr__(self, name, check(name, getattr(self, name), option))  # frozen
        if self.sampling_temperature is None and self.num_hypotheses > self.beam_size:
            raise OptionError(
                "num_hypotheses",
                self.num_hypotheses,
                limit=f"[1, beam_size={self.beam_size}]",
                says=f" must lie in [1, beam_size={self.beam_size}]: ",
                hint="raise beam_size or lower num_hypotheses",
            )
        if self.max_decoding_length is not None and self.min_decoding_length >= self.max_decoding_length:
            raise OptionError(
                "min_decoding_length",
                self.min_decoding_length,
                limit=f"below max_decoding_length={self.max_decoding_length}",
                says=f" must be below max_decoding_length={self.max_decoding_length}: ",
                hint="lower the minimum or raise the maximum",
            )

    @property
    def sampling(self) -> bool:
        """True when sampling_temperature is set: random sampling instead of beam/greedy search."""
        return self.sampling_temperature is not None


# Every decoding option by its Python name (translate_batch's keyword), in SearchOptions's order.
OPTIONS: dict[str, Option] = {f.name: f.metadata["option"] for f in fields(SearchOptions)}
DEFAULTS = {f.name: f.default for f in fields(SearchOptions)}
SCOPES = {"stream": ("stream",), "text": ("stream", "text"), "batch": ("stream", "text", "batch")}
_TAKES = {
    scope: tuple(name for name, o in OPTIONS.items() if o.scope in scopes) for scope, scopes in SCOPES.items()
}


def check(name: str, value, option: Option):
    """Returns an option's value checked against its Option (a None where it is nullable; ids unchecked here).

    Raises:
        OptionError: the value's type or range refused, naming the option, the value, the limit and the fix.
    """
    if (value is None and option.nullable) or option.kind == "ids":
        return value
    kind, low, high, plain = option.kind, option.low, option.high, type(value)  # int, float: no ABC check
    if kind == "int":
        ok = (plain is int or _is_int(value)) and value >= low
    elif kind == "number":
        # NaN fails both comparisons; the type is checked before them
        ok = (
            (plain is float or plain is int or _is_real(value))
            and value <= high
            and (low < value if option.low_open else low <= value)
        )
    else:
        ok = plain is (bool if kind == "bool" else str) or isinstance(value, bool if kind == "bool" else str)
    if not ok:
        raise OptionError(name, value, limit=option.limit, hint=option.hint, shown=_describe(value))
    return int(value) if kind == "int" else float(value) if kind == "number" else value


def unknown_options(given, method: str, scope: str) -> None:
    """Refuses the keywords of a call that are not options of `method` (of `scope`: OPTIONS' scopes).

    Raises:
        TypeError: naming the first unknown keyword and the options the method takes.
    """
    takes = _TAKES[scope]
    bad = [name for name in given if name not in takes]
    if bad:
        elsewhere = f"; {bad[0]} is translate_batch's" if bad[0] in OPTIONS else ""
        listed = ", ".join(takes)
        raise TypeError(f"{method}() got an unknown option {bad[0]!r}{elsewhere}; it takes {listed}")


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
        TypeError: an unknown option name (naming it and the options).
    """
    unknown_options(options, "translate_batch", "batch")
    for name, option in OPTIONS.items():
        if option.bundle and options.get(name) is None:
            options[name] = decoding.get(option.bundle, DEFAULTS[name])
    resolved = SearchOptions(**options)
    limit = max_positions
    positions = f"; this model has {limit} positions (max_positions in bundle.json): "
    if resolved.max_decoding_length is not None and resolved.max_decoding_length > limit:
        raise OptionError(
            "max_decoding_length",
            resolved.max_decoding_length,
            limit=f"[1, {limit}]",
            says=positions,
            hint="choose 1..that",
        )
    if resolved.min_decoding_length >= limit:
        raise OptionError(
            "min_decoding_length",
            resolved.min_decoding_length,
            limit=f"[0, {limit - 1}]",
            says=positions,
            hint=f"choose 0..{limit - 1}",
        )
    beam = resolved.beam_size
    if not resolved.sampling and beam > 1 and 2 * beam > tgt_vocab:  # each step keeps 2 x beam candidates
        raise OptionError(
            "beam_size",
            beam,
            limit=f"at most {tgt_vocab // 2}",
            hint="choose a smaller beam",
            says=f" needs a target vocabulary of at least {2 * beam} pieces, this model has {tgt_vocab}: ",
        )
    return resolved
