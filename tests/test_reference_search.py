"""The reference beam search against docs/decoding.md, on hand-made fake steps with answers
worked out by hand, and on random tiny Transformers (beam 1 == greedy, batched == alone)."""

from __future__ import annotations

import math

import pytest
import torch

from seq2onnx.model.search import Hypothesis, beam_search, greedy_search, model_step, translate_ids

START, EOS, A, B = 2, 3, 4, 5  # the fake vocabulary: 0 pad, 1 unk, 2 start, 3 end, 4 "a", 5 "b"
V = 6
L = math.log


class TableStep:
    """A fake step whose distribution depends on the generated prefix (start token excluded).

    table maps a prefix tuple to {token: probability}; the rest of the mass is spread evenly over
    the unlisted tokens. Unknown prefixes get DEFAULT. Every call is recorded: calls[t] is the
    list of live prefixes the step was asked about at step t (in row order).
    """

    DEFAULT = {EOS: 0.9}

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]]):
        self.table = table
        self.calls: list[list[tuple[int, ...]]] = []

    def dist(self, prefix: tuple[int, ...]) -> torch.Tensor:
        spec = self.table.get(prefix, self.DEFAULT)
        rest = [i for i in range(V) if i not in spec]
        left = 1.0 - sum(spec.values())
        assert left > 0
        probs = torch.tensor([spec.get(i, left / len(rest)) for i in range(V)], dtype=torch.float64)
        return probs.log()

    def __call__(self, tokens, cache_indices, t, state):
        assert tokens.shape == (len(cache_indices), 1)
        if t == 0:
            assert tokens.tolist() == [[START]] * len(cache_indices)
            prefixes = [() for _ in cache_indices.tolist()]
        else:
            prefixes = [
                state[c] + (int(tok),) for c, tok in zip(cache_indices.tolist(), tokens[:, 0].tolist())
            ]
        self.calls.append(prefixes)
        return torch.stack([self.dist(p) for p in prefixes]), prefixes


def search(table, **kw):
    step = TableStep(table)
    kw.setdefault("length_penalty", 0.0)
    hyps = beam_search(step, None, start_id=START, eos_id=EOS, **kw)
    return hyps, step


# ---------------------------------------------------------------------------------------------
# Hand-worked cases

# Case 1, K = 2.
# t=0 from (): a .6, b .3, end .05, tokens 0,1,2 .05/3 each.
#   top 2K=4: a .6, b .3, end .05 (rank 2 >= K: NOT finished), 0 .0167. Live: a, b.
# t=1 from a (.6): end .5 -> .30, a .3 -> .18, b .1 -> .06;  from b (.3): end .9 -> .27.
#   top 4: (a,end) .30, (b,end) .27, (a,a) .18, (a,b) .06: two ends in the top K finish -> done.
# n-best: [a, end] log .6 + log .5 (= log .30) then [b, end] log .3 + log .9 (= log .27).
CASE1 = {(): {A: 0.6, B: 0.3, EOS: 0.05}, (A,): {EOS: 0.5, A: 0.3, B: 0.1}}


def test_nbest_order_and_scores_include_end_token():
    hyps, step = search(CASE1, beam_size=2, max_length=10, num_hypotheses=2)
    assert [h.tokens for h in hyps] == [[A, EOS], [B, EOS]]
    assert hyps[0].score == pytest.approx(L(0.6) + L(0.5), abs=1e-12)
    assert hyps[1].score == pytest.approx(L(0.3) + L(0.9), abs=1e-12)
    assert step.calls == [[()], [(A,), (B,)]]  # two steps; the end at rank 2 of step 0 did not finish
    # num_hypotheses=1 returns only the best.
    best, _ = search(CASE1, beam_size=2, max_length=10, num_hypotheses=1)
    assert best == hyps[:1]


# Case 2, K = 2: the end token inside and outside the top K, and the length penalty.
# t=0 from (): a .5, end .4, b .05, tokens 0,1,2 .05/3 = .0167 each.
#   top 4: a .5, end .4 (rank 1 < K: finished [end], score log .4), b .05, 0 .0167.
#   The finished end is replaced by the next candidate that does not end: b. Live: a, b.
# t=1 from a (.5): a .8 -> .40, b .15 -> .075, end .01 -> .005, 0/1/2 .04/3 -> .0067;
#      from b (.05): end .9 -> .045 (default), others .02 -> .001.
#   top 4: (a,a) .40, (a,b) .075, (b,end) .045 (rank 2 >= K: NOT finished), (a,0) .0067.
#   Live: (a,a), (a,b).
# t=2 from (a,a) (.40): end .8 -> .32;  from (a,b) (.075): end .9 -> .0675.
#   top: (a,a,end) .32 rank 0 -> finished; K=2 hypotheses have finished -> done.
# Finished: [end] score log .4 = -0.916 (len 1) and [a,a,end] score log .32 = -1.139 (len 3).
#   alpha = 0: [end] (-0.916) > [a,a,end] (-1.139).
#   alpha = 1: [a,a,end] (-1.139/3 = -0.380) > [end] (-0.916/1).
CASE2 = {(): {A: 0.5, EOS: 0.4, B: 0.05}, (A,): {A: 0.8, B: 0.15, EOS: 0.01}, (A, A): {EOS: 0.8}}


