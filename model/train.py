"""Training with teacher forcing: Adam (beta2 0.98), inverse-square-root warm-up, label smoothing,
dropout, gradient clipping; periodic validation loss and BLEU on reference greedy decodes."""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from . import checkpoint, distributed, train_setup
from .adam import Adam
from .batches import encode_pairs, make_batch
from .data import Split, filter_by_length, token_batches
from .metrics import bleu
from .options import TrainOptions
from .preflight import pick_device, steps_reachable
from .search import translate_ids
from .tokenizer import Tokenizer
from .transformer import Transformer


def inverse_sqrt(step: int, d_model: int, warmup: int, scale: float) -> float:
    """Returns the learning rate: scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).

    Args:
        step: the step (at least 1 is used).
        d_model: the model width.
        warmup: warm-up steps.
        scale: --lr.
    """
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@torch.no_grad()
def evaluate(model, tok, examples, pairs, cfg, device, max_tokens, bleu_sentences) -> dict:
    """Computes validation loss per target token (no smoothing) and BLEU of greedy decodes.

    Args:
        model (Transformer): the model (back in training mode afterwards).
        tok (Tokenizer): its tokenizer.
        examples (list[tuple[list[int], list[int]]]): the encoded validation pairs, for the loss.
        pairs (list[tuple[str, str]]): the validation text pairs, for BLEU.
        cfg (ModelConfig): the model's config.
        device (torch.device): the model's device.
        max_tokens (int): tokens per batch.
        bleu_sentences (int): the first this many pairs are decoded for BLEU.

    Returns:
        {"valid_loss", "valid_bleu", "samples"}: samples are up to 3 (source, translation) of distinct
        sources.
    """
    model.eval()
    total, count = 0.0, 0
    lengths = [(len(s), len(t) + 1) for s, t in examples]
    for batch in token_batches(lengths, max_tokens=max_tokens, shuffle=False):
        src, mask, tgt_in, tgt_out = make_batch(examples, batch, cfg, device)
        logits = model(src, mask, tgt_in)
        total += F.cross_entropy(
            logits.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=cfg.pad_id, reduction="sum"
        ).item()
        count += int((tgt_out != cfg.pad_id).sum())
    n = min(bleu_sentences, len(pairs))
    hyps = translate_ids(model, [tok.encode_source(s) for s, _ in pairs[:n]], beam_size=1)
    texts = [tok.decode_target(h[0].tokens) for h in hyps]
    model.train()
    valid_bleu = bleu(texts, [t for _, t in pairs[:n]]) if n else 0.0
    return {
        "valid_loss": total / max(count, 1),
        "valid_bleu": valid_bleu,
        "samples": _distinct_samples([s for s, _ in pairs[:n]], texts, 3),
    }


def _distinct_samples(sources: list[str], texts: list[str], k: int) -> list[tuple[str, str]]:
    """The first k translations of distinct sources (real corpora repeat a source with other references)."""
    seen: dict[str, str] = {}
    for s, t in zip(sources, texts):
        if s not in seen and len(seen) < k:
            seen[s] = t
    return list(seen.items())


class _Bar(tqdm):
    """tqdm without its monitor thread: no thread of the run's may still be alive when a process
    exits (a daemon thread woken during interpreter shutdown can abort it)."""

    monitor_interval = 0


def train(opts: TrainOptions) -> Path:
    """Trains (or resumes) a run in opts.out.

    Under torchrun every process calls this and they train one model together (see
    model/distributed.py): each takes its part of every batch, rank 0 validates, logs and writes
    the checkpoints.

    Args:
        opts: the run's options.

    Returns:
        The run directory.

    Raises:
        TrainError: options that cannot work.
        DistributedError: the process group cannot form or loses a rank.
    """
    device = pick_device(opts.device)
    group = distributed.start(device)
    clean = False
    try:
        if not group.active:
            out = _train(opts, group)
        else:
            # Writes each rank's exception to the file torchrun reads, so its failure summary shows it.
            out = distributed.recorded(_train)(opts, group)
        clean = True
        return out
    finally:
        group.close(clean=clean)  # on every path: success, error, KeyboardInterrupt


@dataclasses.dataclass
class _Run:
    """What one training run holds from step to step (every rank has its own)."""

    opts: TrainOptions  # the resumed run's own options where --resume
    group: distributed.Group
    model: Transformer
    net: torch.nn.Module  # the model, or its DistributedDataParallel wrapper
    tok: Tokenizer
    split: Split
    train_ex: list[tuple[list[int], list[int]]]  # encoded, too-long pairs dropped
    valid_ex: list[tuple[list[int], list[int]]]  # encoded, cut to the model's positions
    optimizer: Adam
    state: dict  # train_state.json: step, epoch, batch_in_epoch, best_valid_loss, history, options
    amp: torch.autocast  # bf16 autocast on CUDA, a no-op on the CPU
    start_step: int  # the step the run (or its resumption) started at
    t0: float = dataclasses.field(default_factory=time.time)
    tokens_seen: int = 0

    @property
    def out(self) -> Path:
        return Path(self.opts.out)

    @property
    def lengths(self) -> list[tuple[int, int]]:
        """Each training pair's source length and target length (end token included)."""
        return [(len(s), len(t) + 1) for s, t in self.train_ex]


