"""runtime/search.py alone (numpy, no onnxruntime): the hand-made fake steps with known answers of
spec/cases/search.json (shared with js/test/search.test.mjs), and token-for-token agreement with the
PyTorch oracle (model/search.py) on random log-prob tables."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from seq2onnx.runtime.sampling import sample
from seq2onnx.runtime.beam import beam_search
from seq2onnx.runtime.search import (
    TopK,
    candidates_needed,
    greedy_search,
    stream_greedy,
)
from seq2onnx.runtime.prefix import force_prefix

CASES = json.loads(
    (Path(__file__).resolve().parents[1] / "spec" / "cases" / "search.json").read_text(encoding="utf-8")
)
START, EOS = CASES["start_id"], CASES["end_id"]
NEG = CASES["never"]  # "never" without -inf


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


def case_fn(case: dict):
    """The fake decoder of a spec/cases/search.json case: its log-prob row for (sentence, prefix),
    looked up by the keys "S:P", "P", "S:*", "*" in turn; unlisted prefixes strongly prefer
    `default_best` (the end token when absent). See the file's $comment."""
    tables, vocab = case["log_probs"], case["vocab"]

    def value(v):
        return NEG if v == "never" else float(v)

    def fn(s, prefix):
        p = ",".join(str(int(tok)) for tok in prefix)
        key = next((k for k in (f"{s}:{p}", p, f"{s}:*", "*") if k in tables), None)
        if key is None:
            row = np.full(vocab, NEG)
            row[case.get("default_best", EOS)] = -0.01
            return row
        row = np.full(vocab, value(tables[key].get("*", "never")))
        for token, v in tables[key].items():
            if token != "*":
                row[int(token)] = value(v)
        return row

    return fn


# -- greedy and beam search: the shared hand-made cases (spec/cases/search.json) -------------------


def _run_case(case: dict, fn, batch: int, max_lengths, step_output: str, sentence: int = 0):
    """One case through greedy_search or beam_search, the Fake answering with full float64 log-probs
    or with the float32 top-k candidates the decoder graph gives."""
    fake = Fake(fn, batch)
    min_length = case.get("min_length", 0)
    beam = case["beam_size"] if case["search"] == "beam" else 1
    k = candidates_needed(beam, min_length, greedy=case["search"] == "greedy")
    step = fake.step if step_output == "full" else _as_top_k(fake.step, k)
    if "target_prefixes" in case or case.get(
        "forced_eos"
    ):  # forced tokens wrap the step, as the Translator does
        prefixes = case.get("target_prefixes", [[]] * len(case["max_lengths"]))
        step = force_prefix(
            step,
            prefixes if len(prefixes) == batch else prefixes[sentence : sentence + 1],
            end_id=EOS if case.get("forced_eos") else None,
            max_lengths=max_lengths,
        )
    kw = dict(start_id=START, eos_id=EOS, max_lengths=np.array(max_lengths), min_length=min_length)
    if case["search"] == "greedy":
        return greedy_search(step, batch, **kw), fake
    assert case["search"] == "beam", case["search"]
    return beam_search(
        step,
        batch,
        beam_size=beam,
        num_hypotheses=case["num_hypotheses"],
        length_penalty=case["length_penalty"],
        convention=case.get("convention", "fairseq"),
        **kw,
    ), fake


SPEC_RUNS = [(case, step_output) for case in CASES["cases"] for step_output in case["steps"]]


@pytest.mark.parametrize("case, step_output", SPEC_RUNS, ids=[f"{c['name']} [{o}]" for c, o in SPEC_RUNS])
def test_shared_search_case(case, step_output):
    assert step_output in ("full", "top_k"), step_output
    fn, max_lengths = case_fn(case), case["max_lengths"]
    batch = len(max_lengths)
    res, fake = _run_case(case, fn, batch, max_lengths, step_output)
    tol = case["score_tolerance"]
    assert len(res) == len(case["expect"]) == batch
    for s, (r, want) in enumerate(zip(res, case["expect"])):
        assert r.hypotheses == want["hypotheses"], s
        assert len(r.scores) == len(want["scores"]), s
        for got, expected in zip(r.scores, want["scores"]):
            assert abs(got - expected) <= tol, (s, got, expected)
    if "calls" in case:
        assert fake.calls == [(t, rows, keep) for t, rows, keep in case["calls"]]
    if batch > 1:  # each sentence alone gives what it gets in the batch
        for s in range(batch):
            [alone], _ = _run_case(
                case, lambda _, p, s=s: fn(s, p), 1, max_lengths[s : s + 1], step_output, s
            )
            assert (alone.hypotheses, alone.scores) == (res[s].hypotheses, res[s].scores), s


# -- argument errors -------------------------------------------------------------------------------


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
        hyps = torch_beam(
            oracle_step(fn, s),
            None,
            beam_size=k,
            start_id=START,
            eos_id=EOS,
            max_length=int(max_lengths[s]),
            min_length=min_length,
            length_penalty=alpha,
            num_hypotheses=k,
        )
        out.append(([h.tokens for h in hyps], [h.score for h in hyps]))
    return out


