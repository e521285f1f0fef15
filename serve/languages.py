"""Language codes between the drop-in APIs (serve/deepl.py, serve/libretranslate.py) and the bundles.

The APIs speak BCP 47 (`DE`, `EN-US`, `pt-BR`); bundles speak their own codes: NLLB's `deu_Latn`, Marian's
`deu` (of `>>deu<<`), M2M100's `de`, or none at all (a single-pair bundle, whose pair the operator declares
with `seq2onnx serve --languages en:fr`). Every code is normalised with `langcodes` (the IETF/CLDR data:
`deu_Latn` -> `de`, `zho_Hans` -> `zh-Hans`), and a request's code is matched to a bundle's by
`langcodes.closest_match`, so that `EN-US` finds `en` and `pt` finds `pt-BR` while `zh-Hant` never finds
`zh-Hans`. No table of codes is written here. docs/drop-in-apis.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import langcodes

# langcodes' distance: 0 is the same language; 4 a regional variant (en-US for en-GB); above 9 another
# script or language. A request's code finds a bundle's within this.
MAX_DISTANCE = 9
ANY = "*"  # in --languages: every language token of the bundle


class UnknownCode(ValueError):
    """A code that is no IETF language tag (the message names it)."""


@functools.lru_cache(maxsize=4096)
def tag(code: str) -> str:
    """The standard BCP 47 tag of a code: an API's (`EN-US`), NLLB's (`deu_Latn`), Marian's (`deu` or
    `>>deu<<`), M2M100's (`de`).

    Raises:
        UnknownCode: not a valid language tag (names the code).
    """
    text = code.strip()
    if text.startswith(">>") and text.endswith("<<"):
        text = text[2:-2]
    text = text.replace("_", "-")
    try:
        if not langcodes.tag_is_valid(text):
            raise ValueError(text)
        return langcodes.standardize_tag(text)
    except ValueError:
        raise UnknownCode(
            f"{code!r} is not a language code (BCP 47, such as en, de, pt-BR or zh-Hans)"
        ) from None


@functools.lru_cache(maxsize=1024)
def name(code: str) -> str:
    """The English name of a tag, as the APIs' language lists show it (`pt-BR` -> `Portuguese (Brazil)`)."""
    return langcodes.Language.get(code).display_name("en")


def deepl_code(code: str) -> str:
    """DeepL's spelling of a tag: upper case (`EN-US`, `ZH-HANS`)."""
    return code.upper()


@dataclass(frozen=True)
class Side:
    """The languages one side of a bundle reads or writes.

    Attributes:
        codes: standard tag -> the bundle's own language code to pass as source_lang/target_lang, or None
            where the bundle takes no code for it (a single-pair bundle, or a source that a Marian model
            reads without a token).
    """

    codes: dict[str, str | None]

    def find(self, asked: str) -> tuple[str, str | None] | None:
        """(the matching tag, the bundle's code) for a request's code, or None when no language is close."""
        wanted = tag(asked)
        if wanted in self.codes:
            return wanted, self.codes[wanted]
        found, distance = langcodes.closest_match(wanted, list(self.codes), max_distance=MAX_DISTANCE)
        if distance > MAX_DISTANCE or found not in self.codes:
            return None
        return found, self.codes[found]

    def listed(self) -> str:
        """The tags, sorted and comma-separated, for an error message."""
        return ", ".join(sorted(self.codes)) or "none"


def sides(declared: str | None, bundle_codes: dict[str, int], target_lang_in: str) -> tuple[Side, Side]:
    """The (source, target) sides of a bundle from --languages and its language tokens.

    Args:
        declared: "SRC:TGT" (each side a code, a comma list, or `*` for the bundle's language tokens), or
            None: `*:*` for a bundle with language tokens.
        bundle_codes: bundle.json's tokens.languages (code -> token id).
        target_lang_in: where the target token goes; "source_prefix" (Marian) means the tokens are targets
            only, so `*` on the source side is refused.

    Raises:
        ValueError: a malformed declaration, a bad code, or `*` where the bundle has no tokens (each named).
    """
    if declared is None:
        if not bundle_codes:
            return Side({}), Side({})
        if target_lang_in == "source_prefix":  # targets only (Marian's >>code<<): the source is not known
            return Side({}), _side(ANY, bundle_codes, "")
        declared = f"{ANY}:{ANY}"
    source, colon, target = declared.partition(":")
    if not colon or not source or not target:
        raise ValueError(f"{declared!r}: give SOURCE:TARGET, e.g. en:fr, en:de,fr or en:*")
    if source == ANY and target_lang_in == "source_prefix":
        raise ValueError(
            f"{declared!r}: this bundle's language tokens are targets only "
            "(Marian's >>code<<): name the source language, e.g. en:*"
        )
    return _side(source, bundle_codes, declared), _side(target, bundle_codes, declared)


def _side(text: str, bundle_codes: dict[str, int], declared: str) -> Side:
    """One side of --languages: `*` (the bundle's tokens, by their standard tags) or a list of codes."""
    if text == ANY:
        if not bundle_codes:
            raise ValueError(
                f"{declared!r}: `*` means the bundle's language tokens, and this "
                "bundle has none: name its languages, e.g. en:fr"
            )
        return Side({tag(code): code for code in bundle_codes})
    codes: dict[str, str | None] = {}
    for code in filter(None, (c.strip() for c in text.split(","))):
        try:
            standard = tag(code)
        except UnknownCode as e:
            raise ValueError(f"{declared!r}: {e}") from None
        # a named language that is also a token of the bundle: pass the token (NLLB, M2M100)
        codes[standard] = next((c for c in bundle_codes if tag(c) == standard), None)
    return Side(codes)
