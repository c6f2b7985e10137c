"""Checks a flag's value gets where it is declared (typer callbacks), so a bad value never reaches a verb.

typer's own `min=`/`max=` bound the integers; floats need more than that
(click lets `nan` through every range, and `inf` through any lower bound), and
a command line inside a flag (`--engine-args`) must split like a shell's. Each
check raises `typer.BadParameter`; click attaches the flag's name, and
`ServelabCommands` prints it as one line and exits 2.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable

import typer

MAX_INT = 2**31 - 1
"""The largest count or length any integer flag takes (numpy's int32 arrays hold them): typer's `max=` for them all."""
MAX_GPUS = 1024
"""The most GPUs a tensor-parallel group, or replicas behind a router, may number: each replica is a simulated
engine in memory, so --replicas 1e9 would exhaust it before the first step."""


def real(
    *, gt: float | None = None, ge: float | None = None, le: float | None = None, inf: bool = False
) -> Callable[[float | None], float | None]:
    """A float flag's callback: a finite number (or +inf where `inf`, e.g. a rate meaning "all at once") within
    the bounds given; None (not given) passes."""

    def check(value: float | None) -> float | None:
        if value is None:
            return None
        if math.isnan(value) or (math.isinf(value) and not (inf and value > 0)):
            raise typer.BadParameter(
                f"{value} is not a usable number here: give a finite one" + (" (or inf)" if inf else "")
            )
        if gt is not None and not value > gt:
            raise typer.BadParameter(f"{value:g} must be > {gt:g}")
        if ge is not None and not value >= ge:
            raise typer.BadParameter(f"{value:g} must be >= {ge:g}")
        if le is not None and not value <= le:
            raise typer.BadParameter(f"{value:g} must be <= {le:g}")
        return value

    return check


def shell_words(value: str | None) -> str | None:
    """A flag that holds a command line (`--engine-args "--max-num-seqs 8"`): it must split as a shell would."""
    if value is None:
        return None
    try:
        shlex.split(value)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise typer.BadParameter(f"{value!r} does not split as a shell command line: {exc}") from None
    return value
