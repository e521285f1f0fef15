"""The options checked against a model: language codes, target prefixes (their ids, count and length) and the
minimum length against each source's maximum. Each refusal is an OptionError (runtime/option_error.py)."""

from __future__ import annotations

from .option_error import OptionError, _is_int
from .options import SearchOptions


def language_id(languages: dict[str, int], code, option: str) -> int:
    """A language code's token id (runtime/vocab.py's Vocabulary.language).

    Args:
        languages: the model's language code -> token id (bundle.json's tokens.languages).
        code: the code asked for.
        option: "source_lang" or "target_lang", for the error.

    Raises:
        OptionError: a code this model does not have, naming it and the known ones.
    """
    if not isinstance(code, str):
        raise OptionError(option, code, limit="a str", says="; ", hint="give a language code (a str)")
    if code not in languages:
        known = sorted(languages)
        listed = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
        fix = f"choose one of {listed}" if known else "this model has no language tokens: leave it out"
        raise OptionError(
            option,
            code,
            limit=f"one of {listed}" if known else "none (no language tokens)",
            says=" is not a language of this model; ",
            hint=fix,
        )
    return languages[code]


def target_prefixes(target_prefix, n: int, tgt_vocab: int, eos_id: int) -> list[list[int]]:
    """Checks translate_batch's target_prefix for n sources: one list of target ids per source.

    Args:
        target_prefix: one sequence of target ids per source.
        n: the sources.
        tgt_vocab: the target vocabulary's size.
        eos_id: the end token, which a prefix may not hold.

    Returns:
        The prefixes as lists of ints.

    Raises:
        OptionError: a list of the wrong length, an item not a list of ids, ids out of range or the end
            token.
    """
    if not isinstance(target_prefix, (list, tuple)) or len(target_prefix) != n:
        got = len(target_prefix) if isinstance(target_prefix, (list, tuple)) else type(target_prefix).__name__
        raise OptionError(
            "target_prefix",
            target_prefix,
            limit=f"{n} lists of target ids",
            shown=None,
            says=f" has {got} entries for {n} sources; ",
            hint="give one list of target ids per source",
        )
    out = []
    for i, prefix in enumerate(target_prefix):
        if not isinstance(prefix, (list, tuple)) or not all(_is_int(x) for x in prefix):
            raise OptionError(
                "target_prefix",
                target_prefix,
                limit="lists of target ids",
                shown=None,
                index=i,
                says=f" is {prefix!r}; ",
                hint="give a list of target token ids",
            )
        bad = [int(x) for x in prefix if not 0 <= int(x) < tgt_vocab or int(x) == eos_id]
        if bad:
            raise OptionError(
                "target_prefix",
                target_prefix,
                limit=f"ids in [0, {tgt_vocab}) but {eos_id}",
                shown=None,
                index=i,
                hint="give target ids of the text before the translation",
                says=f" has ids {bad[:5]} outside [0, {tgt_vocab}) or the end token {eos_id}; ",
            )
        out.append([int(x) for x in prefix])
    return out


def check_prefix_options(
    options: SearchOptions,
    n: int,
    languages: dict[str, int],
    tgt_vocab: int,
    eos_id: int,
    max_positions: int | None = None,
) -> None:
    """Checks the options that depend on a model's vocabulary (source_lang, target_lang, target_prefix) for n
    sources, as translate_batch would, so that a front end refuses them before it starts any work.

    Args:
        options: the checked SearchOptions.
        n: the sources the options go with.
        languages, tgt_vocab, eos_id: the model's (Translator.vocabulary.languages, .tgt_vocab, .eos_id).
        max_positions: the model's positions (Translator.max_positions): a target_prefix must leave one for
            the start token and one for a token of its own (else the search would cut it silently).

    Raises:
        OptionError: as language_id and target_prefixes, or a target_prefix too long for the model.
    """
    for name in ("source_lang", "target_lang"):
        if getattr(options, name) is not None:
            language_id(languages, getattr(options, name), name)
    if options.target_prefix is not None:
        prefixes = target_prefixes(options.target_prefix, n, tgt_vocab, eos_id)
        if max_positions is not None:
            check_prefix_length(options.target_prefix, prefixes, max_positions)


def check_prefix_length(given, prefixes: list[list[int]], max_positions: int) -> None:
    """Refuses a target_prefix that leaves no room in the model's positions (the search would cut it).

    Args:
        given: the option's value, for the message.
        prefixes: the prefixes as read (target_prefixes).
        max_positions: the model's positions: one goes to the start token and one to a token after the prefix.

    Raises:
        OptionError: naming the longest prefix, its length and the room.
    """
    longest = max(map(len, prefixes), default=0)
    if longest > max_positions - 2:
        i = next(i for i, p in enumerate(prefixes) if len(p) == longest)
        room = max_positions - 2
        raise OptionError(
            "target_prefix",
            given,
            limit=f"at most {room} ids",
            shown=None,
            index=i,
            says=f" has {longest} ids; ",
            hint=f"give at most {room} (the model has {max_positions} positions, one for "
            "the start token and one for a token after the prefix)",
        )


def check_min_length(min_decoding_length: int, limit: int, tokens: int, source: int | None = None) -> None:
    """Checks min_decoding_length against one source's maximum length (translate_batch's per-source check).

    Args:
        min_decoding_length: the option's value.
        limit: the source's maximum target length (max_length_a x tokens + max_length_b, at most
            max_positions).
        tokens: the source's tokens.
        source: the source's index in a batch; None for generate_tokens's one text.

    Raises:
        OptionError: min_decoding_length >= limit.
    """
    if min_decoding_length < limit:
        return
    whose = "this text's" if source is None else "its"
    raise OptionError(
        "min_decoding_length",
        min_decoding_length,
        limit=f"below {limit}",
        before="" if source is None else f"source {source}: ",
        says=f" is not below {whose} maximum length {limit} (max_length_a x {tokens} tokens + "
        "max_length_b in bundle.json, at most max_positions): ",
        hint="pass a larger max_decoding_length or a smaller min_decoding_length",
    )
