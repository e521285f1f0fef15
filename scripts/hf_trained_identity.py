"""Trained Hugging Face imports held to generate(): our bundles and CTranslate2 (issue 35, item 9).

    python scripts/hf_trained_identity.py --work DIR --out DIR [--families marian,nllb,mbart]
                                             [--sentences 1000] [--train-minutes 5] [--no-train]

Run by hand, not in CI. For each family the script trains a small model (d_model 128, 3+3 layers, ffn 512, a
joint English-Chinese SentencePiece vocabulary of 4,000 pieces) for --train-minutes on the Tatoeba pairs of
../shared/data/tatoeba-cmn-eng/cmn.txt (English -> Chinese; CC-BY 2.0 France, tatoeba.org), holding out
--sentences pairs as the test set, and saves it with transformers' own save_pretrained:

- marian: MarianMTModel + MarianTokenizer as OPUS-MT ships them (forced_eos_token_id 0,
  bad_words_ids [[pad]]);
- nllb: M2M100ForConditionalGeneration + transformers 5's NllbTokenizer, eng_Latn -> zho_Hans (the
  sentencepiece.bpe.model put beside tokenizer.json, as in a hub snapshot);
- mbart: MBartForConditionalGeneration + MBart50Tokenizer, en_XX -> zh_CN;
- t5: T5ForConditionalGeneration shaped as MADLAD-400 / T5 v1.1 (gated-GELU, its own lm_head, relative
  position bias, RMS norm; d_model 256, 4 heads x 64, d_ff 1024, 2+2 layers) + T5Tokenizer (spiece.model put
  beside tokenizer.json), measured under both beam conventions: its generation_config.json as MADLAD's
  (no early_stopping), and a copy with early_stopping true (rows "t5 early_stopping").

It then exports each with `seq2onnx export` (fp32, and --quantize int8), converts it with CTranslate2's
TransformersConverter (quantization int8, and None for a reference row), and counts, over the test
sentences, the sentences whose token ids (and texts) equal generate()'s: greedy, beam 4, beam 5 x 3 n-best
(num_return_sequences=3 against num_hypotheses=3: all three must match, in order), our int8 and
CTranslate2's int8 (each against generate()'s fp32). Results: OUT/identity.md and OUT/identity.json
(with the first differences of each row). Models and exports are kept under --work.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_identity_models import (  # noqa: E402
    BATCH,
    FAMILIES,
    MAX_LENGTH,
    T0,
    TATOEBA,
    conventions,
    log,
    read_pairs,
    train_family,
)
from hf_sizes_common import strip  # noqa: E402

__all__ = ["BATCH", "FAMILIES", "compare", "ct2", "ours", "quiet", "read_pairs", "reference"]


# ---------------------------------------------------------------------------------------------- convert
def export_all(model_dir: Path, work: Path) -> dict[str, Path]:
    """Our fp32 and int8 bundles (`seq2onnx export`), CTranslate2's int8 and fp32 models (its converter)."""
    from ctranslate2.converters import TransformersConverter

    cli = Path(sys.executable).parent / "seq2onnx"
    paths = {
        "ours fp32": work / "bundle",
        "ours int8": work / "bundle-int8",
        "ct2 int8": work / "ct2-int8",
        "ct2 fp32": work / "ct2-fp32",
    }
    for name, extra in (("ours fp32", []), ("ours int8", ["--quantize", "int8"])):
        t = time.perf_counter()
        subprocess.run(
            [str(cli), "export", str(model_dir), str(paths[name]), "--force", *extra],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        log(f"  seq2onnx export ({name}): {time.perf_counter() - t:.1f} s")
    for name, quantization in (("ct2 int8", "int8"), ("ct2 fp32", None)):
        TransformersConverter(str(model_dir)).convert(str(paths[name]), quantization=quantization, force=True)
    return paths


# ----------------------------------------------------------------------------------------------- decode
def reference(model_dir: Path, family: str, sources: list[str], beam: int, n: int) -> list[dict]:
    """generate()'s outputs: per sentence {"ids": n id lists, "texts": n texts}."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir)).eval()
    source_lang, target_lang, _ = FAMILIES[family]
    extra = {"forced_bos_token_id": tok.convert_tokens_to_ids(target_lang)} if target_lang else {}
    if source_lang:
        tok.src_lang = source_lang
    eos, pad, out = model.config.eos_token_id, model.config.pad_token_id, []
    for i in range(0, len(sources), BATCH):
        batch = tok(sources[i : i + BATCH], return_tensors="pt", padding=True)
        with torch.inference_mode():
            rows = model.generate(
                **batch, num_beams=beam, num_return_sequences=n, do_sample=False, length_penalty=1.0, **extra
            ).tolist()
        for j in range(0, len(rows), n):
            ids = [strip(r, eos, pad) for r in rows[j : j + n]]
            out.append({"ids": ids, "texts": tok.batch_decode(ids, skip_special_tokens=True)})
    return out


def ours(bundle: Path, family: str, sources: list[str], beam: int, n: int) -> list[dict]:
    """Our runtime's outputs on the texts (the bundle's own tokenizer), in reference()'s form."""
    from seq2onnx.runtime.translator import Translator

    source_lang, target_lang, _ = FAMILIES[family]
    langs = {"source_lang": source_lang, "target_lang": target_lang} if target_lang else {}
    tr = Translator(bundle, device="cpu", intra_threads=1)
    results = tr.translate_batch(
        sources, beam_size=beam, num_hypotheses=n, length_penalty=1.0, max_batch_size=BATCH, **langs
    )
    return [{"ids": [list(x) for x in r.token_ids], "texts": list(r.hypotheses)} for r in results]


