"""Several bundles behind one port, routed by (source, target) language: what the drop-in APIs translate with.

`seq2onnx serve BUNDLE --languages en:fr --route en:de=OTHER_BUNDLE ...`: each bundle has its own Engine
(continuous batching, as the native API's); a DeepL or LibreTranslate request goes to the first bundle that
reads its source and writes its target (serve/languages.py matches the codes). The native API
(/v1/translate) keeps serving the first bundle, as before. docs/drop-in-apis.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from seq2onnx.serve.languages import Side, UnknownCode, sides, tag


@dataclass
class Route:
    """One bundle's engine and the languages it translates between.

    Attributes:
        engine: its Engine (serve/engine.py).
        source, target: the languages it reads and writes (serve/languages.py's Side).
    """

    engine: object
    source: Side
    target: Side

    @classmethod
    def of(cls, engine, declared: str | None) -> Route:
        """The route of an engine's bundle, from --languages (or its own language tokens).

        Raises:
            ValueError: a bad declaration (named).
        """
        vocabulary = engine.translator.vocabulary
        source, target = sides(declared, vocabulary.languages, vocabulary.target_lang_in)
        return cls(engine, source, target)


@dataclass
class Choice:
    """Where one request goes: the route, the standard tags matched, the options naming the bundle's codes."""

    route: Route
    source: str
    target: str
    options: dict


class Unsupported(ValueError):
    """A language the served bundles cannot honour.

    Attributes:
        param: the API's parameter at fault (source_lang, target, ...); value: what was asked;
        supported: the codes that would work, as standard tags.
    """

    def __init__(self, param: str, value, why: str, supported: list[str]):
        self.param, self.value, self.supported = param, value, supported
        listed = (
            ", ".join(supported)
            or "none (a bundle's languages are declared with seq2onnx serve --languages SRC:TGT)"
        )
        super().__init__(f"{param}={value!r}: {why}; supported: {listed}")


class Routes:
    """The bundles served, in the order given (the first is also the native API's)."""

    def __init__(self, routes: list[Route]):
        self.routes = routes

    @property
    def engines(self) -> list:
        return [r.engine for r in self.routes]

    def sources(self) -> list[str]:
        """Every source language of any bundle, as standard tags, sorted."""
        return sorted({code for r in self.routes for code in r.source.codes})

    def targets(self, source: str | None = None) -> list[str]:
        """Every target language (of the bundles reading `source`, when given), sorted."""
        return sorted(
            {
                code
                for r in self.routes
                for code in r.target.codes
                if source is None or source in r.source.codes
            }
        )

    def choose(self, source: str | None, target: str, names: tuple[str, str]) -> Choice:
        """The bundle for (source, target); source None: the one language that some bundle writing
        `target` reads (this server detects no language).

        Args:
            source, target: the request's codes (any BCP 47 spelling).
            names: the API's parameter names for them, e.g. ("source_lang", "target_lang"), for errors.
        Raises:
            Unsupported: naming the parameter and listing the codes that would work.
        """
        wanted = self._tag(target, names[1], self.targets())
        writers = [r for r in self.routes if r.target.find(wanted)]
        if not writers:
            raise Unsupported(names[1], target, "no bundle served here translates into it", self.targets())
        if source is None:
            return self._only_source(writers, target, names)
        asked = self._tag(source, names[0], self.sources())
        for route in writers:
            found = route.source.find(asked)
            if found:
                return self._choice(route, found, route.target.find(wanted))
        readers = sorted({c for r in writers for c in r.source.codes})
        raise Unsupported(names[0], source, f"no bundle served here translates it into {target}", readers)

    def _only_source(self, writers: list[Route], target: str, names: tuple[str, str]) -> Choice:
        """The route when the request names no source: only where one language can be meant."""
        readers = sorted({c for r in writers for c in r.source.codes})
        if len(readers) != 1:
            why = "this server detects no language" + (
                f" and the bundles translating into {target} read several"
                if readers
                else " and the bundle's source language is not declared (seq2onnx serve --languages SRC:TGT)"
            )
            raise Unsupported(names[0], None, why + ": name the source language", readers)
        route = next(r for r in writers if readers[0] in r.source.codes)
        source = (readers[0], route.source.codes[readers[0]])
        return self._choice(route, source, route.target.find(tag(target)))

    @staticmethod
    def _tag(code, param: str, supported: list[str]) -> str:
        if not isinstance(code, str) or not code:
            raise Unsupported(param, code, "give a language code", supported)
        try:
            return tag(code)
        except UnknownCode as e:
            raise Unsupported(param, code, str(e), supported) from None

    @staticmethod
    def _choice(route: Route, source: tuple[str, str | None], target: tuple[str, str | None]) -> Choice:
        options = {}
        if source[1] is not None and route.engine.translator.vocabulary.target_lang_in != "source_prefix":
            options["source_lang"] = source[1]  # NLLB, M2M100: a source token
        if target[1] is not None:
            options["target_lang"] = target[1]
        return Choice(route, source[0], target[0], options)