def test_end_in_top_k_finishes_and_is_replaced_end_below_k_does_not():
    hyps, step = search(CASE2, beam_size=2, max_length=10, num_hypotheses=2)
    assert step.calls == [[()], [(A,), (B,)], [(A, A), (A, B)]]
    assert sorted(h.tokens for h in hyps) == sorted([[EOS], [A, A, EOS]])
    assert [B, EOS] not in [h.tokens for h in hyps]


def test_length_penalty_changes_the_ranking():
    raw, _ = search(CASE2, beam_size=2, max_length=10, num_hypotheses=2, length_penalty=0.0)
    assert [h.tokens for h in raw] == [[EOS], [A, A, EOS]]
    assert raw[0].score == pytest.approx(L(0.4), abs=1e-12)
    assert raw[1].score == pytest.approx(L(0.5) + L(0.8) + L(0.8), abs=1e-12)
    normed, _ = search(CASE2, beam_size=2, max_length=10, num_hypotheses=2, length_penalty=1.0)
    assert [h.tokens for h in normed] == [[A, A, EOS], [EOS]]
    # Scores stay raw sums; only the ranking is normalised (len counts the end token).
    assert normed[0].score == pytest.approx(L(0.32), abs=1e-12)
    assert normed[0].normalized(1.0) == pytest.approx(L(0.32) / 3, abs=1e-12)
    assert normed[1].normalized(1.0) == pytest.approx(L(0.4), abs=1e-12)
    best, _ = search(CASE2, beam_size=2, max_length=10, length_penalty=1.0)
    assert [h.tokens for h in best] == [[A, A, EOS]]


# Case 3, K = 1 (minimum length).
# (): end .6, a .3;  (a,): end .7, b .2;  (a,b): end .9 (default).
#   min_length 0: [end], log .6.
#   min_length 1: t=0 end forbidden -> a; t=1 end .7 -> [a, end], log .3 + log .7.
#   min_length 2: t=0 a; t=1 end forbidden -> b; t=2 end .9 -> [a, b, end], log .3 + log .2 + log .9.
CASE3 = {(): {EOS: 0.6, A: 0.3}, (A,): {EOS: 0.7, B: 0.2}}


@pytest.mark.parametrize(
    "min_length, tokens, score",
    [
        (0, [EOS], L(0.6)),
        (1, [A, EOS], L(0.3) + L(0.7)),
        (2, [A, B, EOS], L(0.3) + L(0.2) + L(0.9)),
    ],
)
def test_min_length_forbids_the_end_token(min_length, tokens, score):
    for k in (1, 2):
        hyps, _ = search(CASE3, beam_size=k, max_length=10, min_length=min_length)
        assert hyps[0].tokens == tokens, k
        assert hyps[0].score == pytest.approx(score, abs=1e-12)
    greedy = greedy_search(
        TableStep(CASE3), None, rows=1, start_id=START, eos_id=EOS, max_length=10, min_length=min_length
    )
    assert greedy[0].tokens == tokens and greedy[0].score == pytest.approx(score, abs=1e-12)


def test_min_length_two_beams_no_early_end_anywhere():
    hyps, step = search(CASE3, beam_size=2, max_length=6, min_length=3, num_hypotheses=2)
    for h in hyps:
        assert EOS not in h.tokens[:3]
    # No live prefix ever held an end token.
    assert all(EOS not in p for call in step.calls for p in call)


# Case 4, K = 2, max_length = 2 (the last allowed step is t=1).
# t=0 from (): a .5, b .4 -> live a, b (end .1/4 = .025 is rank >= 2).
# t=1 from a (.5): a .6 -> .30, b .3 -> .15;  from b (.4): end .55 -> .22, a .3 -> .12.
#   top 4: (a,a) .30, (b,end) .22, (a,b) .15, (b,a) .12.
#   Last step: every top-K candidate is finished, ended or not: [a,a] (.30), [b,end] (.22).
CASE4 = {(): {A: 0.5, B: 0.4}, (A,): {A: 0.6, B: 0.3}, (B,): {EOS: 0.55, A: 0.3}}


