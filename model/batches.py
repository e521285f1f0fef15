"""Training examples as tensors: text pairs encoded to ids, and a batch of them padded, with the
teacher-forced decoder input (start + target) and output (target + end)."""

from __future__ import annotations

import torch

from .config import ModelConfig
from .tokenizer import Tokenizer


def encode_pairs(tok: Tokenizer, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """Returns (source ids with end token, target ids) for each (source, target) text pair, in order.

    Args:
        tok: the tokenizer.
        pairs: the text pairs.
    """
    return [(tok.encode_source(s), tok.encode_target(t)) for s, t in pairs]


def make_batch(examples, indices, cfg: ModelConfig, device):
    """Returns a padded batch (src, src_mask, tgt_in, tgt_out): tgt_in = start + y, tgt_out = y + end.

    Args:
        examples (list[tuple[list[int], list[int]]]): (source ids, target ids) pairs.
        indices (list[int]): the examples of the batch.
        cfg: the model's config (pad, start and end ids).
        device (torch.device): where the tensors go.
    """
    rows = [examples[i] for i in indices]
    src_len = max(len(s) for s, _ in rows)
    tgt_len = max(len(t) for _, t in rows) + 1
    pad, start, end = cfg.pad_id, cfg.decoder_start_id, cfg.eos_id
    # padded as lists, one tensor each: a tensor and a copy per row cost more than the rest of the batch
    src = torch.tensor([s + [pad] * (src_len - len(s)) for s, _ in rows], dtype=torch.long)
    tgt_in = torch.tensor([[start, *t] + [pad] * (tgt_len - 1 - len(t)) for _, t in rows], dtype=torch.long)
    tgt_out = torch.tensor([[*t, end] + [pad] * (tgt_len - 1 - len(t)) for _, t in rows], dtype=torch.long)
    src, tgt_in, tgt_out = src.to(device), tgt_in.to(device), tgt_out.to(device)
    return src, src != cfg.pad_id, tgt_in, tgt_out