def ct2(model: Path, model_dir: Path, family: str, sources: list[str], beam: int) -> list[dict]:
    """CTranslate2's best hypothesis on the tokenizer's pieces (its documented use), as ids; no texts."""
    import ctranslate2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    source_lang, target_lang, _ = FAMILIES[family]
    if source_lang:
        tok.src_lang = source_lang
    tokens = [tok.convert_ids_to_tokens(tok(s).input_ids) for s in sources]
    prefix = {"target_prefix": [[target_lang]] * len(sources)} if target_lang else {}
    tr = ctranslate2.Translator(str(model), device="cpu", intra_threads=1)
    # max_decoding_length counts the target prefix, as generate()'s max_length - 1 does
    results = tr.translate_batch(
        tokens,
        beam_size=beam,
        max_decoding_length=MAX_LENGTH - 1,
        min_decoding_length=0,
        length_penalty=1.0,
        max_batch_size=BATCH,
        **prefix,
    )
    return [{"ids": [tok.convert_tokens_to_ids(r.hypotheses[0])], "texts": None} for r in results]


# ------------------------------------------------------------------------------------------------ rows
# (row, search, beam, n-best, engine); every row is held to generate()'s fp32 at the same search
ROWS = [
    ("greedy", 1, 1, "ours fp32"),
    ("beam 4", 4, 1, "ours fp32"),
    ("beam 5 x 3 n-best", 5, 3, "ours fp32"),
    ("greedy", 1, 1, "ours int8"),
    ("beam 4", 4, 1, "ours int8"),
    ("greedy", 1, 1, "ct2 int8"),
    ("beam 4", 4, 1, "ct2 int8"),
    ("greedy", 1, 1, "ct2 fp32"),
    ("beam 4", 4, 1, "ct2 fp32"),
]


def compare(want: list[dict], got: list[dict], sources: list[str]) -> dict:
    """Identical ids (every hypothesis, in order) and texts, and the first five differences."""
    same = [w["ids"] == g["ids"] for w, g in zip(want, got, strict=True)]
    texts = None if got[0]["texts"] is None else sum(w["texts"] == g["texts"] for w, g in zip(want, got))
    diffs = [
        {"sentence": i, "source": sources[i], "generate": want[i], "engine": got[i]}
        for i, ok in enumerate(same)
        if not ok
    ][:5]
    return {"ids": sum(same), "texts": texts, "total": len(same), "differences": diffs}


def evaluate(
    label: str, family: str, model_dir: Path, paths: dict[str, Path], sources: list[str]
) -> list[dict]:
    """Every row of ROWS for one family's model (`label`: the family, or the family and its convention)."""
    wanted = {}
    rows = []
    for name, beam, n, engine in ROWS:
        if beam == 1 and label != family:
            continue  # early_stopping changes beam search only: greedy is the saved model's rows
        if (beam, n) not in wanted:
            t = time.perf_counter()
            wanted[beam, n] = reference(model_dir, family, sources, beam, n)
            log(f"  generate() {name}: {time.perf_counter() - t:.1f} s")
        if engine.startswith("ours"):
            got = ours(paths[engine], family, sources, beam, n)
        else:
            got = ct2(paths[engine], model_dir, family, sources, beam)
        counts = compare(wanted[beam, n], got, sources)
        rows.append({"family": label, "row": name, "engine": engine, **counts})
        log(f"  {engine} {name}: {rows[-1]['ids']}/{rows[-1]['total']} identical ids")
    return rows


