"""The browser host (the page of `seq2onnx web`) as `seq2onnx verify-host --host browser` and the browser
tests run it: finding headless Chromium and the page driver, serving a site on 127.0.0.1, and driving the
page through translations (js/tools/drive-page.mjs, puppeteer-core) as a user would.

The page takes text, not ids: it tokenizes each line itself, and shows each line's n-best with its token
ids and scores (data attributes) and a heatmap whose columns are the source pieces. Standard library only.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from seq2onnx import errors
from seq2onnx.commands.host_report import compare_pieces
from seq2onnx.commands.node_host import find_node_host, js_dir_default

CHROMIUM_NAMES = ("chromium", "chromium-browser")  # Debian's and Ubuntu's names on PATH
DRIVER = ("tools", "drive-page.mjs")  # in the js/ folder
DRIVER_MODULES = ("puppeteer-core", "onnxruntime-web", "@sctg/sentencepiece-js")
SERVER_START_S = 60  # for http.server to print its port
_INSTALL = "install it (Debian: apt-get install chromium) or pass --chromium PATH"


def find_chromium(chromium: str | None = None) -> str:
    """Returns the Chromium executable: `chromium` (else the first of CHROMIUM_NAMES on PATH).

    Raises:
        CommandError: none on PATH, or `chromium` is not an executable file; the message names
            `apt-get install chromium` and --chromium PATH.
    """
    if chromium is None:
        found = next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)
        if found is None:
            raise errors.CommandError(
                f"chromium is not installed (none of {', '.join(CHROMIUM_NAMES)} on PATH): {_INSTALL}"
            )
        return found
    path = shutil.which(chromium)
    if path is None:
        raise errors.CommandError(
            f"--chromium {chromium}: not an executable file; give the path of the Chromium "
            f"binary, or {_INSTALL}"
        )
    return path


def browser_skip_reason(js_dir: str | Path | None = None) -> str:
    """Why the browser cannot be driven here, with the fix; "" when Chromium, node and the JS
    host's dependencies are present (the browser tests skip with this line)."""
    js = Path(js_dir) if js_dir is not None else js_dir_default()
    if not any(map(shutil.which, CHROMIUM_NAMES)):
        return "chromium is not installed: apt-get install chromium (Debian) to run the browser test"
    if shutil.which("node") is None:
        return (
            "node is not installed: install Node.js >= 18 (Debian: apt-get install nodejs npm) "
            "to run the browser test"
        )
    if not all((js / "node_modules" / name).is_dir() for name in DRIVER_MODULES):
        return "js/node_modules is missing: run `npm ci --prefix js` to build and test the web site"
    return ""


def find_browser_host(
    chromium: str | None = None, node: str | None = None, js_dir: str | Path | None = None
) -> dict:
    """Returns the browser host to drive: find_node_host's fields plus "chromium", "driver",
    "chromium_version" and "onnxruntime_web".

    Raises:
        CommandError: naming what to install or pass when Chromium, node, the driver or the JS
            dependencies (puppeteer-core, onnxruntime-web) are missing.
    """
    path = find_chromium(chromium)
    host = find_node_host(node, js_dir)
    js = Path(host["js_dir"])
    for package in DRIVER_MODULES:
        if not (js / "node_modules" / package / "package.json").is_file():
            raise errors.CommandError(
                f"{js / 'node_modules' / package}: missing; install the JS host's dependencies: "
                f"npm ci --prefix {js}"
            )
    driver = js.joinpath(*DRIVER)
    if not driver.is_file():
        raise errors.CommandError(
            f"{driver}: missing; pass --js-dir DIR, the js/ folder of a seq2onnx checkout"
        )
    try:
        said = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise errors.CommandError(f"{path} --version failed ({e}); {_INSTALL}") from e
    ort_web = json.loads(
        (js / "node_modules" / "onnxruntime-web" / "package.json").read_text(encoding="utf-8")
    )
    return {
        **host,
        "chromium": path,
        "driver": driver,
        "chromium_version": said.strip() or "unknown version",
        "onnxruntime_web": ort_web.get("version"),
    }


