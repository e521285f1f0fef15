"""The engine registry: one Runner class per engine kind, each naming the engines (device, precision) it runs.

Adding an engine is one class in its own module of this package, decorated with @register and imported
by __init__.py (registration order is the order of ENGINES, hence of the bench's rows and tables).
"""

from __future__ import annotations

from seq2onnx.bench.settings import PARALLEL_KINDS

# name -> (kind, device, precision), in registration order; filled by @register
ENGINES: dict[str, tuple[str, str, str]] = {}
RUNNERS: dict[str, type[Runner]] = {}  # kind -> its Runner class


class Runner:
    """One engine, loaded in the child process and timed by run_engine (bench/engines/timing.py).

    A subclass sets `kind` and `variants` (engine name -> (device, precision)), loads its engine in
    __init__ (imports of the engine itself go there, never at module top: the parent process reads
    ENGINES without them), and implements run and describe; run_many only where its kind has a
    parallel setting (bench/settings.py PARALLEL_KINDS).

    Attributes:
        job: the job that bench/run.py wrote (engine, sources, limits, threads, eos_id, parallel, paths).
        device, precision: the engine's, from `variants`.
    """

    kind: str = ""
    variants: dict[str, tuple[str, str]] = {}

    def __init__(self, job: dict, device: str, precision: str):
        self.job, self.device, self.precision = job, device, precision
        self.sources, self.limits = job["sources"], job["limits"]
        self.threads, self.eos = job["threads"], job["eos_id"]
        self.parallel = job.get("parallel", 1)

    def run(self, indices: list[int], beam: int) -> list[list[int]]:
        """Decodes sentences `indices` as one batch; returns their target ids, end token excluded."""
        raise NotImplementedError

    def run_many(self, chunks: list[list[int]], beam: int) -> list[list[list[int]]]:
        """Decodes the chunks `parallel` at a time; returns run's answer per chunk."""
        raise NotImplementedError(f"{self.kind} has no parallel setting")

    def describe(self) -> str:
        """The engine and its settings in words, for the report."""
        raise NotImplementedError


def register(cls: type[Runner]) -> type[Runner]:
    """Class decorator: adds a Runner class and its engine names to the registry.

    Raises:
        ValueError: a kind or an engine name that is already registered.
    """
    taken = [n for n in cls.variants if n in ENGINES]
    if cls.kind in RUNNERS or taken:
        raise ValueError(
            f"engine kind {cls.kind!r} or names {taken} already registered; give the class new ones"
        )
    RUNNERS[cls.kind] = cls
    for name, (device, precision) in cls.variants.items():
        ENGINES[name] = (cls.kind, device, precision)
    return cls


def unregister(cls: type[Runner]) -> None:
    """Removes a class registered by register (tests register fakes)."""
    RUNNERS.pop(cls.kind, None)
    for name in cls.variants:
        ENGINES.pop(name, None)


def make_runner(job: dict) -> Runner:
    """Loads the job's engine: the Runner class registered for its kind.

    Raises:
        ValueError: an unknown engine name (the known ones listed), or a parallel setting for an
            engine without one.
    """
    name = job["engine"]
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; choose among {', '.join(ENGINES)}")
    kind, device, precision = ENGINES[name]
    if job.get("parallel", 1) > 1 and kind not in PARALLEL_KINDS:
        raise ValueError(f"{name} has no parallel setting")
    return RUNNERS[kind](job, device, precision)


def strip_eos(ids, eos: int) -> list[int]:
    """The ids without a trailing end token."""
    ids = list(ids)
    return ids[:-1] if ids and ids[-1] == eos else ids
