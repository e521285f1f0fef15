"""Which layers cost int8 its agreement with generate(): one group of layers left fp32 at a time (issue 35).

    python scripts/int8_layers.py --work /tmp/h8/big --family nllb [--sentences 1000] [--beam 1]
                                     [--groups all] [--weights range] [--out DIR]

Run by hand, not in CI, on a family that scripts/hf_trained_identity.py trained (WORK/FAMILY/model, and its
CTranslate2 int8 model WORK/FAMILY/ct2-int8, converted again when absent). The test sentences, generate()'s
references and the agreement count are that script's (imported). Rows, each held to generate()'s fp32 ids
(and, for ours, the score error: how far int8 moves the greedy log-probabilities from the fp32 bundle's):

- ours int8: `seq2onnx export --quantize int8` as shipped (export_hf_bundle);
- ours int8, GROUP fp32: the same with export/quantize.py's keep_float={GROUP} (quantize_graphs patched in for
  the export), for each group of export/quantize.py's GROUPS: embeddings (id tables and the output
  projection), encoder self-attention, encoder feed-forward, decoder self-attention, cross-attention,
  decoder feed-forward;
- ct2 int8: CTranslate2's own converter (TransformersConverter, quantization int8).

--weights symmetric re-quantizes every int8 row's weights as CTranslate2 does (per output channel,
max|w| / 127, zero point 0) in place of the shipped scheme, to compare the two. Bundles go to
OUT/FAMILY-WEIGHTS-GROUP; generate()'s references are cached in OUT (reference-FAMILY-bBEAM-N.json).
Results: OUT/int8_layers-FAMILY-WEIGHTS-bBEAM.md (and .json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_trained_identity as ident  # noqa: E402  (the test sentences, generate(), ours(), ct2(), compare())

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def symmetric_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CTranslate2's int8 weights (specs/model_spec.py, _quantize): per output channel, scale max|w| / 127,
    codes rint(w / scale) in [-127, 127], zero point 0; quantize_weights' signature and layout."""
    scale = (np.abs(w).max(axis=0) / 127).astype(np.float32)
    scale[scale == 0] = 1.0
    codes = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
    return codes, scale, np.zeros(w.shape[1], np.int8)


def export_int8(model_dir: Path, out: Path, keep: frozenset[str], weights: str) -> Path:
    """An int8 bundle of the HF model with the groups `keep` left fp32 (and the weights scheme asked)."""
    import seq2onnx.export.bundle as bundle_module
    import seq2onnx.export.quantize as q
    from seq2onnx.export.hf.bundle import export_hf_bundle

    patched = partial(q.quantize_graphs, keep_float=keep)
    scheme = symmetric_weights if weights == "symmetric" else q.quantize_weights
    with (
        mock.patch.object(bundle_module, "quantize_graphs", patched),
        mock.patch.object(q, "quantize_weights", scheme),
    ):
        export_hf_bundle(model_dir, out, quantize="int8", force=True)
    return out


def ct2_model(work: Path, model_dir: Path) -> Path:
    """WORK's CTranslate2 int8 model, converted by TransformersConverter when absent."""
    path = work / "ct2-int8"
    if not (path / "model.bin").is_file():
        from ctranslate2.converters import TransformersConverter

        TransformersConverter(str(model_dir)).convert(str(path), quantization="int8", force=True)
    return path


def references(args, model_dir: Path, sources: list[str]) -> list[dict]:
    """generate()'s fp32 outputs at --beam, cached in OUT."""
    cache = args.out / f"reference-{args.family}-b{args.beam}-{len(sources)}.json"
    if cache.is_file():
        return json.loads(cache.read_text(encoding="utf-8"))
    t = time.perf_counter()
    want = ident.reference(model_dir, args.family, sources, args.beam, 1)
    log(f"generate() beam {args.beam}: {time.perf_counter() - t:.1f} s")
    cache.write_text(json.dumps(want, ensure_ascii=False), encoding="utf-8")
    return want


def scored(bundle: Path, family: str, sources: list[str]) -> list[tuple[list[int], float]]:
    """Greedy (ids, sum of log-probabilities) per sentence from our runtime, with ident.ours()'s options."""
    from seq2onnx.runtime.translator import Translator

    source_lang, target_lang, _ = ident.FAMILIES[family]
    langs = {"source_lang": source_lang, "target_lang": target_lang} if target_lang else {}
    tr = Translator(bundle, device="cpu", intra_threads=1)
    results = tr.translate_batch(
        sources, beam_size=1, length_penalty=1.0, max_batch_size=ident.BATCH, return_scores=True, **langs
    )
    return [(list(r.token_ids[0]), float(r.scores[0])) for r in results]


def score_error(fp32: list[tuple[list[int], float]], int8: list[tuple[list[int], float]]) -> float:
    """Mean |int8 - fp32| of the log-probability per token (end token included), over the sentences whose
    greedy ids are the same: how far int8 moves the scores, a measure that near-ties do not flip."""
    same = [(abs(a[1] - b[1]), len(a[0]) + 1) for a, b in zip(fp32, int8, strict=True) if a[0] == b[0]]
    return sum(d for d, _ in same) / max(1, sum(n for _, n in same))


def size_mb(bundle: Path) -> float:
    return sum(p.stat().st_size for p in bundle.iterdir() if p.is_file()) / 1e6