def test_max_length_records_every_top_k_candidate():
    hyps, step = search(CASE4, beam_size=2, max_length=2, num_hypotheses=2)
    assert len(step.calls) == 2
    assert [h.tokens for h in hyps] == [[A, A], [B, EOS]]
    assert hyps[0].score == pytest.approx(L(0.5) + L(0.6), abs=1e-12)
    assert hyps[1].score == pytest.approx(L(0.4) + L(0.55), abs=1e-12)
    # alpha = 1: normalised -1.204/2 = -0.602 vs -1.514/2 = -0.757: same order.
    hyps1, _ = search(CASE4, beam_size=2, max_length=2, num_hypotheses=2, length_penalty=1.0)
    assert [h.tokens for h in hyps1] == [[A, A], [B, EOS]]


def test_max_length_one():
    # Only t=0: the top K candidates a (.5) and b (.4) are finished without an end token.
    hyps, step = search(CASE4, beam_size=2, max_length=1, num_hypotheses=2)
    assert [h.tokens for h in hyps] == [[A], [B]]
    assert [h.score for h in hyps] == pytest.approx([L(0.5), L(0.4)], abs=1e-12)
    assert len(step.calls) == 1


def test_ties_go_to_the_lower_flat_index():
    # t=0: a and b tie at .45; K=1 keeps a (lower index). t=1: end.
    hyps, step = search({(): {A: 0.45, B: 0.45}}, beam_size=1, max_length=5)
    assert hyps[0].tokens == [A, EOS]
    # With K=2, the second live beam at t=1 continues b.
    _, step2 = search({(): {A: 0.45, B: 0.45}}, beam_size=2, max_length=5)
    assert step2.calls[1] == [(A,), (B,)]


# ---------------------------------------------------------------------------------------------
# Beam 1 == greedy


class RandomStep:
    """log-probabilities from a fixed random table indexed by (t, last token)."""

    def __init__(self, seed: int, vocab: int = 12, steps: int = 20, eos_boost: float = 0.0):
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(steps, vocab, vocab, generator=g, dtype=torch.float64) * 2
        logits[..., EOS] += eos_boost
        self.table = torch.log_softmax(logits, dim=-1)

    def __call__(self, tokens, cache_indices, t, state):
        return self.table[t, tokens[:, 0]], state


@pytest.mark.parametrize("seed", range(6))
def test_beam_one_equals_greedy_on_fake_step(seed):
    step = RandomStep(seed, eos_boost=-1.0)
    beam = beam_search(step, None, beam_size=1, start_id=START, eos_id=EOS, max_length=15, length_penalty=1.0)
    greedy = greedy_search(step, None, rows=1, start_id=START, eos_id=EOS, max_length=15)
    assert beam[0].tokens == greedy[0].tokens
    assert abs(beam[0].score - greedy[0].score) <= 1e-9
    # The score is the sum of the chosen tokens' log-probabilities, end token included.
    prev, total = START, 0.0
    for t, tok in enumerate(beam[0].tokens):
        total += float(step.table[t, prev, tok])
        prev = tok
    assert abs(beam[0].score - total) <= 1e-9
    assert beam[0].tokens[-1] == EOS or len(beam[0].tokens) == 15


def test_greedy_search_per_row_limits():
    step = RandomStep(1, eos_boost=-20.0)  # the end token never wins
    hyps = greedy_search(step, None, rows=3, start_id=START, eos_id=EOS, max_length=[2, 5, 3])
    assert [len(h.tokens) for h in hyps] == [2, 5, 3]
    alone = greedy_search(step, None, rows=1, start_id=START, eos_id=EOS, max_length=3)
    assert hyps[2] == alone[0]


def _random_model(seed: int, pre_norm: bool = False, eos_pull: float = 1.4):
    from seq2onnx.model.config import ModelConfig
    from seq2onnx.model.transformer import Transformer

    torch.manual_seed(seed)
    cfg = ModelConfig(
        src_vocab_size=30,
        tgt_vocab_size=25,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=2,
        d_ff=32,
        dropout=0.0,
        max_positions=64,
        pre_norm=pre_norm,
    )
    model = Transformer(cfg).eval()
    with torch.no_grad():
        # Sharper outputs, and a pull towards the end token through the bias of the last norm,
        # so that some sentences end before their length limit and others do not.
        model.generator.weight.mul_(3.0)
        last_norm = model.decoder_norm if pre_norm else model.decoder_layers[-1].sub_ff.norm
        w_eos = model.generator.weight[EOS]
        last_norm.bias.copy_(eos_pull * w_eos / w_eos.norm())
    return model


