"""The fused decoder's serving rounds (runtime/fused_rounds.py), driven round by round with scripted searches.

A search's rows answered in a shared round, whatever else the buffers hold and however they moved, must be
what the same search gets alone in fresh buffers: the rows sit at other places, began at other positions,
the positions were dropped or grown under them, other searches' beams shared their group of rows.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from seq2onnx.runtime.translator import Translator
from seq2onnx.runtime.rounds import rounds_runner
from seq2onnx.serve.scheduler import Member
from seq2onnx.runtime.fused_rounds import FusedRounds
from seq2onnx.serve.round_profile import NoProfile


class Script:
    """A scripted search: its sentences, width, tokens and parents at every step, made up front (seeded)."""

    def __init__(
        self, t: Translator, lengths: list[int], width: int, steps: int, seed: int, drop_at: int = -1
    ):
        rng = np.random.default_rng(seed)
        src = np.full((len(lengths), max(lengths)), t.pad_id, np.int64)
        for b, n in enumerate(lengths):
            src[b, :n] = np.append(rng.integers(4, t.src_vocab, n - 1), t.eos_id)
        self.encoded = mask, cross = t.graphs.encode(src, np.array(lengths, np.int64))
        self.mask, self.cross = mask.numpy(), [c.numpy() for c in cross]
        self.width, self.steps, self.drop_at = width, steps, drop_at
        self.requests = []
        sentences = len(lengths)
        for step in range(steps):
            keep = None
            if step == drop_at and sentences > 1:
                keep = np.array([0, sentences - 1][: sentences - 1])  # the middle ones finish
            prev = sentences
            if keep is not None:
                sentences = keep.size
            rows = sentences if (step == 0 or width == 1) else sentences * width
            tokens = rng.integers(4, t.tgt_vocab, rows)
            if step == 0:
                tokens[:] = t.start_id
            if width == 1 or step == 0:
                indices = np.arange(rows)
            else:
                prev_width = 1 if step == 1 else width
                kept = np.arange(prev) if keep is None else keep
                parents = rng.integers(0, prev_width, (sentences, width))
                indices = (kept[:, None] * prev_width + parents).reshape(-1)
            self.requests.append((tokens, indices, step, keep))

    def member(self) -> Member:
        return Member(None, self.mask, self.cross, None, self.width)


def _alone(t: Translator, script: Script) -> list[np.ndarray]:
    """The search alone through translate_batch's own step (runtime/fused_step.py's FusedStep)."""
    step_fn = t.graphs.step(
        script.encoded, rows=script.mask.shape[0], top_k=None, max_length=64, beam_width=script.width
    )
    tokens_shape = lambda tokens: np.asarray(tokens, np.int64).reshape(-1, 1)  # noqa: E731
    return [
        np.array(step_fn(tokens_shape(tokens), indices, step, keep))
        for tokens, indices, step, keep in script.requests
    ]


@pytest.fixture(scope="module")
def translator(bundle):
    return Translator(bundle, device="cpu")


def test_scripted_searches_sharing_rounds_get_what_they_get_alone(translator):
    t = translator
    scripts = {  # name: (script, the round it joins)
        "greedy": (Script(t, [4, 3, 5], 1, 9, seed=1, drop_at=4), 0),
        "beam 4": (Script(t, [5, 3], 4, 12, seed=2, drop_at=6), 3),
        "beam 2": (Script(t, [11], 2, 10, seed=3), 7),
        "late greedy": (Script(t, [2], 1, 8, seed=4), 10),
        "beam 3": (Script(t, [10, 2], 3, 7, seed=5, drop_at=3), 11),
    }
    runner = rounds_runner(t)
    assert isinstance(runner, FusedRounds)
    runner.first_positions, runner.first_rows, runner.width_quantum = 4, 1, 1
    members = {name: s.member() for name, (s, _) in scripts.items()}
    got: dict[str, list] = {name: [] for name in scripts}
    for round_ in range(40):
        work = []
        for name, (script, join) in scripts.items():
            step = round_ - join
            if 0 <= step < script.steps:
                work.append(
                    (members[name], *script.requests[step][:3], script.requests[step][3], script.width)
                )
        if not work:
            break
        answers = runner.run(work, NoProfile())
        for member, *_ in work:
            name = next(n for n, m in members.items() if m is member)
            got[name].append(answers[member].copy())
        for name, (script, join) in scripts.items():
            if round_ - join == script.steps - 1:
                runner.leave(members[name])
    # every way the buffers move was taken, with beams live (widths mixed in every round: no relayout here,
    # the next test's)
    assert all(runner.copies[k] > 0 for k in runner.copies if k != "relayout"), runner.copies
    for name, (script, _) in scripts.items():
        wanted = _alone(t, script)
        assert len(got[name]) == len(wanted) == script.steps
        for step, (a, b) in enumerate(zip(got[name], wanted)):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5, err_msg=f"{name}, step {step}")


def _drive(runner, plan: dict, rounds: int, seen=None) -> tuple[dict[str, list], dict[str, Member]]:
    """Runs the scripted searches of `plan` (name: (script, the round it joins)); returns each one's answers
    and members. seen(round, runner) is called after each round."""
    members = {name: s.member() for name, (s, _) in plan.items()}
    got = {name: [] for name in plan}
    for round_ in range(rounds):
        work = [
            (members[name], *s.requests[round_ - join][:3], s.requests[round_ - join][3], s.width)
            for name, (s, join) in plan.items()
            if 0 <= round_ - join < s.steps
        ]
        if not work:
            continue
        answers = runner.run(work, NoProfile())
        for member, *_ in work:
            got[next(n for n, m in members.items() if m is member)].append(answers[member].copy())
        for name, (s, join) in plan.items():
            if round_ - join == s.steps - 1:
                runner.leave(members[name])
        if seen is not None:
            seen(round_, runner)
    return got, members


@pytest.mark.slow
def test_beams_share_their_sentence_cross_entry_and_the_layout_follows_the_widths(translator):
    """While every search in flight has beams of the round's group, a sentence's beams share one cross entry
    (the arrays hold capacity / group entries); a greedy search joining makes it one per row, and its leaving
    one per group again; beams of 8 after beams of 4 relay them by 8. Every answer stays what the search
    gets alone."""
    t = translator
    plan = {
        "beam 4": (Script(t, [5, 3], 4, 10, seed=11, drop_at=4), 0),
        "beam 3": (Script(t, [7], 3, 6, seed=12), 2),
        "greedy": (Script(t, [4, 6], 1, 4, seed=13), 5),
        "beam 4 b": (Script(t, [2, 9], 4, 8, seed=14, drop_at=3), 6),
        "beam 8": (Script(t, [6, 4], 8, 5, seed=15), 14),
    }
    runner = rounds_runner(t)
    runner.first_positions, runner.first_rows, runner.width_quantum = 4, 1, 1
    groups, masks = {}, []

    def seen(round_, r):
        groups[round_] = r.cross_group
        assert all(c.shape[0] == r.capacity // r.cross_group for c in r.cross)
        assert r.mask.shape[0] == r.capacity // r.cross_group
        masks.append(weakref.ref(r.mask))

    got, _ = _drive(runner, plan, 20, seen)
    assert [groups[i] for i in (1, 4, 5, 8, 9, 13, 14, 18)] == [4, 4, 1, 1, 4, 4, 8, 8], groups
    # 4 -> 1 -> 4 -> 8 (the first round's layout is made with the buffers: no copy)
    assert runner.copies["relayout"] == 3, runner.copies
    # no binding kept with the buffers keeps the entries of an earlier layout alive (an IOBinding holds what
    # it binds)
    gc.collect()
    current, array = set(), runner.mask  # the current entries and the arrays they are views of
    while array is not None:
        current.add(id(array))
        array = array.base
    assert {id(m()) for m in masks if m() is not None} <= current
    for name, (s, _) in plan.items():
        assert len(got[name]) == s.steps
        for step, (a, b) in enumerate(zip(got[name], _alone(t, s))):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5, err_msg=f"{name}, step {step}")
    # and with the entries per row throughout (share_cross off), the same answers
    runner = rounds_runner(t)
    runner.share_cross = False
    per_row, _ = _drive(runner, plan, 20)
    assert runner.copies["relayout"] == 0 and runner.cross_group == 1
    for name in plan:
        for a, b in zip(got[name], per_row[name]):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5, err_msg=name)


def test_rows_freed_by_wide_beams_stay_valid_in_narrower_groups(translator):
    """A beam-4 search's rows point at each other's rows; once it leaves and only beams of 2 are in flight
    (groups of 2 rows), its freed rows still run as dummy rows: each must point at itself again, or the
    kernel refuses the round (an indirection outside the row's group)."""
    t = translator
    wide = Script(t, [4], 4, 6, seed=6)
    greedy = Script(t, [5], 1, 14, seed=7)
    narrow = Script(t, [3], 2, 6, seed=8)
    runner = rounds_runner(t)
    plan = {"wide": (wide, 0), "greedy": (greedy, 0), "narrow": (narrow, 7)}
    got, members = _drive(runner, plan, 14)
    assert members["narrow"].placed.blocks[0] < 4  # it took the wide search's rows
    for name, (s, _) in plan.items():
        for step, (a, b) in enumerate(zip(got[name], _alone(t, s))):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5, err_msg=f"{name}, step {step}")


