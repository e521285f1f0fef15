"""Quality and size of int4 bundles beside fp32, int8 and CTranslate2 int8 on a trained checkpoint (issue 58).

    nice python scripts/int4_quality.py RUN_DIR --out DIR [--sentences 500] [--speed 100] [--variants "a;b"]
    nice python scripts/int4_quality.py HF_MODEL_DIR --hf nllb --out DIR [...]

Exports from RUN_DIR (its `best`, else `last`) the fp32, int8 and int4 bundles, int4 variants (4-bit tables,
block 16, 64 or 128, zero points, accuracy level 0, each layer group of export/graph_layers.py's GROUPS at 8
bits: export/quantize_nbits.py's options, patched in), int8 with each group left fp32 (export/quantize.py's
keep_float: which layers cost int8 its agreement), and CTranslate2's float32 and int8 models
(export/ctranslate2/convert.py; the float32 one tells CTranslate2's own search from its int8), then on the
checkpoint's test split. With --hf FAMILY the model is a trained Hugging Face directory
(scripts/hf_trained_identity.py's WORK/FAMILY/model, its held-out Tatoeba sentences and languages; CTranslate2
through its TransformersConverter). --variants picks rows by name (fp32 is always measured):

- greedy ids identical to the fp32 bundle's (agreement), BLEU (model/metrics.py, sacrebleu);
- for our bundles, greedy ids and scores at batch 1 against batch 32 (identical or not), and the scores
  against batches of sources of one token length (no padding);
- the weights' bytes (weights.bin, CTranslate2's model.bin);
- with --speed N (ours only): greedy target tokens/s at batch 1 and 32 on N sentences, 1 thread, best of 2
  rounds (the machine is shared: rough).

Prints a Markdown table and writes OUT/quality.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from unittest import mock

GROUPS = (  # export/graph_layers.py's GROUPS ("embeddings": an untied output projection)
    "embeddings",
    "encoder_self_attention",
    "encoder_feed_forward",
    "decoder_self_attention",
    "cross_attention",
    "decoder_feed_forward",
)


def _v(**options) -> tuple[str, dict]:
    """An int4 row from the symmetric, all-4-bit scheme (the first one built) with `options` over it."""
    return "int4", {"symmetric": True, "eight_bit": frozenset(), **options}


VARIANTS = {  # name -> (quantize, quantize_graphs_nbits options patched in)
    "fp32": (None, {}),
    "int8": ("int8", {}),
    "int8, MatMulNBits bits 8": ("int4", {"bits": 8}),
    "int4": ("int4", {}),  # the default: zero points, encoder self-attention 8-bit, 8-bit tables
    "int4, 4-bit tables": ("int4", {"table_bits": 4}),  # the default's: zero points, every layer 4-bit
    "int4, block 16": ("int4", {"block": 16}),
    "int4 zero points, all 4-bit": _v(symmetric=False),
    "int4 symmetric": _v(),
    "int4 symmetric, 4-bit tables": _v(table_bits=4),
    "int4 symmetric, block 16": _v(block=16),
    "int4 symmetric, block 16, 4-bit tables": _v(block=16, table_bits=4),
    "int4 symmetric, block 64": _v(block=64),
    "int4 symmetric, block 128": _v(block=128),
    "int4 symmetric, accuracy level 0 (the browser's arithmetic)": _v(level=0),
    **{f"int4 symmetric, {g} 8-bit": _v(eight_bit=frozenset({g})) for g in GROUPS},
    "int4 symmetric, encoder 8-bit": _v(eight_bit=frozenset(GROUPS[1:3])),
    "int4 symmetric, 4-bit tables, encoder_self_attention 8-bit": _v(
        table_bits=4, eight_bit=frozenset(GROUPS[1:2])
    ),
    # which layers cost int8 its agreement (issues 35, 61): one group left fp32 at a time (keep_float)
    **{f"int8, {g} fp32": ("int8", {"keep_float": frozenset({g})}) for g in GROUPS},
}
HF_FAMILY: str | None = None  # --hf: the family of a Hugging Face model directory
HF_TOKENIZER = None  # --hf: its tokenizer (source lengths)


def export(ckpt: Path, out: Path, quantize: str | None, options: dict) -> Path:
    import seq2onnx.export.bundle as bundle_module
    import seq2onnx.export.quantize_files as int8_module
    from seq2onnx.export.hf.bundle import export_hf_bundle
    import seq2onnx.export.quantize_nbits as nbits_module
    from seq2onnx.export.quantize_nbits import quantize_graphs_nbits

    if out.is_dir():
        return out
    options = dict(options)
    keep = options.pop("keep_float", frozenset())

    def patched(*args, **kwargs):  # the variant's options over the exporter's own (bits, table_bits)
        return quantize_graphs_nbits(*args, **{**kwargs, **options})

    def int8(*args, **kwargs):  # int8 with the variant's groups left fp32
        return int8_module.quantize_graphs(*args, **kwargs, keep_float=keep)

    # bits 8 is a measurement, not a scheme the hosts run: it goes under int4's name here
    names = {8: nbits_module.SCHEME_NAMES[4]} if options.get("bits") == 8 else {}
    with (
        mock.patch.object(bundle_module, "quantize_graphs_nbits", patched),
        mock.patch.object(bundle_module, "quantize_graphs", int8),
        mock.patch.dict(nbits_module.SCHEME_NAMES, names),
    ):
        if HF_FAMILY:
            return export_hf_bundle(ckpt, out, quantize=quantize)
        return bundle_module.export_bundle(ckpt, out, quantize=quantize)


def _langs() -> dict:
    if not HF_FAMILY:
        return {}
    import hf_trained_identity as ident

    source_lang, target_lang, _ = ident.FAMILIES[HF_FAMILY]
    return {"source_lang": source_lang, "target_lang": target_lang} if target_lang else {}


def ours(path: Path, sources: list, speed: int) -> dict:
    from seq2onnx.runtime.translator import Translator

    t = Translator(path, device="cpu", intra_threads=1)
    together, langs = [], _langs()
    for i in range(0, len(sources), 32):
        together += t.translate_batch(sources[i : i + 32], beam_size=1, return_scores=True, **langs)
    alone = [t.translate_batch([s], beam_size=1, return_scores=True, **langs)[0] for s in sources]
    row = {
        "ids": [r.token_ids[0] for r in together],
        "texts": [r.hypotheses[0] for r in together],
        "b1_eq_b32_ids": sum(a.token_ids == b.token_ids for a, b in zip(alone, together)),
        "b1_eq_b32_scores": sum(a.scores == b.scores for a, b in zip(alone, together)),
        "b1_eq_one_length_scores": _one_length(t, sources, alone, langs),
        "bytes": (path / "weights.bin").stat().st_size,
    }
    if speed:
        row["tok_s"] = {
            b: _speed(
                lambda batch: [r.token_ids[0] for r in t.translate_batch(batch, beam_size=1, **langs)],
                sources[:speed],
                b,
            )
            for b in (1, 32)
        }
    return row


def _one_length(t, sources: list, alone: list, langs: dict) -> int:
    """Sentences whose scores alone equal their scores in batches (of up to 32) of sources of their own
    token length: no padding, so the cross-attention sums over the same positions (optimisation-notes row
    61); what differs then is the linear layers' arithmetic."""
    by_length: dict[int, list[int]] = {}
    for i, s in enumerate(sources):
        length = len(HF_TOKENIZER(s).input_ids) if isinstance(s, str) else len(s)
        by_length.setdefault(length, []).append(i)
    same = 0
    for rows in by_length.values():
        for j in range(0, len(rows), 32):
            part = rows[j : j + 32]
            got = t.translate_batch([sources[i] for i in part], beam_size=1, return_scores=True, **langs)
            same += sum(alone[i].scores == r.scores for i, r in zip(part, got))
    return same


