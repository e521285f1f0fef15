"""`seq2onnx bench`'s run: sentences, bundles, one child process per engine and thread setting, the report.

All engines get the same sentences and the same batches: the sentences are sorted by source length
once and cut into batches here, and every engine gets exactly those batches. By default each engine
runs at every thread setting of the sweep (bench/settings.py), and the report puts each engine's
best setting per configuration first; with `threads` given, every engine runs at those threads only.
Each (engine, setting) runs in a fresh child process (`python -m seq2onnx.bench.engines JOB OUT`),
so its peak memory is its own and no engine warms another's caches.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from seq2onnx.bench.engines import ENGINES, PEAK_RSS_NOTE, TORCH_BEAM_NOTE
from seq2onnx.bench.machine import describe_machine, usable_cores
from seq2onnx.bench.rows import fill_rows, merge_rounds
from seq2onnx.bench.settings import Setting, sweep_settings

CONFIGS = [(1, 1), (1, 32), (4, 1), (4, 32)]  # (beam size, batch size); beam 1 is greedy
QUICK_SENTENCES, DEFAULT_SENTENCES = 16, 100
CHILD_MODULE = "seq2onnx.bench.engines"
SWEEP_NOTE = (
    "every engine ran at each thread setting (bench/settings.py; N x 1 thread: N batches at once, "
    "CTranslate2 inter_threads=N, seq2onnx one Translator shared by N threads); best: per engine "
    "and configuration the setting with the most tokens/s, x torch / x ct2 against the other's "
    "best; rows: every engine at `threads`, one batch at a time"
)


def _load_sentences(ckpt_dir: Path, n: int, data: str | None) -> tuple[list[tuple[str, str]], str]:
    from seq2onnx.export.parity import test_sentences
    from seq2onnx.model import checkpoint

    state_path = ckpt_dir / checkpoint.STATE
    options = json.loads(state_path.read_text()).get("options") if state_path.exists() else None
    if data is not None:
        return test_sentences(ckpt_dir, n, data=data), f"{data} (first {n} lines)"
    try:
        pairs = test_sentences(ckpt_dir, n)
    except FileNotFoundError as e:
        from seq2onnx.model.corpus import generate_pairs

        return generate_pairs(n, seed=12345), f"generated corpus ({e})"
    if options and options.get("data"):
        return pairs, f"test split of {options['data']} (the checkpoint's training corpus)"
    return pairs, "test split of the generated corpus (the checkpoint's training corpus)"


def _weights_sha256(ckpt_dir: Path) -> str:
    import hashlib

    from seq2onnx.model import checkpoint

    h = hashlib.sha256()
    with open(ckpt_dir / checkpoint.WEIGHTS, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _ensure_bundle(ckpt_dir: Path, directory: Path, precision: str, weights_sha: str) -> str:
    """Exports the bundle of one precision into `directory`, unless it holds one of these very weights
    (recorded in DIR/../bench-sources.json by an earlier run) and, for int8, this quantization scheme.
    Returns what was done."""
    from seq2onnx.export.bundle import export_bundle
    from seq2onnx.export.quantize import SCHEME

    stamps_path = directory.parent / "bench-sources.json"
    stamps = json.loads(stamps_path.read_text()) if stamps_path.is_file() else {}
    # an int8 bundle of an older scheme (per-tensor scales) must not be timed as this one
    stamp = f"{weights_sha} {SCHEME['name']}" if precision == "int8" else weights_sha
    if (directory / "bundle.json").is_file() and stamps.get(precision) == stamp:
        return "reused"
    if directory.exists() and not (directory / "bundle.json").is_file():
        raise ValueError(f"{directory} exists and is not a bundle; remove it or choose another --bundle-dir")
    exports = {"fp32": ("float32", None), "int8": ("float32", "int8"), "fp16": ("float16", None)}
    dtype, quantize = exports[precision]
    export_bundle(ckpt_dir, directory, dtype=dtype, quantize=quantize, force=directory.exists())
    stamps[precision] = stamp
    stamps_path.write_text(json.dumps(stamps, indent=1) + "\n")
    return "exported"


def _cuda_reason() -> str | None:
    """None where onnxruntime's CUDA provider can run here, else why not."""
    from seq2onnx.runtime.devices import cuda_usable as _cuda_usable

    usable, why = _cuda_usable()
    return None if usable else why


