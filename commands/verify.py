"""`seq2onnx verify CHECKPOINT BUNDLE`: the bundle (or CTranslate2 model) against the PyTorch checkpoint."""

from __future__ import annotations

import json
import sys
import time

from seq2onnx import atomic
from seq2onnx.errors import EXIT_FAIL, CommandError, needs_torch


def add(sub) -> None:
    """Registers the command on the `seq2onnx` parser's subparsers."""
    p = sub.add_parser(
        "verify",
        help="prove a bundle or CTranslate2 model computes what its checkpoint computes",
        description="Compare the bundle with the PyTorch checkpoint in tiers: tensors step by "
        "step (along teacher-forced targets and the greedy path), greedy token ids, BLEU. A "
        "CTranslate2 directory (from export --format ctranslate2, recognised by its "
        "model.bin) is compared on token ids instead: greedy identical on every sentence, "
        "beam 4 on >= 99.5%, each difference shown with both scores. Exit 1 when any check "
        "fails.",
    )
    p.add_argument(
        "checkpoint",
        help="our checkpoint (a run or one of its step-*/last/best), or the Hugging "
        "Face model directory the bundle was imported from (then the reference is transformers "
        "itself; needs --data)",
    )
    p.add_argument("bundle", help="the ONNX bundle, or a CTranslate2 model directory")
    p.add_argument("--sentences", type=int, default=100, help="test sentences to compare (default 100)")
    p.add_argument(
        "--tensor-sentences",
        type=int,
        default=100,
        metavar="N",
        help="ONNX bundles: the first N of them also go through the tensor tier, which evaluates "
        "the checkpoint in float64 step by step (default 100; the token and text tiers cover "
        "all)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument(
        "--data",
        help="TSV of sentences to use instead of the checkpoint's test split (required "
        "for a Hugging Face model: one source per line, or TSV with --src-col/--tgt-col)",
    )
    p.add_argument("--src-col", type=int, default=0, help="--data's source column (default 0)")
    p.add_argument(
        "--tgt-col",
        type=int,
        default=None,
        help="--data's reference column (default 1 for our checkpoints; none for a Hugging Face "
        "model, whose teacher-forced targets are then transformers' greedy outputs)",
    )
    p.add_argument("--source-lang", help="Hugging Face multilingual models: the source language code")
    p.add_argument(
        "--target-lang",
        help="Hugging Face multilingual models: the target language code (forced "
        "first target token, as transformers' forced_bos_token_id)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        choices=["auto", "cpu", "cuda"],
        help="onnxruntime provider (or CTranslate2 device)",
    )
    p.add_argument(
        "--json",
        help="also write the report as JSON to this file (written atomically; replaced if it exists)",
    )
    p.set_defaults(func=run)


def _progress(quiet: bool):
    """A progress line on stderr at most every 2 s, with the elapsed time."""
    start, last = time.monotonic(), [0.0]

    def log(line: str) -> None:
        now = time.monotonic()
        if not quiet and now - last[0] >= 2.0:
            last[0] = now
            print(f"verify [{now - start:5.0f} s] {line}", file=sys.stderr, flush=True)

    return log


def run(args) -> int:
    """Runs `seq2onnx verify`: prints the report; exit status 1 when a check fails."""
    needs_torch("verify")
    for name in ("sentences", "tensor_sentences"):
        if getattr(args, name) < (1 if name == "sentences" else 0):
            raise CommandError(
                f"--{name.replace('_', '-')} {getattr(args, name)}: give "
                f"{'at least 1' if name == 'sentences' else '0 or more'}"
            )
    from seq2onnx.export.ctranslate2.convert import ct2_available, is_ct2_dir
    from seq2onnx.export.hf.read import is_hf_dir

    if is_hf_dir(args.checkpoint):
        return _verify_hf(args)
    if args.source_lang or args.target_lang:
        raise CommandError(
            "--source-lang/--target-lang apply to Hugging Face model directories only; drop them"
        )
    if args.tgt_col is None:
        args.tgt_col = 1
    if is_ct2_dir(args.bundle):
        ok, why = ct2_available()
        if not ok:
            raise CommandError(f"{args.bundle} is a CTranslate2 model; verifying it needs ctranslate2: {why}")
        from seq2onnx.export.ctranslate2.report import format_ct2_report
        from seq2onnx.export.ctranslate2.verify import verify_ct2

        report = verify_ct2(
            args.checkpoint,
            args.bundle,
            sentences=args.sentences,
            device=args.device,
            data=args.data,
            src_col=args.src_col,
            tgt_col=args.tgt_col,
        )
        print(format_ct2_report(report))
    else:
        from seq2onnx.export.parity import verify
        from seq2onnx.export.parity_report import format_report

        report = verify(
            args.checkpoint,
            args.bundle,
            sentences=args.sentences,
            device=args.device,
            data=args.data,
            src_col=args.src_col,
            tgt_col=args.tgt_col,
            tensor_sentences=args.tensor_sentences,
            log=_progress(args.quiet),
        )
        print(format_report(report))
    if args.json:
        atomic.write_file(args.json, json.dumps(report, indent=2) + "\n")
    return 0 if report["passed"] else EXIT_FAIL


def _verify_hf(args) -> int:
    """verify against transformers (export/hf/verify.py)."""
    if not args.data:
        raise CommandError(
            f"{args.checkpoint} is a Hugging Face model directory, which holds no test "
            "sentences: give --data FILE (one source sentence per line, or a TSV with "
            "--src-col/--tgt-col)"
        )
    from seq2onnx.export.hf.verify import format_differences, verify_hf
    from seq2onnx.export.parity_report import format_report

    try:
        report = verify_hf(
            args.checkpoint,
            args.bundle,
            data=args.data,
            sentences=args.sentences,
            device=args.device,
            src_col=args.src_col,
            tgt_col=args.tgt_col,
            source_lang=args.source_lang,
            target_lang=args.target_lang,
            tensor_sentences=args.tensor_sentences,
            log=_progress(args.quiet),
        )
    except (OSError, ValueError) as e:
        raise CommandError(str(e)) from None
    print(format_report(report))
    extra = format_differences(report)
    if extra:
        print(extra)
    if args.json:
        atomic.write_file(args.json, json.dumps(report, indent=2) + "\n")
    return 0 if report["passed"] else EXIT_FAIL
