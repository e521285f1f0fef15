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
    src_len = max(len(examples[i][0]) for i in indices)
    tgt_len = max(len(examples[i][1]) for i in indices) + 1
    src = torch.full((len(indices), src_len), cfg.pad_id, dtype=torch.long)
    tgt_in = torch.full((len(indices), tgt_len), cfg.pad_id, dtype=torch.long)
    tgt_out = torch.full((len(indices), tgt_len), cfg.pad_id, dtype=torch.long)
    for row, i in enumerate(indices):
        s, t = examples[i]
        src[row, : len(s)] = torch.tensor(s)
        tgt_in[row, : len(t) + 1] = torch.tensor([cfg.decoder_start_id] + t)
        tgt_out[row, : len(t) + 1] = torch.tensor(t + [cfg.eos_id])
    src, tgt_in, tgt_out = src.to(device), tgt_in.to(device), tgt_out.to(device)
    return src, src != cfg.pad_id, tgt_in, tgt_out
