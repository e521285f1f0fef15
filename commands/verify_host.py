"""`seq2onnx verify-host BUNDLE`: does another host translate this bundle as the Python runtime does?

The host is the Node one (js/, `node js/bin/seq2onnx-js.mjs`) or, with --host browser, the page of
`seq2onnx web` in headless Chromium (commands/browser_host.py). Both read the same bundle, so the
comparison needs neither PyTorch nor the checkpoint: the Python runtime is the reference
(docs/bundle-format.md says so), and the other host must give

- the same tokenizer ids (and detokenised text) for every source sentence and every target text;
- the same target token ids for greedy search and for beam search with its whole n-best, fed the
  same source ids (the Python tokenizer's), so that a tokenizer difference shows in its own row
  and not again in every search row;
- scores (sums of log-probabilities, end token included) within SCORE_BOUND.

Both hosts drive the standard decoder (graphs.decoder: the Node host cannot run the fused one's
com.microsoft kernels), on the CPU, with the same threads, the same batches (256 lines per
translate call, at most 32 sources per batch, sorted by length) and bundle.json's decoding
defaults (or --max-length on both). A difference is shown with both hosts' ids and scores, so that
a near-tie between two hypotheses can be told from a convention difference. The Python runtime's
sessions are closed before the Node host runs, so that the two hosts' memory does not add up.

The browser host takes text, not ids, and shows no ids of its tokenizer: its source tokenizer row
compares the source pieces of the page's heatmaps, and its search rows take the texts (a tokenizer
difference shows there too). All lines go to the page at once, as one translate call (the Python
runtime is given them the same way), with bundle.json's decoding defaults (no --max-length).
Torch-free.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

from seq2onnx import atomic, errors
from seq2onnx.commands.host_sentences import DEFAULT_SENTENCES, read_sentences
from seq2onnx.commands.browser_host import browser_side, find_browser_host
from seq2onnx.commands.host_report import (
    check_row,
    host_label,
    compare_search,
    format_report,
)
from seq2onnx.commands.node_host import MAX_BATCH, find_node_host, js_dir_default, node_side

HOSTS = ("node", "browser")
SCORE_BOUND = 1e-4  # max |score difference| between hosts, per hypothesis with identical ids
READ_CHUNK = 256  # js/bin/seq2onnx-js.mjs: lines per translateBatch call (as `seq2onnx translate`)


# -- the sentences ---------------------------------------------------------------------------------


def _target_tokens(results) -> int:
    """Target tokens produced, as `seq2onnx bench` counts them: the best hypothesis and its end token."""
    return sum(len(r[0]) + 1 for r in results)


def _python_searches(
    translator,
    source_ids: list[list[int]],
    searches: dict[str, tuple[int, int]],
    target_lang: str | None,
    max_length: int | None,
    log,
    chunk: int = READ_CHUNK,
) -> tuple[dict[str, list], dict[str, float]]:
    """Each search's results from the Python runtime, read in chunks of `chunk` lines, and its seconds."""
    python, python_s = {}, {}
    for label, (size, n_best) in searches.items():
        log(f"the Python runtime: {label} on {len(source_ids)} sentences")
        t0 = time.perf_counter()
        python[label] = [
            r
            for start in range(0, len(source_ids), chunk)
            for r in translator.translate_batch(
                source_ids[start : start + chunk],
                beam_size=size,
                num_hypotheses=n_best,
                return_scores=True,
                max_batch_size=MAX_BATCH,
                target_lang=target_lang,
                max_decoding_length=max_length,
            )
        ]
        python_s[label] = time.perf_counter() - t0
    return python, python_s


def _check_options(beam, max_length, host: str) -> None:
    if host not in HOSTS:
        raise errors.CommandError(f"--host {host}: give one of {', '.join(HOSTS)}")
    if isinstance(beam, bool) or not isinstance(beam, int) or beam < 2:
        raise errors.CommandError(
            f"--beam {beam}: give a beam of at least 2 (greedy search is compared anyway)"
        )
    if host == "browser" and max_length is not None:
        raise errors.CommandError(
            f"--max-length {max_length}: the page has no length field (it decodes to bundle.json's "
            "max_length_a x source length + max_length_b); leave --max-length out with --host browser"
        )


