"""The order in which xdist hands out the test files (tests/conftest.py `_longest_first`): files with `slow`
tests first, the fewest tests first among them, then the others, the largest first; a file's tests together
and in their own order."""

from __future__ import annotations

from conftest import _longest_first


class Item:
    """What `_longest_first` reads of a pytest item: its node id and its `slow` mark."""

    def __init__(self, nodeid: str, slow: bool = False):
        self.nodeid, self.slow = nodeid, slow

    def get_closest_marker(self, name: str):
        return object() if name == "slow" and self.slow else None


def test_long_scenarios_first_then_the_largest_files():
    items = [
        *(Item(f"tests/test_many.py::test_{i}") for i in range(5)),  # fast: after every slow file
        *(Item(f"tests/test_few.py::test_{i}") for i in range(2)),
        Item("tests/test_mixed.py::test_a"),
        Item("tests/test_mixed.py::test_b", slow=True),
        Item("tests/test_mixed.py::test_c"),
        Item("tests/test_scenario.py::test_run_it_all", slow=True),  # one slow test: first of all
    ]
    order = [item.nodeid for item in _longest_first(items)]
    assert order == [
        "tests/test_scenario.py::test_run_it_all",
        "tests/test_mixed.py::test_a",
        "tests/test_mixed.py::test_b",
        "tests/test_mixed.py::test_c",
        *(f"tests/test_many.py::test_{i}" for i in range(5)),
        *(f"tests/test_few.py::test_{i}" for i in range(2)),
    ]