def _speed(run, sources, batch: int) -> float:
    best = 0.0
    for _ in range(2):
        start, tokens = time.perf_counter(), 0
        for i in range(0, len(sources), batch):
            tokens += sum(len(ids) for ids in run(sources[i : i + batch]))
        best = max(best, tokens / (time.perf_counter() - start))
    return best


def ct2(ckpt: Path, out: Path, sources: list[list[int]], speed: int, compute: str = "int8") -> dict:
    import ctranslate2

    from seq2onnx.export.ctranslate2.convert import convert_checkpoint, source_pieces, target_pieces
    from seq2onnx.model import checkpoint

    if not (out / "model.bin").is_file():  # int8: weights stored in int8 (its size on disk), else float32
        convert_checkpoint(ckpt, out, quantization="int8" if compute == "int8" else None)
    model, tok, _ = checkpoint.load(ckpt)
    unk = model.cfg.unk_id
    src, tgt = source_pieces(tok), {p: i for i, p in enumerate(target_pieces(tok))}
    tr = ctranslate2.Translator(str(out), device="cpu", compute_type=compute, intra_threads=1)

    def run(batch):
        limit = max(int(1.5 * len(s) + 10) for s in batch)
        res = tr.translate_batch(
            [[src[t] for t in s] for s in batch], beam_size=1, max_decoding_length=limit, max_batch_size=32
        )
        return [[tgt.get(p, unk) for p in r.hypotheses[0]] for r in res]

    ids = []
    for i in range(0, len(sources), 32):
        ids += run(sources[i : i + 32])
    row = {
        "ids": ids,
        "texts": [tok.decode_target(x) for x in ids],
        "bytes": (out / "model.bin").stat().st_size,
    }
    if speed:
        row["tok_s"] = {b: _speed(run, sources[:speed], b) for b in (1, 32)}
    return row


