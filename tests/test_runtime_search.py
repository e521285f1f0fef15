"""runtime/search.py alone (numpy, no onnxruntime): hand-made fake steps with known answers, and
token-for-token agreement with the PyTorch oracle (model/search.py) on random log-prob tables."""
from __future__ import annotations


import numpy as np
import pytest

from seq2onnx.runtime.search import TopK, beam_search, candidates_needed, greedy_search, sample, stream_greedy

START, EOS = 2, 3
NEG = -50.0  # "never" without -inf


class Fake:
    """A decoder whose log-probs are a function of (sentence, generated prefix).

    It follows rows through cache_indices and sentences through `keep`, checks that both are
    consistent with each other (rows grouped by sentence, beams contiguous), and records
    (t, rows, keep) of every call.
    """

    def __init__(self, fn, batch: int):
        self.fn, self.batch = fn, batch
        self.calls: list[tuple[int, int, list[int] | None]] = []
        self.rows_seen: list[list[tuple[int, tuple[int, ...]]]] = []  # (sentence, prefix) per row

    def step(self, tokens, cache_indices, t, keep):
        tokens = np.asarray(tokens)
        cache_indices = np.asarray(cache_indices)
        assert tokens.dtype == np.int64 and tokens.ndim == 2 and tokens.shape[1] == 1
        assert cache_indices.shape == (tokens.shape[0],)
        self.calls.append((t, tokens.shape[0], None if keep is None else [int(k) for k in keep]))
        if t == 0:
            assert keep is None
            assert (tokens[:, 0] == START).all()
            assert cache_indices.tolist() == list(range(self.batch))
            self.alive = list(range(self.batch))
            rows = [(s, ()) for s in self.alive]
        else:
            assert len(self.calls) == t + 1, "steps must come in order t = 0, 1, ..."
            prev = self.rows
            if keep is not None:
                assert len(keep) < len(self.alive) and list(keep) == sorted(set(int(k) for k in keep))
                self.alive = [self.alive[k] for k in keep]
            rows = [(prev[c][0], prev[c][1] + (int(tok),)) for c, tok in zip(cache_indices, tokens[:, 0])]
            # rows are grouped by the alive sentences, in order, with the same number of beams each
            beams = len(rows) // len(self.alive)
            assert beams * len(self.alive) == len(rows)
            assert [s for s, _ in rows] == [s for s in self.alive for _ in range(beams)]
        self.rows = rows
        self.rows_seen.append(rows)
        return np.stack([np.asarray(self.fn(s, p), dtype=np.float64) for s, p in rows])


def oracle_step(fn, sentence):
    """The same fake decoder as a step of model.search (torch tensors, state = row prefixes)."""
    import torch

    def step(tokens, cache_indices, t, state):
        if t == 0:
            prefixes = [()]
        else:
            prefixes = [state[int(c)] + (int(tok),) for c, tok in zip(cache_indices, tokens[:, 0])]
        lp = torch.tensor(np.stack([np.asarray(fn(sentence, p), dtype=np.float64) for p in prefixes]))
        return lp, prefixes

    return step


def random_fn(seed: int, vocab: int, *, ties: bool = False, eos_drift: float = 0.7):
    """Normalised log-probs from a seeded generator per (sentence, prefix); the end token grows
    likelier with length. ties=True draws logits from 3 values, so many log-probs are equal."""
    cache: dict = {}

    def fn(s, prefix):
        key = (s, prefix)
        if key not in cache:
            rng = np.random.default_rng([seed, s, len(prefix), *prefix])
            logits = rng.integers(0, 3, vocab).astype(np.float64) if ties else rng.normal(0, 1.5, vocab)
            logits[EOS] += eos_drift * (len(prefix) - 2)
            cache[key] = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
        return cache[key]

    return fn


def table_fn(tables: dict, vocab: int, default_best: int = EOS):
    """Hand-made log-probs by prefix; unlisted prefixes strongly prefer `default_best`."""

    def fn(s, prefix):
        table = tables.get((s, prefix), tables.get(prefix))
        if table is None:
            row = np.full(vocab, NEG)
            row[default_best] = -0.01
            return row
        row = np.full(vocab, NEG)
        for token, value in table.items():
            row[token] = value
        return row

    return fn


# -- greedy ----------------------------------------------------------------------------------------