class StaticServer:
    """`python -m http.server` on 127.0.0.1, on a free port that the server picks itself (port 0)."""

    def __init__(self, directory: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "http.server", "0", "-b", "127.0.0.1", "-d", str(directory)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = self.proc.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N ..." or "" on exit
        match = re.search(r"port (\d+)", line)
        if not match:
            self.stop()
            raise errors.CommandError(f"python -m http.server did not start on 127.0.0.1: {line!r}")
        self.url = f"http://127.0.0.1:{match.group(1)}/"

    def __enter__(self) -> StaticServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


def drive_page(
    site: Path,
    sentences: list[str],
    runs: list[dict],
    screenshot: Path | None = None,
    *,
    host: dict | None = None,
    timeout_ms: int = 240_000,
    fill: bool = False,
    weights: bool = True,
) -> tuple[dict, str]:
    """Serves `site` on 127.0.0.1 and drives its page in headless Chromium through `runs`.

    Args:
        site: a folder written by build_site.
        sentences, runs: the page's input lines, and each run's {beamSize, numHypotheses,
            sourceLang?, targetLang?} (js/tools/drive-page.mjs).
        screenshot: where to save a PNG of the page after the last run; None: none.
        host: find_browser_host(); None: found with the defaults.
        timeout_ms: the page's load and each translation's limit.
        fill: set the text box at once instead of typing each key (many sentences).
        weights: read the heatmaps' weights back (else only their source pieces).

    Returns:
        (the driver's JSON report, the server's URL).

    Raises:
        CommandError: the driver failed (its last lines of stderr).
    """
    host = host or find_browser_host()
    job = {
        "chromium": host["chromium"],
        "sentences": sentences,
        "runs": runs,
        "screenshot": str(screenshot) if screenshot else None,
        "timeoutMs": timeout_ms,
        "fill": fill,
        "weights": weights,
    }
    with StaticServer(site) as server:
        job["url"] = server.url
        proc = subprocess.run(
            [host["node"], str(host["driver"])],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            encoding="utf-8",
            cwd=host["js_dir"],
            timeout=timeout_ms / 1000 * (len(runs) + 1) + 120,
        )
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:]) or "no message"
        raise errors.CommandError(f"the page driver failed (exit {proc.returncode}): {tail}")
    return json.loads(proc.stdout), server.url


def _page_results(run: dict) -> list[dict]:
    """A run's n-bests as the Node host writes them: {"hypotheses", "token_ids", "scores"}."""
    return [
        {
            "hypotheses": [h["text"] for h in r["hypotheses"]],
            "token_ids": [h["tokens"] for h in r["hypotheses"]],
            "scores": [h["score"] for h in r["hypotheses"]],
        }
        for r in run["results"]
    ]


def browser_searches(
    host: dict,
    bundle_dir: str | Path,
    sentences: list[str],
    searches: dict[str, tuple[int, int]],
    langs: dict[str, str | None],
    log,
    timeout_ms: int = 3_600_000,
) -> tuple[dict[str, list[dict]], dict[str, dict], list[list[str]], dict]:
    """Builds the site of `bundle_dir` in a temporary folder and translates `sentences` on its page,
    each search once (all lines in one press of Translate).

    Returns:
        (each search's results as _page_results, each search's {"translate_s"} from the click to
        the page's done state, each sentence's source pieces read from the first run's heatmaps
        with "</s>" last, {"load_s"}).

    Raises:
        CommandError: the page did not load, a translation failed, or a line is missing.
    """
    from seq2onnx.commands.web import build_site

    lang_fields = {"sourceLang": langs.get("source_lang"), "targetLang": langs.get("target_lang")}
    runs = [
        {"beamSize": size, "numHypotheses": n_best, **{k: v for k, v in lang_fields.items() if v}}
        for size, n_best in searches.values()
    ]
    with tempfile.TemporaryDirectory(prefix="seq2onnx-verify-host-") as tmp:
        log("the browser host: building the site")
        site = build_site(bundle_dir, Path(tmp) / "site", js_dir=host["js_dir"])
        log(f"the browser host: {', '.join(searches)} on {len(sentences)} sentences in headless Chromium")
        started = time.perf_counter()
        report, url = drive_page(
            site, sentences, runs, host=host, timeout_ms=timeout_ms, fill=True, weights=False
        )
        log(f"the browser host: done in {time.perf_counter() - started:.0f} s")
    if report["loadStatus"]["state"] != "ready":
        raise errors.CommandError(f"the page did not load the bundle: {report['loadStatus']['text']}")
    results, timing = {}, {}
    for label, run in zip(searches, report["runs"], strict=True):
        if run["status"]["state"] != "done" or [r["source"] for r in run["results"]] != sentences:
            raise errors.CommandError(
                f"the page's {label} run ended {run['status']['state']!r} with {len(run['results'])} of "
                f"{len(sentences)} lines (or other lines): {run['status']['text']}"
            )
        results[label], timing[label] = _page_results(run), {"translate_s": run["ms"] / 1000}
    pieces = [a["sourcePieces"] for a in report["runs"][0]["attention"]]
    outside = [r for r in report["requests"] if not r.startswith(url)]
    if outside or report["errors"]:
        raise errors.CommandError(
            f"the page asked for {outside[:3]} outside its server or logged errors {report['errors'][:3]}"
        )
    return results, timing, pieces, {"load_s": report["loadMs"] / 1000}


def browser_side(runner, bundle_dir, sentences, searches, tokenizers, options, log):
    """verify-host's browser side: the page's searches (it tokenizes the texts itself) and the row of
    its source pieces; the page shows no target tokenization, so its texts rows stand for the target
    tokenizer's decoding."""
    results, timing, pieces, _ = browser_searches(
        runner, bundle_dir, sentences, searches, options["langs"], log
    )
    differences: list[dict] = []
    checks = [compare_pieces("source tokenizer", sentences, tokenizers[0], pieces, differences)]
    return results, timing, checks, differences
