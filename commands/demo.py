"""`seq2onnx demo`: train, export, verify and translate on the generated corpus, in one command."""

from __future__ import annotations

import os
import time
from pathlib import Path

from seq2onnx.errors import EXIT_FAIL, CommandError, needs_torch


def add(sub) -> None:
    """Registers the command on the `seq2onnx` parser's subparsers."""
    p = sub.add_parser(
        "demo",
        help="train, export, verify and translate on the generated corpus (~5 min on 2 cores)",
        description="The whole path on data the project makes itself: train a small "
        "Transformer, show reference translations, export the bundle, verify parity, "
        "translate with onnxruntime.",
    )
    p.add_argument("--out", default="seq2onnx-demo", help="working directory (default ./seq2onnx-demo)")
    p.add_argument(
        "--steps",
        type=int,
        default=1000,
        help="training steps (default 1000: about 5 minutes on 2 CPU cores)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing demo directory")
    p.set_defaults(func=run)


DEMO_SENTENCES = [
    "the big dogs saw a cat in the house",
    "a small bird sleeps",
    "three old kings carry the red boxes",
    "the farmer liked 12 green cows",
    "quiet women bring a white horse near the river",
]


def run(args) -> int:
    needs_torch("demo")
    import torch

    from seq2onnx.export.bundle import export_bundle
    from seq2onnx.export.parity import verify
    from seq2onnx.export.parity_report import format_report
    from seq2onnx.model import checkpoint
    from seq2onnx.model.search import translate_ids
    from seq2onnx.model.train import TrainOptions, train
    from seq2onnx.runtime.translator import Translator

    root = Path(args.out)
    if root.exists() and not args.force:
        raise CommandError(
            f"{root} already exists; pass --force to replace it or --out DIR for another place"
        )
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    t0 = time.time()
    print(f"1/4 training a small Transformer on the generated English -> Lirish corpus ({args.steps} steps)")
    run = root / "run"
    train(
        TrainOptions(
            out=str(run),
            d_model=128,
            n_heads=4,
            layers=2,
            d_ff=256,
            vocab_size=400,
            max_steps=args.steps,
            eval_every=max(args.steps // 4, 1),
            warmup=200,
            lr=1.5,
            max_tokens=3000,
            bleu_sentences=100,
            force=True,
        )
    )
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
    print(
        f"\ndemo done in {time.time() - t0:.0f} s. Try: seq2onnx translate {bundle} <<< 'the old cat sees "
        "two birds'"
    )
    return 0 if report["passed"] else EXIT_FAIL