def test_greedy_argmax_first_index_on_ties_and_score():
    fn = table_fn({(): {4: -0.5, 5: -0.5, EOS: -0.9}, (4,): {6: -0.25, EOS: -1.0}, (4, 6): {EOS: -0.125}}, 8)
    fake = Fake(fn, 1)
    [r] = greedy_search(fake.step, 1, start_id=START, eos_id=EOS, max_lengths=np.array([10]))
    assert r.hypotheses == [[4, 6, EOS]]  # 4 and 5 tie at t=0: the lower index wins
    assert r.scores == [pytest.approx(-0.875, abs=1e-12)]
    assert [c[0] for c in fake.calls] == [0, 1, 2]


def test_greedy_min_length_forbids_end_token():
    fn = table_fn({(): {EOS: -0.1, 5: -2.0, 6: -3.0}, (5,): {EOS: -0.1, 6: -1.0}, (5, 6): {EOS: -0.2}}, 8)
    [free] = greedy_search(Fake(fn, 1).step, 1, start_id=START, eos_id=EOS, max_lengths=np.array([10]))
    assert free.hypotheses == [[EOS]]
    [r] = greedy_search(Fake(fn, 1).step, 1, start_id=START, eos_id=EOS, max_lengths=np.array([10]), min_length=2)
    assert r.hypotheses == [[5, 6, EOS]]
    assert r.scores[0] == pytest.approx(-3.2)


def test_greedy_per_sentence_max_lengths_and_finished_rows_leave():
    fn = lambda s, p: np.array([NEG, NEG, NEG, -9.0, -0.1 - s, -0.2, -5.0, -6.0])  # never ends
    fake = Fake(fn, 3)
    res = greedy_search(fake.step, 3, start_id=START, eos_id=EOS, max_lengths=np.array([2, 4, 3]))
    assert [r.hypotheses for r in res] == [[[4, 4]], [[5, 5, 5, 5]], [[5, 5, 5]]]
    assert res[1].scores[0] == pytest.approx(-0.8)
    # rows: 3, 3, then sentence 0 leaves (keep [1, 2]), then sentence 2 leaves (keep [0] of [1, 2])
    assert fake.calls == [(0, 3, None), (1, 3, None), (2, 2, [1, 2]), (3, 1, [0])]


def test_greedy_end_token_finishes_each_sentence_on_its_own():
    # sentence s ends after s + 1 tokens
    fn = lambda s, p: np.where(np.arange(8) == (EOS if len(p) >= s + 1 else 4), -0.1, -3.0)
    fake = Fake(fn, 3)
    res = greedy_search(fake.step, 3, start_id=START, eos_id=EOS, max_lengths=np.array([20, 20, 20]))
    assert [r.hypotheses[0] for r in res] == [[4, EOS], [4, 4, EOS], [4, 4, 4, EOS]]
    assert [c[1] for c in fake.calls] == [3, 3, 2, 1]


# -- beam search: hand-made cases ------------------------------------------------------------------

def test_beam_end_token_outside_top_k_does_not_finish():
    # K=2. t=0: tokens 4 (-0.1), 5 (-0.2), EOS (-0.25, rank 2 of 2K: must not finish).
    fn = table_fn({(): {4: -0.1, 5: -0.2, EOS: -0.25, 6: -4.0}, (4,): {EOS: -0.1, 6: -3.0},
                   (5,): {EOS: -0.1, 6: -3.0}}, 8)
    [r] = beam_search(Fake(fn, 1).step, 1, beam_size=2, start_id=START, eos_id=EOS, max_lengths=np.array([10]),
                      length_penalty=0.0, num_hypotheses=2)
    # [EOS] alone (score -0.25) would rank second with alpha=0 had it finished
    assert r.hypotheses == [[4, EOS], [5, EOS]]
    assert r.scores == [pytest.approx(-0.2), pytest.approx(-0.3)]


