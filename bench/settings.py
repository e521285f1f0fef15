"""`seq2onnx bench`'s thread settings: what each engine is tried at, and their names.

A setting is (intra, parallel): `intra` threads inside each operator, and `parallel` batches decoded
at the same time, each on one worker with `intra` threads. What `parallel` means per engine:

  ct2     CTranslate2's own throughput setting: Translator(inter_threads=parallel, intra_threads=intra),
          and every batch of a pass submitted at once (translate_batch(..., asynchronous=True), one
          call per batch), so that its workers take batches from its queue. A single blocking
          translate_batch call of one batch runs on one worker whatever inter_threads is: CTranslate2
          splits a call into max_batch_size chunks and spreads those over its workers, and one batch
          is one chunk.
  onnx    one runtime Translator (intra_threads=intra) shared by `parallel` Python threads, each taking
          the next batch: how a user of seq2onnx gets throughput from several batches (a Translator
          may be shared by threads; onnxruntime sessions run concurrently, the weights are loaded once).
  torch   not run in parallel (the reference has no such mode).

The sweep (the bench's default) tries intra = 1, 2, 4, ... up to the cores and the cores themselves,
with parallel 1, and for onnx and ct2 on the CPU also (intra 1, parallel = cores). The equal-threads
setting is (cores, 1), every engine at the same threads: the bench's table before the sweep.
"""

from __future__ import annotations

from dataclasses import dataclass

PARALLEL_KINDS = ("onnx", "ct2")  # engine kinds with a parallel setting (bench/engines/ ENGINES)


@dataclass(frozen=True, order=True)
class Setting:
    """Threads of one engine process.

    Attributes:
        intra: threads inside each operator (torch.set_num_threads, onnxruntime intra_op_num_threads,
            CTranslate2 intra_threads).
        parallel: batches decoded at the same time (CTranslate2 inter_threads; for the runtime, Python
            threads sharing one Translator); 1: one batch after another.
    """

    intra: int
    parallel: int = 1

    @property
    def label(self) -> str:
        """The setting in a few words, as tables print it: "1 thread", "2 threads", "2 x 1 thread"."""
        one = f"{self.intra} thread{'s' if self.intra > 1 else ''}"
        return one if self.parallel == 1 else f"{self.parallel} x {one}"

    @property
    def key(self) -> str:
        """A name for files and JSON: "2x1" is parallel 2, intra 1; "2" is intra 2 alone."""
        return str(self.intra) if self.parallel == 1 else f"{self.parallel}x{self.intra}"


def intra_counts(cores: int) -> list[int]:
    """Intra thread counts the sweep tries: 1, 2, 4, ... below `cores`, and `cores` itself."""
    counts, n = [], 1
    while n < cores:
        counts.append(n)
        n *= 2
    return counts + [max(cores, 1)]


def sweep_settings(kind: str, device: str, cores: int) -> list[Setting]:
    """The settings an engine is tried at by the sweep.

    Args:
        kind: the engine's kind ("torch", "torch-batched", "onnx", "ct2").
        device: "cpu" or "cuda": on a GPU the threads matter little, so a CUDA engine runs only at the
            equal setting (cores, 1).
        cores: the most threads an engine may use.

    Returns:
        The settings, the equal-threads one among them.
    """
    if device != "cpu":
        return [Setting(cores)]
    settings = [Setting(n) for n in intra_counts(cores)]
    if kind in PARALLEL_KINDS and cores > 1:
        settings.append(Setting(1, cores))
    return settings


def describe_setting(kind: str, setting: Setting) -> str:
    """The engine's own words for a setting (the report's notes and each row's description)."""
    if kind == "ct2":
        text = f"intra_threads={setting.intra} inter_threads={setting.parallel}"
        at_once = ", the pass's batches submitted at once (asynchronous=True)"
        return text + (at_once if setting.parallel > 1 else "")
    if kind == "onnx":
        text = f"intra_op_num_threads={setting.intra}"
        return text + (
            f", one Translator shared by {setting.parallel} threads, each taking the next batch"
            if setting.parallel > 1
            else ""
        )
    return f"{setting.intra} thread{'s' if setting.intra > 1 else ''}"
