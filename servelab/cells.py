"""Table cells: every number and percentage servelab shows in a table, and the one mark for a value that is absent.

One formatter, so a missing value reads the same everywhere (an em dash, never 0, which would read as instant or
free) and a value that is not a number (an old or partial results file) is shown as missing instead of failing.
"""

from __future__ import annotations

MISSING = "—"
"""A cell with nothing to show: the statistic was not measured, or nothing completed."""


def number(value: object, fmt: str = ",.4g", missing: str = MISSING) -> str:
    """`value` in the format spec `fmt` (`.2f`, `,.0f`...); `missing` for None or anything not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return missing
    return format(value, fmt)


def percent(value: object, fmt: str = "+.0f") -> str:
    """A percentage already in percent (12.3 -> "+12%"), signed by default; MISSING where there is none."""
    text = number(value, fmt)
    return text if text == MISSING else text + "%"
