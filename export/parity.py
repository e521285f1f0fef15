"""`verify`: does a bundle compute what the PyTorch checkpoint computes?

Checked in tiers and reported per output against one named tolerance each: tensors (encoder
outputs; decoder log-probabilities and cache, step by step along teacher-forced targets and along
the reference greedy path), then greedy token ids, then BLEU. A failure is an error with the
numbers in it, never only a warning. A bundle with two decoders (decoder.onnx and the fused
decoder_fused.onnx) has each checked at the same bounds, each row naming its decoder; the
verdict fails if either fails. The fused decoder is driven by the runtime's own static step
loop (runtime/fused_step.py), cache updated in place, so that loop is what is checked.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from seq2onnx.model import checkpoint
from seq2onnx.model.search import translate_ids
from seq2onnx.model.metrics import bleu
from seq2onnx.model.options import TrainOptions
from seq2onnx.model.splits import load_split
from seq2onnx.model.corpus import generate_pairs
from seq2onnx.runtime import bundle as fmt
from seq2onnx.export.parity_report import Check, int8_products
from seq2onnx.export.tensor_parity import tensor_checks
from seq2onnx.runtime.session_tuning import SessionTuning
from seq2onnx.runtime.translator import Translator


class ParityError(AssertionError):
    """The bundle does not compute what the checkpoint computes, within the stated tolerance."""


def test_sentences(
    ckpt_dir: Path, n: int, data: str | None = None, src_col: int = 0, tgt_col: int = 1
) -> list[tuple[str, str]]:
    """Picks the sentences to verify on: the test split of the corpus the checkpoint was trained on.

    Args:
        ckpt_dir: the checkpoint directory (its train_state.json names the corpus and split).
        n: how many pairs at most.
        data: a TSV file to take the first n pairs of instead (malformed lines skipped).
        src_col: its source column.
        tgt_col: its target column.

    Returns:
        (source, target) pairs; generated ones (seed 12345) when the checkpoint records no options.

    Raises:
        FileNotFoundError: the corpus the checkpoint was trained on is not here.
        DataError: `data` (or the training corpus) cannot be read.
    """
    state_file = ckpt_dir / checkpoint.STATE
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    options = state.get("options")
    if data is not None:
        from seq2onnx.model.data import read_pairs

        pairs, _ = read_pairs(data, src_col=src_col, tgt_col=tgt_col, skip_bad=True)
        return pairs[:n]
    if options is None:
        return generate_pairs(n, seed=12345)
    opts = TrainOptions(**options)
    if opts.data is not None and not Path(opts.data).is_file():
        raise FileNotFoundError(
            f"the checkpoint was trained on {opts.data}, which is not here; "
            "pass --data FILE with test sentences"
        )
    return load_split(opts, valid=False).test[:n]  # the test split never depends on --valid-data


# The tensor tier runs the checkpoint in float64 step by step: its cost grows with every sentence,
# while its verdict is about the arithmetic, which a sample shows. Tokens and text cover them all.
TENSOR_SENTENCES = 100


def verify(
    ckpt: str | Path,
    bundle_dir: str | Path,
    *,
    sentences: int = 100,
    device: str = "cpu",
    data: str | None = None,
    src_col: int = 0,
    tgt_col: int = 1,
    tensor_sentences: int = TENSOR_SENTENCES,
    log=None,
) -> dict:
    """Runs every tier and returns the report (parity_report.format_report prints it).

    Args:
        ckpt: the checkpoint (a run directory or one of its step-*/last/best).
        bundle_dir: the bundle.
        sentences: test sentences for the token and text tiers.
        device: onnxruntime provider for the standard decoder ("cpu", "cuda", "auto").
        data, src_col, tgt_col: a TSV of sentences instead of the checkpoint's test split.
        tensor_sentences: the first this many of them also go through the tensor tier.
        log (Callable[[str], None] | None): called with a line of progress now and then (the command
            prints it on stderr).

    Returns:
        dict: `passed`, the checks, and which sentences each tier covered.

    Raises:
        BundleError: the bundle cannot be read.
        CheckpointError: a bad checkpoint.
        FileNotFoundError: as test_sentences.
    """
    say = log or (lambda line: None)
    bundle_dir = Path(bundle_dir)
    bundle = fmt.read_bundle(bundle_dir)  # read and hash-checked once; every Translator below loads from it
    meta = bundle.meta
    model, tok, ckpt_dir = checkpoint.load(ckpt)
    tol = meta["tolerances"]
    pairs = test_sentences(ckpt_dir, sentences, data, src_col, tgt_col)
    decoders = tuple(bundle.decoder_variants)
    translators = _translators(bundle, decoders, device)
    translator = translators[fmt.STANDARD]
    sample = pairs[: max(0, tensor_sentences)]
    checks = _tensor_tier(model, tok, bundle, sample, translator.device, tol, decoders, say)
    checks += _search_checks(model, tok, translators, pairs, tol, say)
    judged = _judged(checks, meta)
    return {
        "bundle": str(bundle_dir),
        "checkpoint": str(ckpt_dir),
        "variant": meta.get("variant", meta["dtype"]),
        "decoders": list(decoders),
        "int8_products": int8_products(meta),
        "provider": translator.device.upper() if translator.device == "cpu" else "CUDA",
        "sentences": len(pairs),
        "tensor_sentences": len(sample),
        "passed": all(c.passed for c in judged),
        "checks": [asdict(c) | {"judged": c in judged} for c in checks],
    }


def _translators(bundle, decoders: tuple[str, ...], device: str) -> dict[str, Translator]:
    """One Translator per decoder, each forced to it: a fused decoder that cannot run is an error here.
    The fused graph's kernels are the CPU's (its cache layout), so it is verified on the CPU."""
    return {
        d: Translator(bundle, device="cpu" if d == fmt.FUSED else device, _tuning=SessionTuning(decoder=d))
        for d in decoders
    }


def _tensor_tier(model, tok, bundle, sample, device: str, tol: dict, decoders, say) -> list[Check]:
    """The tensor tier's checks on `sample` (none for no sentences)."""
    if not sample:
        return []
    return tensor_checks(model, tok, bundle, sample, device, tol["tensor_atol"], decoders=decoders, log=say)


