"""runtime/beam.py advance_together: many beam programs advanced by one round's outputs at once give each
program exactly the requests and results it gets advanced alone (the serving scheduler's path against
translate_batch's)."""

from __future__ import annotations

import numpy as np
import pytest

from seq2onnx.runtime.beam import BeamProgram, advance_together, beam_program
from seq2onnx.runtime.search import BEAM_CONVENTIONS, TopK, candidates_needed

START, EOS, VOCAB = 0, 1, 10


def _settings(rng: np.random.Generator) -> dict:
    """Random beam settings: sizes, lengths, a forbidden end token, conventions, penalties, n-best."""
    k = int(rng.integers(1, 5))
    batch = int(rng.integers(1, 4))
    min_length = int(rng.choice([0, 0, 2]))
    return dict(
        batch=batch,
        beam_size=k,
        start_id=START,
        eos_id=EOS,
        max_lengths=rng.integers(min_length + 1, 9, size=batch),
        min_length=min_length,
        length_penalty=float(rng.choice([0.0, 1.0, 0.6])),
        num_hypotheses=int(rng.integers(1, k + 1)),
        convention=str(rng.choice(BEAM_CONVENTIONS)),
    )


def _output(rng: np.random.Generator, rows: int, settings: dict, ties: bool) -> TopK:
    """A step's TopK as the decoder graph gives it: float32, sorted by (value desc, id asc); the end token
    often among the best, exact ties when `ties`."""
    logits = rng.normal(size=(rows, VOCAB))
    logits[:, EOS] += rng.choice([-3.0, 0.0, 2.0])
    if ties:
        logits = np.round(logits, 0)
    lp = (logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))).astype(np.float32)
    kk = candidates_needed(settings["beam_size"], settings["min_length"])
    ids = np.broadcast_to(np.arange(VOCAB), lp.shape)
    order = np.lexsort((ids, -lp), axis=1)[:, :kk]
    return TopK(np.take_along_axis(lp, order, axis=1), order.astype(np.int64), VOCAB)


def _program(settings: dict) -> BeamProgram:
    s = dict(settings)
    return beam_program(s.pop("batch"), **s)


def _same_request(a, b) -> bool:
    tokens_a, indices_a, t_a, keep_a = a
    tokens_b, indices_b, t_b, keep_b = b
    keeps = (keep_a is None and keep_b is None) or (
        keep_a is not None and keep_b is not None and np.array_equal(keep_a, keep_b)
    )
    return (
        np.array_equal(tokens_a, tokens_b) and np.array_equal(indices_a, indices_b) and t_a == t_b and keeps
    )


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ties", [False, True])
def test_programs_advanced_together_get_what_they_get_alone(seed, ties):
    """Twelve programs of mixed beam sizes, lengths and conventions, joining at different rounds: every
    request and every result advanced together equals the same program's advanced alone by send."""
    rng = np.random.default_rng(seed)
    plans = [(_settings(rng), int(rng.integers(0, 4))) for _ in range(12)]  # (settings, the round it joins)
    together = [_program(s) for s, _ in plans]
    alone = [_program(s) for s, _ in plans]
    requests: dict[int, tuple] = {}
    results: dict[int, list] = {}
    finished_together = 0
    for round_ in range(40):
        running, outputs = [], []
        for i, (settings, join) in enumerate(plans):
            if round_ == join:
                requests[i] = next(together[i])
                assert _same_request(requests[i], next(alone[i]))
            if i in requests and i not in results:
                out = _output(rng, len(requests[i][0]), settings, ties)
                running.append(i)
                outputs.append(out)
        if not running and round_ > 3:
            break
        outcomes = advance_together([together[i] for i in running], outputs)
        for i, out, outcome in zip(running, outputs, outcomes):
            try:
                expected = alone[i].send(out)
            except StopIteration as done:
                assert isinstance(outcome, StopIteration), (i, outcome)
                assert [(r.hypotheses, r.scores) for r in outcome.value] == [
                    (r.hypotheses, r.scores) for r in done.value
                ]
                results[i] = outcome.value
                finished_together += 1
                continue
            assert not isinstance(outcome, BaseException), (i, outcome)
            assert _same_request(outcome, expected), (i, round_)
            requests[i] = outcome
    assert finished_together == len(plans)
    assert any(len(r.hypotheses[0]) > 2 for found in results.values() for r in found)


def test_a_program_s_own_error_is_its_outcome_and_the_others_go_on():
    """A program given too few candidates gets the ValueError it gets alone; the program beside it goes on."""
    rng = np.random.default_rng(0)
    settings = dict(batch=1, beam_size=2, start_id=START, eos_id=EOS, max_lengths=np.array([5]), min_length=0)
    bad, good = _program(settings), _program(settings)
    next(bad), next(good)
    short = TopK(np.zeros((1, 3), np.float32), np.arange(3, dtype=np.int64)[None], VOCAB)  # needs 4
    outcomes = advance_together([bad, good], [short, _output(rng, 1, settings, False)])
    assert isinstance(outcomes[0], ValueError) and "needs 4" in str(outcomes[0])
    tokens, _, t, _ = outcomes[1]
    assert t == 1 and tokens.shape == (2, 1)


def test_a_program_ends_with_its_error_as_a_generator_does():
    """Bad settings raise at the first request, and the program is over: a further send stops it."""
    program = beam_program(
        1, beam_size=2, start_id=START, eos_id=EOS, max_lengths=np.array([5]), num_hypotheses=3
    )
    with pytest.raises(ValueError, match="num_hypotheses=3"):
        next(program)
    with pytest.raises(StopIteration):
        program.send(None)
