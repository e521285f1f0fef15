"""`seq2onnx serve`'s options for the drop-in APIs (DeepL, LibreTranslate), several bundles and API keys.

Kept apart from commands/serve.py, which calls add_arguments, check and mount: serve/dropin.py and its
neighbours do the work; docs/drop-in-apis.md explains it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from seq2onnx.errors import CommandError

log = logging.getLogger("seq2onnx.serve")


def add_arguments(p) -> None:
    """Adds --languages, --route, --api-keys, --key-in-flight and --key-per-minute to `serve`'s parser."""
    g = p.add_argument_group(
        "drop-in APIs (DeepL /v2/*, LibreTranslate /translate) and API keys; docs/drop-in-apis.md"
    )
    g.add_argument(
        "--languages",
        metavar="SRC:TGT",
        default=None,
        help="the languages BUNDLE translates between, as BCP 47 codes: en:fr, en:de,fr, or `*` "
        "for the bundle's own language tokens (en:* for a multi-target Marian model). "
        "Default: *:* for a bundle with language tokens (NLLB, M2M100); a single-pair bundle "
        "without it serves only the native API",
    )
    g.add_argument(
        "--route",
        metavar="SRC:TGT=BUNDLE",
        action="append",
        default=[],
        help="also serve BUNDLE for SRC:TGT (as --languages) to the drop-in APIs, on its own "
        "engine; repeat for more (one OPUS-MT bundle per pair). A request goes to the first "
        "bundle, BUNDLE then each --route, that reads its source and writes its target",
    )
    g.add_argument(
        "--api-keys",
        metavar="FILE",
        default=None,
        help="require a key: FILE holds `NAME sha256:HEX [in_flight=N] [per_minute=N] "
        "[characters=N]` a line (python -m seq2onnx.serve.keys NAME makes one); SIGHUP "
        "re-reads it. Without it the server is open to anyone who reaches it",
    )
    g.add_argument(
        "--key-in-flight",
        type=int,
        default=8,
        help="requests in flight per key, where its line sets none (default 8); beyond: 429",
    )
    g.add_argument(
        "--key-per-minute",
        type=int,
        default=600,
        help="requests per minute per key, where its line sets none (default 600); beyond: 429 "
        "with Retry-After",
    )


def check(args) -> None:
    """Refuses a bad value of these options before a bundle is loaded (CommandError naming it)."""
    for option in ("--key-in-flight", "--key-per-minute"):
        value = getattr(args, option[2:].replace("-", "_"))
        if value < 1:
            raise CommandError(f"{option} {value}: give an int >= 1")
    for route in args.route:
        languages, equals, bundle = route.partition("=")
        if not equals or ":" not in languages or not bundle:
            raise CommandError(f"--route {route!r}: give SRC:TGT=BUNDLE, e.g. --route en:de=opus-mt-en-de")
        if not Path(bundle).is_dir():
            raise CommandError(f"--route {route!r}: {bundle} is no bundle directory")
    if args.api_keys is not None:
        from seq2onnx.serve.keys import read_keys

        try:
            read_keys(Path(args.api_keys), args.key_in_flight, args.key_per_minute)
        except (OSError, ValueError) as e:
            raise CommandError(f"--api-keys {args.api_keys}: {e}") from None


def mount(app, args, make_engine) -> None:
    """Mounts the drop-in APIs on `app` (its engine serves BUNDLE), with an engine for each --route
    (make_engine(translator) builds one as --batching says). The extra engines are closed with the app's."""
    from seq2onnx.runtime.translator import Translator
    from seq2onnx.serve.mount import mount as mount_dropin
    from seq2onnx.serve.keys import Gate, reload_on_sighup
    from seq2onnx.serve.routes import Routes

    f = app.state.frontend
    routes = [_route(f.engine, args.languages, "--languages")]
    app.state.also_close = engines = []
    try:
        for option in args.route:
            languages, _, bundle = option.partition("=")
            translator = Translator(
                bundle, device=args.device, intra_threads=args.intra_threads, cache_dir=args.cache_dir
            )
            engines.append(make_engine(translator))
            routes.append(_route(engines[-1], languages, f"--route {option}"))
        gate = Gate(args.api_keys, args.key_in_flight, args.key_per_minute, f.registry)
    except BaseException:
        for engine in engines:
            engine.close()
        raise
    mount_dropin(app, Routes(routes), gate)
    reload_on_sighup(gate)
    if gate.open:
        log.warning(
            "no --api-keys: the server is open; anyone who can reach it may translate (the DeepL "
            "and LibreTranslate endpoints take any key or none)"
        )
    else:
        log.info("--api-keys %s: %d keys; SIGHUP re-reads it", args.api_keys, len(gate.keys))


def _route(engine, languages: str | None, option: str):
    from seq2onnx.serve.routes import Route

    try:
        return Route.of(engine, languages)
    except ValueError as e:
        raise CommandError(f"{option}: {e}") from None