def test_beam_length_penalty_changes_ranking_and_scores_include_end_token():
    # K=2: [EOS] finishes at t=0 (-1.0, len 1); [5, EOS] at t=1 (-1.15, len 2); [6, EOS] finds no room.
    fn = table_fn({(): {EOS: -1.0, 5: -1.1, 6: -3.0, 7: -9.0}, (5,): {EOS: -0.05, 7: -6.0},
                   (6,): {EOS: -0.05, 7: -6.0}}, 8)
    hyps = {}
    for alpha in (0.0, 0.6, 1.0):
        [r] = beam_search(Fake(fn, 1).step, 1, beam_size=2, start_id=START, eos_id=EOS,
                          max_lengths=np.array([10]), length_penalty=alpha, num_hypotheses=2)
        hyps[alpha] = r
    assert hyps[0.0].hypotheses == [[EOS], [5, EOS]]
    assert hyps[0.0].scores == [pytest.approx(-1.0), pytest.approx(-1.15)]
    # -1.15 / 2^0.6 = -0.759 > -1.0: the longer one wins from alpha 0.6 on
    assert hyps[0.6].hypotheses == [[5, EOS], [EOS]]
    assert hyps[1.0].hypotheses == [[5, EOS], [EOS]]
    assert hyps[1.0].scores == [pytest.approx(-1.15), pytest.approx(-1.0)]  # raw scores, not normalised
    # num_hypotheses=1 gives the best only
    [one] = beam_search(Fake(fn, 1).step, 1, beam_size=2, start_id=START, eos_id=EOS,
                        max_lengths=np.array([10]), length_penalty=1.0, num_hypotheses=1)
    assert one.hypotheses == [[5, EOS]]


def test_beam_max_length_records_top_k_as_finished_with_lower_flat_index_on_ties():
    # never ends: 4 costs -0.25, 5 costs -0.5 (exact binary fractions, so ties are exact)
    fn = lambda s, p: np.array([NEG, NEG, NEG, -20.0, -0.25, -0.5, -8.0, -9.0])
    fake = Fake(fn, 1)
    [r] = beam_search(fake.step, 1, beam_size=2, start_id=START, eos_id=EOS, max_lengths=np.array([3]),
                      length_penalty=1.0, num_hypotheses=2)
    # t=1: [4,5] and [5,4] tie at -0.75: [4,5] has the lower flat index (beam 0). t=2: [4,4,5] (beam 0)
    # beats [4,5,4] (beam 1), both -1.0.
    assert r.hypotheses == [[4, 4, 4], [4, 4, 5]]
    assert r.scores == [-0.75, -1.0]
    assert len(fake.calls) == 3


def test_beam_n_best_order_k4():
    # t=0 ranks: EOS -0.5 (finishes), 4 -0.6, 5 -0.7, 6 -0.8, 7 -0.9; then each prefix ends
    # with its own cost, so the finished list is known.
    ends = {4: -0.5, 5: -0.1, 6: -1.5, 7: -0.05}
    tables = {(): {EOS: -0.5, 4: -0.6, 5: -0.7, 6: -0.8, 7: -0.9}}
    for tok, cost in ends.items():
        tables[(tok,)] = {EOS: cost, 8: -7.0}
    fn = table_fn(tables, 10)
    [r] = beam_search(Fake(fn, 1).step, 1, beam_size=4, start_id=START, eos_id=EOS, max_lengths=np.array([10]),
                      length_penalty=0.0, num_hypotheses=4)
    # t=1 candidates: [5,E] -0.8, [7,E] -0.95, [4,E] -1.1, [6,E] -2.3, then non-ending -7.6...; room for 3
    assert r.hypotheses == [[EOS], [5, EOS], [7, EOS], [4, EOS]]
    assert r.scores == pytest.approx([-0.5, -0.8, -0.95, -1.1])


def test_beam_sentences_finish_on_their_own_and_leave_the_batch():
    # sentence 0 ends at once (top-K candidates at t=1 all end); sentence 1 never ends (max length 4)
    def fn(s, p):
        row = np.full(8, -6.0)
        if s == 0:
            row[EOS] = -0.1 if p else -6.5
            row[4], row[5] = (-3.0, -3.5) if p else (-0.2, -0.3)
        else:
            row[EOS] = NEG
            row[4 + len(p) % 3] = -0.1
        return row

    fake = Fake(fn, 2)
    res = beam_search(fake.step, 2, beam_size=2, start_id=START, eos_id=EOS, max_lengths=np.array([4, 4]),
                      length_penalty=1.0, num_hypotheses=2)
    rows = [c[1] for c in fake.calls]
    keeps = [c[2] for c in fake.calls]
    assert rows == [2, 4, 2, 2]  # 1 beam per sentence, then 2, then sentence 0's rows are gone
    assert keeps == [None, None, [1], None]
    alone = [beam_search(Fake(lambda _, p, s=s: fn(s, p), 1).step, 1, beam_size=2, start_id=START, eos_id=EOS,
                         max_lengths=np.array([4]), length_penalty=1.0, num_hypotheses=2)[0] for s in (0, 1)]
    assert [r.hypotheses for r in res] == [r.hypotheses for r in alone]
    assert [r.scores for r in res] == [r.scores for r in alone]
    assert all(h[-1] == EOS for h in res[0].hypotheses) and all(len(h) == 4 for h in res[1].hypotheses)


