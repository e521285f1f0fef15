"""ModelSpec: what planning a search needs of a bundle, read once at load and frozen.

A translation's limits (each source's maximum decoding length), its forced end token and the candidates a
step takes from the graph's TopK depend only on the bundle and the options, never on the Translator's
state: runtime/plan.py computes them here, once per call, from values read once per bundle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .options import SearchOptions
from .search import candidates_needed


@dataclass(frozen=True)
class ModelSpec:
    """The model's sizes, special ids and decoding defaults (bundle.json's model, special_ids, decoding).

    Attributes:
        n_layers, n_heads, head_dim: the decoder's layers, attention heads and head size.
        max_positions: the positional table's length: no source or decoding is longer.
        src_vocab, tgt_vocab: the vocabularies' sizes.
        pad_id, eos_id, start_id: the padding, end and decoder start ids.
        max_length_a, max_length_b: a source of n ids decodes at most a x n + b tokens (bundle.json's).
        forced_eos: the end token is forced at the last allowed step (transformers' forced_eos_token_id).
        beam_convention: the beam search's convention (docs/decoding.md).
        top_k_from_graph: steps return the graph's TopK candidates, not every log-probability.
    """

    n_layers: int
    n_heads: int
    head_dim: int
    max_positions: int
    src_vocab: int
    tgt_vocab: int
    pad_id: int
    eos_id: int
    start_id: int
    max_length_a: float
    max_length_b: int
    forced_eos: bool
    beam_convention: str
    top_k_from_graph: bool = True

    @classmethod
    def of_bundle(cls, bundle, top_k_from_graph: bool = True) -> "ModelSpec":
        """The spec of a read Bundle (runtime/bundle.py), its fields checked there already."""
        cfg, ids, decoding = bundle.model, bundle.special_ids, bundle.decoding
        return cls(
            n_layers=cfg["n_decoder_layers"],
            n_heads=cfg["n_heads"],
            head_dim=cfg.get("d_kv") or cfg["d_model"] // cfg["n_heads"],  # d_kv: T5's own head size
            max_positions=cfg["max_positions"],
            src_vocab=cfg["src_vocab_size"],
            tgt_vocab=cfg["tgt_vocab_size"],
            pad_id=ids["pad"],
            eos_id=ids["eos"],
            start_id=ids["decoder_start"],
            max_length_a=decoding["max_length_a"],
            max_length_b=decoding["max_length_b"],
            forced_eos=bool(decoding.get("forced_eos")),
            beam_convention=decoding.get("beam_convention", "fairseq"),
            top_k_from_graph=top_k_from_graph,
        )

    def max_lengths(self, sources: list[list[int]], options: SearchOptions) -> np.ndarray:
        """Returns each source's maximum decoding length (int64): options' max_decoding_length, else
        max_length_a x its ids + max_length_b, at most max_positions."""
        if options.max_decoding_length is not None:
            return np.full(len(sources), options.max_decoding_length, dtype=np.int64)
        a, b = self.max_length_a, self.max_length_b
        return np.array([min(int(a * len(s)) + b, self.max_positions) for s in sources], dtype=np.int64)

    def forced_end(self, max_lengths) -> dict:
        """force_prefix's end-token options (runtime/prefix.py): the end token at each sentence's last
        allowed step where forced_eos, else {}."""
        return {"end_id": self.eos_id, "max_lengths": max_lengths} if self.forced_eos else {}

    def step_top_k(self, beam_size: int, min_length: int) -> int | None:
        """Candidates per row a step takes from the graph's TopK (beam_size 1: greedy; None: all of them)."""
        if not self.top_k_from_graph:
            return None
        return min(candidates_needed(beam_size, min_length, greedy=beam_size == 1), self.tgt_vocab)
