"""`verify` of a CTranslate2 model directory (`seq2onnx export --format ctranslate2`) against its checkpoint.

CTranslate2 is driven exactly as the directory's seq2onnx-ct2.json tells a deployment to drive it
(its SentencePiece models, the end token appended, its translate_batch options, each sentence's
own max_decoding_length) and compared on token ids with the PyTorch reference search
(model/search.py), greedy and beam K (the decoding defaults, K = 4). Greedy must agree on every
sentence. Beam K must agree on MIN_BEAM_AGREEMENT of them: CTranslate2 computes in another order
(its own GEMM and softmax), and beam search ranks 2K candidates by float sums at every step, so a
candidate tied to within float noise may go either way.

Every difference is shown with both hypotheses scored by both engines under teacher forcing
(PyTorch's forward, CTranslate2's score_batch: one scale for both), the gap of their normalised
scores and the log-probabilities of the two tokens where they first part. Engines that disagree
on the same tokens compute differently (weights, tokenizer, source); engines that agree, with a
deciding gap of float noise (<= TIE), met a near-tie; engines that agree with a wide gap searched
differently (options, convention). The bounds are there to catch the first and the last.
"""

from __future__ import annotations

import json
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

MIN_GREEDY_AGREEMENT = 1.0  # greedy: identical token ids on every sentence
MIN_BEAM_AGREEMENT = 0.995  # beam K: identical on >= 99.5% (near-ties may flip, see above)
# nats: a gap at most this is float noise (a near-tie), and so is a difference between the engines'
# log-probabilities of the same token (measured: at most 5.3e-6 on the tests' tiny model)
TIE = 1e-3
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