def test_dead_positions_are_dropped_before_the_buffer_is_full(translator):
    """The kernel reads positions 0..slot of every row, masked or not: once the positions before every live
    row's start are at least shift_min and at least the live span, they are dropped (one copy of the live
    ones), however large the buffer. The round's position stays near the longest live search's, and every
    answer stays what the search gets alone."""
    t = translator
    plan = {
        "first": (Script(t, [4, 3], 4, 12, seed=21), 0),
        "second": (Script(t, [6], 4, 10, seed=22), 12),  # joins as the first leaves: 12 dead positions
        "third": (Script(t, [5], 1, 9, seed=23), 16),
        "fourth": (Script(t, [3, 7], 2, 8, seed=24, drop_at=4), 25),
    }
    runner = rounds_runner(t)
    runner.first_positions = 128  # never full here: only the early drop moves the positions
    slots = []
    got, _ = _drive(runner, plan, 34, lambda round_, r: slots.append(r.slot))
    assert runner.copies["shift_positions"] >= 2 and runner.copies["grow_positions"] == 0, runner.copies
    assert runner.positions == 128 and max(slots) <= 2 * 12 + runner.shift_min, slots
    for name, (s, _) in plan.items():
        assert len(got[name]) == s.steps
        for step, (a, b) in enumerate(zip(got[name], _alone(t, s))):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5, err_msg=f"{name}, step {step}")