def _check_max_length(max_length, max_positions: int) -> None:
    if max_length is not None and (
        isinstance(max_length, bool)
        or not isinstance(max_length, int)
        or not 1 <= max_length <= max_positions
    ):
        raise errors.CommandError(
            f"--max-length {max_length}: give an integer from 1 to {max_positions} "
            "(the model's max_positions)"
        )


def _search_rows(host, sentences, searches, python, other, differences) -> list[dict]:
    checks, score_rows = [], []
    for label, (size, n_best) in searches.items():
        name = label if size == 1 else f"{label} (n-best {n_best})"
        ids_row, text_row, worst, compared = compare_search(
            name, sentences, python[label], other[label], differences, host
        )
        checks += [ids_row, text_row]
        score_rows.append(
            check_row(
                f"{name} max |score diff|",
                f"{worst:.1e}",
                f"{SCORE_BOUND:.0e}",
                worst <= SCORE_BOUND,
                f"over {compared} hypotheses with identical ids",
            )
        )
    return checks + score_rows


def _speed(searches, python, python_s, other, timing) -> dict:
    """Each search's seconds and target tokens on both sides (a measurement, not a check)."""
    return {
        label: {
            "python_s": python_s[label],
            "host_s": timing[label]["translate_s"] if timing[label] else None,
            "python_tokens": _target_tokens([r.token_ids for r in python[label]]),
            "host_tokens": _target_tokens([n["token_ids"] for n in other[label]]),
        }
        for label in searches
    }


def verify_host(
    bundle_dir: str | Path,
    sentences: list[str],
    *,
    host: str = "node",
    beam: int = 4,
    threads: int = 1,
    node: str | None = None,
    js_dir: str | Path | None = None,
    chromium: str | None = None,
    log=None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    max_length: int | None = None,
) -> dict:
    """Translates `sentences` with the Python runtime and another host, and compares them.

    Args:
        bundle_dir, sentences: the bundle and the texts.
        host: "node" (js/bin/seq2onnx-js.mjs, fed the Python tokenizer's ids) or "browser" (the
            page of `seq2onnx web` in headless Chromium, fed the texts, its site in a temp folder).
        beam: the beam size, at least 2 (greedy search is compared anyway).
        threads: onnxruntime threads of the Python runtime, and of the Node host.
        node, js_dir, chromium: the node executable, the JS host's folder (find_node_host) and the
            browser host's Chromium (None: chromium on PATH).
        log (Callable[[str], None] | None): called with a line of progress.
        source_lang, target_lang: a multilingual bundle's languages, given to both hosts.
        max_length: the decoding length limit of both hosts (1 to the model's max_positions); None:
            bundle.json's max_length_a x source length + max_length_b. A cap keeps a run on a model
            that seldom ends a sentence (random weights) short. Refused with host "browser" (the
            page has no such field).

    Returns:
        The report (host_report.py): `passed`, the checks, the first differences of each, timing.

    Raises:
        CommandError: the host cannot run (the message names what to install), a beam below 2 or a
            max_length outside 1..max_positions.
        BundleError: the bundle is refused by the Python runtime.
    """
    log = log or (lambda message: None)
    _check_options(beam, max_length, host)
    runner = find_browser_host(chromium, node, js_dir) if host == "browser" else find_node_host(node, js_dir)
    started = time.perf_counter()
    langs = {"source_lang": source_lang, "target_lang": target_lang}
    searches = {"greedy": (1, 1), f"beam {beam}": (beam, beam)}
    py = _python_side(bundle_dir, sentences, searches, threads, langs, max_length, host, log)
    gc.collect()  # the translator's sessions are gone: free them before the other host loads the bundle
    options, tokenizers = {"langs": langs, "max_length": max_length, "threads": threads}, py["tokenizers"]
    if host == "browser":
        side = browser_side(runner, bundle_dir, sentences, searches, tokenizers, options, log)
    else:
        side = node_side(
            runner, bundle_dir, sentences, py["source_ids"], searches, py["results"], tokenizers, options, log
        )
    other, timing, checks, differences = side
    checks += _search_rows(host, sentences, searches, py["results"], other, differences)
    speed = _speed(searches, py["results"], py["seconds"], other, timing)
    settings = {"max_length": max_length, "threads": threads, "beam": beam}
    return _report(bundle_dir, host, runner, py, settings, checks, differences, speed, started)


