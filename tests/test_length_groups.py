"""runtime/length_groups.py: the encoder's batch cut into groups of like lengths, and Graphs.encode over them."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from seq2onnx.runtime.length_groups import length_groups


def _cost(lengths, groups, call):
    return sum(call + len(g) * int(lengths[g].max()) for g in groups)


def _cheapest(lengths, call):
    """Brute force: every cut of the rows sorted by length into runs."""
    order = np.argsort(lengths, kind="stable")
    best = float("inf")
    for k in range(len(order)):
        for cuts in itertools.combinations(range(1, len(order)), k):
            bounds = (0, *cuts, len(order))
            best = min(best, _cost(lengths, [order[a:b] for a, b in zip(bounds, bounds[1:])], call))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_groups_cover_every_row_once_at_the_least_cost(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, size=int(rng.integers(1, 9)))
    call = float(rng.choice([0, 4, 16, 64]))
    groups = length_groups(lengths, call)
    assert sorted(np.concatenate(groups).tolist()) == list(range(len(lengths)))
    assert _cost(lengths, groups, call) == _cheapest(lengths, call)
    longest = [int(lengths[g].max()) for g in groups]
    assert longest == sorted(longest)  # shortest first
    if len(groups) > 1:  # each group's rows are a run of the lengths
        assert all(lengths[a].max() <= lengths[b].min() for a, b in zip(groups, groups[1:]))


def test_a_batch_of_like_lengths_is_one_call_in_its_own_order():
    groups = length_groups(np.array([9, 8, 9, 7]), 16)
    assert len(groups) == 1 and groups[0].tolist() == [0, 1, 2, 3]


def test_a_few_long_sources_are_encoded_apart():
    lengths = np.array([17, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 16])
    groups = length_groups(lengths, 16)
    assert [sorted(g.tolist()) for g in groups] == [list(range(1, 17)), [0, 17]]
    assert len(length_groups(lengths, 1000)) == 1  # calls dearer than the padding: one call


def test_grouped_encoding_equals_the_padded_call_where_it_is_read(translator):
    """Graphs.encode of a batch of mixed lengths (encoded in groups) against the same batch in one padded
    call: the same mask, the same keys and values at every real position, and zeros past each group's longest
    source (the short sources' group was not padded to the batch's longest)."""
    ids = [[5 + (i % 7)] * n for i, n in enumerate([2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 30, 29])]
    src, lengths = translator.sources.pad(ids)
    assert len(length_groups(lengths)) > 1
    graphs = translator.graphs
    mask, cross = graphs.encode(src, lengths)
    one_mask, one_cross = graphs._encode_padded(src, lengths)
    np.testing.assert_array_equal(mask.numpy(), one_mask.numpy())
    real = one_mask.numpy()  # (B, S) True where a source has a token
    for grouped, padded in zip(cross, one_cross):
        g, p = grouped.numpy(), padded.numpy()  # (B, H, S, Dh)
        assert g.shape == p.shape
        np.testing.assert_allclose(
            g.transpose(0, 2, 1, 3)[real], p.transpose(0, 2, 1, 3)[real], rtol=0, atol=1e-6
        )
        assert not g[lengths == 2][:, :, 2:].any() and p[lengths == 2][:, :, 2:].any()
