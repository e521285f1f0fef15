"""Checks made before a run trains: the device, a writable run directory, the memory a batch needs, and
whether the run's step budget can be reached in its time."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from .config import ModelConfig, available_memory, gib, training_memory
from .options import TrainError


def pick_device(name: str) -> torch.device:
    """Returns the training device that --device names.

    Args:
        name: "auto" (CUDA when torch sees it, else the CPU), "cpu" or "cuda".

    Raises:
        TrainError: "cuda" when torch sees no CUDA device.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise TrainError("--device cuda, but torch sees no CUDA device; use --device cpu or auto")
    return torch.device(name)


def check_writable(out: Path) -> None:
    """Creates the run directory and a temporary file in it.

    So an unwritable place fails now, not at the first checkpoint after minutes of training.

    Args:
        out: the run directory.

    Raises:
        TrainError: the directory or the file cannot be made.
    """
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".probe-"):
            pass
    except OSError as e:
        raise TrainError(
            f"cannot write checkpoints to {out}: {e.strerror or e}; choose a writable directory for the run"
        ) from e


def device_memory(device: torch.device) -> int | None:
    """Returns the bytes of memory on the training device, None when unknown.

    Args:
        device: a CUDA device (its total memory) or the CPU (config.available_memory).
    """
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return available_memory()


def check_memory(cfg: ModelConfig, max_tokens: int, limit: int | None) -> None:
    """Refuses, before anything is allocated, a model too large to train here.

    Args:
        cfg: the model's shape.
        max_tokens: tokens per batch.
        limit: bytes available; nothing is checked when limit is None.

    Raises:
        TrainError: a rough estimate of training memory (config.training_memory) exceeds `limit`.
    """
    weights, activations = training_memory(cfg, max_tokens)
    if limit is None or weights + activations <= limit:
        return
    raise TrainError(
        f"this model would need about {gib(weights + activations)} to train: "
        f"{cfg.parameter_count():,} parameters x 16 bytes (weights, gradients, Adam's two moments) = "
        f"{gib(weights)}, plus about {gib(activations)} of activations for --max-tokens {max_tokens}; "
        f"this machine has {gib(limit)}. Choose a smaller --d-model "
        f"(now {cfg.d_model}), --d-ff ({cfg.d_ff}), --layers ({cfg.n_encoder_layers}), --vocab-size "
        f"({max(cfg.src_vocab_size, cfg.tgt_vocab_size)}) or --max-tokens ({max_tokens})"
    )


def steps_reachable(
    max_steps: int, start_step: int, step: int, elapsed_s: float, max_minutes: float | None
) -> int:
    """Returns the step at which the run will stop: max_steps, or sooner when --max-minutes ends it first.

    The time limit is turned into steps with the rate measured so far in this process (steps
    since start_step over elapsed_s, evaluations included), so a progress bar toward it tells
    the time left truthfully. Before any step is measured the answer is max_steps.

    Args:
        max_steps: the run's step limit.
        start_step: the step this process started from.
        step: the current step.
        elapsed_s: seconds since this process started training.
        max_minutes: the run's time limit, or None.
    """
    if max_minutes is None or step <= start_step or elapsed_s <= 0:
        return max_steps
    rate = (step - start_step) / elapsed_s
    left_s = max(60.0 * max_minutes - elapsed_s, 0.0)
    return max(step, min(max_steps, step + int(rate * left_s)))
