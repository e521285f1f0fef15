"""`seq2onnx verify MODEL_DIR BUNDLE`: an imported bundle against transformers' own model and tokenizer.

Tiers, each against the transformers model evaluated in float64 (the reference is the model's own
library, not our import of it):
- tensors: the encoder's outputs (each decoder layer's cross-attention keys and values, made by
  transformers' own k_proj/v_proj from its encoder output) and the decoder's log-probabilities
  step by step along teacher-forced targets (the references when given, else transformers'
  greedy outputs, which is the greedy path), for each decoder graph of the bundle;
- tokens: the source ids identical to the tokenizer's; greedy ids identical to
  model.generate(num_beams=1, do_sample=False) on every sentence; beam 4 identical to
  model.generate(num_beams=4, length_penalty=1.0, early_stopping as the bundle's beam_convention
  records it) on >= 99.5%, each
  difference shown with both hypotheses' float64 scores and labelled (a near-tie or not);
- text: texts identical to the tokenizer's batch_decode(skip_special_tokens=True).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from seq2onnx.export.parity_report import Check
from seq2onnx.export.parity_report import int8_products
from seq2onnx.runtime import bundle as fmt
from seq2onnx.runtime.session_tuning import SessionTuning
from seq2onnx.runtime.search import EARLY_STOPPING
from seq2onnx.runtime.translator import Translator

from .read import load_hf, read_config
from .reference import generate, language_text, log_probs, score, strip, translate
from .tokens import load_tokenizer
from .verify_tensors import tensor_checks

MIN_BEAM_AGREEMENT = 0.995  # the bound for beam 4; greedy must agree on every sentence
TIE = 1e-4  # nats: a deciding gap this small is float noise between float64 and the bundle's float32
# sentences per generate() and translate_batch call: bounded padding and memory, a progress line each


def read_sentences(
    path: str | Path, n: int, src_col: int = 0, tgt_col: int | None = None
) -> list[tuple[str, str | None]]:
    """Up to n (source, reference or None) pairs from a text file: one source per line, or TSV columns.

    Raises:
        FileNotFoundError: no such file.
        ValueError: no usable line, or a column missing (naming the line).
    """
    pairs = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            cols = line.rstrip("\n").split("\t")
            if not line.strip():
                continue
            if src_col >= len(cols) or (tgt_col is not None and tgt_col >= len(cols)):
                raise ValueError(
                    f"{path}:{number}: {len(cols)} columns; --src-col {src_col}"
                    f"{'' if tgt_col is None else f' and --tgt-col {tgt_col}'} need more"
                )
            pairs.append((cols[src_col], None if tgt_col is None else cols[tgt_col]))
            if len(pairs) >= n:
                break
    if not pairs:
        raise ValueError(f"{path}: no sentences; give one source sentence per line")
    return pairs


def verify_hf(
    model_dir: str | Path,
    bundle_dir: str | Path,
    *,
    data: str,
    sentences: int = 100,
    device: str = "cpu",
    src_col: int = 0,
    tgt_col: int | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    tensor_sentences: int = 100,
    log=None,
) -> dict:
    """Runs every tier; returns the report (seq2onnx.export.parity_report.format_report prints it, then
    format_differences).

    Args:
        model_dir: the Hugging Face model directory the bundle was exported from.
        bundle_dir: the bundle.
        data, sentences, src_col, tgt_col: up to `sentences` test sentences from a text file (TSV with
            tgt_col: with references, used as the teacher-forced targets).
        device: onnxruntime provider for the standard decoder.
        source_lang, target_lang: language codes of a multilingual model (as translate_batch's).
        tensor_sentences: the first this many go through the tensor tier.
        log (Callable[[str], None] | None): progress lines.

    Returns:
        dict: passed, checks, differences.
    """
    say = log or (lambda line: None)
    model_dir, bundle_dir = Path(model_dir), Path(bundle_dir)
    run = _open(
        model_dir, bundle_dir, (data, sentences, src_col, tgt_col), device, (source_lang, target_lang)
    )
    ours_src, hf_srcs, same_ids, check = _source_ids(run, target_lang)
    checks = [check]
    want = _generated(run, hf_srcs, say)
    texts = run.tok.batch_decode(want[1], skip_special_tokens=True)
    rows, targets = _teacher_inputs(run, hf_srcs, want[1])
    # the tensor tier compares encoder outputs position by position: only sentences whose ids agree (the
    # token tier above reports the others)
    tensor_rows = [i for i in range(min(tensor_sentences, len(run.srcs))) if same_ids[i]]
    tensor_inputs = [
        [rows[i] for i in tensor_rows],
        [ours_src[i] for i in tensor_rows],
        [targets[i] for i in tensor_rows],
    ]
    differences = []
    for variant, t in run.translators.items():
        tensor_args = (run.start, run.suppression, run.tol["tensor_atol"], variant, say)
        checks.extend(tensor_checks(t, run.hf, *tensor_inputs, *tensor_args))
        for beams in (1, 4):
            found, differing = _search_checks(run, variant, beams, (want[beams], rows, texts), say)
            checks.extend(found)
            differences.extend(differing)
    return _report(run, model_dir, bundle_dir, min(tensor_sentences, len(run.srcs)), checks, differences)


@dataclass
class _Run:
    """What every tier reads: the bundle and its translators, transformers' model and tokenizer, the
    sentences, and the decoding settings as the runtime applies them."""

    bundle: fmt.Bundle
    hf: torch.nn.Module
    tok: object
    pairs: list[tuple[str, str | None]]
    translators: dict
    options: dict
    source_prefix: list[int]
    prefix: list[int]

    @property
    def srcs(self) -> list[str]:
        return [s for s, _ in self.pairs]

    @property
    def first(self) -> Translator:
        return next(iter(self.translators.values()))

    @property
    def tol(self) -> dict:
        return self.bundle.meta["tolerances"]

    @property
    def start(self) -> int:
        return self.bundle.special_ids["decoder_start"]

    @property
    def max_length(self) -> int:
        return int(self.bundle.decoding["max_length_b"]) + 1  # transformers counts the start token

    @property
    def suppression(self) -> tuple[list[int], bool]:
        cfg = self.bundle.model
        return list(cfg.get("suppressed_ids", [])), bool(cfg.get("renormalize", False))

    @property
    def exact(self) -> bool:
        return self.bundle.meta["dtype"] == "float32" and not self.bundle.meta.get("quantization")


def _open(model_dir: Path, bundle_dir: Path, data: tuple, device: str, langs: tuple) -> _Run:
    """Reads the model directory, the bundle and the sentences: both models, the tokenizer set to the
    languages, and the prefixes the runtime puts on a source and a target.

    data: read_sentences' (path, n, src_col, tgt_col); langs: (source_lang, target_lang).
    """
    source_lang, target_lang = langs
    read_config(model_dir)
    bundle = fmt.read_bundle(bundle_dir)
    hf = load_hf(model_dir).double()
    tok = load_tokenizer(model_dir)
    pairs = read_sentences(*data)
    translators = {
        d: Translator(bundle, device="cpu" if d == fmt.FUSED else device, _tuning=SessionTuning(decoder=d))
        for d in bundle.decoder_variants
    }
    first = next(iter(translators.values()))
    if source_lang is not None and hasattr(tok, "src_lang"):
        tok.src_lang = source_lang
    if target_lang is not None and hasattr(tok, "tgt_lang"):
        tok.tgt_lang = target_lang
    options = {"source_lang": source_lang, "target_lang": target_lang}
    source_prefix, [prefix] = first.prefixes(1, first.search_options(**options))  # as the runtime puts them
    return _Run(bundle, hf, tok, pairs, translators, options, source_prefix, prefix)


def _source_ids(run: _Run, target_lang: str | None) -> tuple[list, list[str], list[bool], Check]:
    """Our source ids and the tokenizer's, sentence by sentence: (ours, the texts given to transformers,
    which agree, the check)."""
    srcs = run.srcs
    ours_src = [run.first.sources.ids(i, s, False, run.source_prefix) for i, s in enumerate(srcs)]
    hf_srcs = [language_text(run.bundle.meta.get("tokens", {}), run.tok, target_lang) + s for s in srcs]
    theirs_src = [run.tok(s).input_ids for s in hf_srcs]
    same_ids = [a == b for a, b in zip(ours_src, theirs_src)]
    check = Check(
        "tokens",
        "source ids identical to the tokenizer's",
        sum(same_ids) / len(srcs),
        1.0,
        all(same_ids),
        f"{sum(same_ids)}/{len(srcs)} sentences",
    )
    return ours_src, hf_srcs, same_ids, check


def _generated(run: _Run, hf_srcs: list[str], say) -> dict[int, list]:
    """transformers' generate() ids by beam count: greedy (in float32) and beam 4 (in float64)."""
    forced = run.prefix[0] if run.prefix else None
    hf, tok, max_length = run.hf, run.tok, run.max_length
    want = {
        1: generate(hf.float(), tok, hf_srcs, beams=1, max_length=max_length, forced=forced, say=say),
        4: generate(
            hf,
            tok,
            hf_srcs,
            beams=4,
            max_length=max_length,
            forced=forced,
            say=say,
            early_stopping=EARLY_STOPPING[run.bundle.decoding.get("beam_convention", "fairseq")],
        ),
    }
    hf.double()
    return want


