"""How many spans are open at once: what the tests check a run's concurrency with."""

from __future__ import annotations

from collections.abc import Iterable


def most_open_at_once(spans: Iterable[tuple[float, float]]) -> int:
    """The most (start, end) spans open at one instant; a span ending when another starts does not overlap it."""
    edges = sorted(edge for start, end in spans for edge in ((start, 1), (end, -1)))
    open_now = most = 0
    for _, step in edges:
        open_now += step
        most = max(most, open_now)
    return most
