"""`seq2onnx export CHECKPOINT OUT_DIR`: an ONNX bundle (or, with --format ctranslate2, a CTranslate2
model)."""

from __future__ import annotations


from seq2onnx.errors import CommandError, needs_torch

EXPORT_FORMATS = ("onnx", "ctranslate2")
# export options of ONNX bundles (export_bundle has their defaults)
ONNX_ONLY = ("dtype", "quantize", "decoder", "table_bits", "block_size", "activations")


def add(sub) -> None:
    """Registers the command on the `seq2onnx` parser's subparsers."""
    p = sub.add_parser(
        "export",
        help="turn a checkpoint into an ONNX bundle (or a CTranslate2 model)",
        description="Export CHECKPOINT (a run directory or one of its step-*/last/best) into "
        "the bundle OUT_DIR: encoder.onnx, decoder.onnx (one step with a key/value cache), "
        "the tokenizers and bundle.json. With --format ctranslate2, a CTranslate2 model "
        "directory instead (model.bin, config.json, vocabularies, the tokenizers and "
        "seq2onnx-ct2.json; docs/ctranslate2.md). Written atomically; validated before "
        "success is reported.",
    )
    p.add_argument(
        "checkpoint",
        help="our checkpoint (a run directory or one of its step-*/last/best), or a "
        "Hugging Face model directory as save_pretrained writes it (model_type marian or m2m_100: "
        "OPUS-MT, M2M100, NLLB-200), recognised by its config.json",
    )
    p.add_argument(
        "out_dir", help="the bundle directory to write (never over an existing one without --force)"
    )
    p.add_argument(
        "--format",
        default="onnx",
        choices=EXPORT_FORMATS,
        help="onnx (default): the ONNX bundle; ctranslate2: a model directory for "
        "ctranslate2.Translator (float32 weights; choose int8/float16 at load with compute_type)",
    )
    _add_precision_flags(p)
    p.add_argument("--force", action="store_true", help="replace an existing OUT_DIR")
    p.add_argument(
        "--decoder",
        choices=["both", "standard"],
        help="ONNX only. both (default): decoder.onnx and, for float32 bundles, "
        "decoder_fused.onnx (onnxruntime's com.microsoft kernels, faster on its CPU provider); "
        "standard: decoder.onnx only",
    )
    p.set_defaults(func=run)


def _add_precision_flags(p) -> None:
    """The ONNX bundle's precision: --dtype, --quantize; int4's --table-bits, --block-size, --activations."""
    # None when not given, so that --format ctranslate2 can refuse them and export_bundle's defaults apply.
    p.add_argument(
        "--dtype",
        choices=["float32", "float16"],
        help="ONNX only. float32 (default), or float16 for the CUDA provider (LayerNorm and "
        "softmax stay fp32)",
    )
    p.add_argument(
        "--quantize",
        choices=["int8", "int4"],
        help="ONNX only. int8: int8 linear layers, for the CPU: weights per output column, "
        "activations per row at run time (a sentence's result does not depend on its batch; "
        "export/quantize.py). int4: 4-bit block-wise weights in onnxruntime's MatMulNBits, "
        "8-bit tables (export/quantize_nbits.py; docs/precision.md)",
    )
    p.add_argument(
        "--table-bits",
        type=int,
        choices=[8, 4],
        help="ONNX only, with --quantize int4: the embedding tables' (and a tied output "
        "projection's) bits, 8 (default) or 4, which a large vocabulary needs to reach a "
        "sixth of the fp32 size (docs/precision.md)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        choices=[16, 32, 64, 128],
        help="ONNX only, with --quantize int4: values per block of weights (each with its own "
        "scale), 32 (default); 16: scores independent of the batch at one row too, a larger "
        "and slower bundle; 64/128: smaller (docs/precision.md)",
    )
    p.add_argument(
        "--activations",
        choices=["int8", "float32"],
        help="ONNX only, with --quantize int4: how MatMulNBits takes its inputs. int8 (default; "
        "accuracy level 4): quantized per block of each row, the CPU's fast path. float32 (level "
        "0): what onnxruntime-web computes whatever the bundle says, so that Python, Node and the "
        "browser decode alike; slower on the CPU (docs/precision.md)",
    )


def run(args) -> int:
    needs_torch("export")
    from seq2onnx.export.hf.read import is_hf_dir

    if is_hf_dir(args.checkpoint):
        if args.format != "onnx":
            raise CommandError(
                f"{args.checkpoint} is a Hugging Face model directory: --format {args.format} "
                "applies to our checkpoints; for CTranslate2 use its own converter "
                "(ct2-transformers-converter)"
            )
        from seq2onnx.export.hf.bundle import export_hf_bundle

        options = {name: getattr(args, name) for name in ONNX_ONLY if getattr(args, name) is not None}
        out = export_hf_bundle(args.checkpoint, args.out_dir, force=args.force, **options)
        print(
            f"bundle written to {out} "
            f"({', '.join(sorted(p.name for p in out.iterdir() if not p.name.startswith('.')))}); check it "
            f"with: seq2onnx verify {args.checkpoint} {out} --data SENTENCES.txt"
        )
        return 0
    if args.format == "ctranslate2":
        given = [f"--{name.replace('_', '-')}" for name in ONNX_ONLY if getattr(args, name) is not None]
        if given:
            raise CommandError(
                f"{', '.join(given)} apply to ONNX bundles only, not to --format ctranslate2: "
                f"drop {'them' if len(given) > 1 else 'it'}; a CTranslate2 model is written "
                "in float32 and its precision chosen when loaded "
                "(ctranslate2.Translator(OUT_DIR, compute_type='int8'))"
            )
        from seq2onnx.export.ctranslate2.convert import export_ctranslate2

        out = export_ctranslate2(args.checkpoint, args.out_dir, force=args.force)
        print(
            f"CTranslate2 model written to {out} "
            f"({', '.join(sorted(p.name for p in out.iterdir() if not p.name.startswith('.')))}); check it "
            f"with: seq2onnx verify {args.checkpoint} {out}"
        )
        return 0
    from seq2onnx.export.bundle import export_bundle

    options = {name: getattr(args, name) for name in ONNX_ONLY if getattr(args, name) is not None}
    out = export_bundle(args.checkpoint, args.out_dir, force=args.force, **options)
    print(
        f"bundle written to {out} "
        f"({', '.join(sorted(p.name for p in out.iterdir() if not p.name.startswith('.')))})"
    )
    return 0