@pytest.mark.slow
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
                got = beam_search(
                    fake.step,
                    batch,
                    beam_size=k,
                    start_id=START,
                    eos_id=EOS,
                    max_lengths=max_lengths,
                    min_length=min_length,
                    length_penalty=alpha,
                    num_hypotheses=k,
                )
                want = _oracle(fn, batch, k=k, alpha=alpha, min_length=min_length, max_lengths=max_lengths)
                for s, (r, (tokens, scores)) in enumerate(zip(got, want)):
                    assert r.hypotheses == tokens, (seed, alpha, min_length, s)
                    assert len(r.scores) == len(scores) == k
                    assert np.allclose(r.scores, scores, rtol=0, atol=1e-9), (seed, alpha, min_length, s)
                    # scores are the sums of the fake's log-probs along each hypothesis, end token included
                    for h, sc in zip(r.hypotheses, r.scores):
                        assert sum(fn(s, tuple(h[:i]))[h[i]] for i in range(len(h))) == pytest.approx(
                            sc, abs=1e-9
                        )
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
            greedy = greedy_search(
                Fake(fn, 4).step,
                4,
                start_id=START,
                eos_id=EOS,
                max_lengths=max_lengths,
                min_length=min_length,
            )
            beam = beam_search(
                Fake(fn, 4).step,
                4,
                beam_size=1,
                start_id=START,
                eos_id=EOS,
                max_lengths=max_lengths,
                min_length=min_length,
                length_penalty=1.0,
            )
            assert [g.hypotheses for g in greedy] == [b.hypotheses for b in beam]
            assert np.allclose([g.scores for g in greedy], [b.scores for b in beam], rtol=0, atol=1e-9)
            for s in range(4):
                [h] = torch_greedy(
                    oracle_step(fn, s),
                    None,
                    rows=1,
                    start_id=START,
                    eos_id=EOS,
                    max_length=int(max_lengths[s]),
                    min_length=min_length,
                )
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


@pytest.mark.parametrize(
    "kw", [dict(temperature=0), dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1)]
)
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
            [g] = greedy_search(
                Fake(fn, 1).step,
                1,
                start_id=START,
                eos_id=EOS,
                max_lengths=np.array([max_length]),
                min_length=min_length,
            )
            fake = Fake(fn, 1)
            streamed = list(
                stream_greedy(
                    fake.step, start_id=START, eos_id=EOS, max_length=max_length, min_length=min_length
                )
            )
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
        batch = sample(
            Fake(lambda s, p: base(contents[s], p), 5).step,
            5,
            start_id=START,
            eos_id=EOS,
            max_lengths=np.full(5, 8),
            seed=seed,
            row_keys=[[c] for c in contents],
        )
        for s, c in enumerate(contents):
            [alone] = sample(
                Fake(lambda _, p, c=c: base(c, p), 1).step,
                1,
                start_id=START,
                eos_id=EOS,
                max_lengths=np.full(1, 8),
                seed=seed,
                row_keys=[[c]],
            )
            assert alone.hypotheses == batch[s].hypotheses and alone.scores == batch[s].scores
    with pytest.raises(ValueError, match="row_keys"):
        sample(
            Fake(base, 2).step,
            2,
            start_id=START,
            eos_id=EOS,
            max_lengths=np.full(2, 8),
            seed=0,
            row_keys=[[1]],
        )


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
    k = candidates_needed(beam, min_length, greedy=beam == 1)
    for make in (lambda: full_step(fn, batch), lambda: _as_top_k(full_step(fn, batch), k)):
        step = make()
        kw = dict(start_id=START, eos_id=EOS, max_lengths=lengths, min_length=min_length)
        found = (
            greedy_search(step, batch, **kw)
            if beam == 1
            else beam_search(step, batch, beam_size=beam, num_hypotheses=beam, **kw)
        )
        results.append([(r.hypotheses, r.scores) for r in found])
    assert results[0] == results[1]
    assert any(len(h) > 1 for hyps, _ in results[0] for h in hyps)


def test_greedy_asks_the_graph_for_its_best_candidate_alone():
    """Greedy reads column 0 only (the next one too while the end token is forbidden); a beam search
    needs 2K, K = 1 included. The tests around this one hold each count exact."""
    assert [candidates_needed(1, 0, greedy=True), candidates_needed(1, 3, greedy=True)] == [1, 2]
    assert [candidates_needed(1, 0), candidates_needed(4, 0), candidates_needed(4, 1)] == [2, 8, 9]


def test_the_translator_downloads_greedy_s_best_candidate_alone(translator):
    """What a Translator asks of the decoder graph's TopK: 1 for greedy, 2K for a beam of K."""
    assert [
        translator.spec.step_top_k(1, 0),
        translator.spec.step_top_k(1, 2),
        translator.spec.step_top_k(4, 0),
    ] == [1, 2, 8]


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
    make = (
        (lambda f, b: _as_top_k(full_step(f, b), candidates_needed(1, min_length, greedy=True)))
        if top_k
        else full_step
    )
    kw = dict(start_id=START, eos_id=EOS, min_length=min_length)
    batched = greedy_search(make(fn, 3), 3, max_lengths=lengths, **kw)
    for s in range(3):
        alone = greedy_search(make(lambda _, p, s=s: fn(s, p), 1), 1, max_lengths=lengths[s : s + 1], **kw)
        assert (alone[0].hypotheses, alone[0].scores) == (batched[s].hypotheses, batched[s].scores)
    # the end token first at step 0 while it is forbidden (top-k column 0 is EOS): the shared case
    # "greedy: the minimum length forbids the end token ..." of spec/cases/search.json, both outputs
