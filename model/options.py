"""The options of a training run (`seq2onnx train`'s flags), written into every checkpoint's state."""

from __future__ import annotations

from dataclasses import dataclass

from .corpus import DEFAULT_PAIRS


@dataclass
class TrainOptions:
    """The options of one training run: `seq2onnx train`'s flags, kept in every checkpoint's state.

    Attributes:
        out: run directory: step-*/ checkpoints and the `last`/`best` links.
        data: TSV corpus; None trains on the generated corpus.
        valid_data: TSV validation set (same columns); None: valid_size pairs of `data`.
        src_col: 0-based column of the source text.
        tgt_col: 0-based column of the target text.
        skip_bad_lines: skip and count malformed lines instead of failing.
        generated_pairs: size of the generated corpus when `data` is None.
        valid_size: validation pairs held out of `data` (ignored with `valid_data`).
        test_size: test pairs held out of `data`.
        vocab_size: SentencePiece pieces per side.
        joint_vocab: one SentencePiece model for both sides.
        max_len: longest source or target in tokens kept for training.
        d_model: model width.
        n_heads: attention heads.
        layers: encoder and decoder layers each.
        d_ff: inner width of the feed-forward.
        dropout: dropout probability.
        pre_norm: pre-LN instead of the paper's post-LN.
        tie_embeddings: target embedding shared with the output projection.
        max_tokens: tokens per batch (padding included).
        lr: multiplies d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
        warmup: warm-up steps of the schedule.
        label_smoothing: label smoothing of the training loss.
        clip_norm: gradient norm clipping.
        max_steps: the step at which training stops.
        max_minutes: stop early at this wall time (a checkpoint is written); None: no limit.
        eval_every: steps between validation and checkpoints.
        bleu_sentences: valid sentences decoded for BLEU at each evaluation.
        seed: seed of the split, the shuffles and the initialisation.
        device: "auto", "cpu" or "cuda".
        resume: continue the run in `out` from its last checkpoint.
        force: replace an existing run in `out`.
        progress: show a progress bar.
    """

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