@torch.no_grad()
def token_log_probs(model, src: list[int], tokens: list[int]) -> list[float]:
    """Scores tokens under the PyTorch model by teacher forcing: log p(tokens[t] | source, tokens[:t]).

    In fp32 as decode_step computes them, summed by the caller in float64 as the search does.

    Args:
        model (Transformer): the model.
        src: the source ids.
        tokens: the hypothesis' ids.

    Returns:
        One log-probability per token; [] for no tokens.
    """
    if not tokens:
        return []
    cfg = model.cfg
    src_t = torch.tensor([src])
    tgt_in = torch.tensor([[cfg.decoder_start_id] + tokens[:-1]])
    logits = model(src_t, src_t != cfg.pad_id, tgt_in)[0]  # (T, V)
    log_probs = torch.log_softmax(logits.float(), dim=-1).double()
    return log_probs[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()


def ct2_token_log_probs(
    translator, pieces: list[str], tokens: list[int], id_to_piece, eos_id: int, max_positions: int
) -> list[float] | None:
    """Scores tokens under CTranslate2 (Translator.score_batch, which appends the end token itself).

    Args:
        translator (ctranslate2.Translator): the model.
        pieces: the source pieces.
        tokens: the hypothesis' ids, the end token included when produced.
        id_to_piece (Callable[[int], str]): the target vocabulary.
        eos_id: the end token's id.
        max_positions: the model's positions.

    Returns:
        The same log-probabilities as token_log_probs; None for a hypothesis cut at the last
        position, which it cannot score.
    """
    ends = bool(tokens) and tokens[-1] == eos_id
    body = tokens[:-1] if ends else tokens
    if len(body) + 1 > max_positions:
        return None
    result = translator.score_batch([pieces], [[id_to_piece(t) for t in body]], max_input_length=0)[0]
    return list(result.log_probs)[: len(tokens)]


def describe_difference(
    model,
    tok,
    translator,
    search: str,
    index: int,
    source: str,
    src: list[int],
    pieces: list[str],
    want: list[int],
    got: list[int],
    length_penalty: float,
) -> dict:
    """Describes one sentence where the searches part: both hypotheses scored by both engines (teacher
    forcing).

    So a near-tie can be told from engines that compute differently or search differently.

    Args:
        model (Transformer): the PyTorch model.
        tok (Tokenizer): its tokenizer.
        translator (ctranslate2.Translator): the CTranslate2 model.
        search: "greedy" or "beam K".
        index: the sentence's index.
        source: its text.
        src: its ids (PyTorch's side).
        pieces: its pieces (CTranslate2's side).
        want: PyTorch's hypothesis.
        got: CTranslate2's hypothesis.
        length_penalty: alpha of the normalised scores.

    Returns:
        Both sides' scores, the first differing token, the gap, the engines' disagreement and the kind.
    """
    cfg = model.cfg

    def side(tokens: list[int]) -> dict:
        by_torch = token_log_probs(model, src, tokens)
        by_ct2 = ct2_token_log_probs(
            translator, pieces, tokens, tok.target.id_to_piece, cfg.eos_id, cfg.max_positions
        )
        norm = max(len(tokens), 1) ** length_penalty
        return {
            "tokens": tokens,
            "text": tok.decode_target(tokens),
            "length": len(tokens),
            "torch_log_probs": by_torch,
            "ct2_log_probs": by_ct2,
            "torch_score": float(sum(by_torch)),
            "torch_normalized": float(sum(by_torch)) / norm,
            "ct2_score": None if by_ct2 is None else float(sum(by_ct2)),
            "ct2_normalized": None if by_ct2 is None else float(sum(by_ct2)) / norm,
        }

    torch_side, ct2_side = side(want), side(got)
    # How far the engines' own log-probabilities of the same tokens lie apart: float noise, or not.
    pairs = [
        (x, y)
        for h in (torch_side, ct2_side)
        if h["ct2_log_probs"] is not None
        for x, y in zip(h["torch_log_probs"], h["ct2_log_probs"])
    ]
    disagreement = max((abs(x - y) for x, y in pairs), default=0.0)
    first = next((t for t, (x, y) in enumerate(zip(want, got)) if x != y), None)
    first_difference = None
    if first is not None:  # the same prefix before it: both tokens from one distribution per engine
        lp = lambda h, engine: None if h[f"{engine}_log_probs"] is None else h[f"{engine}_log_probs"][first]
        first_difference = {
            "position": first,
            "torch_piece": tok.target.id_to_piece(want[first]),
            "ct2_piece": tok.target.id_to_piece(got[first]),
            "torch_gap": lp(torch_side, "torch") - lp(ct2_side, "torch"),
        }
        if lp(torch_side, "ct2") is not None and lp(ct2_side, "ct2") is not None:
            first_difference["ct2_gap"] = lp(torch_side, "ct2") - lp(ct2_side, "ct2")
    gap = torch_side["torch_normalized"] - ct2_side["torch_normalized"]
    # Greedy parts where the two argmaxes part, so the gap of those two tokens decides; beam search
    # ranks finished hypotheses by their normalised scores, so the gap of those decides.
    decisive = (
        gap if search != "greedy" else None if first_difference is None else first_difference["torch_gap"]
    )
    if disagreement > TIE:
        kind = f"the engines' log-probabilities differ by up to {disagreement:.1e}: they compute differently"
    elif decisive is not None and abs(decisive) <= TIE:
        kind = "near-tie"
    else:
        kind = "NOT a near-tie; same log-probabilities, so the searches differ: options or convention" + (
            "" if search == "greedy" else ", or a tie among pruned candidates"
        )
    return {
        "search": search,
        "index": index,
        "source": source,
        "torch": torch_side,
        "ct2": ct2_side,
        "first_difference": first_difference,
        "gap": gap,
        "engine_disagreement": disagreement,
        "near_tie": kind == "near-tie",
        "kind": kind,
    }


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
    import sentencepiece as spm

    from seq2onnx.export.parity import test_sentences
    from seq2onnx.model import checkpoint
    from seq2onnx.model.search import translate_ids
    from seq2onnx.model.metrics import bleu

    model_dir = Path(model_dir)
    recipe = read_recipe(model_dir)
    model, tok, ckpt_dir = checkpoint.load(ckpt)
    model.eval()
    cfg = model.cfg
    # PyTorch decodes by the project's convention (what export writes today); CTranslate2 as the
    # directory's recipe says. An edited or stale recipe then shows as differences, and is named.
    reference = deploy_recipe(model, tok, ckpt_dir)
    recipe_changes = [
        f"{part}.{key} {recipe[part].get(key)!r} (the convention: {want!r})"
        for part in ("source", "translate_batch", "max_decoding_length")
        for key, want in reference[part].items()
        if key not in ("how", "rule") and recipe.get(part, {}).get(key) != want
    ]
    pairs = test_sentences(ckpt_dir, sentences, data, src_col, tgt_col)
    source_spm = spm.SentencePieceProcessor(model_file=str(model_dir / recipe["source"]["tokenizer"]))
    target_spm = spm.SentencePieceProcessor(model_file=str(model_dir / recipe["target"]["tokenizer"]))
    # What a deployment feeds CTranslate2 (from the directory's files) and what PyTorch is fed (from
    # the checkpoint's): a tokenizer that differs from the checkpoint's shows as differences.
    pieces = [source_spm.encode(s, out_type=str) + recipe["source"]["append"] for s, _ in pairs]
    limits = [max_decoding_length(recipe, len(p)) for p in pieces]
    srcs = [tok.encode_source(s)[: cfg.max_positions] for s, _ in pairs]
    options, convention = recipe["translate_batch"], reference["translate_batch"]
    alpha = convention["length_penalty"]
    rule = reference["max_decoding_length"]
    device = ct2_device(device)
    # As many threads as PyTorch's side: CTranslate2's default (4 OpenMP threads, which spin) made
    # one-sentence calls 70x slower on the loaded 2-core machine this was written on.
    translator = load_ct2(
        model_dir, device=device, compute_type="float32", intra_threads=torch.get_num_threads()
    )
    refs = [t for _, t in pairs]

    searches = {"greedy": 1}
    if convention["beam_size"] > 1:
        searches[f"beam {convention['beam_size']}"] = convention["beam_size"]
    checks, measurements, differences = [], [], []
    for name, beam in searches.items():
        want = [
            h[0]
            for h in translate_ids(
                model,
                srcs,
                beam_size=beam,
                length_penalty=alpha,
                min_length=convention["min_decoding_length"],
                max_length_a=rule["a"],
                max_length_b=rule["b"],
            )
        ]
        got = ct2_search(translator, pieces, limits, options, beam, target_spm.piece_to_id)
        same = [w.tokens == g for w, (g, _) in zip(want, got)]
        rate = sum(same) / max(len(pairs), 1)
        bound = MIN_GREEDY_AGREEMENT if beam == 1 else MIN_BEAM_AGREEMENT
        checks.append(
            {
                "tier": "tokens",
                "search": name,
                "name": "token ids identical",
                "value": rate,
                "bound": bound,
                "passed": rate >= bound,
                "detail": f"{sum(same)}/{len(pairs)} sentences",
            }
        )
        # CTranslate2 reports score / len^(its length_penalty): back to the sum of log-probabilities
        raw = [s * max(len(g), 1) ** options["length_penalty"] for g, s in got]
        score_diffs = [abs(w.score - r) for w, r, ok in zip(want, raw, same) if ok]
        measurements.append(
            {
                "tier": "score",
                "search": name,
                "name": "max |ct2 - torch| search score, same ids",
                "value": max(score_diffs, default=0.0),
                "detail": f"sum of log-probabilities, over {len(score_diffs)} sentences",
            }
        )
        torch_bleu = bleu([tok.decode_target(w.tokens) for w in want], refs)
        ct2_bleu = bleu([tok.decode_target(g) for g, _ in got], refs)
        measurements.append(
            {
                "tier": "text",
                "search": name,
                "name": "BLEU drop (torch - ct2)",
                "value": torch_bleu - ct2_bleu,
                "detail": f"torch {torch_bleu:.2f}, ct2 {ct2_bleu:.2f}",
            }
        )
        for i, ok in enumerate(same):
            if not ok:
                differences.append(
                    describe_difference(
                        model,
                        tok,
                        translator,
                        name,
                        i,
                        pairs[i][0],
                        srcs[i],
                        pieces[i],
                        want[i].tokens,
                        got[i][0],
                        alpha,
                    )
                )
    return {
        "format": "ctranslate2",
        "model_dir": str(model_dir),
        "checkpoint": str(ckpt_dir),
        "engine": f"CTranslate2 {ctranslate2.__version__}",
        "device": device,
        "compute_type": "float32",
        "sentences": len(pairs),
        "options": {**convention, "max_decoding_length": rule},
        "tie": TIE,
        "recipe_changes": recipe_changes,
        "passed": all(c["passed"] for c in checks),
        "checks": checks,
        "measurements": measurements,
        "differences": differences,
    }
