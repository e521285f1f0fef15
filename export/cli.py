"""The training side of the `seq2onnx` command: train, export, verify, evaluate, demo (and bench).

seq2onnx.cli (the entry point) dispatches these commands here; they import torch
when they run and say how to install it when it is missing.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from seq2onnx.export import needs_torch
from seq2onnx.runtime.cli import EXIT_FAIL, TRAINING_COMMANDS, CommandError, build_parser, run_command


# -- train ---------------------------------------------------------------------------------------

def add_train(sub) -> None:
    p = sub.add_parser("train", description="Train an encoder-decoder Transformer with teacher forcing. Checkpoints go to "
                       "OUT/step-*/ with OUT/last and OUT/best pointing at them; --resume continues a run.")
    p.add_argument("out", help="run directory (checkpoints, `last` and `best`)")
    p.add_argument("--data", help="tab-separated corpus; default: the generated corpus of `seq2onnx demo`")
    p.add_argument("--valid-data", help="tab-separated validation set, read with the same column options; "
                   "default: --valid-size pairs held out of --data (the test split always comes from --data)")
    p.add_argument("--src-col", type=int, default=0, help="0-based column of the source text (default 0)")
    p.add_argument("--tgt-col", type=int, default=1, help="0-based column of the target text (default 1)")
    p.add_argument("--skip-bad-lines", action="store_true", help="skip and count malformed lines instead of failing")
    p.add_argument("--pairs", type=int, default=20000, help="size of the generated corpus when --data is not given")
    p.add_argument("--valid-size", type=int, default=500, help="validation pairs held out of --data "
                   "(ignored with --valid-data)")
    p.add_argument("--test-size", type=int, default=500, help="test pairs held out of --data")
    p.add_argument("--vocab-size", type=int, default=1000, help="SentencePiece pieces per side")
    p.add_argument("--joint-vocab", action="store_true", help="one SentencePiece model for both sides")
    p.add_argument("--max-len", type=int, default=64, help="drop training pairs longer than this many tokens")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--pre-norm", action="store_true", help="pre-LN instead of the paper's post-LN")
    p.add_argument("--untied", action="store_true", help="separate target embedding and output projection")
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
    p.add_argument("--nproc", type=int, metavar="N",
                   help="train with N processes on this machine (DistributedDataParallel through torchrun's launcher: "
                        "one per GPU, or CPU processes); --max-tokens is the batch of all N together")
    p.set_defaults(func=cmd_train)


def train_options(args):
    from seq2onnx.model.train import TrainOptions

    return TrainOptions(
        out=args.out, data=args.data, valid_data=args.valid_data, src_col=args.src_col, tgt_col=args.tgt_col, skip_bad_lines=args.skip_bad_lines,
        generated_pairs=args.pairs, valid_size=args.valid_size, test_size=args.test_size, vocab_size=args.vocab_size,
        joint_vocab=args.joint_vocab, max_len=args.max_len, d_model=args.d_model, n_heads=args.heads,
        layers=args.layers, d_ff=args.d_ff, dropout=args.dropout, pre_norm=args.pre_norm,
        tie_embeddings=not args.untied, max_tokens=args.max_tokens, lr=args.lr, warmup=args.warmup,
        label_smoothing=args.label_smoothing, clip_norm=args.clip_norm, max_steps=args.max_steps,
        max_minutes=args.max_minutes, eval_every=args.eval_every, bleu_sentences=args.bleu_sentences,
        seed=args.seed, device=args.device, resume=args.resume, force=args.force,
    )


def cmd_train(args) -> int:
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


# -- export / verify -----------------------------------------------------------------------------

EXPORT_FORMATS = ("onnx", "ctranslate2")
ONNX_ONLY = ("dtype", "quantize", "decoder")  # export options of ONNX bundles (export_bundle has their defaults)


def add_export(sub) -> None:
    p = sub.add_parser("export", description="Export CHECKPOINT (a run directory or one of its step-*/last/best) into the "
                       "bundle OUT_DIR: encoder.onnx, decoder.onnx (one step with a key/value cache), the "
                       "tokenizers and bundle.json. With --format ctranslate2, a CTranslate2 model directory "
                       "instead (model.bin, config.json, vocabularies, the tokenizers and seq2onnx-ct2.json; "
                       "docs/ctranslate2.md). Written atomically; validated before success is reported.")
    p.add_argument("checkpoint")
    p.add_argument("out_dir")
    p.add_argument("--format", default="onnx", choices=EXPORT_FORMATS,
                   help="onnx (default): the ONNX bundle; ctranslate2: a model directory for ctranslate2.Translator "
                   "(float32 weights; choose int8/float16 at load with compute_type)")
    # None when not given, so that --format ctranslate2 can refuse them and export_bundle's defaults apply.
    p.add_argument("--dtype", choices=["float32", "float16"],
                   help="ONNX only. float32 (default), or float16 for the CUDA provider (LayerNorm and softmax stay fp32)")
    p.add_argument("--quantize", choices=["int8"], help="ONNX only. int8 linear layers, for the CPU: weights per output column, activations per row at run time (a sentence's result does not depend on its batch; export/quantize.py)")
    p.add_argument("--force", action="store_true", help="replace an existing OUT_DIR")
    p.add_argument("--decoder", choices=["both", "standard"],
                   help="ONNX only. both (default): decoder.onnx and, for float32 bundles, decoder_fused.onnx "
                   "(onnxruntime's com.microsoft kernels, faster on its CPU provider); standard: decoder.onnx only")
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    needs_torch("export")
    if args.format == "ctranslate2":
        given = [f"--{name}" for name in ONNX_ONLY if getattr(args, name) is not None]
        if given:
            raise CommandError(f"{', '.join(given)} apply to ONNX bundles only, not to --format ctranslate2: drop "
                               f"{'them' if len(given) > 1 else 'it'}; a CTranslate2 model is written in float32 and "
                               "its precision chosen when loaded (ctranslate2.Translator(OUT_DIR, compute_type='int8'))")
        from seq2onnx.export.ct2convert import export_ctranslate2

        out = export_ctranslate2(args.checkpoint, args.out_dir, force=args.force)
        print(f"CTranslate2 model written to {out} ({', '.join(sorted(p.name for p in out.iterdir()))}); "
              f"check it with: seq2onnx verify {args.checkpoint} {out}")
        return 0
    from seq2onnx.export.bundle import export_bundle

    options = {name: getattr(args, name) for name in ONNX_ONLY if getattr(args, name) is not None}
    out = export_bundle(args.checkpoint, args.out_dir, force=args.force, **options)
    print(f"bundle written to {out} ({', '.join(sorted(p.name for p in out.iterdir()))})")
    return 0


def add_verify(sub) -> None:
    p = sub.add_parser("verify", description="Compare the bundle with the PyTorch checkpoint in tiers: tensors step by step "
                       "(along teacher-forced targets and the greedy path), greedy token ids, BLEU. A CTranslate2 "
                       "directory (from export --format ctranslate2, recognised by its model.bin) is compared on "
                       "token ids instead: greedy identical on every sentence, beam 4 on >= 99.5%, each difference "
                       "shown with both scores. Exit 1 when any check fails.")
    p.add_argument("checkpoint")
    p.add_argument("bundle", help="the ONNX bundle, or a CTranslate2 model directory")
    p.add_argument("--sentences", type=int, default=100, help="test sentences to compare (default 100)")
    p.add_argument("--data", help="TSV of sentences to use instead of the checkpoint's test split")
    p.add_argument("--src-col", type=int, default=0)
    p.add_argument("--tgt-col", type=int, default=1)
    p.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"],
                   help="onnxruntime provider (or CTranslate2 device)")
    p.add_argument("--json", help="also write the report as JSON to this file")
    p.set_defaults(func=cmd_verify)


def cmd_verify(args) -> int:
    needs_torch("verify")
    from seq2onnx.export.ct2convert import ct2_available, is_ct2_dir

    if is_ct2_dir(args.bundle):
        ok, why = ct2_available()
        if not ok:
            raise CommandError(f"{args.bundle} is a CTranslate2 model; verifying it needs ctranslate2: {why}")
        from seq2onnx.export.ct2verify import format_ct2_report, verify_ct2

        report = verify_ct2(args.checkpoint, args.bundle, sentences=args.sentences, device=args.device,
                            data=args.data, src_col=args.src_col, tgt_col=args.tgt_col)
        print(format_ct2_report(report))
    else:
        from seq2onnx.export.parity import format_report, verify

        report = verify(args.checkpoint, args.bundle, sentences=args.sentences, device=args.device, data=args.data,
                        src_col=args.src_col, tgt_col=args.tgt_col)
        print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["passed"] else EXIT_FAIL


def add_evaluate(sub) -> None:
    p = sub.add_parser("evaluate", description="Decode the test split of the corpus the checkpoint was trained on (the same "
                       "deterministic split as training) and report sacreBLEU against its references.")
    p.add_argument("checkpoint")
    p.add_argument("--bundle", help="also decode with this bundle through onnxruntime and count agreement")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--sentences", type=int, default=100000, help="at most this many test sentences")
    p.add_argument("--data", help="TSV to evaluate on instead of the checkpoint's test split")
    p.add_argument("--src-col", type=int, default=0)
    p.add_argument("--tgt-col", type=int, default=1)
    p.set_defaults(func=cmd_evaluate)


def cmd_evaluate(args) -> int:
    needs_torch("evaluate")
    from seq2onnx.export.parity import test_sentences
    from seq2onnx.model import checkpoint
    from seq2onnx.model.search import translate_ids
    from seq2onnx.model.train import bleu

    model, tok, ckpt = checkpoint.load(args.checkpoint)
    pairs = test_sentences(ckpt, args.sentences, args.data, args.src_col, args.tgt_col)
    sources = [tok.encode_source(s)[: model.cfg.max_positions] for s, _ in pairs]
    refs = [t for _, t in pairs]
    t0 = time.time()
    hyps = translate_ids(model, sources, beam_size=args.beam)
    t_torch = time.time() - t0
    texts = [tok.decode_target(h[0].tokens) for h in hyps]
    print(f"{len(pairs)} test sentences, beam {args.beam}")
    print(f"PyTorch reference: BLEU {bleu(texts, refs):.2f} ({t_torch:.1f} s)")
    if args.bundle:
        from seq2onnx.runtime.translator import Translator

        translator = Translator(args.bundle, device="cpu")
        t0 = time.time()
        results = translator.translate_batch(sources, beam_size=args.beam)
        t_ort = time.time() - t0
        strip = lambda t: t[:-1] if t and t[-1] == model.cfg.eos_id else t
        same = sum(r.token_ids[0] == strip(h[0].tokens) for r, h in zip(results, hyps))
        print(f"onnxruntime bundle: BLEU {bleu([r.hypotheses[0] for r in results], refs):.2f} ({t_ort:.1f} s), "
              f"token ids identical to PyTorch on {same}/{len(pairs)} sentences")
    return 0


# -- demo ----------------------------------------------------------------------------------------

def add_demo(sub) -> None:
    p = sub.add_parser("demo", description="The whole path on data the project makes itself: train a small Transformer, "
                       "show reference translations, export the bundle, verify parity, translate with onnxruntime.")
    p.add_argument("--out", default="seq2onnx-demo", help="working directory (default ./seq2onnx-demo)")
    p.add_argument("--steps", type=int, default=1000, help="training steps (default 1000: about 5 minutes on 2 CPU cores)")
    p.add_argument("--force", action="store_true", help="replace an existing demo directory")
    p.set_defaults(func=cmd_demo)


DEMO_SENTENCES = [
    "the big dogs saw a cat in the house",
    "a small bird sleeps",
    "three old kings carry the red boxes",
    "the farmer liked 12 green cows",
    "quiet women bring a white horse near the river",
]


def cmd_demo(args) -> int:
    needs_torch("demo")
    import torch

    from seq2onnx.export.bundle import export_bundle
    from seq2onnx.export.parity import format_report, verify
    from seq2onnx.model import checkpoint
    from seq2onnx.model.search import translate_ids
    from seq2onnx.model.train import TrainOptions, train
    from seq2onnx.runtime.translator import Translator

    root = Path(args.out)
    if root.exists() and not args.force:
        raise CommandError(f"{root} already exists; pass --force to replace it or --out DIR for another place")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    t0 = time.time()
    print(f"1/4 training a small Transformer on the generated English -> Lirish corpus ({args.steps} steps)")
    run = root / "run"
    train(TrainOptions(out=str(run), d_model=128, n_heads=4, layers=2, d_ff=256, vocab_size=400, max_steps=args.steps,
                       eval_every=max(args.steps // 4, 1), warmup=200, lr=1.5, max_tokens=3000, bleu_sentences=100,
                       force=True))
    t_train = time.time() - t0
    model, tok, ckpt = checkpoint.load(run / "best")
    print(f"\n2/4 reference decoding in PyTorch (beam 4), after {t_train:.0f} s of training:")
    hyps = translate_ids(model, [tok.encode_source(s) for s in DEMO_SENTENCES], beam_size=4)
    for s, h in zip(DEMO_SENTENCES, hyps):
        print(f"  {s}\n    -> {tok.decode_target(h[0].tokens)}")
    bundle = root / "bundle"
    export_bundle(ckpt, bundle, force=True)
    print(f"\n3/4 exported {bundle}; verifying parity with the checkpoint:")
    report = verify(ckpt, bundle, sentences=100)
    print(format_report(report))
    translator = Translator(bundle)
    print(f"\n4/4 translating with onnxruntime ({translator.device}: {translator.device_reason}), beam 4:")
    for s, r in zip(DEMO_SENTENCES, translator.translate_batch(DEMO_SENTENCES, beam_size=4)):
        print(f"  {s}\n    -> {r.hypotheses[0]}")
    print(f"\ndemo done in {time.time() - t0:.0f} s. Try: seq2onnx translate {bundle} <<< 'the old cat sees two birds'")
    return 0 if report["passed"] else EXIT_FAIL


# -- main ----------------------------------------------------------------------------------------

# The training-side commands, in the order `seq2onnx --help` lists them; seq2onnx.cli dispatches
# these names here, and the runtime's own commands never import this module.
def add_commands(sub) -> None:
    """Adds the training-side subcommands to the `seq2onnx` parser."""
    from seq2onnx.export.benchcli import add_bench

    one_help = _OneHelp(sub)
    for add in (add_train, add_export, add_verify, add_evaluate, add_demo, add_bench):
        add(one_help)


class _OneHelp:
    """The subparsers object, but each command's one-line help comes from TRAINING_COMMANDS:
    `seq2onnx --help` lists it from there without importing this module, so it is written once."""

    def __init__(self, sub):
        self._sub = sub

    def add_parser(self, name: str, **kwargs):
        kwargs["help"] = TRAINING_COMMANDS[name]
        return self._sub.add_parser(name, **kwargs)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(add_training=add_commands)
    parser.set_defaults(argv=argv)  # cmd_train hands the command line to torchrun's workers (--nproc)
    return run_command(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