def _teacher_inputs(run: _Run, hf_srcs: list[str], greedy: list) -> tuple[list[dict], list[list[int]]]:
    """transformers' encoder inputs per sentence, and the teacher-forced targets: the references when
    given, else the greedy outputs."""
    ids = run.bundle.special_ids
    rows = [
        {k: torch.tensor([v]) for k, v in run.tok(s).items() if k in ("input_ids", "attention_mask")}
        for s in hf_srcs
    ]
    targets = [
        (run.tok(text_target=r).input_ids[:-1] if r is not None else strip(w, ids["pad"], ids["eos"]))
        for (_, r), w in zip(run.pairs, greedy)
    ]
    return rows, targets


def _search_checks(run: _Run, variant: str, beams: int, refs: tuple, say) -> tuple[list[Check], list[dict]]:
    """One decoder's greedy or beam-4 ids (and greedy texts) against generate()'s, with each difference;
    refs: (generate()'s ids for this search, transformers' encoder inputs, greedy texts)."""
    want, rows, texts = refs
    srcs, ids = run.srcs, run.bundle.special_ids
    pad, eos = ids["pad"], ids["eos"]
    got = translate(
        run.translators[variant],
        srcs,
        beams=beams,
        max_length=run.max_length - 1,
        options=run.options,
        say=say,
        label=variant,
    )
    expected = [strip(w, pad, eos) for w in want]
    agree = [g.token_ids[0] == w for g, w in zip(got, expected)]
    # fp32: every greedy sentence, beam 4 on >= 99.5%; int8/fp16: the bundle's own agreement bound
    bound = min(run.tol["min_greedy_agreement"], 1.0 if beams == 1 else MIN_BEAM_AGREEMENT)
    rate = sum(agree) / len(agree)
    search = f"{'greedy' if beams == 1 else 'beam 4'} ids identical to generate()"
    checks = [
        Check("tokens", search, rate, bound, rate >= bound, f"{sum(agree)}/{len(agree)} sentences", variant)
    ]
    differences = []
    for i in np.flatnonzero(~np.array(agree)):
        mismatch = _Mismatch(int(i), srcs[i], got[i].token_ids[0], expected[i], beams, variant)
        differences.append(
            _difference(
                run.hf,
                rows[i],
                mismatch,
                run.start,
                eos,
                len(run.prefix),
                run.suppression,
                run.exact,
                run.bundle.meta.get("variant"),
            )
        )
    if beams == 1:
        checks.append(_text_check(got, texts, run.tol["min_greedy_agreement"], variant))
    return checks, differences