def measure_ours(args, model_dir: Path, sources: list[str], want: list[dict], keep: frozenset[str]) -> dict:
    """One row: export with `keep` fp32, decode, count."""
    label = "+".join(sorted(keep)) or "none"
    out = args.out / f"{args.family}-{args.weights}-{label}"
    t = time.perf_counter()
    export_int8(model_dir, out, keep, args.weights)
    got = ident.ours(out, args.family, sources, args.beam, 1)
    counts = ident.compare(want, got, sources)
    error = score_error(args.fp32_scores, scored(out, args.family, sources))
    log(
        f"ours int8 ({args.weights}), fp32 {label}: {counts['ids']}/{counts['total']}, "
        f"score error {error:.2e} ({time.perf_counter() - t:.0f} s)"
    )
    return {"engine": "ours int8", "fp32": label, "size_mb": size_mb(out), "score_error": error, **counts}


def measure_ct2(args, model_dir: Path, sources: list[str], want: list[dict]) -> dict:
    path = ct2_model(args.work / args.family, model_dir)
    counts = ident.compare(want, ident.ct2(path, model_dir, args.family, sources, args.beam), sources)
    log(f"ct2 int8: {counts['ids']}/{counts['total']}")
    return {"engine": "ct2 int8", "fp32": "none", "size_mb": size_mb(path), "score_error": None, **counts}


def markdown(args, rows: list[dict]) -> str:
    base = next((r["ids"] for r in rows if r["engine"] == "ours int8" and r["fp32"] == "none"), None)
    lines = [
        f"# int8 agreement by layer group ({args.family}, beam {args.beam}, weights {args.weights})",
        "",
        f"Command: `{' '.join(['python', *sys.argv])}`  ",
        f"{os.cpu_count()} CPU cores; wall {time.perf_counter() - T0:.0f} s",
        "",
        "| engine | left fp32 | identical ids | vs all int8 | score error | files MB |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        delta = "—" if base is None or r["engine"] != "ours int8" else f"{r['ids'] - base:+d}"
        error = "—" if r["score_error"] is None else f"{r['score_error']:.2e}"
        lines.append(
            f"| {r['engine']} | {r['fp32']} | {r['ids']}/{r['total']} | {delta} | {error} | "
            f"{r['size_mb']:.2f} |"
        )
    lines += [
        "",
        "score error: mean |int8 - fp32| log-probability per token of the greedy output (end "
        "token included), against the fp32 bundle WORK/FAMILY/bundle, over the sentences both decode "
        "alike.",
    ]
    return "\n".join(lines) + "\n"


def save(args, rows: list[dict]) -> None:
    """The rows so far, as markdown and JSON (after each row: an interrupted run keeps what it measured)."""
    stem = args.out / f"int8_layers-{args.family}-{args.weights}-b{args.beam}"
    stem.with_suffix(".json").write_text(json.dumps(rows, indent=1, ensure_ascii=False), encoding="utf-8")
    stem.with_suffix(".md").write_text(markdown(args, rows), encoding="utf-8")


def parse_args(argv=None) -> argparse.Namespace:
    import seq2onnx.export.quantize as q

    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--work",
        type=Path,
        required=True,
        help="hf_trained_identity.py's --work: WORK/FAMILY/model is the trained HF model",
    )
    p.add_argument(
        "--family", default="nllb", choices=sorted(ident.FAMILIES), help="which trained family (default nllb)"
    )
    p.add_argument(
        "--sentences",
        type=int,
        default=1000,
        help="held-out Tatoeba test sentences, as hf_trained_identity.py's --sentences\n"
        "(default 1000: the same test set when it was run with 1000)",
    )
    p.add_argument("--beam", type=int, default=1, help="beam size of every row (default 1: greedy)")
    p.add_argument(
        "--groups",
        default="all",
        help="comma-separated groups to leave fp32, one row each, of\n"
        f"{', '.join(q.GROUPS)};\n'all' (default): every group; 'none': only the int8 "
        "and CTranslate2 rows",
    )
    p.add_argument(
        "--weights",
        default="range",
        choices=("range", "symmetric"),
        help="int8 weights of the rows: 'range' (default) as export/quantize.py ships them;\n"
        "'symmetric' CTranslate2's scheme (max|w| / 127 per output channel, zero point 0)",
    )
    p.add_argument("--no-ct2", action="store_true", help="leave out the CTranslate2 int8 row")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where bundles, cached references and results go (default WORK/int8-layers)",
    )
    args = p.parse_args(argv)
    names = {"all": list(q.GROUPS), "none": []}.get(args.groups, [g for g in args.groups.split(",") if g])
    if unknown := [g for g in names if g not in q.GROUPS]:
        p.error(f"--groups: unknown {unknown}; choose among {', '.join(q.GROUPS)}, all, none")
    args.groups, args.out = names, args.out or args.work / "int8-layers"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    ident.quiet()
    import torch

    torch.set_num_threads(1)  # a shared machine; generate() at one thread
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = args.work / args.family / "model"
    sources = [s for s, _ in ident.read_pairs(args.sentences)[1]]
    want = references(args, model_dir, sources)
    args.fp32_scores = scored(args.work / args.family / "bundle", args.family, sources)
    rows = [measure_ours(args, model_dir, sources, want, frozenset())]
    save(args, rows)
    if not args.no_ct2:
        rows.append(measure_ct2(args, model_dir, sources, want))
        save(args, rows)
    for group in args.groups:
        rows.append(measure_ours(args, model_dir, sources, want, frozenset({group})))
        save(args, rows)
    print(markdown(args, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