def test_search_argument_errors():
    fn = random_fn(0, 6)
    kw = dict(start_id=START, eos_id=EOS)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(Fake(fn, 1).step, 1, beam_size=0, max_lengths=np.array([5]), **kw)
    with pytest.raises(ValueError, match="num_hypotheses"):
        beam_search(Fake(fn, 1).step, 1, beam_size=2, num_hypotheses=3, max_lengths=np.array([5]), **kw)
    with pytest.raises(ValueError, match="min_decoding_length"):
        beam_search(Fake(fn, 1).step, 1, beam_size=2, min_length=5, max_lengths=np.array([5]), **kw)
    with pytest.raises(ValueError, match="min_decoding_length"):
        greedy_search(Fake(fn, 1).step, 1, min_length=-1, max_lengths=np.array([5]), **kw)
    with pytest.raises(ValueError, match="max_decoding_length"):
        greedy_search(Fake(fn, 1).step, 1, max_lengths=np.array([0]), **kw)
    with pytest.raises(ValueError, match="vocabulary"):  # 2K = 8 candidates from 6 tokens
        beam_search(Fake(fn, 1).step, 1, beam_size=4, max_lengths=np.array([5]), **kw)


# -- beam search against the oracle ----------------------------------------------------------------

def _oracle(fn, batch, *, k, alpha, min_length, max_lengths):
    from seq2onnx.model.search import beam_search as torch_beam

    out = []
    for s in range(batch):
        hyps = torch_beam(oracle_step(fn, s), None, beam_size=k, start_id=START, eos_id=EOS,
                          max_length=int(max_lengths[s]), min_length=min_length, length_penalty=alpha,
                          num_hypotheses=k)
        out.append(([h.tokens for h in hyps], [h.score for h in hyps]))
    return out


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("ties", [False, True])
def test_beam_equals_torch_oracle(k, batch, ties):
    vocab = 9
    checked = finished_early = 0
    for seed in range(4):
        fn = random_fn(seed * 10 + k, vocab, ties=ties)
        max_lengths = np.array([7, 4, 9][:batch]) if seed % 2 else np.array([6] * batch)
        for alpha in (0.0, 0.6, 1.0, 2.0):
            for min_length in (0, 2):
                fake = Fake(fn, batch)
                got = beam_search(fake.step, batch, beam_size=k, start_id=START, eos_id=EOS, max_lengths=max_lengths,
                                  min_length=min_length, length_penalty=alpha, num_hypotheses=k)
                want = _oracle(fn, batch, k=k, alpha=alpha, min_length=min_length, max_lengths=max_lengths)
                for s, (r, (tokens, scores)) in enumerate(zip(got, want)):
                    assert r.hypotheses == tokens, (seed, alpha, min_length, s)
                    assert len(r.scores) == len(scores) == k
                    assert np.allclose(r.scores, scores, rtol=0, atol=1e-9), (seed, alpha, min_length, s)
                    # scores are the sums of the fake's log-probs along each hypothesis, end token included
                    for h, sc in zip(r.hypotheses, r.scores):
                        assert sum(fn(s, tuple(h[:i]))[h[i]] for i in range(len(h))) == pytest.approx(sc, abs=1e-9)
                        assert len(h) <= max_lengths[s] and (EOS not in h[:min_length])
                    checked += 1
                finished_early += any(c[2] is not None for c in fake.calls)
    assert checked == 4 * 4 * 2 * batch
    if batch > 1:
        assert finished_early > 0  # the batch shrank at least once: `keep` was exercised