def _sources(seed: int, n: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = 2 + (i * 3) % 7
        out.append(torch.randint(4, vocab, (length - 1,), generator=g).tolist() + [EOS])
    return out


# (pre_norm, seed) pairs whose greedy outputs end by the end token at several lengths (> 1) for
# some of the sources and at the length limit for others.
MODELS = [(False, 4), (True, 7)]


@pytest.mark.slow
@pytest.mark.parametrize("pre_norm, seed", MODELS)
def test_beam_one_equals_greedy_on_tiny_transformer(pre_norm, seed):
    model = _random_model(seed, pre_norm)
    cfg = model.cfg
    sources = _sources(2, 9, cfg.src_vocab_size)
    greedy = translate_ids(model, sources, beam_size=1, batch_size=1)
    for s, g in zip(sources, greedy):
        src = torch.tensor([s])
        step, state = model_step(model, src, torch.ones_like(src, dtype=torch.bool))
        with torch.no_grad():
            beam = beam_search(
                step,
                state,
                beam_size=1,
                start_id=cfg.decoder_start_id,
                eos_id=cfg.eos_id,
                max_length=int(1.5 * len(s)) + 10,
            )
        assert beam[0].tokens == g[0].tokens
        assert abs(beam[0].score - g[0].score) <= 1e-9
    # Both kinds of stop are covered: by the end token and by the length limit.
    ends = [h[0].tokens[-1] == EOS for h in greedy]
    assert any(ends) and not all(ends), ends
    assert any(len(h[0].tokens) > 2 for h, e in zip(greedy, ends) if e)


@pytest.mark.slow
@pytest.mark.parametrize("pre_norm, seed", MODELS)
def test_greedy_batched_equals_one_at_a_time(pre_norm, seed):
    model = _random_model(seed, pre_norm)
    sources = _sources(2, 9, model.cfg.src_vocab_size)
    assert len({len(s) for s in sources}) > 1  # batches really pad
    batched = translate_ids(model, sources, beam_size=1, batch_size=4)
    alone = translate_ids(model, sources, beam_size=1, batch_size=1)
    for b, a in zip(batched, alone):
        assert b[0].tokens == a[0].tokens
        assert b[0].score == pytest.approx(a[0].score, abs=1e-4)
    # Limits are per sentence: max_length_a * len + max_length_b.
    for s, a in zip(sources, alone):
        assert len(a[0].tokens) <= int(1.5 * len(s)) + 10


def test_translate_ids_beam_returns_sorted_nbest():
    model = _random_model(9)
    sources = _sources(3, 3, model.cfg.src_vocab_size)
    out = translate_ids(model, sources, beam_size=3, num_hypotheses=3, length_penalty=1.0)
    for hyps in out:
        assert len(hyps) == 3
        norm = [h.normalized(1.0) for h in hyps]
        assert norm == sorted(norm, reverse=True)


# ---------------------------------------------------------------------------------------------
# Arguments


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(beam_size=0), r"beam_size=0"),
        (dict(beam_size=2, max_length=0), r"max_length=0"),
        (dict(beam_size=2, max_length=3, min_length=3), r"min_length=3 must lie in \[0, max_length=3\)"),
        (dict(beam_size=2, min_length=-1), r"min_length=-1"),
        (dict(beam_size=2, num_hypotheses=3), r"num_hypotheses=3 must lie in \[1, beam_size=2\]"),
        (dict(beam_size=2, num_hypotheses=0), r"num_hypotheses=0"),
    ],
)
def test_bad_arguments_raise(kw, match):
    kw.setdefault("max_length", 5)
    with pytest.raises(ValueError, match=match):
        beam_search(TableStep(CASE1), None, start_id=START, eos_id=EOS, **kw)


def test_num_hypotheses_bounds():
    for n in (1, 2, 3):
        hyps, _ = search(CASE2, beam_size=3, max_length=6, num_hypotheses=n)
        assert len(hyps) == n
    model = _random_model(10)
    with pytest.raises(ValueError, match=r"num_hypotheses=3"):
        translate_ids(model, [[5, 6, EOS]], beam_size=2, num_hypotheses=3)
    with pytest.raises(ValueError, match=r"min_length=20"):
        translate_ids(model, [[5, 6, EOS]], beam_size=1, max_length=20, min_length=20)
    with pytest.raises(ValueError, match=r"beam_size=0"):
        translate_ids(model, [[5, 6, EOS]], beam_size=0)


def test_hypothesis_normalized():
    h = Hypothesis([4, 5, 3], -3.0)
    assert h.normalized(0.0) == -3.0
    assert h.normalized(1.0) == pytest.approx(-1.0)
    assert h.normalized(0.5) == pytest.approx(-3.0 / math.sqrt(3))
