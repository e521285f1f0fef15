"""onnxruntime's CPU arena given back after a burst of large rounds (issue 37, item 8).

The arena (a BFC arena) grows by chunks to hold the largest round's tensors (the cache is rows x slots x
layers x d_model) and keeps them for the session's life. Its documented remedy is a run option,
"memory.enable_memory_arena_shrinkage", which frees the arena's wholly unused chunks at the end of that
run: `ArenaShrink` asks for it on a round once the rows have fallen to half of their peak since the last
shrink (not every round: freed chunks would be allocated again at the next growth). The serving rounds
(runtime/fused_rounds.py, runtime/standard_rounds.py) run their graph through it; serve/memory.py gives
the C heap back beside it.
"""

from __future__ import annotations

SHRINK_KEY = "memory.enable_memory_arena_shrinkage"
# a shrink frees chunks that the next growth allocates again: not on every falling round
MIN_ROUNDS_BETWEEN = 8


class ArenaShrink:
    """When a round should run with onnxruntime's arena shrinkage, and the RunOptions that ask for it.

    Args:
        device: "cpu" or "cuda": whose arena is shrunk (the CPU's always: outputs are bound there too).
    """

    def __init__(self, device: str = "cpu"):
        import onnxruntime

        self.options = onnxruntime.RunOptions()
        self.options.add_run_config_entry(SHRINK_KEY, "cpu:0;gpu:0" if device == "cuda" else "cpu:0")
        self.peak, self.since, self.count = 0, 0, 0

    def run_options(self, rows: int):
        """The RunOptions for a round of `rows` rows: the shrinking ones, or None (onnxruntime's defaults)."""
        self.peak, self.since = max(self.peak, rows), self.since + 1
        if not self.enabled or 2 * rows > self.peak or self.since < MIN_ROUNDS_BETWEEN:
            return None
        self.peak, self.since, self.count = rows, 0, self.count + 1
        return self.options

    enabled = True  # False once a session refused the option (it has no arena: nothing to shrink)

    def run(self, session, binding, rows: int = 0, shrink: bool = False) -> None:
        """session.run_with_iobinding(binding), under shrinkage when `shrink` or run_options(rows) says so.

        A session without an arena (enable_cpu_mem_arena off) refuses the option ("Did not find an arena based
        allocator"): the run is made again without it, and shrinking is off from then on.
        """
        options = (self.options if self.enabled else None) if shrink else self.run_options(rows)
        try:
            session.run_with_iobinding(binding, options)
        except Exception as e:
            if options is None or "arena" not in str(e):
                raise
            self.enabled = False
            session.run_with_iobinding(binding)
