"""The serving round's array bookkeeping (issue 36 item 3): runtime/standard_rounds.py's _row_inputs against the
per-member loop it replaced, and serve/round_profile.py's report."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from seq2onnx.serve import round_profile
from seq2onnx.runtime.standard_rounds import StandardRounds


class _Member:
    def __init__(self, offset):
        self.offset = offset


def _per_member(work, starts, rows, total):
    """The loop _row_inputs replaced: each member's rows written one member at a time."""
    tokens = np.zeros((total, 1), dtype=np.int64)
    steps = np.zeros(total, dtype=np.int64)
    indices = np.zeros(total, dtype=np.int64)
    for (m, tok, local, t), start, n in zip(work, starts, rows):
        tokens[start : start + n, 0] = tok
        steps[start : start + n] = t
        if t > 0:
            indices[start : start + n] = m.offset + local
    return tokens, steps, indices


@pytest.mark.parametrize("seed", range(20))
def test_row_inputs_equal_the_per_member_loop(seed):
    rng = np.random.default_rng(seed)
    work, starts, rows, at = [], [], [], 0
    for _ in range(int(rng.integers(1, 40))):
        n = int(rng.choice([1, 2, 4, 5]))
        t = int(rng.integers(0, 3))  # t == 0: a first step, its cache indices ignored
        at += int(rng.integers(0, 3))  # a hole before it
        m = _Member(int(rng.integers(0, 50)) if t > 0 else None)
        work.append((m, rng.integers(0, 100, n), rng.permutation(n).astype(np.int64), t))
        starts.append(at)
        rows.append(n)
        at += n
    total = at + int(rng.integers(0, 3))
    order = rng.permutation(len(work))  # members are not in row order in a round
    work, starts, rows = [work[i] for i in order], [starts[i] for i in order], [rows[i] for i in order]
    got_all = StandardRounds._row_inputs(work, starts, rows, total)
    for got, expected in zip(got_all, _per_member(work, starts, rows, total)):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)


def test_row_inputs_refuse_a_member_without_a_previous_round():
    work = [(_Member(None), np.zeros(1, np.int64), np.zeros(1, np.int64), 3)]
    with pytest.raises(RuntimeError, match="no rows in the previous round"):
        StandardRounds._row_inputs(work, [0], [1], 1)


def test_round_profile_reports_every_phase(caplog):
    profile = round_profile.RoundProfile(every=2)
    with caplog.at_level(logging.WARNING, logger="seq2onnx.serve"):
        for _ in range(2):
            profile.begin()
            for phase in round_profile.PHASES:
                profile.lap(phase)
            profile.end_round(rows=4, searches=2)
    [record] = [r for r in caplog.records if "round profile" in r.getMessage()]
    message = record.getMessage()
    assert "2 rounds, 4.0 rows and 2.0 searches per round" in message
    assert all(f"{phase} " in message for phase in round_profile.PHASES)
    assert profile.rounds == 0  # reset after its report


def test_round_profile_is_off_by_default(monkeypatch):
    monkeypatch.setattr(round_profile, "ENABLED", False)
    assert isinstance(round_profile.round_profile(), round_profile.NoProfile)
