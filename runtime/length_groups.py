"""The encoder's batch cut into groups of like lengths: fewer padded positions for a few more calls.

A batch of sources is padded to its longest: at 32 Tatoeba sentences of 3-17 tokens, 544 positions are
encoded for 231 real ones, and on the CPU every position costs the same products. Each extra encoder call
costs its own pass over the encoder's weights and its operators' start-up, about as much as CALL_POSITIONS
more positions per intra-op thread (measured: 6-24 at one thread, 19-36 at two, across the recipe model and
OPUS-MT size, fp32 and int8; docs/optimisation-notes.md row 88). length_groups picks the groups that
minimise the sum over calls of (call cost + rows x longest): sorted by length, a group is a run of the
sorted rows, and the best cut is a small dynamic programme over the distinct lengths.

A source's encoding does not depend on the rows beside it, nor on padding it does not attend to, so the
grouped outputs at real positions are the one padded call's; the padded positions are zeros that the
decoders mask.
"""

from __future__ import annotations

import numpy as np

CALL_POSITIONS = 16  # an encoder call's cost in source positions, per intra-op thread (see above)


def length_groups(lengths: np.ndarray, call_positions: float = CALL_POSITIONS) -> list[np.ndarray]:
    """The rows of a batch grouped for the encoder, each group a call padded to its own longest.

    Args:
        lengths: (B,) the sources' lengths.
        call_positions: what one more call costs, in padded positions.

    Returns:
        Row indices per group, shortest sources first; one group holding every row (in order) where
        cutting saves nothing.
    """
    lengths = np.asarray(lengths)
    order = np.argsort(lengths, kind="stable")
    values, starts = np.unique(lengths[order], return_index=True)
    ends = np.append(starts[1:], len(order))
    # cost[g]: the cheapest encoding of the rows of the g shortest lengths; cut[g]: where its last call starts
    cost, cut = [0.0] + [float("inf")] * len(values), [0] * (len(values) + 1)
    for g in range(1, len(values) + 1):
        end, longest = int(ends[g - 1]), int(values[g - 1])
        for j in range(g):
            c = cost[j] + call_positions + (end - int(starts[j])) * longest
            if c < cost[g]:
                cost[g], cut[g] = c, j
    if cut[len(values)] == 0:
        return [np.arange(len(order))]
    groups, g = [], len(values)
    while g > 0:
        groups.append(order[starts[cut[g]] : ends[g - 1]])
        g = cut[g]
    return groups[::-1]
