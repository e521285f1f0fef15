"""The decoding options' flags of `seq2onnx translate` (and translate-dataset): made from the options' one
declaration (runtime/options.py), read into translate_batch's options, and checked with the command's
one-line errors (CommandError naming the --flag), before the model loads and against it."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from seq2onnx.errors import CommandError

if TYPE_CHECKING:  # the runtime is imported when a bundle is loaded, not for --help
    from seq2onnx.runtime.options import OptionError


def _id_list(text: str) -> list[int]:
    """--target-prefix: "12,7" -> [12, 7]."""
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of token ids, e.g. 128028 or 5,17"
        )
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more token ids >= 0, separated by commas")
    return ids


# How a flag reads its value, by the option's kind (runtime/options.py's Option.kind).
_READ = {"int": int, "number": float, "lang": str, "ids": _id_list}


def add_option_flags(p, only: tuple[str, ...] | None = None, notes: dict[str, str] | None = None) -> None:
    """The decoding options' flags (all, or those of the options `only` names), made from their one
    declaration (runtime/options.py: Option.cli, its kind, doc and default), with the command's `notes` on
    their help: each flag's dest is translate_batch's name of its option."""
    from seq2onnx.runtime.option_spec import api_default
    from seq2onnx.runtime.options import OPTIONS

    for name, o in OPTIONS.items():
        if o.cli and (only is None or name in only):
            default = api_default(name)
            said = f"the bundle's decoding.{o.bundle}" if o.bundle else default
            metavar = {"lang": "CODE", "ids": "IDS"}.get(o.kind, name.split("_")[-1].upper())
            p.add_argument(
                o.cli,
                dest=name,
                type=_READ[o.kind],
                default=default,
                metavar=metavar,
                help=f"{o.doc}{(notes or {}).get(name, '')} (default: {said})",
            )


def check_options(args) -> None:
    """Option errors that need no bundle, before the model loads."""
    from seq2onnx.runtime.option_spec import api_default
    from seq2onnx.runtime.options import OPTIONS, OptionError, check

    cores = os.cpu_count() or 1
    if not 0 <= args.threads <= cores:
        raise CommandError(
            f"--threads {args.threads}: this machine has {cores} cores; give 1 to {cores}, "
            "or 0 to use them all"
        )
    given = [
        o.cli
        for name, o in OPTIONS.items()
        if o.cli
        and o.scope == "text"
        and name not in ("beam_size", "length_penalty", "sampling_temperature")
        and getattr(args, name) != api_default(name)
    ]
    if given and args.sampling_temperature is None:  # as serve's 422 and seq2onnx-js: they mean nothing alone
        raise CommandError(f"{given[0]} needs --sampling-temperature (sampling); give it, or drop {given[0]}")
    for name, o in OPTIONS.items():
        value = getattr(args, name) if o.cli else None
        try:
            if value is not None:  # None: the bundle's default
                check(name, value, o)
        except OptionError as e:
            raise option_error(e) from None
    if args.input not in (None, "-") and not Path(args.input).is_file():
        raise CommandError(f"--input {args.input}: no such file")


def check_against_model(args, translator) -> None:
    """Option errors that need the bundle, before the first line is read: the command's own, then every option
    as translate_batch will check it (languages and the prefix against the bundle too)."""
    from seq2onnx.runtime.model_options import check_prefix_options
    from seq2onnx.runtime.options import OptionError

    beam = args.beam_size if args.beam_size is not None else translator.bundle.decoding.get("beam_size", 4)
    if args.num_hypotheses > beam and args.sampling_temperature is None:
        raise CommandError(
            f"--n-best {args.num_hypotheses} is more than the beam size {beam}; give --beam "
            f"{args.num_hypotheses} or more, or a smaller --n-best"
        )
    limit = translator.max_positions
    if args.max_decoding_length is not None and not 1 <= args.max_decoding_length <= limit:
        raise CommandError(
            f"--max-length {args.max_decoding_length}: this model has {limit} positions "
            f"(max_positions in bundle.json); give 1 to {limit}"
        )
    try:
        options = translator.search_options(**search_options(args))
        check_prefix_options(
            options,
            1,
            translator.vocabulary.languages,
            translator.tgt_vocab,
            translator.eos_id,
            max_positions=translator.max_positions,
        )
    except OptionError as e:
        raise option_error(e) from None


def option_error(e: OptionError) -> CommandError:
    """The runtime's OptionError as the command's one-line error, naming the option's flag (Option.cli)."""
    from seq2onnx.runtime.options import OPTIONS

    flag = {"intra_threads": "--threads"}.get(e.option) or getattr(OPTIONS.get(e.option), "cli", None)
    return CommandError(e.named(flag) if flag else str(e))


def search_options(args, lines: int = 1) -> dict:
    """translate_batch's options as the command's flags set them (None: the bundle's default), for `lines`."""
    from seq2onnx.runtime.options import OPTIONS

    options = {name: getattr(args, name) for name, o in OPTIONS.items() if o.cli}
    return options | {"target_prefix": [args.target_prefix] * lines if args.target_prefix else None}