def test_beam_one_equals_greedy_and_greedy_equals_oracle():
    from seq2onnx.model.search import greedy_search as torch_greedy

    for seed in range(6):
        fn = random_fn(100 + seed, 7, ties=seed % 2 == 1)
        max_lengths = np.array([8, 3, 6, 10])
        for min_length in (0, 2):
            greedy = greedy_search(Fake(fn, 4).step, 4, start_id=START, eos_id=EOS, max_lengths=max_lengths,
                                   min_length=min_length)
            beam = beam_search(Fake(fn, 4).step, 4, beam_size=1, start_id=START, eos_id=EOS, max_lengths=max_lengths,
                               min_length=min_length, length_penalty=1.0)
            assert [g.hypotheses for g in greedy] == [b.hypotheses for b in beam]
            assert np.allclose([g.scores for g in greedy], [b.scores for b in beam], rtol=0, atol=1e-9)
            for s in range(4):
                [h] = torch_greedy(oracle_step(fn, s), None, rows=1, start_id=START, eos_id=EOS,
                                   max_length=int(max_lengths[s]), min_length=min_length)
                assert greedy[s].hypotheses == [h.tokens]
                assert greedy[s].scores[0] == pytest.approx(h.score, abs=1e-9)


# -- sampling --------------------------------------------------------------------------------------

def _sample(fn, batch, **kw):
    kw.setdefault("max_lengths", np.full(batch, 8))
    return sample(Fake(fn, batch).step, batch, start_id=START, eos_id=EOS, **kw)


def test_sample_reproducible_with_seed_and_seed_matters():
    fn = random_fn(7, 10, eos_drift=0.3)
    a = _sample(fn, 20, seed=5)
    b = _sample(fn, 20, seed=5)
    c = _sample(fn, 20, seed=6)
    assert [r.hypotheses for r in a] == [r.hypotheses for r in b]
    assert [r.scores for r in a] == [r.scores for r in b]
    assert [r.hypotheses for r in a] != [r.hypotheses for r in c]
    greedy = greedy_search(Fake(fn, 20).step, 20, start_id=START, eos_id=EOS, max_lengths=np.full(20, 8))
    assert [r.hypotheses for r in a] != [r.hypotheses for r in greedy]  # it does sample
    for s, r in enumerate(a):  # scores: the model's log-probs of the sampled tokens
        h = r.hypotheses[0]
        assert r.scores[0] == pytest.approx(sum(fn(s, tuple(h[:i]))[h[i]] for i in range(len(h))))


def test_sample_top_k_one_and_cold_temperature_equal_greedy():
    fn = random_fn(8, 10)
    greedy = greedy_search(Fake(fn, 10).step, 10, start_id=START, eos_id=EOS, max_lengths=np.full(10, 8))
    for kw in (dict(top_k=1), dict(temperature=1e-4), dict(top_p=1e-9)):
        got = _sample(fn, 10, seed=1, **kw)
        assert [r.hypotheses for r in got] == [r.hypotheses for r in greedy], kw
        assert np.allclose([r.scores for r in got], [r.scores for r in greedy])


def test_sample_top_k_and_top_p_restrict_the_support():
    fn = random_fn(9, 12, eos_drift=0.2)
    seen_rank = {}
    for name, kw in (("top_k", dict(top_k=3)), ("top_p", dict(top_p=0.5))):
        ranks = []
        for seed in range(5):
            for s, r in enumerate(_sample(fn, 20, seed=seed, **kw)):
                h = r.hypotheses[0]
                for i, tok in enumerate(h):
                    lp = fn(s, tuple(h[:i]))
                    order = np.argsort(-lp, kind="stable")
                    rank = int(np.flatnonzero(order == tok)[0])
                    ranks.append(rank)
                    if name == "top_k":
                        assert rank < 3
                    else:  # the mass of the tokens before it is below top_p
                        assert np.exp(lp[order[:rank]]).sum() < 0.5 + 1e-12
        seen_rank[name] = max(ranks)
    assert seen_rank["top_k"] == 2  # the restriction is not stricter than asked
    unrestricted = [r.hypotheses[0][0] for seed in range(5) for r in _sample(fn, 20, seed=seed)]
    assert len(set(unrestricted)) > 3