def hf_ct2(model_dir: Path, out: Path, sources: list[str], speed: int, compute: str = "int8") -> dict:
    """CTranslate2 on a Hugging Face directory, as scripts/hf_trained_identity.py runs it (greedy)."""
    import hf_trained_identity as ident
    from ctranslate2.converters import TransformersConverter

    if not (out / "model.bin").is_file():
        quantization = "int8" if compute == "int8" else None
        TransformersConverter(str(model_dir)).convert(str(out), quantization=quantization, force=True)
    ids = [r["ids"][0] for r in ident.ct2(out, model_dir, HF_FAMILY, sources, 1)]
    return {"ids": ids, "texts": None, "bytes": (out / "model.bin").stat().st_size}


def test_set(run: Path, sentences: int) -> tuple[Path, list, list[str]]:
    """The checkpoint (or HF directory), its test sources (ids, or texts for --hf) and references."""
    if HF_FAMILY:
        import hf_trained_identity as ident
        from transformers import AutoTokenizer

        global HF_TOKENIZER
        HF_TOKENIZER = AutoTokenizer.from_pretrained(str(run))
        if ident.FAMILIES[HF_FAMILY][0]:
            HF_TOKENIZER.src_lang = ident.FAMILIES[HF_FAMILY][0]
        pairs = ident.read_pairs(sentences)[1]
        return run, [s for s, _ in pairs], [t for _, t in pairs]
    from seq2onnx.export.parity import test_sentences
    from seq2onnx.model import checkpoint

    ckpt = run / "best" if (run / "best").is_dir() else run / "last"
    model, tok, ckpt_dir = checkpoint.load(ckpt)
    pairs = test_sentences(ckpt_dir, sentences)
    return ckpt, [tok.encode_source(s)[: model.cfg.max_positions] for s, _ in pairs], [t for _, t in pairs]


def main(argv=None) -> None:
    global HF_FAMILY
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--speed", type=int, default=0, help="sentences timed at batch 1 and 32 (0: none)")
    parser.add_argument("--hf", default=None, help="RUN is a Hugging Face directory of this family")
    parser.add_argument("--variants", default="all", help="names of VARIANTS separated by ;, or all")
    parser.add_argument("--no-ct2", action="store_true", help="leave out CTranslate2's rows")
    args = parser.parse_args(argv)
    from seq2onnx.model.metrics import bleu

    if args.hf:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        HF_FAMILY = args.hf
    ckpt, sources, refs = test_set(args.run, args.sentences)
    wanted = set(VARIANTS) if args.variants == "all" else {"fp32", *args.variants.split(";")}
    if unknown := wanted - set(VARIANTS):
        parser.error(f"--variants: unknown {sorted(unknown)}; choose among {', '.join(VARIANTS)}")
    rows = {}
    for name, (quantize, options) in VARIANTS.items():
        if name in wanted:
            path = export(ckpt, args.out / name.replace(", ", "-").replace(" ", "-"), quantize, options)
            rows[name] = ours(path, sources, args.speed)
    run_ct2 = hf_ct2 if HF_FAMILY else ct2
    if not args.no_ct2:  # CTranslate2's fp32: its own search, to hold its int8 to
        rows["ct2 fp32"] = run_ct2(ckpt, args.out / "ct2-fp32", sources, args.speed, "float32")
        rows["ct2 int8"] = run_ct2(ckpt, args.out / "ct2-int8", sources, args.speed)
    base, n = rows["fp32"], len(sources)
    print(f"{ckpt}: {n} test sentences, greedy")
    print(
        "| engine | weights MB | × fp32 | ids = fp32 bundle | ids = own fp32 | BLEU | b1 = b32 ids "
        "| b1 = b32 scores | same, one source length | tok/s b1 | tok/s b32 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        row["agree"] = sum(a == b for a, b in zip(row["ids"], base["ids"]))
        # CTranslate2's int8 against its own fp32
        own = rows.get("ct2 fp32", base) if name.startswith("ct2") else base
        row["agree_own"] = sum(a == b for a, b in zip(row["ids"], own["ids"]))
        row["bleu"] = bleu(row["texts"], refs) if row["texts"] is not None else float("nan")
        speed = row.get("tok_s", {})
        print(
            f"| {name} | {row['bytes'] / 1e6:.2f} | {row['bytes'] / base['bytes']:.3f} | "
            f"{row['agree']}/{n} | {row['agree_own']}/{n} | "
            f"{row['bleu']:.2f} | {row.get('b1_eq_b32_ids', '–')} | {row.get('b1_eq_b32_scores', '–')} | "
            f"{row.get('b1_eq_one_length_scores', '–')} | "
            f"{speed.get(1, 0):.0f} | {speed.get(32, 0):.0f} |"
        )
    summary = {k: {f: v for f, v in r.items() if f not in ("ids", "texts")} for k, r in rows.items()}
    (args.out / "quality.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
