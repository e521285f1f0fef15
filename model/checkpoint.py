"""Checkpoints: directories of config.json, safetensors weights, tokenizer models, training state.

A run directory holds complete checkpoints `step-NNNNNNNN/` and two symbolic links, `last` and
`best`, that point at them. A checkpoint is written into a temporary directory and renamed into
place, then a link is swapped with os.replace; both are atomic on POSIX, so killing the process at
any moment leaves `last` pointing at a complete checkpoint. Loading never unpickles.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from seq2onnx import atomic

from .adam import Adam
from .config import ModelConfig, available_memory, gib
from .tokenizer import SOURCE_MODEL, TARGET_MODEL, Tokenizer
from .transformer import Transformer

CONFIG, WEIGHTS = "config.json", "model.safetensors"
STATE, OPTIMIZER = "train_state.json", "optimizer.safetensors"
REQUIRED = (CONFIG, WEIGHTS, SOURCE_MODEL, TARGET_MODEL)


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete or does not match its config."""


def _unique_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """state_dict without aliases (tied embeddings appear once: safetensors refuses shared memory)."""
    seen: set[int] = set()
    out = {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        out[name] = tensor.detach().contiguous().cpu()
    return out


def resolve(path: str | Path) -> Path:
    """Finds the checkpoint directory from itself or from a run directory (its `last`).

    Args:
        path: a checkpoint directory (step-*, `last`, `best`) or a run directory.

    Returns:
        The checkpoint directory, resolved (links followed).

    Raises:
        CheckpointError: no such path, not a directory, or a file of REQUIRED is missing.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(
            f"{path}: no such checkpoint directory; give a run directory or one of its step-*/last/best"
        )
    if path.is_dir() and not (path / CONFIG).exists() and (path / "last").exists():
        path = path / "last"
    if not path.is_dir():
        raise CheckpointError(
            f"{path}: is not a directory; a checkpoint is a directory with {', '.join(REQUIRED)}"
        )
    missing = [name for name in REQUIRED if not (path / name).is_file()]
    if missing:
        raise CheckpointError(
            f"{path}: not a complete checkpoint, missing {', '.join(missing)}; "
            f"a checkpoint directory holds {', '.join(REQUIRED)} (written by `seq2onnx train`)"
        )
    return path.resolve()


def load(path: str | Path, device: str | torch.device = "cpu") -> tuple[Transformer, Tokenizer, Path]:
    """Loads a checkpoint without unpickling anything.

    Args:
        path: a checkpoint or run directory (see `resolve`).
        device: where the model goes.

    Returns:
        (model in eval mode, tokenizer, resolved directory).

    Raises:
        CheckpointError: names what is wrong: an incomplete directory, an invalid config, weights too
            large for this machine's memory, unreadable weights, weights or tokenizer vocabularies
            that do not match the config.
    """
    path = resolve(path)
    try:
        cfg = ModelConfig.load(path / CONFIG)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path / CONFIG}: not a valid model config: {e}") from e
    _check_fits(cfg, path)
    model = Transformer(cfg)
    try:
        weights = load_file(str(path / WEIGHTS))
    except Exception as e:  # safetensors raises its own error types for damaged headers
        raise CheckpointError(f"{path / WEIGHTS}: cannot be read as safetensors: {e}") from e
    expected = {k: v.shape for k, v in _unique_state(model).items()}
    problems = [f"missing {k} {tuple(s)}" for k, s in expected.items() if k not in weights]
    problems += [f"unexpected {k}" for k in weights if k not in expected]
    problems += [
        f"{k} has shape {tuple(weights[k].shape)}, config.json implies {tuple(s)}"
        for k, s in expected.items()
        if k in weights and weights[k].shape != s
    ]
    if problems:
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
        raise CheckpointError(f"{path / WEIGHTS} does not match {path / CONFIG}: {shown}")
    model.load_state_dict(weights, strict=False)
    tokenizer = Tokenizer.load(path)
    if (tokenizer.src_vocab_size, tokenizer.tgt_vocab_size) != (cfg.src_vocab_size, cfg.tgt_vocab_size):
        raise CheckpointError(
            f"{path}: tokenizer vocabularies ({tokenizer.src_vocab_size}, {tokenizer.tgt_vocab_size}) "
            f"differ from config.json ({cfg.src_vocab_size}, {cfg.tgt_vocab_size})"
        )
    return model.to(device).eval(), tokenizer, path


def _check_fits(cfg: ModelConfig, path: Path) -> None:
    """Refuses, before allocating, a config whose weights cannot fit in this machine's memory."""
    # The model's fp32 weights and the tensors read from the file exist at once while loading.
    need = 2 * 4 * cfg.parameter_count()
    limit = available_memory()
    if limit is not None and need > limit:
        raise CheckpointError(
            f"{path / CONFIG}: this model has {cfg.parameter_count():,} parameters and needs about "
            f"{gib(need)} to load, more than this machine's {gib(limit)}; load it on a machine with more "
            f"memory, or check that d_model ({cfg.d_model}), d_ff ({cfg.d_ff}) and the vocabulary sizes in "
            "config.json are right"
        )


# Test-only: seconds to sleep inside a checkpoint write, while its temporary directory exists, so
# that tests/test_kill_resume.py can kill a process inside a write for certain.
_WRITE_PAUSE_ENV = "SEQ2ONNX_TEST_CHECKPOINT_WRITE_PAUSE"


def save(
    run_dir: str | Path,
    model: Transformer,
    tokenizer: Tokenizer,
    state: dict,
    optimizer: Adam | None = None,
    *,
    best: bool = False,
    keep: int = 1,
) -> Path:
    """Writes step-NNNNNNNN/ atomically, points `last` (and `best`) at it, drops older ones.

    Args:
        run_dir: the run directory (made if missing).
        model: the model to save (its config and weights).
        tokenizer: its tokenizer.
        state: the training state; state["step"] names the checkpoint.
        optimizer: saved too (its tensors as safetensors) when given.
        best: point `best` at the new checkpoint as well.
        keep: unused: every checkpoint that neither link points at is removed.

    Returns:
        The new checkpoint directory.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    final = run_dir / f"step-{state['step']:08d}"
    tmp = atomic.temp_dir(run_dir, ".tmp-")  # a plain mkdir's mode: a checkpoint is shared like any output
    try:
        model.cfg.save(tmp / CONFIG)
        save_file(_unique_state(model), str(tmp / WEIGHTS))
        tokenizer.save(tmp)
        if optimizer is not None:
            tensors, meta = _optimizer_state(optimizer)
            save_file(tensors, str(tmp / OPTIMIZER))
            state = {**state, "optimizer": meta}
        (tmp / STATE).write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
        for f in tmp.iterdir():  # data on disk before the rename makes it visible
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if os.environ.get(_WRITE_PAUSE_ENV):
            time.sleep(float(os.environ[_WRITE_PAUSE_ENV]))
        if final.exists():
            _remove(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _point(run_dir / "last", final.name)
    if best:
        _point(run_dir / "best", final.name)
    _prune(run_dir)
    return final


def _point(link: Path, target: str) -> None:
    tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)


def _remove(path: Path) -> None:
    """Deletes a directory so that no half-deleted checkpoint is ever visible: rename, then delete."""
    doomed = path.with_name(f".tmp-del-{path.name}-{os.getpid()}")
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _prune(run_dir: Path) -> None:
    """Removes checkpoints that neither link points at, and temporary leftovers of a killed run."""
    keep = {os.readlink(run_dir / n) for n in ("last", "best") if (run_dir / n).is_symlink()}
    for child in run_dir.iterdir():
        if child.name.startswith("step-") and child.name not in keep:
            _remove(child)
    remove_leftovers(run_dir)


def remove_leftovers(run_dir: str | Path) -> list[str]:
    """Deletes the temporary files and directories a killed write left in a run directory.

    Only for a run no other process is writing (training resumes it).

    Args:
        run_dir: the run directory.

    Returns:
        The names removed.
    """
    removed = []
    for child in Path(run_dir).iterdir():
        if child.name.startswith((".tmp-", ".last.tmp", ".best.tmp", ".probe-")):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
            removed.append(child.name)
    return removed


def _optimizer_state(optimizer: Adam) -> tuple[dict[str, torch.Tensor], dict]:
    sd = optimizer.state_dict()
    tensors, meta = {}, {"param_groups": sd["param_groups"], "state": {}}
    for pid, st in sd["state"].items():
        meta["state"][str(pid)] = {}
        for key, value in st.items():
            if torch.is_tensor(value):
                tensors[f"{pid}.{key}"] = value.detach().contiguous().cpu()
            else:
                meta["state"][str(pid)][key] = value
    return tensors, meta


def load_training_state(path: Path, optimizer: Adam | None) -> dict:
    """Reads train_state.json of a checkpoint; restores the optimizer's moments when it is given.

    Args:
        path: the checkpoint directory.
        optimizer: the optimizer to restore, or None.

    Returns:
        The training state, without its "optimizer" entry.
    """
    state = json.loads((path / STATE).read_text())
    meta = state.pop("optimizer", None)
    if optimizer is not None and meta is not None:
        tensors = load_file(str(path / OPTIMIZER))
        sd = {"param_groups": meta["param_groups"], "state": {}}
        for pid, scalars in meta["state"].items():
            sd["state"][int(pid)] = dict(scalars)
        for key, value in tensors.items():
            pid, name = key.split(".", 1)
            sd["state"].setdefault(int(pid), {})[name] = value
        optimizer.load_state_dict(sd)
    return state
