"""`seq2onnx web BUNDLE OUT`: a static site that translates in the browser, no server-side inference.

The site is the page (js/web/), the JS host's browser build (plain ES modules from js/src/, bound
by an import map), the bundle spec that host takes its names and limits from (spec/bundle.json,
the one the Python runtime reads), onnxruntime-web's WebAssembly build and @sctg/sentencepiece-js
(SentencePiece compiled to WebAssembly, embedded in its module), all copied from js/node_modules,
and the bundle's standard graphs and tokenisers. Nothing is fetched from the internet at run time,
so it can be served behind a firewall by any static file server (`python -m http.server`).
Torch-free: this module needs only the standard library and seq2onnx.runtime (which checks the bundle).
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

from seq2onnx import atomic
from seq2onnx.runtime.bundle import BUNDLE_JSON, DECODER_LABELS, SPEC_PATH, STANDARD
from seq2onnx.runtime.option_spec import CAPABILITIES_PATH

# The JS host's platform-free modules and its browser entry point (never platform-node.js).
HOST_FILES = (
    "spec.js",
    "options.js",
    "bundle.js",
    "checks.js",
    "search.js",
    "sampling.js",
    "tokenizer.js",
    "translator.js",
    "platform-web.js",
    "index-web.js",
)
# Where the site keeps the bundle spec: host/spec.js fetches ../spec/bundle.json beside itself. It is
# the spec of this package (SPEC_PATH, the repository's spec/bundle.json), the one that checked the bundle.
SITE_SPEC = "spec/bundle.json"
PAGE_FILES = ("index.html", "app.js", "shims/fs.js", "shims/buffer.js")
# (package folder, file in it, name in the site). onnxruntime-web's WASM-only build with its
# JavaScript glue bundled in, so that it needs only the .wasm beside it; renamed .js because some
# static servers do not know .mjs and browsers refuse a module served as application/octet-stream.
VENDOR_FILES = (
    ("onnxruntime-web", "dist/ort.wasm.bundle.min.mjs", "ort/ort.wasm.bundle.min.js"),
    ("onnxruntime-web", "dist/ort-wasm-simd-threaded.wasm", "ort/ort-wasm-simd-threaded.wasm"),
    ("onnxruntime-web", "package.json", "ort/package.json"),  # its version and licence (MIT; no LICENSE file)
    ("@sctg/sentencepiece-js", "dist/index.js", "sentencepiece/index.js"),
    ("@sctg/sentencepiece-js", "LICENSE", "sentencepiece/LICENSE"),
)
# The graphs a browser can run: onnxruntime-web has no contrib kernels (the spec's contrib_domain),
# so a fused decoder stays out and the standard one serves.
ENCODER_LABEL = "encoder"  # graphs.encoder and files.encoder: a key of the spec's files.required
BROWSER_GRAPHS = (ENCODER_LABEL, DECODER_LABELS[STANDARD])
BUNDLE_FOLDER = "bundle"


def default_js_dir() -> Path:
    """Returns the js/ folder of the checkout this package runs from (the repository root is the package)."""
    return Path(__file__).resolve().parents[1] / "js"


def _check_js_dir(js_dir: Path) -> None:
    from seq2onnx.errors import CommandError

    if not all((js_dir / name).is_file() for name in ("package.json", "src/index-web.js", "web/index.html")):
        raise CommandError(
            f"--js-dir {js_dir}: no JS host there (package.json, src/index-web.js, "
            "web/index.html); point it at the js/ folder of a seq2onnx checkout"
        )
    missing = [f"src/{name}" for name in HOST_FILES if not (js_dir / "src" / name).is_file()]
    missing += [f"web/{name}" for name in PAGE_FILES if not (js_dir / "web" / name).is_file()]
    if missing:
        raise CommandError(
            f"--js-dir {js_dir}: the JS host lacks {', '.join(missing)}; point it at the js/ "
            "folder of a seq2onnx checkout of this version"
        )
    manifest = json.loads((js_dir / "package.json").read_text(encoding="utf-8"))
    for package, _, _ in VENDOR_FILES:
        installed = js_dir / "node_modules" / package / "package.json"
        if not installed.is_file():
            raise CommandError(
                f"{installed.parent}: missing; install the JS dependencies first: npm ci --prefix {js_dir}"
            )
        want = manifest.get("dependencies", {}).get(package)
        have = json.loads(installed.read_text(encoding="utf-8")).get("version")
        if want is not None and have != want:
            raise CommandError(
                f"{installed.parent}: version {have}, js/package.json pins {want}; "
                f"reinstall: npm ci --prefix {js_dir}"
            )


def _site_meta(meta: dict) -> dict:
    """bundle.json as the site serves it: only the files and graphs a browser loads."""
    keep = dict(meta)
    keep["files"] = {k: v for k, v in meta["files"].items() if k not in meta["graphs"] or k in BROWSER_GRAPHS}
    keep["graphs"] = {k: v for k, v in meta["graphs"].items() if k in BROWSER_GRAPHS}
    return keep


def _write_site(site: Path, bundle, js_dir: Path) -> None:
    for name in PAGE_FILES:
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(js_dir / "web" / name, site / name)
    (site / "host").mkdir()
    for name in HOST_FILES:
        shutil.copyfile(js_dir / "src" / name, site / "host" / name)
    (site / SITE_SPEC).parent.mkdir(parents=True)
    shutil.copyfile(SPEC_PATH, site / SITE_SPEC)
    # host/spec.js fetches the options' spec beside it too (the decoding options' names and limits)
    shutil.copyfile(CAPABILITIES_PATH, site / SITE_SPEC.replace("bundle.json", CAPABILITIES_PATH.name))
    for package, source, target in VENDOR_FILES:
        (site / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(js_dir / "node_modules" / package / source, site / target)
    # index.html's import map names the .js copy of onnxruntime-web (see VENDOR_FILES).
    page = site / "index.html"
    html = page.read_text(encoding="utf-8").replace("ort.wasm.bundle.min.mjs", "ort.wasm.bundle.min.js")
    page.write_text(html, encoding="utf-8")
    meta = _site_meta(bundle.meta)
    target = site / BUNDLE_FOLDER
    target.mkdir()
    for key, entry in meta["files"].items():
        dest = target / entry["path"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        # read as a stream (runtime/weights.py): copied from the directory checked, hashed again
        if key == "weights":
            bundle.weights.copy_to(dest)
            continue
        dest.write_bytes(bundle.bytes(key))  # the bytes that were hashed and checked, not the path again
    if meta == bundle.meta:  # byte for byte when nothing was left out
        (target / BUNDLE_JSON).write_bytes(bundle.bytes(BUNDLE_JSON))
    else:
        (target / BUNDLE_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build_site(
    bundle_dir: str | Path, out: str | Path, *, js_dir: str | Path | None = None, force: bool = False
) -> Path:
    """Writes the static site for a bundle into `out`, atomically (a temporary folder beside it, then a
    rename).

    The bundle is read once and loaded by the Python runtime first, with every check a host makes
    (every graph, the tokenizers, bundle.json against both): a bundle the browser would refuse is
    refused here. The site gets exactly the bytes that were checked.

    Args:
        bundle_dir: the bundle.
        out: the site's folder.
        js_dir: the JS host (js/ of a seq2onnx checkout, with its node_modules); None: default_js_dir().
        force: replace an existing `out`.

    Returns:
        `out`.

    Raises:
        BundleError: a missing, damaged or inconsistent bundle.
        CommandError: `out` exists (without force), would hold or replace the bundle or the JS host,
            or js_dir lacks the host or its node_modules.
    """
    from seq2onnx.errors import CommandError
    from seq2onnx.runtime.bundle import read_bundle
    from seq2onnx.runtime.translator import Translator

    bundle = read_bundle(bundle_dir)
    Translator(bundle, device="cpu", intra_threads=1)  # the load-time checks; the site holds these bytes
    js_dir = Path(js_dir) if js_dir is not None else default_js_dir()
    _check_js_dir(js_dir)
    out = Path(out)
    atomic.refuse_overlap(out, {"the bundle": bundle.path, "the JS host": js_dir}, CommandError)
    if out.exists() and not force:
        raise CommandError(f"{out} exists; choose another OUT or pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise CommandError(f"{out} exists and is not a folder; refusing to replace it")
    with atomic.building(out, force, "site", error=CommandError) as temp:
        _write_site(temp, bundle, js_dir)
    return out


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def add(subparsers) -> None:
    """Registers `seq2onnx web` on the CLI's subparsers."""
    p = subparsers.add_parser(
        "web",
        help="write a static site that translates in the browser (onnxruntime-web, no server-side inference)",
        description="Write a self-contained static site into OUT: the page, the JS host and its bundle spec, "
        "onnxruntime-web's WebAssembly files and the bundle's standard graphs. Serve it with any "
        "static file server, "
        "e.g. python -m http.server -d OUT -b 127.0.0.1 8000. Needs the JS dependencies: "
        "npm ci --prefix js.",
    )
    p.add_argument("bundle", metavar="BUNDLE", help="a bundle made by `seq2onnx export`")
    p.add_argument("out", metavar="OUT", help="the folder to write (refused if it exists, unless --force)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument(
        "--js-dir",
        default=None,
        help=f"the JS host's folder, with node_modules installed (default: {default_js_dir()})",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    """`seq2onnx web`: builds the site and says how to serve it."""
    out = build_site(args.bundle, args.out, js_dir=args.js_dir, force=args.force)
    print(
        f"wrote {out} ({_size(out) / 1e6:.1f} MB); serve it with:\n"
        f"  python -m http.server -d {shlex.quote(str(out))} -b 127.0.0.1 8000\n"
        "and open http://127.0.0.1:8000/"
    )
    return 0