def _report(bundle_dir, host, runner, py, settings, checks, differences, speed, started) -> dict:
    import onnxruntime

    versions = {
        k: runner.get(k) for k in ("node_version", "onnxruntime_node", "chromium_version", "onnxruntime_web")
    }
    return {
        "bundle": str(bundle_dir),
        "host": host,
        "host_label": host_label(host, runner),
        **{k: v for k, v in versions.items() if v is not None},
        "onnxruntime": onnxruntime.__version__,
        "decoder": py["decoder"],
        **settings,
        "sentences": len(py["source_ids"]),
        "empty": sum(not ids for ids in py["source_ids"]),
        "truncated": sum(cut for _, cut in py["prepared"]),
        "checks": checks,
        "differences": differences,
        "speed": speed,
        "wall_s": time.perf_counter() - started,
        "passed": all(c["passed"] for c in checks),
    }


def _python_side(bundle_dir, sentences, searches, threads, langs, max_length, host, log) -> dict:
    """The Python runtime's sources and searches; only its tokenizers are kept of it, so that its
    sessions (and their arenas, which keep the largest key/value caches of the searches) go."""
    from seq2onnx.runtime.session_tuning import SessionTuning
    from seq2onnx.runtime.translator import Translator

    translator = Translator(
        bundle_dir, device="cpu", intra_threads=threads, _tuning=SessionTuning(decoder="standard")
    )
    _check_max_length(max_length, translator.max_positions)
    prepared = [translator.prepare_source(s, truncate=True, **langs) for s in sentences]
    source_ids = [ids for ids, _ in prepared]
    # the page translates every line in one call (sorted and batched by the host): so does Python
    chunk = max(1, len(source_ids)) if host == "browser" else READ_CHUNK
    results, seconds = _python_searches(
        translator, source_ids, searches, langs["target_lang"], max_length, log, chunk
    )
    return {
        "prepared": prepared,
        "source_ids": source_ids,
        "results": results,
        "seconds": seconds,
        "tokenizers": (translator.source_tokenizer, translator.target_tokenizer),
        "decoder": translator.decoder_variant,
    }


# -- the command -----------------------------------------------------------------------------------


def add(sub) -> None:
    """Registers `seq2onnx verify-host` on the CLI's subparsers."""
    p = sub.add_parser(
        "verify-host",
        help="check that the Node host (js/) or the browser page translates a bundle exactly as the "
        "Python runtime does",
        description="Translate the same sentences with the Python runtime and with the Node host (node "
        "js/bin/seq2onnx-js.mjs), or with --host browser the page of `seq2onnx web` (its site built "
        "in a temporary folder, served on 127.0.0.1 and driven in headless Chromium), on the same "
        "bundle, and compare: tokenizer ids (the browser: the source pieces its heatmaps show), "
        "greedy and beam-search token ids (the whole n-best), texts, and scores within 1e-4. Needs "
        "no PyTorch; needs Node.js >= 18.17 and the JS host's dependencies (npm ci --prefix js), "
        "and for the browser Chromium (Debian: apt-get install chromium, or --chromium PATH). "
        "Exit 1 when any check fails.",
        epilog="Sentences: --sentences-file FILE (one per line), --data TSV --src-col N, or --synthetic "
        "(random pieces of the bundle's source vocabulary, for a bundle without data at hand). Of a "
        "longer file, --sentences lines evenly spaced over it are used. Example: seq2onnx verify-host "
        "my-bundle --data corpus.tsv --src-col 1 --sentences 200 (add --host browser for the page)",
    )
    p.add_argument("bundle", metavar="BUNDLE", help="a bundle made by `seq2onnx export`")
    p.add_argument(
        "--host",
        default="node",
        choices=HOSTS,
        help="the host to compare with the Python runtime: node, or browser (the web page in headless "
        "Chromium; no --max-length) (default node)",
    )
    _add_sentence_arguments(p)
    _add_host_arguments(p)
    p.set_defaults(func=run)


