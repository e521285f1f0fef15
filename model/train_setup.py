"""What a training run starts from: a new run directory (refused where occupied, without --force) or the
last checkpoint of one to resume, the model's config from the options, and the corpus with the tokenizer
trained on it, shared by every rank. model/train.py runs the steps."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import checkpoint, distributed
from .config import ModelConfig
from .data import Split
from .options import TrainError, TrainOptions
from .preflight import check_memory, check_writable, device_memory
from .splits import load_split
from .tokenizer import Tokenizer


def config(opts: TrainOptions, src_vocab_size: int, tgt_vocab_size: int) -> ModelConfig:
    try:
        return ModelConfig(
            src_vocab_size=src_vocab_size,
            tgt_vocab_size=tgt_vocab_size,
            d_model=opts.d_model,
            n_heads=opts.n_heads,
            n_encoder_layers=opts.layers,
            n_decoder_layers=opts.layers,
            d_ff=opts.d_ff,
            dropout=opts.dropout,
            max_positions=max(opts.max_len + 2, 128),
            pre_norm=opts.pre_norm,
            tie_embeddings=opts.tie_embeddings,
            share_vocab=opts.joint_vocab,
        )
    except ValueError as e:
        raise TrainError(f"the model options do not fit together: {e}") from e


def open_run(opts: TrainOptions, out: Path, device: torch.device, main: bool):
    """--resume: the run's last checkpoint and its options (only limits and logging may change)."""
    if not (out / "last").exists():
        raise TrainError(f"--resume: {out} has no checkpoint (no {out / 'last'}); start without --resume")
    model, tok, ckpt = checkpoint.load(out / "last", device)
    saved = json.loads((ckpt / checkpoint.STATE).read_text())["options"]
    # Data, split and model shape come from the run; only limits and logging may change.
    keep = ("max_steps", "max_minutes", "eval_every", "progress", "device", "resume", "force", "out")
    opts = TrainOptions(**{**saved, **{k: getattr(opts, k) for k in keep}})
    check_memory(model.cfg, opts.max_tokens, device_memory(device))
    if main:  # only rank 0 writes in the run directory
        checkpoint.remove_leftovers(out)  # temporary directories of a write the last run was killed in
        check_writable(out)
    return opts, model, tok, ckpt


def new_run(opts: TrainOptions, out: Path, device: torch.device, main: bool) -> None:
    """A fresh run: refuses an occupied OUT without --force, and fails early where it cannot write."""
    # The largest config the options allow (the vocabularies are at most --vocab-size), checked
    # before the corpus is read and the tokenizers trained.
    check_memory(config(opts, opts.vocab_size, opts.vocab_size), opts.max_tokens, device_memory(device))
    if not main:  # only rank 0 writes in the run directory
        return
    if out.exists() and not out.is_dir():
        raise TrainError(f"{out} is a file, not a run directory; choose another OUT")
    if out.exists() and any(out.iterdir()):
        if not opts.force:
            raise TrainError(
                f"{out} already holds a run; pass --resume to continue it or --force to start over"
            )
        if not ((out / "last").is_symlink() or any(p.name.startswith("step-") for p in out.iterdir())):
            raise TrainError(
                f"{out} holds files but no run of `seq2onnx train` (no last or step-* inside): "
                "--force replaces only a run; choose another OUT or empty it yourself"
            )
        for flag, path in (("--data", opts.data), ("--valid-data", opts.valid_data)):
            if path is not None and out.resolve() in Path(path).resolve().parents:
                raise TrainError(
                    f"{flag} {path} lies inside OUT {out}, which --force would delete; "
                    "move the data out of the run directory or choose another OUT"
                )
        import shutil

        shutil.rmtree(out)
    check_writable(out)


def corpus(opts: TrainOptions, group: distributed.Group) -> tuple[Split, Tokenizer | None]:
    """The split, and for a new run the tokenizer trained on it (by rank 0 only; see share)."""
    split = load_split(opts, verbose=group.is_main)
    if opts.resume or not group.is_main:
        return split, None
    return split, Tokenizer.train(split.train, opts.vocab_size, joint=opts.joint_vocab)


def share(tok: Tokenizer | None, group: distributed.Group) -> Tokenizer:
    """Rank 0's tokenizer on every rank: each rank training its own could differ in a piece."""
    if not group.active:
        return tok
    models = group.broadcast((tok.source_model, tok.target_model) if group.is_main else None)
    return Tokenizer(*models)