def test_sample_frequencies_follow_the_distribution():
    probs = np.array([0.0, 0.0, 0.0, 0.1, 0.6, 0.3])  # EOS, 4, 5
    fn = lambda s, p: np.log(np.maximum(probs, 1e-300))
    res = _sample(fn, 4000, seed=0, max_lengths=np.full(4000, 1))
    first = np.array([r.hypotheses[0][0] for r in res])
    freq = np.array([(first == t).mean() for t in (EOS, 4, 5)])
    assert np.abs(freq - [0.1, 0.6, 0.3]).max() < 0.04
    # temperature 2 flattens it: p^(1/2) normalised
    res = _sample(fn, 4000, seed=0, max_lengths=np.full(4000, 1), temperature=2.0)
    first = np.array([r.hypotheses[0][0] for r in res])
    flat = np.sqrt([0.1, 0.6, 0.3]) / np.sqrt([0.1, 0.6, 0.3]).sum()
    assert np.abs(np.array([(first == t).mean() for t in (EOS, 4, 5)]) - flat).max() < 0.04
    # top_p 0.7 keeps {4, 5} (0.6 < 0.7), renormalised to 2/3, 1/3
    res = _sample(fn, 4000, seed=0, max_lengths=np.full(4000, 1), top_p=0.7)
    first = np.array([r.hypotheses[0][0] for r in res])
    assert (first != EOS).all() and abs((first == 4).mean() - 2 / 3) < 0.04


def test_sample_min_length():
    fn = lambda s, p: np.array([NEG, NEG, NEG, -0.01, -5.0, -5.5])
    for r in _sample(fn, 30, seed=3, min_length=3):
        assert len(r.hypotheses[0]) == 4 and r.hypotheses[0][-1] == EOS


@pytest.mark.parametrize("kw", [dict(temperature=0), dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5),
                                dict(top_k=-1)])
def test_sample_bad_arguments(kw):
    with pytest.raises(ValueError):
        _sample(random_fn(0, 6), 2, **kw)


def test_sample_top_k_one_equals_greedy_with_ties():
    fn = lambda s, p: np.array([NEG, NEG, NEG, -3.0, -0.5, -0.5, -4.0])  # 4 and 5 tie; never ends
    greedy = greedy_search(Fake(fn, 40).step, 40, start_id=START, eos_id=EOS, max_lengths=np.full(40, 3))
    got = _sample(fn, 40, seed=0, top_k=1, max_lengths=np.full(40, 3))
    assert [r.hypotheses for r in got] == [r.hypotheses for r in greedy]


def test_sample_checks_min_length_like_greedy():
    with pytest.raises(ValueError, match="min_decoding_length"):
        _sample(random_fn(0, 6), 2, min_length=9, max_lengths=np.full(2, 5))


def test_sample_top_k_beyond_vocabulary():
    try:
        res = _sample(random_fn(0, 6), 2, top_k=50, seed=0)
    except ValueError as e:
        assert "top_k" in str(e)
    else:
        assert res == _sample(random_fn(0, 6), 2, top_k=0, seed=0)


# -- streaming -------------------------------------------------------------------------------------

def test_stream_greedy_equals_greedy_without_end_token():
    for seed in range(8):
        fn = random_fn(200 + seed, 8, ties=seed % 3 == 0)
        for max_length, min_length in ((12, 0), (3, 0), (12, 2)):
            [g] = greedy_search(Fake(fn, 1).step, 1, start_id=START, eos_id=EOS, max_lengths=np.array([max_length]),
                                min_length=min_length)
            fake = Fake(fn, 1)
            streamed = list(stream_greedy(fake.step, start_id=START, eos_id=EOS, max_length=max_length,
                                          min_length=min_length))
            want = g.hypotheses[0][:-1] if g.hypotheses[0][-1] == EOS else g.hypotheses[0]
            assert streamed == want
            assert len(fake.calls) == len(g.hypotheses[0])  # no step beyond the end


def test_stream_greedy_is_lazy():
    fn = lambda s, p: np.array([NEG, NEG, NEG, -9.0, -0.1, -0.2])
    fake = Fake(fn, 1)
    it = stream_greedy(fake.step, start_id=START, eos_id=EOS, max_length=50)
    assert next(it) == 4 and len(fake.calls) == 1
    assert next(it) == 4 and len(fake.calls) == 2


