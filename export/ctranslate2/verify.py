"""`verify` of a CTranslate2 model directory (`seq2onnx export --format ctranslate2`) against its checkpoint.

CTranslate2 is driven exactly as the directory's seq2onnx-ct2.json tells a deployment to drive it
(its SentencePiece models, the end token appended, its translate_batch options, each sentence's
own max_decoding_length) and compared on token ids with the PyTorch reference search
(model/search.py), greedy and beam K (the decoding defaults, K = 4). Greedy must agree on every
sentence. Beam K must agree on MIN_BEAM_AGREEMENT of them: CTranslate2 computes in another order
(its own GEMM and softmax), and beam search ranks 2K candidates by float sums at every step, so a
candidate tied to within float noise may go either way.

Every difference is shown with both hypotheses scored by both engines (differences.py): engines
that compute differently, a near-tie, or searches that differ. The bounds are there to catch the
first and the last.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from seq2onnx.export.ctranslate2.convert import (
    load_ct2,
    DEPLOY_FORMAT,
    DEPLOY_FORMAT_VERSION,
    DEPLOY_JSON,
    deploy_recipe,
    max_decoding_length,
)
from seq2onnx.export.ctranslate2.differences import TIE, describe_difference

MIN_GREEDY_AGREEMENT = 1.0  # greedy: identical token ids on every sentence
MIN_BEAM_AGREEMENT = 0.995  # beam K: identical on >= 99.5% (near-ties may flip, see above)
SHOWN = 10  # differences printed per search (--json has them all)


def read_recipe(model_dir: Path) -> dict:
    """Reads the directory's DEPLOY_JSON.

    Args:
        model_dir: the CTranslate2 model directory.

    Returns:
        The recipe.

    Raises:
        ValueError: naming the fix, when it is missing or not ours (another format or version).
    """
    path = model_dir / DEPLOY_JSON
    if not path.is_file():
        raise ValueError(
            f"{model_dir} has a CTranslate2 model.bin but no {DEPLOY_JSON}: it was not written by "
            "`seq2onnx export --format ctranslate2`; export it again with that command"
        )
    recipe = json.loads(path.read_text())
    if recipe.get("format") != DEPLOY_FORMAT or recipe.get("format_version") != DEPLOY_FORMAT_VERSION:
        raise ValueError(
            f"{path}: format {recipe.get('format')!r} version {recipe.get('format_version')!r}; this "
            f"seq2onnx reads {DEPLOY_FORMAT!r} version {DEPLOY_FORMAT_VERSION}: export the model again"
        )
    return recipe


def ct2_device(device: str) -> str:
    """Resolves verify's --device for ctranslate2.

    Args:
        device: "auto", "cpu" or "cuda".

    Returns:
        The device; auto is cuda where ctranslate2 sees a GPU, else cpu.
    """
    import ctranslate2

    if device == "auto":
        return "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
    return device


def ct2_search(
    translator, pieces: list[list[str]], limits: list[int], options: dict, beam_size: int, piece_to_id
) -> list[tuple[list[int], float]]:
    """Finds CTranslate2's best hypothesis per sentence.

    Sentences of one max_decoding_length share a call: CTranslate2 takes one limit per call, and a
    beam search cut at another sentence's limit is not the search at its own.

    Args:
        translator (ctranslate2.Translator): the model.
        pieces: each sentence's source pieces.
        limits: each sentence's max_decoding_length.
        options: the recipe's translate_batch options.
        beam_size: overrides the options' beam size.
        piece_to_id (Callable[[str], int]): the target vocabulary.

    Returns:
        Per sentence (token ids with the end token when produced, its own score, normalised by
        len^length_penalty).
    """
    found: list[tuple[list[int], float] | None] = [None] * len(pieces)
    for limit in sorted(set(limits)):
        rows = [i for i, n in enumerate(limits) if n == limit]
        results = translator.translate_batch(
            [pieces[i] for i in rows],
            **{**options, "beam_size": beam_size},
            max_decoding_length=limit,
            return_end_token=True,
            return_scores=True,
            max_batch_size=32,
        )
        for i, r in zip(rows, results):
            found[i] = ([piece_to_id(p) for p in r.hypotheses[0]], float(r.scores[0]))
    return found  # type: ignore[return-value]


def verify_ct2(
    ckpt: str | Path,
    model_dir: str | Path,
    *,
    sentences: int = 100,
    device: str = "cpu",
    data: str | None = None,
    src_col: int = 0,
    tgt_col: int = 1,
) -> dict:
    """Checks greedy and beam search of the CTranslate2 model against the PyTorch reference on the test split.

    Args:
        ckpt: the checkpoint (or run) directory.
        model_dir: the CTranslate2 model directory.
        sentences: test sentences.
        device: "auto", "cpu" or "cuda" (ct2_device).
        data, src_col, tgt_col: a TSV of sentences instead of the test split.

    Returns:
        The report (report.format_ct2_report prints it; `passed` is the verdict).

    Raises:
        ValueError: a directory without a readable recipe.
        ImportError: without ctranslate2.
        ExportError: model.bin missing or unreadable.
        CheckpointError: a bad checkpoint.
    """
    import ctranslate2

    model_dir = Path(model_dir)
    run = _inputs(ckpt, model_dir, sentences, data, src_col, tgt_col)
    device = ct2_device(device)
    # As many threads as PyTorch's side: CTranslate2's default (4 OpenMP threads, which spin) made
    # one-sentence calls 70x slower on the loaded 2-core machine this was written on.
    translator = load_ct2(
        model_dir, device=device, compute_type="float32", intra_threads=torch.get_num_threads()
    )
    checks, measurements, differences = _compare_searches(run, translator)
    return {
        "format": "ctranslate2",
        "model_dir": str(model_dir),
        "checkpoint": str(run.ckpt_dir),
        "engine": f"CTranslate2 {ctranslate2.__version__}",
        "device": device,
        "compute_type": "float32",
        "sentences": len(run.pairs),
        "options": {**run.convention, "max_decoding_length": run.rule},
        "tie": TIE,
        "recipe_changes": run.recipe_changes,
        "passed": all(c["passed"] for c in checks),
        "checks": checks,
        "measurements": measurements,
        "differences": differences,
    }


def _recipe_changes(recipe: dict, reference: dict) -> list[str]:
    """Where the directory's recipe departs from the convention, one phrase each."""
    return [
        f"{part}.{key} {recipe[part].get(key)!r} (the convention: {want!r})"
        for part in ("source", "translate_batch", "max_decoding_length")
        for key, want in reference[part].items()
        if key not in ("how", "rule") and recipe.get(part, {}).get(key) != want
    ]


