"""The order in which xdist hands test files to its workers (`make test`: `-n 2 --dist loadfile
--no-loadscope-reorder`, so files go out in collection order, each to the next free worker).

Longest first, a file's tests kept in their order: files with a `slow` test first, then the
others as collected, then files with an `exclusive` test (tests/exclusive.py). xdist's own
order (most tests first) sends the long end-to-end files, which have few tests, last, where
one of them can keep a worker busy long after the other has run out of work; an exclusive
test idles the other worker, which costs nothing once that worker has no work left. Only
xdist workers reorder (they must all collect the same order, so the sort is stable and
depends on the collected items only); a plain `pytest` run keeps the collection order.
"""

from __future__ import annotations

import pytest


def _rank(items: list[pytest.Item]) -> int:
    if any(item.get_closest_marker("exclusive") for item in items):
        return 2
    if any(item.get_closest_marker("slow") for item in items):
        return 0
    return 1


def longest_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Reorder `items` in place by file, as the module docstring says (workers only)."""
    if not hasattr(config, "workerinput"):
        return
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    ordered = sorted(files.values(), key=_rank)  # stable: collection order within a rank
    items[:] = [item for group in ordered for item in group]