# ---------------------------------------------------------------------------------------------- report
def markdown(report: dict) -> str:
    lines = [
        f"# Trained imports held to generate() ({report['sentences']} Tatoeba test sentences, en -> zh)",
        "",
        f"Command: `{report['command']}`  ",
        f"Wall time: {report['wall_s']:.0f} s; {report['machine']}",
        "",
        "| family | params | train steps (loss) | row | engine | identical ids | identical texts |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        t = report["training"][row["family"].split()[0]]
        texts = "—" if row["texts"] is None else f"{row['texts']}/{row['total']}"
        lines.append(
            f"| {row['family']} | {t['parameters'] / 1e6:.1f}M | {t['steps']} "
            f"({t['final_loss']:.2f}) | {row['row']} | {row['engine']} | "
            f"{row['ids']}/{row['total']} | {texts} |"
        )
    lines += [
        "",
        "int8 and CTranslate2 rows are held to generate()'s fp32 at the same search. "
        "CTranslate2 is given the tokenizer's pieces; its texts are not compared. "
        "CTranslate2 does not emulate "
        "forced_eos_token_id (Marian, mBART): a sentence reaching max_length differs there. "
        "generate() runs with each checkpoint's generation_config.json: Marian's, as OPUS-MT's, has no "
        "early_stopping (transformers' default False), which the bundle emulates (beam_convention "
        "transformers_heuristic) and CTranslate2 does not (docs/decoding.md), so CTranslate2's beam "
        "rows differ where a longer hypothesis wins late.",
    ]
    return "\n".join(lines) + "\n"


def write_report(out: Path, report: dict) -> None:
    from seq2onnx.atomic import write_file

    out.mkdir(parents=True, exist_ok=True)
    write_file(out / "identity.json", json.dumps(report, indent=1, ensure_ascii=False))
    write_file(out / "identity.md", markdown(report))


def quiet() -> None:
    """Hides transformers' progress bars and MarianTokenizer's sacremoses warning."""
    import warnings

    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    warnings.filterwarnings("ignore", "Recommended: pip install sacremoses")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add(
        "--families", default="marian,nllb,mbart", help="of marian, nllb, mbart, t5 (default the first three)"
    )
    add("--sentences", type=int, default=1000, help="held-out Tatoeba pairs every row decodes (1000)")
    add("--train-minutes", type=float, default=5.0, help="wall-clock minutes of training per family (5)")
    work = "WORK/FAMILY/{model,bundle,bundle-int8,ct2-int8,ct2-fp32}, replaced on each run"
    add("--work", type=Path, default=Path("hf-trained-identity"), help=work)
    conventions = "t5: as saved (no early_stopping), the early_stopping true copy, or both (default)"
    add("--convention", default="both", choices=("both", "saved", "early_stopping"), help=conventions)
    add("--no-train", action="store_true", help="measure the models an earlier run trained under --work")
    add("--out", type=Path, default=None, help="identity.md and identity.json (default WORK/results)")
    args = p.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        p.error(f"--families {args.families!r}: unknown {unknown}; choose among {', '.join(FAMILIES)}")
    args.families, args.out = families, args.out or args.work / "results"
    return args


def trained(args, family: str, model_dir: Path, train: list[tuple[str, str]]) -> dict:
    """Trains and saves the family's model, or with --no-train reads the facts of the one saved before."""
    facts = model_dir / "training.json"
    if args.no_train and facts.is_file():
        return json.loads(facts.read_text(encoding="utf-8"))
    if args.no_train:
        raise SystemExit(
            f"error: --no-train, but {facts} is absent: train {family} first (leave out --no-train)"
        )
    result = train_family(family, model_dir, train, args.train_minutes)
    facts.write_text(json.dumps(result), encoding="utf-8")
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    quiet()
    if not TATOEBA.is_file():
        print(
            f"skipped: {TATOEBA} is absent; put the Tatoeba cmn-eng pairs (cmn.txt from "
            "manythings.org/anki, tatoeba.org's sentence pairs) there",
            file=sys.stderr,
        )
        return 0
    train, test = read_pairs(args.sentences)
    sources = [s for s, _ in test]
    report = {
        "command": " ".join(["python", *sys.argv]),
        "sentences": len(sources),
        "machine": f"{os.cpu_count()} CPU cores, load {os.getloadavg()[0]:.1f} at the start",
        "training": {},
        "rows": [],
    }
    for family in args.families:
        work = args.work / family
        report["training"][family] = trained(args, family, work / "model", train)
        for label, model_dir in conventions(family, work / "model"):
            if args.convention not in ("both", "early_stopping" if label != family else "saved"):
                continue
            out = work / model_dir.name.removeprefix("model").lstrip("-") if label != family else work
            paths = export_all(model_dir, out)
            report["rows"] += evaluate(label, family, model_dir, paths, sources)
            report["wall_s"] = time.perf_counter() - T0
            write_report(args.out, report)  # after each model, so an interrupted run keeps what it measured
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