def _train(opts: TrainOptions, group: distributed.Group) -> Path:
    run, dropped = _prepare(opts, group)
    opts, state, main = run.opts, run.state, group.is_main
    lengths = run.lengths
    # On a terminal the bar redraws often; into a log file a line every 30 s is enough.
    interval = 0.5 if sys.stderr.isatty() else 30.0
    bar = _Bar(
        total=opts.max_steps,
        initial=run.start_step,
        disable=not (opts.progress and main),
        unit="step",
        dynamic_ncols=True,
        mininterval=interval,
    )
    if main and not opts.resume:
        _announce(run, dropped)
    # A resumed run that already reached max_steps is finished: train nothing more.
    stop = state["step"] >= opts.max_steps
    if stop and main:
        print(
            f"{run.out} already reached step {state['step']} of {opts.max_steps}; "
            "raise --max-steps to train further"
        )
    try:  # the bar's monitor thread is joined by bar.close(), on every path
        while not stop:
            batches = token_batches(
                lengths, max_tokens=opts.max_tokens, shuffle=True, seed=opts.seed + run.state["epoch"]
            )
            for b in range(run.state["batch_in_epoch"], len(batches)):
                stop = _step(run, lengths, batches[b], b, bar)
                if stop:
                    break
            else:
                run.state.update(epoch=run.state["epoch"] + 1, batch_in_epoch=0)
    except RuntimeError as e:
        if group.active and distributed.is_collective_failure(e):
            raise distributed.describe_failure(group, e, run.state["step"]) from e
        raise
    finally:
        bar.close()
    return run.out


def _prepare(opts: TrainOptions, group: distributed.Group) -> tuple[_Run, int]:
    """Opens or starts the run, reads the corpus, makes the model and optimizer (seeded in that
    order); returns the run and how many training pairs were too long."""
    out, device, main = Path(opts.out), group.device, group.is_main
    state: dict = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "best_valid_loss": None, "history": []}
    # Each rank checks what it can; a failure on any rank stops all of them (Group.agree).
    if opts.resume:
        opts, model, tok, ckpt = group.agree(lambda: train_setup.open_run(opts, out, device, main))
    else:
        group.agree(lambda: train_setup.new_run(opts, out, device, main))
    random.seed(opts.seed)
    torch.manual_seed(opts.seed)
    split, trained = group.agree(lambda: train_setup.corpus(opts, group))
    if not opts.resume:
        tok = train_setup.share(trained, group)
        model = Transformer(train_setup.config(opts, tok.src_vocab_size, tok.tgt_vocab_size)).to(device)
    cfg = model.cfg
    net = _parallel(model, opts, group)
    train_ex = encode_pairs(tok, split.train)
    keep, dropped = filter_by_length(train_ex, max_len=opts.max_len)
    train_ex = [train_ex[i] for i in keep]
    valid_ex = encode_pairs(tok, split.valid)
    valid_ex = [(s[: cfg.max_positions], t[: cfg.max_positions - 1]) for s, t in valid_ex]
    optimizer = Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)  # the paper's
    if opts.resume:
        state = checkpoint.load_training_state(ckpt, optimizer)
    state["options"] = dataclasses.asdict(opts)
    model.train()
    amp = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    run = _Run(opts, group, model, net, tok, split, train_ex, valid_ex, optimizer, state, amp, state["step"])
    return run, dropped


def _parallel(model: Transformer, opts: TrainOptions, group: distributed.Group) -> torch.nn.Module:
    """The model itself in one process; under torchrun, its DistributedDataParallel wrapper."""
    if not group.active:
        return model
    from torch.nn.parallel import DistributedDataParallel

    device = group.device
    # Rank 0's initial weights reach every rank here, so all ranks start from the same model.
    net = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if group.rank:  # rank 0 keeps the single-process random stream; the others draw other dropout masks
        torch.manual_seed(opts.seed + 7919 * group.rank)
    return net


def _announce(run: _Run, dropped: int) -> None:
    """The new run's first line: parameters, device, pairs and vocabularies."""
    group, cfg = run.group, run.model.cfg
    print(
        f"training {sum(p.numel() for p in run.model.parameters()):,} parameters on {group.device}"
        + (f" x {group.world_size} processes" if group.active else "")
        + ": "
        f"{len(run.train_ex)} pairs ({dropped} longer than {run.opts.max_len} tokens dropped), "
        f"vocabularies {cfg.src_vocab_size}/{cfg.tgt_vocab_size}"
    )