def _report(run: _Run, model_dir: Path, bundle_dir: Path, tensor_sentences: int, checks, differences) -> dict:
    """The report verify_hf returns."""
    # As for our own bundles: the tensor bound of a reduced-precision bundle is a measurement; tokens and text
    # decide.
    judged = [c for c in checks if c.tier != "tensor" or run.exact]
    first = run.first
    return {
        "bundle": str(bundle_dir),
        "checkpoint": str(model_dir),
        "variant": run.bundle.meta.get("variant", "float32"),
        "decoders": list(run.translators),
        "int8_products": int8_products(run.bundle.meta),
        "provider": first.device.upper() if first.device == "cpu" else "CUDA",
        "sentences": len(run.pairs),
        "tensor_sentences": tensor_sentences,
        "passed": all(c.passed for c in judged),
        "checks": [asdict(c) | {"judged": c in judged} for c in checks],
        "differences": differences,
        "tie": TIE,
        "options": run.options,
    }


@dataclass
class _Mismatch:
    """One sentence whose ids differ from generate()'s: where, what each side gave, and by which search."""

    index: int
    source: str
    ours: list[int]
    theirs: list[int]
    beams: int
    decoder: str


def _difference(hf, row, m: _Mismatch, start, eos, n_forced, suppression, exact, variant) -> dict:
    """A differing sentence, with both sides' scores under transformers' model, labelled near-tie or not."""
    lp_ours = log_probs(hf, row, [start] + m.ours, *suppression)
    lp_theirs = log_probs(hf, row, [start] + m.theirs, *suppression)
    ours = score(lp_ours, m.ours, n_forced, eos, 1.0)
    theirs = score(lp_theirs, m.theirs, n_forced, eos, 1.0)
    gap = theirs[1] - ours[1]
    if abs(gap) <= TIE:
        kind = "near-tie"
    else:
        kind = "NOT a near-tie" if exact else f"{variant} arithmetic, not a near-tie"
    return {
        "decoder": m.decoder,
        "search": "greedy" if m.beams == 1 else "beam 4",
        "index": m.index,
        "source": m.source,
        "ours": m.ours,
        "transformers": m.theirs,
        "ours_score": ours,
        "transformers_score": theirs,
        "gap": gap,
        "kind": kind,
    }


