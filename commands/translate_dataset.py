"""`seq2onnx translate-dataset`: translate a corpus with Ray Data over a pool of actors.

Needs the optional extra `pip install 'seq2onnx[scale]'` (ray[data], which brings pyarrow); ray is
imported only when the command runs. The shape of the job, and why:

- The driver reads INPUT (text lines split exactly as `seq2onnx translate` splits them, or one
  Parquet/JSONL column) and tags every row with its index. So the workers need only the bundle,
  never INPUT or OUTPUT, and every row can be checked back in by its index.
- `map_batches` runs TranslateBatches on a fixed pool of `--workers` actors; each loads the bundle
  once, in its constructor, and translates blocks of `--lines-per-task` rows.
- Order: `DataContext.execution_options.preserve_order = True` makes Ray Data hand blocks back in
  input order (it holds finished blocks until the earlier ones arrive, with no sort or shuffle);
  the driver still checks that the indices run 0, 1, 2, ... so that a lost or doubled row is an
  error rather than a shifted output.
- Faults: an actor that dies is restarted and its block retried: Ray Data's own default for actor
  pools (max_restarts=-1, max_task_retries=-1), kept because Ray 2.60 deprecates passing those
  arguments to map_batches. An exception raised by the translator is not retried: it ends the job.
  Only the driver writes, once per index, so a retried block cannot appear twice.
- OUTPUT is written to a temporary file beside it and renamed over it at the end: it is either
  complete or untouched, and an existing one is replaced only with --force.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import time
from pathlib import Path

from seq2onnx.runtime.bundle import BundleError, read_bundle
from seq2onnx import atomic, errors
from seq2onnx.commands.dataset_io import INPUT_FORMATS, OUTPUT_FORMATS, Writer, guess_format, read_source
from seq2onnx.commands.translate_flags import add_option_flags

PROBE_TIMEOUT_S = 120


def import_ray():
    """Imports Ray Data (and pyarrow).

    Returns:
        The ray module.

    Raises:
        CommandError: naming the extra to install.
    """
    try:
        import ray
        import ray.data  # noqa: F401  (ray without the [data] extra lacks pyarrow)
        import pyarrow  # noqa: F401
    except ImportError as e:
        raise errors.CommandError(
            f"translate-dataset needs Ray Data ({e}): pip install 'seq2onnx[scale]'"
        ) from e
    return ray


def check_bundle_on_nodes(ray, bundle: Path) -> None:
    """Fails before any work starts when a Ray node cannot read the bundle (or import seq2onnx).

    Runs one small task pinned to each alive node with CPUs, which reads the bundle there: on a
    cluster the path must exist on every node, since the actors may land on any of them.

    Args:
        ray (module): the connected ray module.
        bundle: the bundle's path.

    Raises:
        CommandError: naming the node, the reason and the fix (or a timeout after PROBE_TIMEOUT_S).
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0, max_retries=0)(_probe_bundle)
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    refs = [
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            str(bundle)
        )
        for n in nodes
    ]
    try:
        answers = ray.get(refs, timeout=PROBE_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError as e:
        raise errors.CommandError(
            f"the Ray nodes did not answer the bundle check within {PROBE_TIMEOUT_S} s; is the cluster busy?"
        ) from e
    except ray.exceptions.RayError as e:  # typically: seq2onnx cannot be imported there
        raise errors.CommandError(
            f"a Ray worker could not check the bundle ({_worker_reason(e)}); "
            "install seq2onnx[cpu] in every node's Python environment"
        ) from e
    failed = [a for a in answers if a]
    if failed:
        raise errors.CommandError(
            f"a Ray worker cannot read the bundle {bundle}: {failed[0]}; put the "
            "bundle at the same path on every node (a shared filesystem) before translating"
        )


def _probe_bundle(path: str) -> str | None:
    """Runs on a Ray node: None if the bundle there is readable, else the host and the reason."""
    import socket

    try:
        read_bundle(path, check_hashes=False)  # the actors verify the hashes when they load it
    except (BundleError, OSError) as e:
        return f"on {socket.gethostname()}: {e}"
    return None


def _worker_reason(error: BaseException) -> str:
    """The worker's own exception line inside a Ray error ("ValueError: ..."), else its first line.

    Ray Data hands the driver a wrapper (RayTaskError(UserCodeException)) that keeps the worker's
    exception only as traceback text, so the line is found in that text.
    """
    text = str(error)
    for line in text.splitlines():
        match = re.match(r"(\w+(?:\.\w+)*(?:Error|Exception)): (.+)", line)
        if match and not match.group(1).startswith("ray."):
            return f"{match.group(1)}: {match.group(2)}"
    lines = [line for line in text.splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


class TranslateBatches:
    """The map_batches callable: one instance per actor, which loads the bundle once.

    Args:
        bundle: the bundle's path.
        device: "cpu" or "cuda".
        threads: onnxruntime threads.
        options: passed to Translator.translate_batch.
    """

    def __init__(self, bundle: str, device: str, threads: int, options: dict):
        from seq2onnx.runtime.translator import Translator

        self.translator = Translator(bundle, device=device, intra_threads=threads)
        self.options = options

    def __call__(self, batch):
        """pyarrow.Table (index, text) -> pyarrow.Table (index, translation); null stays null."""
        import pyarrow as pa

        texts = batch.column("text").to_pylist()
        try:
            results = self.translator.translate_batch([t or "" for t in texts], **self.options)
        except ValueError as e:  # its "source k" counts from this block's first row
            first = batch.column("index")[0].as_py()
            raise ValueError(
                f"in input rows {first}..{first + len(texts) - 1} (source k is row {first}+k, "
                f"counting from 0): {e}"
            ) from None
        out = [None if t is None else r.hypotheses[0] for t, r in zip(texts, results)]
        return pa.table({"index": batch.column("index"), "translation": pa.array(out, pa.string())})


def translate_dataset(
    bundle: str | Path,
    source,
    output: Path,
    *,
    output_format: str = "text",
    workers: int = 1,
    threads: int = 1,
    device: str = "cpu",
    lines_per_task: int = 256,
    actor_class=TranslateBatches,
    **options,
) -> dict:
    """Translates `source` (a pyarrow string array) on the connected Ray instance into `output`.

    Args:
        bundle: an absolute bundle path, readable on every node (see check_bundle_on_nodes).
        source (pyarrow.StringArray): the texts (read_source); a null gives a null translation.
        output: the file to write (replaced atomically; the caller decides about --force).
        output_format: "text" or "parquet".
        workers: actors in the pool (no more than blocks, since each loads the model).
        threads: onnxruntime threads (and Ray CPUs) per actor.
        device: "cpu" or "cuda" (one GPU per actor).
        lines_per_task: at most this many rows per block handed to an actor (the unit retried).
        actor_class (type): the map_batches callable (tests swap in one that crashes).
        **options: passed to Translator.translate_batch (beam_size, max_batch_size, truncate).

    Returns:
        stats: lines, seconds (translation and writing), lines_per_second, and the workers and threads used.

    Raises:
        RuntimeError: a row came back missing, twice or out of order (a bug, never a shifted file).
    """
    import ray

    t0 = time.perf_counter()
    n = len(source)
    lines_per_task, workers = _sizes(n, lines_per_task, workers)
    blocks = _blocks(source, lines_per_task)
    with _order_preserved(ray), atomic.temp_path(output) as tmp, Writer(tmp, output_format) as writer:
        if blocks:
            ds = _pipeline(
                ray, blocks, actor_class, (str(bundle), device, threads, options), lines_per_task, workers
            )
            for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
                writer.write(batch)
        if writer.rows != n:
            raise RuntimeError(f"Ray Data returned {writer.rows} of {n} rows; {output} was not written")
    seconds = time.perf_counter() - t0
    return {
        "lines": n,
        "seconds": round(seconds, 3),
        "lines_per_second": round(n / seconds, 2) if seconds else None,
        "workers": workers,
        "threads": threads,
    }


@contextlib.contextmanager
def _order_preserved(ray):
    """Inside, Ray Data yields the blocks in input order (see the module docstring: order without a
    sort); the setting is global, so it is restored after."""
    ctx = ray.data.DataContext.get_current()
    saved = ctx.execution_options.preserve_order
    ctx.execution_options.preserve_order = True
    try:
        yield
    finally:
        ctx.execution_options.preserve_order = saved


def _pipeline(ray, blocks: list, actor_class, actor_args: tuple, lines_per_task: int, workers: int):
    """The Ray dataset that maps `blocks` through a pool of `workers` actors (actor_class(*actor_args):
    bundle, device, threads, options), a block a batch."""
    threads, device = actor_args[2], actor_args[1]
    return ray.data.from_arrow(blocks).map_batches(
        actor_class,
        batch_size=lines_per_task,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=workers),
        fn_constructor_args=actor_args,
        num_cpus=threads,
        num_gpus=1 if device == "cuda" else 0,
    )


def _sizes(n: int, lines_per_task: int, workers: int) -> tuple[int, int]:
    """(lines per block, actors) for `n` rows.

    Short inputs get smaller blocks (about 4 per actor) so that every actor has work and the last
    block does not leave the others idle; no more actors than blocks, since each loads the model.
    """
    lines_per_task = max(1, min(lines_per_task, -(-n // (4 * workers))))
    return lines_per_task, max(1, min(workers, -(-n // lines_per_task)))


def _blocks(source, lines_per_task: int) -> list:
    """`source` cut into pyarrow tables (index, text) of at most `lines_per_task` rows."""
    import pyarrow as pa

    n = len(source)
    return [
        pa.table(
            {
                "index": pa.array(range(start, min(start + lines_per_task, n)), pa.int64()),
                "text": source.slice(start, lines_per_task),
            }
        )
        for start in range(0, n, lines_per_task)
    ]


# -- the command ---------------------------------------------------------------------------------


def add(sub) -> None:
    """Registers `translate-dataset` on the `seq2onnx` subparsers."""
    p = sub.add_parser(
        "translate-dataset",
        help="translate a corpus on Ray Data (pip install 'seq2onnx[scale]')",
        description="Translate a text file, or one column of a Parquet/JSONL file, over a "
        "pool of Ray actors that each load the bundle once; write the translations in input "
        "order, one per line (text) or as the column 'translation' (Parquet). Runs a local "
        "Ray instance unless --address.",
    )
    p.add_argument("bundle")
    p.add_argument("input", help="text file (one source per line), .parquet or .jsonl")
    p.add_argument("output", help="file to write: text, or Parquet for a .parquet name (see --format)")
    p.add_argument(
        "--column", help="the column to translate in Parquet/JSONL input (default: the only column)"
    )
    p.add_argument("--input-format", choices=INPUT_FORMATS, help="default: from INPUT's suffix")
    p.add_argument("--format", choices=OUTPUT_FORMATS, help="output format (default: from OUTPUT's suffix)")
    p.add_argument(
        "--address",
        help="an existing Ray cluster (host:port, ray://..., or 'auto'); default: a local instance",
    )
    p.add_argument(
        "--workers", type=int, default=2, help="actors, each with its own copy of the model (default 2)"
    )
    p.add_argument(
        "--threads", type=int, default=1, help="onnxruntime threads, and Ray CPUs, per actor (default 1)"
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda gives each actor one GPU")
    add_option_flags(p, only=("beam_size", "max_batch_size"))  # as translate's: --beam, --batch-size
    p.add_argument(
        "--lines-per-task",
        type=int,
        default=256,
        help="at most this many rows per block sent to an actor (the unit retried; default 256)",
    )
    p.add_argument("--truncate", action="store_true", help="cut sources longer than the model's positions")
    p.add_argument("--force", action="store_true", help="replace OUTPUT if it exists")
    p.add_argument(
        "--json", action="store_true", help="print the run's statistics as one JSON line on stdout"
    )
    p.set_defaults(func=run)


def run(args) -> int:
    """Runs `seq2onnx translate-dataset`; user errors raise CommandError (or BundleError)."""
    _check_counts(args)
    # abspath, not resolve: a shared mount may be reached through a symlink that differs per node.
    bundle, source_path, output = Path(os.path.abspath(args.bundle)), Path(args.input), Path(args.output)
    _check_output(output, {"INPUT": source_path, "the bundle": bundle}, args.force)
    ray = import_ray()
    read_bundle(bundle)  # here, hashes included; before Ray starts
    source = read_source(
        source_path, guess_format(source_path, args.input_format, INPUT_FORMATS), args.column
    )
    started = not ray.is_initialized()
    if started:  # "local" starts a fresh instance even where `ray start` left one running
        ray.init(address=args.address or "local", include_dashboard=False, logging_level=logging.WARNING)
    try:
        _check_cpus(ray, args)
        check_bundle_on_nodes(ray, bundle)
        options = {
            "beam_size": args.beam_size,
            "max_batch_size": args.max_batch_size,
            "truncate": args.truncate,
        }
        try:
            output_format = guess_format(output, args.format, OUTPUT_FORMATS)
            stats = translate_dataset(
                bundle,
                source,
                output,
                output_format=output_format,
                workers=args.workers,
                threads=args.threads,
                device=args.device,
                lines_per_task=args.lines_per_task,
                **options,
            )
        except ray.exceptions.RayError as e:  # a worker's error, wrapped by Ray: name the worker's exception
            raise RuntimeError(
                f"translation failed on a Ray worker: {_worker_reason(e)}; {output} was not written"
            ) from e
    finally:
        if started:
            ray.shutdown()
    _report(stats, output, args.json)
    return 0


def _check_counts(args) -> None:
    """Refuses a count below 1."""
    for flag, value in (
        ("--workers", args.workers),
        ("--threads", args.threads),
        ("--batch-size", args.max_batch_size),
        ("--lines-per-task", args.lines_per_task),
        ("--beam", args.beam_size or 1),
    ):
        if value < 1:
            raise errors.CommandError(f"{flag} {value}; it must be at least 1")


def _check_output(output: Path, inputs: dict, force: bool) -> None:
    """Refuses an OUTPUT that overlaps an input, exists without --force, or cannot be written: now,
    not after Ray has translated everything."""
    atomic.refuse_overlap(output, inputs, errors.CommandError)
    if output.exists() and not force:
        raise errors.CommandError(f"OUTPUT {output} exists; pass --force to replace it")
    if output.is_dir() or not output.parent.is_dir():
        raise errors.CommandError(f"OUTPUT {output}: not a file in an existing directory")
    if not os.access(output.parent, os.W_OK | os.X_OK):
        raise errors.CommandError(
            f"OUTPUT {output}: the directory {output.parent} is not writable; "
            "choose a writable place for the output"
        )


def _check_cpus(ray, args) -> None:
    """Refuses more CPUs than a local instance has; on a cluster (--address), warns: it may scale up."""
    need, have = args.workers * args.threads, ray.cluster_resources().get("CPU", 0)
    if need > have:
        message = (
            f"--workers {args.workers} x --threads {args.threads} needs {need} CPUs; the Ray "
            f"instance has {have:g}: lower --workers or --threads"
        )
        if not args.address:
            raise errors.CommandError(message)
        print(f"warning: {message} (or wait for the cluster to scale up)", file=sys.stderr)


def _report(stats: dict, output: Path, as_json: bool) -> None:
    """The run's statistics: one JSON line on stdout (--json), else a line on stderr."""
    if as_json:
        print(json.dumps(stats, sort_keys=True))
    else:
        print(
            f"{stats['lines']} lines in {stats['seconds']:.1f} s ({stats['lines_per_second']} lines/s) on "
            f"{stats['workers']} workers -> {output}",
            file=sys.stderr,
        )
