"""transformers' side of `seq2onnx verify MODEL_DIR BUNDLE`: generate()'s ids, our Translator's on the same
source ids, the reference log-probabilities along a target, and a hypothesis's score under them."""

from __future__ import annotations

import numpy as np
import torch

CHUNK = 32


def generate(
    hf,
    tok,
    texts: list[str],
    *,
    beams: int,
    max_length: int,
    forced: int | None,
    say,
    early_stopping: bool | str = True,
) -> list[list[int]]:
    """generate() on `texts` in chunks of CHUNK sentences, a progress line each (1000 sentences take minutes).

    early_stopping: generate()'s, for beams > 1: the one the bundle's beam_convention stands for
    (runtime/search.py's EARLY_STOPPING)."""
    extra = {"forced_bos_token_id": forced} if forced is not None else {}
    if beams > 1:  # transformers warns that these flags mean nothing to greedy search
        extra.update(early_stopping=early_stopping, length_penalty=1.0)
    rows: list[list[int]] = []
    for i in range(0, len(texts), CHUNK):
        say(
            f"tokens: transformers' {'greedy' if beams == 1 else f'beam-{beams}'} generate, {i}/{len(texts)} "
            "sentences"
        )
        enc = tok(texts[i : i + CHUNK], return_tensors="pt", padding=True)
        with torch.no_grad():
            rows.extend(
                hf.generate(**enc, num_beams=beams, do_sample=False, max_length=max_length, **extra).tolist()
            )
    return rows


def translate(
    translator, srcs: list[str], *, beams: int, max_length: int, options: dict, say, label: str
) -> list:
    """The bundle's search on `srcs` in chunks of CHUNK sentences, a progress line each."""
    got = []
    for i in range(0, len(srcs), CHUNK):
        say(
            f"tokens: the bundle's {'greedy' if beams == 1 else f'beam-{beams}'} search ({label} decoder), "
            f"{i}/{len(srcs)} sentences"
        )
        got.extend(
            translator.translate_batch(
                srcs[i : i + CHUNK],
                beam_size=beams,
                length_penalty=1.0,
                max_decoding_length=max_length,
                **options,
            )
        )
    return got


def language_text(tokens: dict, tok, target_lang: str | None) -> str:
    """The text transformers needs in front of a source for the target language, where the bundle puts it as a
    source token (Marian's >>fra<<: MarianTokenizer reads it from the text, the hosts from target_lang), else
    "".
    """
    if target_lang is None or tokens.get("target_lang_in") != "source_prefix":
        return ""
    return f"{tok.convert_ids_to_tokens(int(tokens['languages'][target_lang]))} "


def strip(ids: list[int], pad: int, eos: int) -> list[int]:
    """A generate() row as our token_ids: without the start token, the end token and the padding after it.

    A row without an end token ran to max_length, so it has no padding: pad tokens there were generated
    (T5's pad is its decoder start, which an untrained model predicts), and are kept as ours are.
    """
    ids = ids[1:]
    return ids[: ids.index(eos)] if eos in ids else ids


def log_probs(
    hf, enc_row: dict, decoder_input: list[int], suppressed: list[int], renormalize: bool
) -> np.ndarray:
    """transformers' float64 log-probabilities (T, V) along decoder_input as generate() scores them:
    suppressed ids (bad_words_ids) at -inf, the rest renormalised when generation_config's renormalize_logits
    says so.
    """
    with torch.no_grad():
        logits = hf(**enc_row, decoder_input_ids=torch.tensor([decoder_input])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    lp[:, suppressed] = float("-inf")
    return (torch.log_softmax(lp, dim=-1) if renormalize else lp).numpy()


def score(lp: np.ndarray, tokens: list[int], forced: int, eos: int, alpha: float) -> tuple[float, float]:
    """(sum of log-probs with the end token, normalised by len^alpha); forced prefix tokens add 0."""
    seq = tokens + [eos]
    total = sum(0.0 if t < forced else float(lp[t, tok]) for t, tok in enumerate(seq))
    return total, total / len(seq) ** alpha
