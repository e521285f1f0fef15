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
    read_config(model_dir)
    bundle = fmt.read_bundle(bundle_dir)
    tol = bundle.meta["tolerances"]
    hf = load_hf(model_dir).double()
    tok = load_tokenizer(model_dir)
    pairs = read_sentences(data, sentences, src_col, tgt_col)
    srcs = [s for s, _ in pairs]
    decoders = tuple(bundle.decoder_variants)
    translators = {
        d: Translator(bundle, device="cpu" if d == fmt.FUSED else device, _tuning=SessionTuning(decoder=d))
        for d in decoders
    }
    first = translators[decoders[0]]
    cfg, ids = bundle.model, bundle.special_ids
    eos, pad, start = ids["eos"], ids["pad"], ids["decoder_start"]
    if source_lang is not None and hasattr(tok, "src_lang"):
        tok.src_lang = source_lang
    if target_lang is not None and hasattr(tok, "tgt_lang"):
        tok.tgt_lang = target_lang
    options = {"source_lang": source_lang, "target_lang": target_lang}
    source_prefix, [prefix] = first.prefixes(1, first.search_options(**options))  # as the runtime puts them
    forced = prefix[0] if prefix else None
    max_length = int(bundle.decoding["max_length_b"]) + 1  # transformers counts the start token
    suppressed, renormalize = list(cfg.get("suppressed_ids", [])), bool(cfg.get("renormalize", False))
    checks: list[Check] = []
    exact = bundle.meta["dtype"] == "float32" and not bundle.meta.get("quantization")

    ours_src = [first.sources.ids(i, s, False, source_prefix) for i, s in enumerate(srcs)]
    hf_srcs = [language_text(bundle.meta.get("tokens", {}), tok, target_lang) + s for s in srcs]
    theirs_src = [tok(s).input_ids for s in hf_srcs]
    same_ids = [a == b for a, b in zip(ours_src, theirs_src)]
    checks.append(
        Check(
            "tokens",
            "source ids identical to the tokenizer's",
            sum(same_ids) / len(srcs),
            1.0,
            all(same_ids),
            f"{sum(same_ids)}/{len(srcs)} sentences",
        )
    )
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
            early_stopping=EARLY_STOPPING[bundle.decoding.get("beam_convention", "fairseq")],
        ),
    }
    hf.double()
    texts = tok.batch_decode(want[1], skip_special_tokens=True)
    rows = [
        {k: torch.tensor([v]) for k, v in tok(s).items() if k in ("input_ids", "attention_mask")}
        for s in hf_srcs
    ]
    targets = [
        (tok(text_target=r).input_ids[:-1] if r is not None else strip(w, pad, eos))
        for (_, r), w in zip(pairs, want[1])
    ]
    # the tensor tier compares encoder outputs position by position: only sentences whose ids agree (the
    # token tier above reports the others)
    tensor_rows = [i for i in range(min(tensor_sentences, len(srcs))) if same_ids[i]]
    differences = []
    for variant, t in translators.items():
        checks.extend(
            _tensor_checks(
                t,
                hf,
                [rows[i] for i in tensor_rows],
                [ours_src[i] for i in tensor_rows],
                [targets[i] for i in tensor_rows],
                start,
                (suppressed, renormalize),
                tol["tensor_atol"],
                variant,
                say,
            )
        )
        for beams in (1, 4):
            got = translate(
                t, srcs, beams=beams, max_length=max_length - 1, options=options, say=say, label=variant
            )
            expected = [strip(w, pad, eos) for w in want[beams]]
            agree = [g.token_ids[0] == w for g, w in zip(got, expected)]
            # fp32: every greedy sentence, beam 4 on >= 99.5%; int8/fp16: the bundle's own agreement bound
            bound = min(tol["min_greedy_agreement"], 1.0 if beams == 1 else MIN_BEAM_AGREEMENT)
            rate = sum(agree) / len(agree)
            checks.append(
                Check(
                    "tokens",
                    f"{'greedy' if beams == 1 else 'beam 4'} ids identical to generate()",
                    rate,
                    bound,
                    rate >= bound,
                    f"{sum(agree)}/{len(agree)} sentences",
                    variant,
                )
            )
            for i in np.flatnonzero(~np.array(agree)):
                mismatch = _Mismatch(int(i), srcs[i], got[i].token_ids[0], expected[i], beams, variant)
                differences.append(
                    _difference(
                        hf,
                        rows[i],
                        mismatch,
                        start,
                        eos,
                        len(prefix),
                        (suppressed, renormalize),
                        exact,
                        bundle.meta.get("variant"),
                    )
                )
            if beams == 1:
                checks.append(_text_check(got, texts, tol["min_greedy_agreement"], variant))
    # As for our own bundles: the tensor bound of a reduced-precision bundle is a measurement; tokens and text
    # decide.
    judged = [c for c in checks if c.tier != "tensor" or exact]
    return {
        "bundle": str(bundle_dir),
        "checkpoint": str(model_dir),
        "variant": bundle.meta.get("variant", "float32"),
        "decoders": list(decoders),
        "int8_products": int8_products(bundle.meta),
        "provider": first.device.upper() if first.device == "cpu" else "CUDA",
        "sentences": len(srcs),
        "tensor_sentences": min(tensor_sentences, len(srcs)),
        "passed": all(c.passed for c in judged),
        "checks": [asdict(c) | {"judged": c in judged} for c in checks],
        "differences": differences,
        "tie": TIE,
        "options": options,
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


def _cross_projections(hf) -> list[tuple]:
    """Each decoder layer's cross-attention key and value projections: BART-style layers, or T5's blocks."""
    decoder = hf.get_decoder()
    if hasattr(decoder, "block"):  # T5, mT5: block.N.layer[1] is the cross-attention
        return [(b.layer[1].EncDecAttention.k, b.layer[1].EncDecAttention.v) for b in decoder.block]
    return [(layer.encoder_attn.k_proj, layer.encoder_attn.v_proj) for layer in decoder.layers]


def _tensor_checks(
    translator, hf, rows, sources, targets, start, suppression, atol, variant, say
) -> list[Check]:
    """Encoder K/V and teacher-forced log-probabilities of one decoder against transformers in float64."""
    if not rows:
        return []
    say(f"tensors: {len(rows)} sentences, {variant} decoder, against transformers in float64")
    worst_kv = worst_lp = 0.0
    scale_kv = 1.0
    n_layers = translator.n_layers
    projections = _cross_projections(hf)
    for row, src, target in zip(rows, sources, targets):
        src_mask, cross = translator.graphs.encode(*translator.sources.pad([src]))
        with torch.no_grad():
            memory = hf.get_encoder()(**row).last_hidden_state  # (1, S, D)
        heads, dh = translator.n_heads, translator.head_dim
        for i in range(n_layers):
            k_proj, v_proj = projections[i]
            for proj, got in ((k_proj, cross[2 * i]), (v_proj, cross[2 * i + 1])):
                with torch.no_grad():
                    ref = proj(memory).reshape(1, -1, heads, dh).transpose(1, 2).numpy()
                worst_kv = max(worst_kv, float(np.abs(got.numpy().astype(np.float64) - ref).max()))
                scale_kv = max(scale_kv, float(np.abs(ref).max()))
        decoder_input = [start] + target
        ref = log_probs(hf, row, decoder_input, *suppression)
        step = translator.graphs.step(
            (src_mask, cross), rows=1, top_k=None, max_length=len(decoder_input) + 1
        )
        for t, token in enumerate(decoder_input):
            lp = np.asarray(step(np.array([[token]], dtype=np.int64), np.zeros(1, dtype=np.int64), t, None))[
                0
            ]
            finite = np.isfinite(ref[t])
            if not np.array_equal(finite, np.isfinite(lp)):
                worst_lp = float("inf")
                continue
            worst_lp = max(worst_lp, float(np.abs(lp[finite].astype(np.float64) - ref[t][finite]).max()))
        translator.graphs.recycle(step)
    kv_bound = atol * scale_kv
    return [
        Check(
            "tensor",
            "encoder K/V (cross-attention inputs)",
            worst_kv,
            kv_bound,
            worst_kv <= kv_bound,
            f"x max|K/V| = {scale_kv:.2f}",
            variant,
        ),
        Check(
            "tensor",
            "decoder log_probs (teacher-forced)",
            worst_lp,
            atol,
            worst_lp <= atol,
            f"{sum(len(t) + 1 for t in targets)} steps",
            variant,
        ),
    ]


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