@dataclass
class _Inputs:
    """What both engines are fed, and how each is driven."""

    model: object
    tok: object
    ckpt_dir: Path
    recipe_changes: list[str]  # where the directory's recipe departs from the convention
    pairs: list[tuple[str, str]]  # (source, reference translation)
    srcs: list[list[int]]  # PyTorch's source ids (the checkpoint's tokenizer)
    pieces: list[list[str]]  # CTranslate2's source pieces (the directory's tokenizer)
    limits: list[int]  # each sentence's max_decoding_length (the recipe's rule)
    options: dict  # the recipe's translate_batch options (CTranslate2)
    convention: dict  # the convention's (PyTorch)
    rule: dict  # the convention's max_decoding_length rule
    piece_to_id: Callable[[str], int]  # the directory's target vocabulary


def _inputs(ckpt, model_dir: Path, sentences: int, data, src_col: int, tgt_col: int) -> _Inputs:
    """The checkpoint, the directory's recipe, and the sentences as each engine is fed them.

    PyTorch decodes by the project's convention (what export writes today); CTranslate2 as the
    directory's recipe says. An edited or stale recipe then shows as differences, and is named.
    What a deployment feeds CTranslate2 (from the directory's files) and what PyTorch is fed (from
    the checkpoint's): a tokenizer that differs from the checkpoint's shows as differences.
    """
    import sentencepiece as spm

    from seq2onnx.export.parity import test_sentences
    from seq2onnx.model import checkpoint

    recipe = read_recipe(model_dir)
    model, tok, ckpt_dir = checkpoint.load(ckpt)
    model.eval()
    reference = deploy_recipe(model, tok, ckpt_dir)
    pairs = test_sentences(ckpt_dir, sentences, data, src_col, tgt_col)
    source_spm = spm.SentencePieceProcessor(model_file=str(model_dir / recipe["source"]["tokenizer"]))
    target_spm = spm.SentencePieceProcessor(model_file=str(model_dir / recipe["target"]["tokenizer"]))
    pieces = [source_spm.encode(s, out_type=str) + recipe["source"]["append"] for s, _ in pairs]
    return _Inputs(
        model=model,
        tok=tok,
        ckpt_dir=ckpt_dir,
        recipe_changes=_recipe_changes(recipe, reference),
        pairs=pairs,
        srcs=[tok.encode_source(s)[: model.cfg.max_positions] for s, _ in pairs],
        pieces=pieces,
        limits=[max_decoding_length(recipe, len(p)) for p in pieces],
        options=recipe["translate_batch"],
        convention=reference["translate_batch"],
        rule=reference["max_decoding_length"],
        piece_to_id=target_spm.piece_to_id,
    )