def _judged(checks: list[Check], meta: dict) -> list[Check]:
    """The checks the verdict rests on: the tensor bound of a reduced-precision bundle is
    informative, its verdict rests on tokens and text."""
    full_precision = meta["dtype"] == "float32" and not meta.get("quantization")
    return [c for c in checks if c.tier != "tensor" or full_precision]


def _search_checks(
    model, tok, translators: dict[str, Translator], pairs: list[tuple[str, str]], tol: dict, say
) -> list[Check]:
    """The token and text tiers: each decoder's greedy ids against the checkpoint's, and its BLEU drop."""
    checks = []
    srcs = [tok.encode_source(s)[: model.cfg.max_positions] for s, _ in pairs]
    say(f"tokens: the PyTorch reference's greedy search on {len(srcs)} sentences")
    want = [h[0].tokens for h in translate_ids(model, srcs, beam_size=1)]
    want = [w[:-1] if w and w[-1] == model.cfg.eos_id else w for w in want]
    refs = [t for _, t in pairs]
    torch_bleu = bleu([tok.decode_target(w) for w in want], refs)
    for variant, t in translators.items():
        say(f"tokens: the bundle's greedy search ({variant} decoder) on {len(srcs)} sentences")
        got = t.translate_batch(srcs, beam_size=1)
        agree = sum(g.token_ids[0] == w for g, w in zip(got, want))
        rate = agree / max(len(pairs), 1)
        checks.append(
            Check(
                "tokens",
                "greedy token ids identical",
                rate,
                tol["min_greedy_agreement"],
                rate >= tol["min_greedy_agreement"],
                f"{agree}/{len(pairs)} sentences",
                variant,
            )
        )
        bundle_bleu = bleu([g.hypotheses[0] for g in got], refs)
        drop = torch_bleu - bundle_bleu
        checks.append(
            Check(
                "text",
                "BLEU drop (torch - bundle)",
                drop,
                tol["max_bleu_drop"],
                drop <= tol["max_bleu_drop"] + 1e-9,
                f"torch {torch_bleu:.2f}, bundle {bundle_bleu:.2f}",
                variant,
            )
        )
    return checks
