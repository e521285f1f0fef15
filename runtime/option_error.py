"""OptionError, the one refusal of an option's value, and the type checks that every option module shares
(runtime/options.py's SearchOptions, runtime/session_tuning.py, runtime/model_options.py).

bool is not accepted where an int is meant (True is an int to Python, never a beam size here).
"""

from __future__ import annotations

import numbers


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

    def __init__(
        self,
        option: str,
        value,
        *,
        limit: str,
        hint: str,
        says: str = ": ",
        shown: str | None = "",
        index: int | None = None,
        before: str = "",
    ):
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


def _bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise OptionError(
            name, value, limit="True or False", hint="give True or False", shown=_describe(value)
        )
    return value


def _choice(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        listed = ", ".join(choices)
        raise OptionError(name, value, limit=f"one of {listed}", hint=f"choose one of {listed}", says="; ")
