"""model/batches.py's make_batch: a teacher-forced batch, padded, start before and end after the target."""

from __future__ import annotations

import torch

from seq2onnx.model.batches import make_batch
from seq2onnx.model.config import ModelConfig


def test_a_batch_is_padded_and_shifted_for_teacher_forcing():
    cfg = ModelConfig(src_vocab_size=50, tgt_vocab_size=50, d_model=16, n_heads=2, d_ff=32)
    pad, start, end = cfg.pad_id, cfg.decoder_start_id, cfg.eos_id
    examples = [([7, 8, 9], [20]), ([10], []), ([11, 12], [21, 22, 23]), ([13], [24])]
    src, src_mask, tgt_in, tgt_out = make_batch(examples, [2, 0, 1], cfg, torch.device("cpu"))
    assert src.tolist() == [[11, 12, pad], [7, 8, 9], [10, pad, pad]]
    assert src_mask.tolist() == [[True, True, False], [True, True, True], [True, False, False]]
    assert tgt_in.tolist() == [[start, 21, 22, 23], [start, 20, pad, pad], [start, pad, pad, pad]]
    assert tgt_out.tolist() == [[21, 22, 23, end], [20, end, pad, pad], [end, pad, pad, pad]]
    assert {t.dtype for t in (src, tgt_in, tgt_out)} == {torch.long}