def _ct2_cuda_reason() -> str | None:
    try:
        import ctranslate2

        if ctranslate2.get_cuda_device_count() > 0:
            return None
    except Exception:
        pass
    return "ctranslate2 sees no CUDA device on this machine"


def _run_child(job: dict, workdir: Path, timeout: float | None) -> dict:
    name = f"{job['engine']}-{Setting(job['threads'], job.get('parallel', 1)).key}"
    job_path, out_path = workdir / f"job-{name}.json", workdir / f"result-{name}.json"
    job_path.write_text(json.dumps(job))
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run(
        [sys.executable, "-m", CHILD_MODULE, str(job_path), str(out_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if proc.returncode != 0 or not out_path.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{name} failed (exit {proc.returncode}): {' | '.join(tail)}")
    return json.loads(out_path.read_text())


def run_bench(
    checkpoint_path: str | Path,
    *,
    sentences: int | None = None,
    threads: int = 0,
    bundle_dir: str | Path | None = None,
    quick: bool = False,
    engines: list[str] | None = None,
    repeat: int = 1,
    data: str | None = None,
    sweep: bool = False,
    max_threads: int = 0,
    log=print,
) -> dict:
    """Runs the benchmark and returns the report (what --json writes).

    Args:
        checkpoint_path (str | Path): the checkpoint (or run) directory.
        sentences (int | None): how many; default QUICK_SENTENCES with quick, else DEFAULT_SENTENCES.
        threads (int): threads for every engine; 0: the cores this process may use (or max_threads).
            With sweep, the equal-threads setting (the secondary table).
        sweep (bool): run every engine at every setting of bench/settings.py's sweep, up to `threads`
            (each a child process in every round); the report's `best` rows are each engine's
            fastest setting per configuration.
        max_threads (int): with threads 0, at most this many threads (0: no cap).
        bundle_dir (str | Path | None): where the bundles and the CTranslate2 model go (kept and
            reused); None: a temporary directory.
        quick (bool): fewer sentences by default.
        engines (list[str] | None): names of ENGINES; torch is always added (the reference); None: all.
        repeat (int): rounds, each running every engine (at every setting) once in rotating order.
        data (str | None): a TSV file of sentences instead of the checkpoint's test split.
        log (Callable[[str], None]): called with a line of progress.

    Returns:
        dict: the report: machine, model, sentences, notes, rows, skipped engines.

    Raises:
        ValueError: unknown engines, no sentences, or a directory in bundle_dir that is not ours.
        CheckpointError: a bad checkpoint.
    """
    cores = usable_cores()
    threads = threads or (min(max_threads, cores) if max_threads else cores)
    n = sentences or (QUICK_SENTENCES if quick else DEFAULT_SENTENCES)
    wanted = _wanted_engines(engines)
    ckpt_dir, tok, cfg, origin, (sources, too_long, limits, order) = _prepare(checkpoint_path, n, data)
    report = _report_head(str(ckpt_dir), cfg, sources, origin, too_long, threads, repeat, sweep)

    with _work_dir(bundle_dir) as root:
        skipped = _unavailable(wanted)
        active = [e for e in wanted if e not in skipped]
        variants = _variants(active, threads, sweep, report)
        bundles = _bundles(ckpt_dir, root, active, log)
        ct2_model = _ct2_model(ckpt_dir, root, active, log)
        report["bundles"], report["ct2_model"] = bundles, ct2_model
        job_base = {**_job_base(ckpt_dir, cfg, tok, sources, limits, order, threads), "bundles": bundles}
        job_base["ct2_model"] = ct2_model
        results = _run_rounds(variants, job_base, repeat, sweep, skipped, log)
        report["skipped"] = [{"engine": k, "reason": v} for k, v in skipped.items()]
        fill_rows(report, results, limits)
    return report


def _prepare(checkpoint_path: str | Path, n: int, data: str | None) -> tuple:
    """The checkpoint's directory, tokenizer and config, where the sentences come from, and the
    sentences in batches (_batches)."""
    from seq2onnx.model import checkpoint

    ckpt_dir = checkpoint.resolve(checkpoint_path)
    model, tok, _ = checkpoint.load(ckpt_dir)
    pairs, origin = _load_sentences(ckpt_dir, n, data)
    if not pairs:
        raise ValueError("no sentences to benchmark")
    return ckpt_dir, tok, model.cfg, origin, _batches(tok, model.cfg, pairs)


def _variants(active: list[str], threads: int, sweep: bool, report: dict) -> list[tuple[str, Setting]]:
    """The (engine, setting) pairs to run, one child each per round; without a sweep every engine at
    `threads`. With a sweep, notes each engine's settings in the report."""
    settings = {
        e: sweep_settings(ENGINES[e][0], ENGINES[e][1], threads) if sweep else [Setting(threads)]
        for e in active
    }
    if sweep:
        report["sweep"] = {e: [s.label for s in settings[e]] for e in active}
        report["notes"].append(SWEEP_NOTE)
    return [(e, s) for e in active for s in settings[e]]


def _job_base(ckpt_dir: Path, cfg, tok, sources, limits, order, threads: int) -> dict:
    """What every child's job holds besides the engine and its setting: the model, the sentences in
    their batches, and the tokenizer's pieces (which the CTranslate2 child translates between)."""
    from seq2onnx.export.ctranslate2.convert import source_pieces, target_pieces

    return {
        "checkpoint": str(ckpt_dir),
        "sources": sources,
        "limits": limits,
        "order": order,
        "threads": threads,
        "eos_id": cfg.eos_id,
        "unk_id": cfg.unk_id,
        "repeat": 1,  # one pass per child: rounds repeat
        "configs": CONFIGS,
        "source_pieces": source_pieces(tok),
        "target_pieces": target_pieces(tok),
    }


def _wanted_engines(engines: list[str] | None) -> list[str]:
    """The engines to run, torch first where not asked for: the reference every ratio is against.

    Raises:
        ValueError: a name that is not one of ENGINES.
    """
    wanted = engines or list(ENGINES)
    unknown = [e for e in wanted if e not in ENGINES]
    if unknown:
        raise ValueError(f"unknown engines {unknown}; choose among {', '.join(ENGINES)}")
    if "torch" not in wanted:
        wanted = ["torch"] + wanted  # the reference every ratio and agreement is against
    return wanted


def _batches(tok, cfg, pairs: list[tuple[str, str]]) -> tuple[list[list[int]], int, list[int], list[int]]:
    """The source ids that fit the model, how many did not, each one's length limit, and the order
    (by source length) that cuts them into the batches every engine gets."""
    from seq2onnx.export.bundle import DECODING_DEFAULTS as dd

    sources = [tok.encode_source(s) for s, _ in pairs]
    too_long = sum(len(s) > cfg.max_positions for s in sources)
    sources = [s for s in sources if len(s) <= cfg.max_positions]
    limits = [min(int(dd["max_length_a"] * len(s)) + dd["max_length_b"], cfg.max_positions) for s in sources]
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))  # the batches every engine gets
    return sources, too_long, limits, order


def _report_head(
    ckpt_dir: str,
    cfg,
    sources: list[list[int]],
    origin: str,
    too_long: int,
    threads: int,
    repeat: int,
    sweep: bool,
) -> dict:
    """The report before any engine ran: the checkpoint, sentences, model, machine and notes."""
    from seq2onnx.export.bundle import DECODING_DEFAULTS as dd

    every = " at every setting" if sweep else ""
    return {
        "checkpoint": ckpt_dir,
        "sentences": len(sources),
        "sentences_source": origin,
        "sentences_dropped_too_long": too_long,
        "mean_source_tokens": sum(map(len, sources)) / len(sources),
        "model": cfg.to_dict(),
        "machine": describe_machine(threads),
        "threads": threads,
        "repeat": repeat,
        "sweep": None,
        "configs": [
            {"search": "greedy" if b == 1 else f"beam{b}", "beam": b, "batch": bs} for b, bs in CONFIGS
        ],
        "max_length": f"min({dd['max_length_a']} x source tokens + {dd['max_length_b']}, "
        f"{cfg.max_positions})",
        "notes": [
            TORCH_BEAM_NOTE,
            "target tokens: generated tokens including the end token, summed over sentences",
            f"{repeat} round{'s' if repeat > 1 else ''}, each running every engine{every} "
            "once in rotating order; "
            "tokens/s: the median pass; x torch / x ct2: the median over rounds of the ratio within a "
            "round",
            PEAK_RSS_NOTE,
        ],
        "rows": [],
        "skipped": [],
    }


@contextlib.contextmanager
def _work_dir(bundle_dir: str | Path | None):
    """`bundle_dir`, made if missing; None: a temporary directory, removed at the end."""
    if bundle_dir is None:
        with tempfile.TemporaryDirectory(prefix="seq2onnx-bench-") as tmp:
            yield Path(tmp)
        return
    root = Path(bundle_dir)
    root.mkdir(parents=True, exist_ok=True)
    yield root


def _unavailable(wanted: list[str]) -> dict[str, str]:
    """The engines that cannot run on this machine, each with why (no CTranslate2, no GPU)."""
    from seq2onnx.export.ctranslate2.convert import ct2_available

    skipped: dict[str, str] = {}
    cuda_why = _cuda_reason()
    have_ct2, ct2_why = ct2_available()
    for name in wanted:
        kind, device, _ = ENGINES[name]
        if kind == "ct2" and not have_ct2:
            skipped[name] = ct2_why
        elif device == "cuda" and cuda_why and kind == "onnx":
            skipped[name] = f"no usable GPU: {cuda_why}"
        elif device == "cuda" and kind == "ct2" and (cuda_why or _ct2_cuda_reason()):
            skipped[name] = f"no usable GPU: {cuda_why or _ct2_cuda_reason()}"
    return skipped


def _bundles(ckpt_dir: Path, root: Path, active: list[str], log) -> dict[str, str]:
    """The bundle of each precision the onnx engines need, under root (exported or reused)."""
    bundles: dict[str, str] = {}
    precisions = sorted({ENGINES[e][2] for e in active if ENGINES[e][0] == "onnx"})
    weights_sha = _weights_sha256(ckpt_dir) if precisions else None
    for precision in precisions:
        t = time.perf_counter()
        how = _ensure_bundle(ckpt_dir, root / precision, precision, weights_sha)
        bundles[precision] = str(root / precision)
        log(f"{how} the {precision} bundle {root / precision} ({time.perf_counter() - t:.1f} s)")
    return bundles


def _ct2_model(ckpt_dir: Path, root: Path, active: list[str], log) -> str | None:
    """root/ct2, converted afresh (cheap), so it is always this checkpoint's; None without a ct2 engine.

    Raises:
        ValueError: root/ct2 exists and is not a CTranslate2 model.
    """
    if not any(ENGINES[e][0] == "ct2" for e in active):
        return None
    from seq2onnx.export.ctranslate2.convert import convert_checkpoint

    t = time.perf_counter()
    target = root / "ct2"
    if target.exists():
        if not (target / "model.bin").is_file():
            raise ValueError(
                f"{target} exists and is not a CTranslate2 model; remove it or choose another --bundle-dir"
            )
        shutil.rmtree(target)
    ct2_model = str(convert_checkpoint(ckpt_dir, target))
    log(f"converted the checkpoint for CTranslate2: {ct2_model} ({time.perf_counter() - t:.1f} s)")
    return ct2_model


def _run_rounds(
    variants: list[tuple[str, Setting]],
    job_base: dict,
    repeat: int,
    sweep: bool,
    skipped: dict[str, str],
    log,
) -> dict[tuple, dict]:
    """Every (engine, setting) in child processes, `repeat` rounds; each one's rounds merged.

    Each round runs every engine at every setting once (a child process, one timed pass per
    configuration), the order rotating from round to round. A machine's speed drifts over
    minutes; engines timed in the same round see about the same machine, so ratios are taken
    within rounds. A variant that fails is recorded in `skipped` and not run again.
    """
    rounds: dict[tuple, list[dict]] = {(name, s.key): [] for name, s in variants}
    failed: set[tuple] = set()
    with tempfile.TemporaryDirectory(prefix="seq2onnx-bench-jobs-") as jobs:
        for r in range(repeat):
            for name, s in variants[r % len(variants) :] + variants[: r % len(variants)]:
                if (name, s.key) in failed:
                    continue
                what = f"{name} ({s.label})" if sweep else name
                log(f"running {what} ..." if repeat == 1 else f"round {r + 1}/{repeat}: running {what} ...")
                job = {**job_base, "engine": name, "threads": s.intra, "parallel": s.parallel}
                try:
                    rounds[(name, s.key)].append(_run_child(job, Path(jobs), timeout=None))
                except Exception as e:  # one engine failing leaves the others' rows
                    failed.add((name, s.key))
                    skipped[name if not sweep else f"{name} ({s.label})"] = f"failed: {e}"
    return {key: merge_rounds(rounds[key]) for key in rounds if key not in failed}