def _step(run: _Run, lengths: list[tuple[int, int]], batch: list[int], b: int, bar: _Bar) -> bool:
    """One optimizer step on the global batch `batch` (number b of its epoch), validation when due.

    Returns:
        Whether the run is over (max_steps reached, or max_minutes on rank 0's clock).
    """
    opts, group, cfg = run.opts, run.group, run.model.cfg
    # Every rank builds the same global batches; each takes its part (all of it in one process).
    mine = group.shard(batch)
    src, mask, tgt_in, tgt_out = make_batch(run.train_ex, mine or batch[:1], cfg, group.device)
    total = sum(lengths[i][1] for i in batch)  # target tokens of the global batch
    step = run.state["step"] + 1
    for group_ in run.optimizer.param_groups:
        group_["lr"] = inverse_sqrt(step, cfg.d_model, opts.warmup, opts.lr)
    loss, grad_norm = _backward(run, (src, mask, tgt_in, tgt_out), bool(mine), total)
    run.state.update(step=step, batch_in_epoch=b + 1)
    run.tokens_seen += total
    bar.update(1)
    if opts.max_minutes is not None:  # count toward whichever limit ends the run first
        elapsed_s = time.time() - run.t0
        reachable = steps_reachable(opts.max_steps, run.start_step, step, elapsed_s, opts.max_minutes)
        if reachable != bar.total:
            bar.total = reachable
    timed_out = opts.max_minutes is not None and time.time() - run.t0 > 60 * opts.max_minutes
    train_loss, timed_out = _agree_on_loss(run, loss, total, timed_out)
    speed = run.tokens_seen / max(time.time() - run.t0, 1e-9)
    bar.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{speed:,.0f}", refresh=False)
    if step % opts.eval_every == 0 or step >= opts.max_steps or timed_out:
        if group.is_main:  # validation runs once, on rank 0; the others wait for its state below
            _validate_and_save(
                run.model,
                run.tok,
                run.valid_ex,
                run.split,
                cfg,
                group.device,
                opts,
                run.state,
                run.optimizer,
                bar,
                train_loss,
                grad_norm.item(),
                run.t0,
                run.out,
            )
        run.state = group.broadcast(run.state)
    return step >= opts.max_steps or timed_out


def _backward(
    run: _Run, batch: tuple[torch.Tensor, ...], has_examples: bool, total: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward, loss, backward, clipping and the optimizer's step; returns (loss, grad norm).

    Under torchrun the loss is this rank's sum over the global batch's tokens, times N because DDP
    averages gradients over ranks: the gradient is the single-process gradient of the whole batch.
    A rank with no examples computes on a stand-in, weighted 0, so that it still joins DDP's
    all-reduce.
    """
    opts, cfg = run.opts, run.model.cfg
    src, mask, tgt_in, tgt_out = batch
    with run.amp:
        logits = run.net(src, mask, tgt_in)
    flat_logits, flat_target = logits.flatten(0, 1).float(), tgt_out.flatten()
    if run.group.active:
        weight = 1.0 if has_examples else 0.0
        loss = (
            F.cross_entropy(
                flat_logits,
                flat_target,
                ignore_index=cfg.pad_id,
                label_smoothing=opts.label_smoothing,
                reduction="sum",
            )
            * weight
        )
        objective = loss * (run.group.world_size / total)
    else:
        loss = F.cross_entropy(
            flat_logits, flat_target, ignore_index=cfg.pad_id, label_smoothing=opts.label_smoothing
        )
        objective = loss
    run.optimizer.zero_grad()
    objective.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), opts.clip_norm)
    run.optimizer.step()
    return loss, grad_norm


def _agree_on_loss(run: _Run, loss: torch.Tensor, total: int, timed_out: bool) -> tuple[float, bool]:
    """The batch's training loss, and whether the run is out of time, the same on every rank.

    One collective for the batch's loss and rank 0's clock: all ranks stop at the same step.
    """
    group = run.group
    if not group.active:
        return loss.item(), timed_out
    shared = torch.tensor(
        [loss.item(), float(timed_out and group.is_main)], dtype=torch.float64, device=group.device
    )
    group.all_reduce_sum(shared)
    return shared[0].item() / total, shared[1].item() > 0


def _validate_and_save(
    model, tok, valid_ex, split, cfg, device, opts, state, optimizer, bar, train_loss, grad_norm, t0, out
) -> None:
    """Validation loss and BLEU, a line in the history and on the bar, and a checkpoint (best or not)."""
    step = state["step"]
    metrics = evaluate(model, tok, valid_ex, split.valid, cfg, device, opts.max_tokens, opts.bleu_sentences)
    best = state["best_valid_loss"] is None or metrics["valid_loss"] < state["best_valid_loss"]
    if best:
        state["best_valid_loss"] = metrics["valid_loss"]
    # grad_norm: the gradient's norm before clipping, the same for any number of processes.
    state["history"].append(
        {
            "step": step,
            "train_loss": train_loss,
            "grad_norm": grad_norm,
            "valid_loss": metrics["valid_loss"],
            "valid_bleu": metrics["valid_bleu"],
            "elapsed_s": time.time() - t0,
        }
    )
    bar.write(
        f"step {step}: train loss {train_loss:.3f}, valid loss {metrics['valid_loss']:.3f}, "
        f"valid BLEU {metrics['valid_bleu']:.1f}" + (" (best)" if best else "")
    )
    for s, h in metrics["samples"]:
        bar.write(f"  {s}  ->  {h}")
    checkpoint.save(out, model, tok, state, optimizer, best=best)