def _text_check(got, texts: list[str], bound: float, variant: str) -> Check:
    """Greedy texts against transformers' batch_decode."""
    same_text = sum(g.hypotheses[0] == x for g, x in zip(got, texts))
    rate = same_text / len(texts)
    return Check(
        "text",
        "texts identical to batch_decode",
        rate,
        bound,
        rate >= bound,
        f"{same_text}/{len(texts)} sentences",
        variant,
    )


def format_differences(report: dict) -> str:
    """The differences of the token tier, each with both float64 scores and its label, or ""."""
    lines = []
    for d in report["differences"]:
        lines.append(
            f"  {d['search']} ({d['decoder']}) sentence {d['index']}: {d['kind']}, gap {d['gap']:+.2e} "
            f"(transformers' hypothesis - ours, score/len under transformers in float64)"
        )
        lines.append(f"    ours         {d['ours_score'][0]:>10.4f} {d['ours_score'][1]:>8.4f}  {d['ours']}")
        lines.append(
            f"    transformers {d['transformers_score'][0]:>10.4f} {d['transformers_score'][1]:>8.4f}  "
            f"{d['transformers']}"
        )
    return (
        ("differences (sum of log-probabilities with </s>, normalised):\n" + "\n".join(lines))
        if lines
        else ""
    )
