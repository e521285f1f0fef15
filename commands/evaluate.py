"""`seq2onnx evaluate CHECKPOINT`: BLEU on the test split, in PyTorch and optionally with a bundle."""

from __future__ import annotations

import time

from seq2onnx.errors import needs_torch


def add(sub) -> None:
    """Registers the command on the `seq2onnx` parser's subparsers."""
    p = sub.add_parser(
        "evaluate",
        help="BLEU on the checkpoint's test split (PyTorch and, with --bundle, onnxruntime)",
        description="Decode the test split of the corpus the checkpoint was trained on (the "
        "same deterministic split as training) and report sacreBLEU against its references.",
    )
    p.add_argument("checkpoint")
    p.add_argument("--bundle", help="also decode with this bundle through onnxruntime and count agreement")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--sentences", type=int, default=100000, help="at most this many test sentences")
    p.add_argument("--data", help="TSV to evaluate on instead of the checkpoint's test split")
    p.add_argument("--src-col", type=int, default=0)
    p.add_argument("--tgt-col", type=int, default=1)
    p.set_defaults(func=run)


def run(args) -> int:
    needs_torch("evaluate")
    from seq2onnx.export.parity import test_sentences
    from seq2onnx.model import checkpoint
    from seq2onnx.model.search import translate_ids
    from seq2onnx.model.metrics import bleu

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
        ort_bleu = bleu([r.hypotheses[0] for r in results], refs)
        print(
            f"onnxruntime bundle: BLEU {ort_bleu:.2f} ({t_ort:.1f} s), "
            f"token ids identical to PyTorch on {same}/{len(pairs)} sentences"
        )
    return 0
