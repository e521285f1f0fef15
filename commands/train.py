"""`seq2onnx train OUT`: train a Transformer with teacher forcing, in one process or DDP (--nproc)."""

from __future__ import annotations

import time

from seq2onnx.errors import CommandError, needs_torch


def add(sub) -> None:
    """Registers the command on the `seq2onnx` parser's subparsers."""
    p = sub.add_parser(
        "train",
        help="train a Transformer on a parallel corpus (or the generated one)",
        description="Train an encoder-decoder Transformer with teacher forcing. Checkpoints "
        "go to OUT/step-*/ with OUT/last and OUT/best pointing at them; --resume continues a "
        "run.",
    )
    p.add_argument("out", help="run directory (checkpoints, `last` and `best`)")
    _add_data_flags(p)
    _add_model_flags(p)
    _add_run_flags(p)
    p.set_defaults(func=run)


def _add_data_flags(p) -> None:
    """The corpus: its files, columns, generated size, splits and vocabulary."""
    p.add_argument("--data", help="tab-separated corpus; default: the generated corpus of `seq2onnx demo`")
    p.add_argument(
        "--valid-data",
        help="tab-separated validation set, read with the same column options; "
        "default: --valid-size pairs held out of --data (the test split always comes from --data)",
    )
    p.add_argument("--src-col", type=int, default=0, help="0-based column of the source text (default 0)")
    p.add_argument("--tgt-col", type=int, default=1, help="0-based column of the target text (default 1)")
    p.add_argument(
        "--skip-bad-lines", action="store_true", help="skip and count malformed lines instead of failing"
    )
    p.add_argument(
        "--pairs", type=int, default=20000, help="size of the generated corpus when --data is not given"
    )
    p.add_argument(
        "--valid-size",
        type=int,
        default=500,
        help="validation pairs held out of --data (ignored with --valid-data)",
    )
    p.add_argument("--test-size", type=int, default=500, help="test pairs held out of --data")
    p.add_argument("--vocab-size", type=int, default=1000, help="SentencePiece pieces per side")
    p.add_argument("--joint-vocab", action="store_true", help="one SentencePiece model for both sides")
    p.add_argument("--max-len", type=int, default=64, help="drop training pairs longer than this many tokens")


def _add_model_flags(p) -> None:
    """The Transformer's shape."""
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--pre-norm", action="store_true", help="pre-LN instead of the paper's post-LN")
    p.add_argument("--untied", action="store_true", help="separate target embedding and output projection")


def _add_run_flags(p) -> None:
    """The optimisation and the run: batch, schedule, stopping, evaluation, device, resume."""
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch, padding included")
    p.add_argument("--lr", type=float, default=1.0, help="scale of the inverse-square-root schedule")
    p.add_argument("--warmup", type=int, default=800)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--clip-norm", type=float, default=1.0)
    p.add_argument("--max-steps", type=int, default=4000)
    p.add_argument("--max-minutes", type=float, help="stop (with a checkpoint) after this much wall time")
    p.add_argument("--eval-every", type=int, default=500, help="steps between validation and checkpoints")
    p.add_argument("--bleu-sentences", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--resume", action="store_true", help="continue the run in OUT from its last checkpoint")
    p.add_argument("--force", action="store_true", help="replace an existing run in OUT")
    p.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="train with N processes on this machine (DistributedDataParallel through torchrun's "
        "launcher: one per GPU, or CPU processes); --max-tokens is the batch of all N "
        "together",
    )


def train_options(args):
    """Turns the parsed command line into the run's options.

    Args:
        args (argparse.Namespace): `seq2onnx train`'s arguments.

    Returns:
        TrainOptions: --heads is n_heads, --pairs generated_pairs, --untied tie_embeddings=False.
    """
    from seq2onnx.model.options import TrainOptions

    return TrainOptions(
        out=args.out,
        data=args.data,
        valid_data=args.valid_data,
        src_col=args.src_col,
        tgt_col=args.tgt_col,
        skip_bad_lines=args.skip_bad_lines,
        generated_pairs=args.pairs,
        valid_size=args.valid_size,
        test_size=args.test_size,
        vocab_size=args.vocab_size,
        joint_vocab=args.joint_vocab,
        max_len=args.max_len,
        d_model=args.d_model,
        n_heads=args.heads,
        layers=args.layers,
        d_ff=args.d_ff,
        dropout=args.dropout,
        pre_norm=args.pre_norm,
        tie_embeddings=not args.untied,
        max_tokens=args.max_tokens,
        lr=args.lr,
        warmup=args.warmup,
        label_smoothing=args.label_smoothing,
        clip_norm=args.clip_norm,
        max_steps=args.max_steps,
        max_minutes=args.max_minutes,
        eval_every=args.eval_every,
        bleu_sentences=args.bleu_sentences,
        seed=args.seed,
        device=args.device,
        resume=args.resume,
        force=args.force,
    )


def run(args) -> int:
    needs_torch("train")
    from seq2onnx.model import distributed

    if args.nproc is not None:  # re-run this command line under torchrun, without --nproc
        if args.nproc < 1:
            raise CommandError(f"--nproc {args.nproc}: give at least 1 process")
        return distributed.launch(args.nproc, distributed.without_option(args.argv, "--nproc"))
    from seq2onnx.model.train import train

    t0 = time.time()
    out = train(train_options(args))
    if distributed.is_main():  # under torchrun every rank returns here; one line is enough
        print(f"trained in {time.time() - t0:.0f} s; checkpoints: {out}/last and {out}/best")
    return 0
