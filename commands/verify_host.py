"""`seq2onnx verify-host BUNDLE`: does another host translate this bundle as the Python runtime does?

The host is the Node one (js/, `node js/bin/seq2onnx-js.mjs`). Both read the same bundle, so the
comparison needs neither PyTorch nor the checkpoint: the Python runtime is the reference
(docs/bundle-format.md says so), and the other host must give

- the same tokenizer ids (and detokenised text) for every source sentence and every target text;
- the same target token ids for greedy search and for beam search with its whole n-best, fed the
  same source ids (the Python tokenizer's), so that a tokenizer difference shows in its own row
  and not again in every search row;
- scores (sums of log-probabilities, end token included) within SCORE_BOUND (host_report.py).

Both hosts drive the standard decoder (graphs.decoder: the Node host cannot run the fused one's
com.microsoft kernels), on the CPU, with the same threads, the same batches (256 lines per
translate call, at most 32 sources per batch, sorted by length) and bundle.json's decoding
defaults (or --max-length on both). A difference is shown with both hosts' ids and scores, so that
a near-tie between two hypotheses can be told from a convention difference. The Python runtime's
sessions are closed before the Node host runs, so that the two hosts' memory does not add up.
Torch-free.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from seq2onnx import atomic, errors
from seq2onnx.commands.host_sentences import DEFAULT_SENTENCES, read_sentences
from seq2onnx.commands.host_report import format_report, host_checks
from seq2onnx.commands.node_host import find_node_host, js_dir_default, run_node

HOSTS = ("node",)
READ_CHUNK = 256  # js/bin/seq2onnx-js.mjs: lines per translateBatch call (as `seq2onnx translate`)
MAX_BATCH = 32  # both hosts' default max_batch_size


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
) -> tuple[dict[str, list], dict[str, float]]:
    """Each search's results from the Python runtime, read in chunks, and its seconds."""
    python, python_s = {}, {}
    for label, (size, n_best) in searches.items():
        log(f"the Python runtime: {label} on {len(source_ids)} sentences")
        t0 = time.perf_counter()
        python[label] = [
            r
            for start in range(0, len(source_ids), READ_CHUNK)
            for r in translator.translate_batch(
                source_ids[start : start + READ_CHUNK],
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


def _node_searches(
    host: dict,
    bundle_dir: str | Path,
    source_ids: list[list[int]],
    searches: dict[str, tuple[int, int]],
    threads: int,
    flags: list[str],
    log,
) -> tuple[dict[str, list[dict]], dict[str, dict | None]]:
    """Each search's results from the Node host (given the same source ids), and its timing."""
    node, node_timing = {}, {}
    id_lines = [json.dumps(ids) for ids in source_ids]
    for label, (size, n_best) in searches.items():
        log(f"the Node host: {label} on {len(source_ids)} sentences")
        args = [
            "translate",
            str(bundle_dir),
            "--ids",
            "--json",
            "--timing",
            "--beam",
            str(size),
            "--n-best",
            str(n_best),
            "--threads",
            str(threads),
            "--batch-size",
            str(MAX_BATCH),
            *flags,
        ]
        node[label], node_timing[label] = run_node(host, args, id_lines)
    return node, node_timing


def verify_host(
    bundle_dir: str | Path,
    sentences: list[str],
    *,
    beam: int = 4,
    threads: int = 1,
    node: str | None = None,
    js_dir: str | Path | None = None,
    log=None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    max_length: int | None = None,
) -> dict:
    """Translates `sentences` with the Python runtime and the Node host, and compares them.

    Args:
        bundle_dir, sentences: the bundle and the texts.
        beam: the beam size, at least 2 (greedy search is compared anyway).
        threads: onnxruntime threads on each side.
        node, js_dir: the node executable and the JS host's folder (find_node_host).
        log (Callable[[str], None] | None): called with a line of progress.
        source_lang, target_lang: a multilingual bundle's languages, given to both hosts.
        max_length: the decoding length limit of both hosts (1 to the model's max_positions); None:
            bundle.json's max_length_a x source length + max_length_b. A model that seldom ends a
            sentence (random weights) decodes to the limit, and each batch's key/value cache grows
            with it: a cap keeps the run short and small.

    Returns:
        The report (see host_report.py): `passed`, the checks, up to SHOWN_DIFFERENCES differences per
        check, timing.

    Raises:
        CommandError: the host cannot run (the message names what to install), a beam below 2 or a
            max_length outside 1..max_positions.
        BundleError: the bundle is refused by the Python runtime.
    """
    log = log or (lambda message: None)
    if isinstance(beam, bool) or not isinstance(beam, int) or beam < 2:
        raise errors.CommandError(
            f"--beam {beam}: give a beam of at least 2 (greedy search is compared anyway)"
        )
    host = find_node_host(node, js_dir)
    started = time.perf_counter()
    langs = {"source_lang": source_lang, "target_lang": target_lang}
    searches = {"greedy": (1, 1), f"beam {beam}": (beam, beam)}
    python = _python_side(bundle_dir, sentences, searches, threads, langs, max_length, log)
    # Only the tokenizers are needed from here on: the sessions (and their arenas, which keep the
    # largest key/value caches of the searches) went with the translator; free them before the
    # Node host loads the bundle.
    gc.collect()
    node = _node_side(
        host, bundle_dir, sentences, python, searches, threads, _node_flags(langs, max_length), log
    )
    differences: list[dict] = []
    checks = host_checks(sentences, searches, python, node, differences)
    settings = {"max_length": max_length, "threads": threads, "beam": beam}
    return _report(
        bundle_dir, host, settings, sentences, python, node, searches, checks, differences, started
    )


@dataclass
class _PythonSide:
    """What the Python runtime gave, kept once its translator (and sessions) are gone: the prepared
    sources (ids, truncated), each search's results and seconds, the tokenizers, the decoder used."""

    prepared: list[tuple[list[int], bool]]
    results: dict[str, list]
    seconds: dict[str, float]
    source_tokenizer: object
    target_tokenizer: object
    decoder: str

    @property
    def source_ids(self) -> list[list[int]]:
        return [ids for ids, _ in self.prepared]


def _python_side(bundle_dir, sentences, searches, threads, langs, max_length, log) -> _PythonSide:
    """Runs the searches on the Python runtime (the standard decoder, on the CPU)."""
    from seq2onnx.runtime.session_tuning import SessionTuning
    from seq2onnx.runtime.translator import Translator

    translator = Translator(
        bundle_dir, device="cpu", intra_threads=threads, _tuning=SessionTuning(decoder="standard")
    )
    if max_length is not None and (
        isinstance(max_length, bool)
        or not isinstance(max_length, int)
        or not 1 <= max_length <= translator.max_positions
    ):
        raise errors.CommandError(
            f"--max-length {max_length}: give an integer from 1 to "
            f"{translator.max_positions} (the model's max_positions)"
        )
    prepared = [translator.prepare_source(s, truncate=True, **langs) for s in sentences]
    source_ids = [ids for ids, _ in prepared]
    results, seconds = _python_searches(
        translator, source_ids, searches, langs["target_lang"], max_length, log
    )
    return _PythonSide(
        prepared,
        results,
        seconds,
        translator.source_tokenizer,
        translator.target_tokenizer,
        translator.decoder_variant,
    )


def _node_flags(langs: dict, max_length: int | None) -> list[str]:
    """The Node host's flags for the languages and the length limit."""
    flags = [x for name, v in langs.items() if v for x in (f"--{name.replace('_', '-')}", v)]
    if max_length is not None:
        flags += ["--max-length", str(max_length)]
    return flags


def _node_side(host, bundle_dir, sentences, python: _PythonSide, searches, threads, flags, log) -> dict:
    """The Node host's searches (results, timing) on the Python runtime's source ids, and its
    tokenizers' ids of the sentences (source) and of every hypothesis the Python runtime wrote
    (targets, once each, in order)."""
    results, timing = _node_searches(host, bundle_dir, python.source_ids, searches, threads, flags, log)
    targets = list(
        dict.fromkeys(
            h for label in searches for r in python.results[label] for h in r.hypotheses if h.strip()
        )
    )
    log("the Node host: tokenizers")
    source_tokens, _ = run_node(host, ["tokenize", str(bundle_dir), "--side", "source"], sentences)
    target_tokens, _ = run_node(host, ["tokenize", str(bundle_dir), "--side", "target"], targets)
    return {
        "results": results,
        "timing": timing,
        "targets": targets,
        "source_tokens": source_tokens,
        "target_tokens": target_tokens,
    }


def _report(
    bundle_dir, host, settings, sentences, python, node, searches, checks, differences, started
) -> dict:
    """verify_host's report (host_report.py formats it)."""
    import onnxruntime

    speed = {
        label: {
            "python_s": python.seconds[label],
            "node_s": node["timing"][label]["translate_s"] if node["timing"][label] else None,
            "python_tokens": _target_tokens([r.token_ids for r in python.results[label]]),
            "node_tokens": _target_tokens([n["token_ids"] for n in node["results"][label]]),
        }
        for label in searches
    }
    return {
        "bundle": str(bundle_dir),
        "host": "node",
        "node_version": host["node_version"],
        "onnxruntime_node": host["onnxruntime_node"],
        "onnxruntime": onnxruntime.__version__,
        "decoder": python.decoder,
        "max_length": settings["max_length"],
        "threads": settings["threads"],
        "beam": settings["beam"],
        "sentences": len(sentences),
        "empty": sum(not ids for ids in python.source_ids),
        "truncated": sum(cut for _, cut in python.prepared),
        "checks": checks,
        "differences": differences,
        "speed": speed,
        "wall_s": time.perf_counter() - started,
        "passed": all(c["passed"] for c in checks),
    }


# -- the command -----------------------------------------------------------------------------------


def add(sub) -> None:
    """Registers `seq2onnx verify-host` on the CLI's subparsers."""
    p = sub.add_parser(
        "verify-host",
        help="check that the Node host (js/) translates a bundle exactly as the Python runtime does",
        description="Translate the same sentences with the Python runtime and with the Node host (node "
        "js/bin/seq2onnx-js.mjs) on the same bundle, and compare: tokenizer ids, greedy and "
        "beam-search token ids (the whole n-best), texts, and scores within 1e-4. Needs no "
        "PyTorch; needs Node.js >= 18.17 and the JS host's dependencies (npm ci --prefix js). "
        "Exit 1 when any check fails.",
        epilog="Sentences: --sentences-file FILE (one per line), --data TSV --src-col N, or --synthetic "
        "(random pieces of the bundle's source vocabulary, for a bundle without data at hand). Of a "
        "longer file, --sentences lines evenly spaced over it are used. Example: seq2onnx verify-host "
        "my-bundle --data corpus.tsv --src-col 1 --sentences 200",
    )
    p.add_argument("bundle", metavar="BUNDLE", help="a bundle made by `seq2onnx export`")
    p.add_argument(
        "--host",
        default="node",
        choices=HOSTS,
        help="the host to compare with the Python runtime (default node)",
    )
    _add_sentence_flags(p)
    _add_search_flags(p)
    _add_host_flags(p)
    p.add_argument(
        "--json",
        metavar="FILE",
        help="also write the report as JSON to FILE (refused if it exists, unless --force)",
    )
    p.add_argument("--force", action="store_true", help="replace the --json file if it exists")
    p.set_defaults(func=run)


def _add_sentence_flags(p) -> None:
    """Where the sentences come from (one of three) and how many."""
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


def _add_search_flags(p) -> None:
    """The searches both hosts run: --beam, --threads, --max-length, the languages."""
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
        help="onnxruntime intra-op threads of each host (default 1; the hosts run one after the other)",
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


def _add_host_flags(p) -> None:
    """The Node host: --node, --js-dir."""
    p.add_argument("--node", metavar="PATH", help="the node executable (default: node on PATH)")
    p.add_argument(
        "--js-dir",
        metavar="DIR",
        default=None,
        help=f"the JS host's folder, with node_modules installed (default: {js_dir_default()})",
    )


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
        beam=args.beam,
        threads=args.threads,
        node=args.node,
        js_dir=args.js_dir,
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
