"""The PyTorch reference search on a hand-made fake step with known answers (../shared/DECODING.md)."""
from __future__ import annotations

import math

import pytest
import torch

from model.search import Hypothesis, beam_search, greedy_search, translate_ids
from test_model import tiny_model

EOS, START, V = 3, 2, 8
NEG = -1e9


def table_step(table):
    """A step whose log-probabilities depend only on each row's last token: table[last] -> V values."""
    def step(tokens, cache_indices, t, state):
        rows = [table.get(int(tok), table["default"]) for tok in tokens[:, 0]]
        return torch.log_softmax(torch.tensor(rows, dtype=torch.float64), dim=-1), state
    return step


def logp(row, token):
    return torch.log_softmax(torch.tensor(row, dtype=torch.float64), dim=-1)[token].item()


# After START: token 4 (p high) or 5; after 4: EOS likely; after 5: 6 then EOS.
T = {
    START: [NEG, NEG, NEG, 0.0, 2.0, 1.5, NEG, NEG],
    4: [NEG, NEG, NEG, 2.0, NEG, NEG, 0.9, NEG],
    5: [NEG, NEG, NEG, NEG, NEG, NEG, 3.0, NEG],
    6: [NEG, NEG, NEG, 3.0, NEG, NEG, NEG, 0.0],
    7: [NEG, NEG, NEG, 3.0, NEG, NEG, NEG, 0.0],
    "default": [0.0] * V,
}


def test_scores_are_sums_of_log_probs_with_the_end_token():
    (best,) = beam_search(table_step(T), None, beam_size=2, start_id=START, eos_id=EOS, max_length=6)
    expected = {
        (4, EOS): logp(T[START], 4) + logp(T[4], EOS),
        (5, 6, EOS): logp(T[START], 5) + logp(T[5], 6) + logp(T[6], EOS),
    }
    assert tuple(best.tokens) in expected
    assert best.score == pytest.approx(expected[tuple(best.tokens)], abs=1e-12)


def test_length_penalty_changes_the_ranking():
    short = logp(T[START], 4) + logp(T[4], EOS)
    long = logp(T[START], 5) + logp(T[5], 6) + logp(T[6], EOS)
    assert short > long and short / 2 < long / 3  # raw prefers short, normalised prefers long
    raw = beam_search(table_step(T), None, beam_size=2, start_id=START, eos_id=EOS, max_length=6,
                      length_penalty=0.0, num_hypotheses=2)
    norm = beam_search(table_step(T), None, beam_size=2, start_id=START, eos_id=EOS, max_length=6,
                       length_penalty=1.0, num_hypotheses=2)
    assert [h.tokens for h in raw] == [[4, EOS], [5, 6, EOS]]
    assert [h.tokens for h in norm] == [[5, 6, EOS], [4, EOS]]


def test_min_length_forbids_the_end_token():
    (h,) = beam_search(table_step(T), None, beam_size=2, start_id=START, eos_id=EOS, max_length=6, min_length=3,
                       length_penalty=0.0)
    assert len(h.tokens) >= 4 and h.tokens[-1] == EOS and EOS not in h.tokens[:-1]
    (g,) = greedy_search(table_step(T), None, rows=1, start_id=START, eos_id=EOS, max_length=6, min_length=2)
    assert g.tokens == [4, 6, EOS]


def test_end_token_outside_top_k_does_not_finish():
    # After START the end token ranks 3rd of 2K=4 candidates with K=2: not finished. Then
    # beams 4 and 5 continue; after each of them the end token is first: both finish.
    table = {START: [NEG, NEG, NEG, 1.0, 3.0, 2.0, 0.5, NEG], 4: [NEG, NEG, NEG, 2.0, NEG, NEG, 0.0, NEG],
             5: [NEG, NEG, NEG, 2.0, NEG, NEG, 0.0, NEG], "default": [0.0] * V}
    hyps = beam_search(table_step(table), None, beam_size=2, start_id=START, eos_id=EOS, max_length=5,
                       length_penalty=0.0, num_hypotheses=2)
    assert [h.tokens for h in hyps] == [[4, EOS], [5, EOS]]
    # with K=3 the end token after START ranks within the top 3: [EOS] alone finishes
    hyps3 = beam_search(table_step(table), None, beam_size=3, start_id=START, eos_id=EOS, max_length=5,
                        length_penalty=0.0, num_hypotheses=3)
    assert [EOS] in [h.tokens for h in hyps3]


def test_max_length_records_every_top_k_candidate():
    never_ends = {"default": [NEG, NEG, NEG, NEG, 1.0, 0.5, NEG, NEG]}
    hyps = beam_search(table_step(never_ends), None, beam_size=2, start_id=START, eos_id=EOS, max_length=3,
                       length_penalty=0.0, num_hypotheses=2)
    assert [h.tokens for h in hyps] == [[4, 4, 4], [4, 4, 5]]
    assert all(len(h.tokens) == 3 for h in hyps)


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="num_hypotheses"):
        beam_search(table_step(T), None, beam_size=2, start_id=START, eos_id=EOS, max_length=5, num_hypotheses=3)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(table_step(T), None, beam_size=0, start_id=START, eos_id=EOS, max_length=5)
    with pytest.raises(ValueError, match="min_length"):
        beam_search(table_step(T), None, beam_size=2, start_id=START, eos_id=EOS, max_length=5, min_length=5)


def test_beam_one_equals_greedy_on_a_random_model():
    model = tiny_model(seed=4)
    g = torch.Generator().manual_seed(9)
    sources = [torch.randint(4, 40, (n,), generator=g).tolist() + [EOS] for n in (3, 8, 5, 11, 2)]
    greedy = translate_ids(model, sources, beam_size=1, max_length=12)
    one_at_a_time = translate_ids(model, sources, beam_size=1, max_length=12, batch_size=1)
    beam1 = translate_ids(model, sources, beam_size=1, num_hypotheses=1, max_length=12)
    from model.search import model_step
    for s, hyp, alone in zip(sources, greedy, one_at_a_time):
        src = torch.tensor([s])
        step, state = model_step(model, src, src != 0)
        (b,) = beam_search(step, state, beam_size=1, start_id=START, eos_id=EOS, max_length=12)
        assert b.tokens == hyp[0].tokens == alone[0].tokens
        assert b.score == pytest.approx(hyp[0].score, abs=1e-5)
    assert [h[0].tokens for h in beam1] == [h[0].tokens for h in greedy]