def _add_sentence_arguments(p) -> None:
    given = p.add_argument_group("sentences (give one)")
    given.add_argument("--sentences-file", metavar="FILE", help="a text file, one sentence per line")
    given.add_argument(
        "--data", metavar="TSV", help="a tab-separated file; the sentences are column --src-col"
    )
    given.add_argument(
        "--src-col", type=int, default=0, metavar="N", help="column of --data, from 0 (default 0)"
    )
    given.add_argument(
        "--synthetic", action="store_true", help="texts of random pieces of the bundle's source vocabulary"
    )
    p.add_argument(
        "--sentences",
        type=int,
        default=DEFAULT_SENTENCES,
        metavar="N",
        help=f"how many sentences to compare (default {DEFAULT_SENTENCES})",
    )


def _add_host_arguments(p) -> None:
    p.add_argument(
        "--beam",
        type=int,
        default=4,
        metavar="K",
        help="beam size of the beam-search row; its n-best is all K (default 4)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        metavar="N",
        help="onnxruntime intra-op threads of the Python runtime and the Node host (default 1; the hosts "
        "run one after the other; the page keeps onnxruntime-web's own)",
    )
    p.add_argument(
        "--max-length",
        type=int,
        default=None,
        metavar="N",
        help="the decoding length limit of both hosts, 1 to the model's max_positions (default: "
        "bundle.json's max_length_a x source length + max_length_b); a model that never "
        "ends a sentence (random weights) decodes to it",
    )
    p.add_argument(
        "--source-lang", metavar="CODE", help="a multilingual bundle's source language, on both hosts"
    )
    p.add_argument(
        "--target-lang", metavar="CODE", help="a multilingual bundle's target language, on both hosts"
    )
    p.add_argument("--node", metavar="PATH", help="the node executable (default: node on PATH)")
    p.add_argument(
        "--chromium",
        metavar="PATH",
        help="--host browser: the Chromium executable (default: chromium or chromium-browser on PATH)",
    )
    p.add_argument(
        "--js-dir",
        metavar="DIR",
        default=None,
        help=f"the JS host's folder, with node_modules installed (default: {js_dir_default()})",
    )
    p.add_argument(
        "--json",
        metavar="FILE",
        help="also write the report as JSON to FILE (refused if it exists, unless --force)",
    )
    p.add_argument("--force", action="store_true", help="replace the --json file if it exists")


def run(args) -> int:
    """`seq2onnx verify-host`: the table on stdout, progress on stderr; exit 1 on any failed check."""
    if args.json and Path(args.json).exists() and not args.force:  # before minutes of work, not after
        raise errors.CommandError(
            f"{args.json} exists; choose another --json FILE or pass --force to replace it"
        )
    sentences, source = read_sentences(
        bundle_dir=args.bundle,
        data=args.data,
        src_col=args.src_col,
        sentences_file=args.sentences_file,
        synthetic=args.synthetic,
        count=args.sentences,
    )
    report = verify_host(
        args.bundle,
        sentences,
        host=args.host,
        beam=args.beam,
        threads=args.threads,
        node=args.node,
        js_dir=args.js_dir,
        chromium=args.chromium,
        log=lambda m: print(f"verify-host: {m}", file=sys.stderr, flush=True),
        source_lang=args.source_lang,
        target_lang=args.target_lang,
        max_length=args.max_length,
    )
    report["source"] = source
    print(format_report(report, source))
    if args.json:  # refused above when it existed without --force
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        atomic.write_file(Path(args.json), json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return 0 if report["passed"] else errors.EXIT_FAIL