def _compare_searches(run: _Inputs, translator) -> tuple[list[dict], list[dict], list[dict]]:
    """Greedy, and beam K where the convention's beam is K > 1: the checks, measurements, differences."""
    searches = {"greedy": 1}
    if run.convention["beam_size"] > 1:
        searches[f"beam {run.convention['beam_size']}"] = run.convention["beam_size"]
    checks, measurements, differences = [], [], []
    for name, beam in searches.items():
        check, measured, differ = _compare(run, translator, name, beam)
        checks.append(check)
        measurements += measured
        differences += differ
    return checks, measurements, differences


def _compare(run: _Inputs, translator, name: str, beam: int) -> tuple[dict, list[dict], list[dict]]:
    """One search on both engines: its check (identical token ids), measurements and differences."""
    from seq2onnx.model.search import translate_ids

    want = [
        h[0]
        for h in translate_ids(
            run.model,
            run.srcs,
            beam_size=beam,
            length_penalty=run.convention["length_penalty"],
            min_length=run.convention["min_decoding_length"],
            max_length_a=run.rule["a"],
            max_length_b=run.rule["b"],
        )
    ]
    got = ct2_search(translator, run.pieces, run.limits, run.options, beam, run.piece_to_id)
    same = [w.tokens == g for w, (g, _) in zip(want, got)]
    rate = sum(same) / max(len(run.pairs), 1)
    bound = MIN_GREEDY_AGREEMENT if beam == 1 else MIN_BEAM_AGREEMENT
    check = {
        "tier": "tokens",
        "search": name,
        "name": "token ids identical",
        "value": rate,
        "bound": bound,
        "passed": rate >= bound,
        "detail": f"{sum(same)}/{len(run.pairs)} sentences",
    }
    differences = [
        describe_difference(
            run.model,
            run.tok,
            translator,
            name,
            i,
            run.pairs[i][0],
            run.srcs[i],
            run.pieces[i],
            want[i].tokens,
            got[i][0],
            run.convention["length_penalty"],
        )
        for i, ok in enumerate(same)
        if not ok
    ]
    return check, _measurements(run, name, want, got, same), differences


def _measurements(run: _Inputs, name: str, want, got, same: list[bool]) -> list[dict]:
    """What is measured and decides nothing: the score difference where the ids agree, the BLEU drop."""
    from seq2onnx.model.metrics import bleu

    # CTranslate2 reports score / len^(its length_penalty): back to the sum of log-probabilities
    raw = [s * max(len(g), 1) ** run.options["length_penalty"] for g, s in got]
    score_diffs = [abs(w.score - r) for w, r, ok in zip(want, raw, same) if ok]
    refs = [t for _, t in run.pairs]
    torch_bleu = bleu([run.tok.decode_target(w.tokens) for w in want], refs)
    ct2_bleu = bleu([run.tok.decode_target(g) for g, _ in got], refs)
    return [
        {
            "tier": "score",
            "search": name,
            "name": "max |ct2 - torch| search score, same ids",
            "value": max(score_diffs, default=0.0),
            "detail": f"sum of log-probabilities, over {len(score_diffs)} sentences",
        },
        {
            "tier": "text",
            "search": name,
            "name": "BLEU drop (torch - ct2)",
            "value": torch_bleu - ct2_bleu,
            "detail": f"torch {torch_bleu:.2f}, ct2 {ct2_bleu:.2f}",
        },
    ]
