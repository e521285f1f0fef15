"""Where each search's rows sit in a serving round, and the rounds' cross-attention inputs, kept between
rounds.

decoder.onnx takes the encoder's keys/values and mask per row here (a sentence's copied for each of its
beams, padded to one source width). Made anew for every round, they cost more than the decoder run at
128 one-sentence requests (copying ~30 MB per round: every round some sentences finish and others
join). So the rows live in persistent arrays: a search keeps its range of rows while its sentences stay
the same, a new or changed search is written into the first hole it fits (a finished search leaves one)
or at the end. Holes are decoded as dummy rows (token 0 at step 0, their outputs unread) while they
stay under a quarter of the rows; beyond, or when the arrays are too small or too narrow, everything
is laid out afresh.
"""

from __future__ import annotations

import numpy as np


class RowLayout:
    """The persistent cross-attention inputs of the serving rounds, and each member's range of rows in them.

    A member (serve/batcher.py) has `src_mask` (B, S), `cross` (per layer and kind (B, H, S, Dh)) and
    `version` (changed when its sentences change); the layout keeps its placement in `member.placed`.

    Args:
        n_layers, n_heads, head_dim: the decoder's sizes.
        dtype: numpy dtype of the keys and values.
        to_device: numpy array -> OrtValue on the decoder's device.
        shares_memory: to_device wraps the array without copying it (the CPU): writes need no new value.
    """

    def __init__(self, *, n_layers: int, n_heads: int, head_dim: int, dtype, to_device, shares_memory: bool):
        self.n_layers, self.n_heads, self.head_dim, self.dtype = n_layers, n_heads, head_dim, dtype
        self._to, self._shares = to_device, shares_memory
        self.clear()

    def clear(self) -> None:
        """Drops every row (nobody is decoding)."""
        self.used, self.width, self.capacity, self.generation = 0, 0, 0, 0
        self.mask: np.ndarray | None = None
        self.cross: list[np.ndarray] = []
        self._values: tuple | None = None

    def place(self, members: list, rows: list[int]) -> list[int]:
        """Places each member's `rows` rows (writing those that moved or changed); returns each one's first
        row.

        Rows [0, used) are the round's; those of no member are holes (dummy rows).
        """
        width = -(-max(m.src_mask.shape[1] for m in members) // 8) * 8  # grows at once, shrinks below 60%
        moved = [i for i, (m, n) in enumerate(zip(members, rows)) if not self._in_place(m, n)]
        growth = sum(rows[i] for i in moved)
        staying = sum(rows) - growth
        if (
            width > self.width
            or width < 0.6 * self.width
            or self.used + growth > self.capacity
            or self.used - staying > max(8, (self.used + growth) // 4)
        ):
            self._allocate(width, max(64, 2 * sum(rows)))
            moved = list(range(len(members)))
        holes = self._holes([m.placed for i, m in enumerate(members) if i not in set(moved)]) if moved else []
        for i in sorted(moved, key=lambda i: -rows[i]):  # the largest first: first fit
            at = next((j for j, (a, size) in enumerate(holes) if size >= rows[i]), None)
            if at is None:
                start = self.used
            else:
                start, size = holes[at]
                holes[at] = (start + rows[i], size - rows[i])
            self._write(members[i], rows[i], start)
        if moved and not self._shares:
            self._values = None
        return [m.placed[0] for m in members]

    def inputs(self) -> tuple:
        """(src_mask, cross values) of rows [0, used), as OrtValues on the decoder's device."""
        if self._values is None or self._values[0] != self.used:
            self._values = (
                self.used,
                self._to(self.mask[: self.used]),
                [self._to(c[: self.used]) for c in self.cross],
            )
        return self._values[1], self._values[2]

    def _holes(self, placed: list[tuple]) -> list[tuple[int, int]]:
        """(start, size) of the rows of [0, used) that none of `placed` holds, in order."""
        holes, at = [], 0
        for start, n, *_ in sorted(placed):
            if start > at:
                holes.append((at, start - at))
            at = start + n
        if self.used > at:
            holes.append((at, self.used - at))
        return holes

    def _in_place(self, m, n: int) -> bool:
        placed = getattr(m, "placed", None)
        return placed is not None and placed[1:] == (n, m.version, self.generation)

    def _allocate(self, width: int, capacity: int) -> None:
        self.generation += 1
        self.used, self.width, self.capacity = 0, width, capacity
        self.mask = np.zeros((capacity, width), dtype=bool)
        self.mask[:, 0] = True  # a dummy row attends somewhere: its softmax stays finite (no 0/0)
        self.cross = [
            np.zeros((capacity, self.n_heads, width, self.head_dim), dtype=self.dtype)
            for _ in range(2 * self.n_layers)
        ]
        self._values = None

    def _write(self, m, n: int, start: int) -> None:
        s = m.src_mask.shape[1]
        per = n // m.src_mask.shape[0]  # rows per sentence: its live beams (1 for greedy)
        end = start + n
        self.mask[start:end, :s] = np.repeat(m.src_mask, per, axis=0) if per > 1 else m.src_mask
        self.mask[start:end, s:] = False
        for out, c in zip(self.cross, m.cross):
            out[start:end, :, :s] = np.repeat(c, per, axis=0) if per > 1 else c
            out[start:end, :, s:] = 0  # masked, but finite: 0 x NaN would be NaN
        m.placed = (start, n, m.version, self.generation)
        self.used = max(self.used, end)