def test_sample_of_a_sentence_does_not_depend_on_its_batch():
    """Each sentence draws from its own generator, keyed by (seed, row key): the same sentence
    (same key, same log-probs) gives the same sample alone and among others."""
    base = random_fn(11, 10, eos_drift=0.3)
    contents = [7, 3, 9, 12, 5]  # what each sentence "is": the fake decoder's sentence id and its key
    for seed in range(6):
        batch = sample(Fake(lambda s, p: base(contents[s], p), 5).step, 5, start_id=START, eos_id=EOS,
                       max_lengths=np.full(5, 8), seed=seed, row_keys=[[c] for c in contents])
        for s, c in enumerate(contents):
            [alone] = sample(Fake(lambda _, p, c=c: base(c, p), 1).step, 1, start_id=START, eos_id=EOS,
                             max_lengths=np.full(1, 8), seed=seed, row_keys=[[c]])
            assert alone.hypotheses == batch[s].hypotheses and alone.scores == batch[s].scores
    with pytest.raises(ValueError, match="row_keys"):
        sample(Fake(base, 2).step, 2, start_id=START, eos_id=EOS, max_lengths=np.full(2, 8), seed=0, row_keys=[[1]])


def _as_top_k(step, k: int):
    """The step as the decoder graph's TopK gives it: float32, the k best per row, sorted by
    (value desc, id asc) as ONNX TopK with sorted=1 breaks ties."""

    def top_k_step(tokens, cache_indices, t, keep):
        lp = np.asarray(step(tokens, cache_indices, t, keep), dtype=np.float32)
        ids = np.broadcast_to(np.arange(lp.shape[1]), lp.shape)
        order = np.lexsort((ids, -lp), axis=1)[:, :k]
        return TopK(np.take_along_axis(lp, order, axis=1), order.astype(np.int64), lp.shape[1])

    return top_k_step


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("min_length", [0, 2])
@pytest.mark.parametrize("beam", [1, 2, 4])
def test_top_k_steps_give_the_full_log_probs_results(ties, min_length, beam):
    """The graph's top-k candidates (the runtime's default) and the full log-probabilities give the
    same hypotheses and scores: greedy's column-0 fast path, the forbidden end token, ties."""
    batch, vocab, lengths = 3, 12, np.array([6, 9, 4])
    fn = random_fn(7, vocab, ties=ties)
    results = []
    for make in (lambda: full_step(fn, batch), lambda: _as_top_k(full_step(fn, batch), candidates_needed(beam, min_length))):
        step = make()
        kw = dict(start_id=START, eos_id=EOS, max_lengths=lengths, min_length=min_length)
        found = (greedy_search(step, batch, **kw) if beam == 1
                 else beam_search(step, batch, beam_size=beam, num_hypotheses=beam, **kw))
        results.append([(r.hypotheses, r.scores) for r in found])
    assert results[0] == results[1]
    assert any(len(h) > 1 for hyps, _ in results[0] for h in hyps)


def full_step(fn, batch):
    """The Fake decoder's step with float32 log-probabilities, as the graph computes them."""
    fake = Fake(fn, batch)
    return lambda *a: fake.step(*a).astype(np.float32)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("min_length", [0, 2])
@pytest.mark.parametrize("top_k", [False, True])
def test_one_sentence_greedy_equals_the_batched_loop(ties, min_length, top_k):
    """A batch of one takes the scalar path (_greedy_one): the same tokens and float64 scores as the
    sentence gets inside a batch, from full log-probs and from top-k, with the end token forbidden."""
    vocab, lengths = 12, np.array([6, 9, 4])
    fn = random_fn(11, vocab, ties=ties)
    make = (lambda f, b: _as_top_k(full_step(f, b), candidates_needed(1, min_length))) if top_k else full_step
    kw = dict(start_id=START, eos_id=EOS, min_length=min_length)
    batched = greedy_search(make(fn, 3), 3, max_lengths=lengths, **kw)
    for s in range(3):
        alone = greedy_search(make(lambda _, p, s=s: fn(s, p), 1), 1, max_lengths=lengths[s : s + 1], **kw)
        assert (alone[0].hypotheses, alone[0].scores) == (batched[s].hypotheses, batched[s].scores)
    # the end token first at step 0 must not be taken while it is forbidden (top-k column 0 is EOS)
    table = table_fn({(): {EOS: -0.1, 5: -2.0, 6: -3.0}, (5,): {EOS: -0.1, 6: -1.0}, (5, 6): {EOS: -0.2}}, 8)
    [r] = greedy_search(make(table, 1), 1, max_lengths=np.array([10]), **kw)
    assert r.hypotheses == ([[EOS]] if min_length == 0 else [[5, 6, EOS]])
