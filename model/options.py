"""The options of a training run (`seq2onnx train`'s flags), written into every checkpoint's state."""
from __future__ import annotations

from dataclasses import dataclass

from .corpus import DEFAULT_PAIRS


@dataclass
class TrainOptions:
    out: str  # run directory: step-*/ checkpoints and the `last`/`best` links
    data: str | None = None  # TSV corpus; None trains on the generated corpus
    valid_data: str | None = None  # TSV validation set (same columns); None: valid_size pairs of `data`
    src_col: int = 0
    tgt_col: int = 1
    skip_bad_lines: bool = False
    generated_pairs: int = DEFAULT_PAIRS
    valid_size: int = 500
    test_size: int = 500
    vocab_size: int = 1000
    joint_vocab: bool = False
    max_len: int = 64  # longest source or target in tokens kept for training
    d_model: int = 256
    n_heads: int = 4
    layers: int = 3
    d_ff: int = 1024
    dropout: float = 0.1
    pre_norm: bool = False
    tie_embeddings: bool = True
    max_tokens: int = 4096  # tokens per batch (padding included)
    lr: float = 1.0  # multiplies d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    warmup: int = 800
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    max_steps: int = 4000
    max_minutes: float | None = None  # stop early at this wall time (a checkpoint is written)
    eval_every: int = 500
    bleu_sentences: int = 200  # valid sentences decoded for BLEU at each evaluation
    seed: int = 1
    device: str = "auto"
    resume: bool = False
    force: bool = False
    progress: bool = True


class TrainError(ValueError):
    """A training run that cannot start: the message names the problem and the fix."""
