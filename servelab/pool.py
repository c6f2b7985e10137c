"""What tune and sweeps need from a pool of workers to run side by side (Ray's is in servelab.cluster).

Declared here, at the bottom (it imports nothing from servelab), implemented
at the top: each layer keeps its one sequential code path and, given a pool,
submits the same functions to it instead of calling them. The pool decides
where work runs; the caller decides what runs and records every outcome, so
the optuna study, tune.json and sweep.json stay the single truth.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from servelab.errors import ServerFault


class TaskLost(ServerFault):
    """A task that never returned: its worker or node died, or it was cancelled. The message says which.

    Where no caller records it as a failed trial, the command ends with it as a machine that broke down (exit 2)."""


class TaskPool(Protocol):
    """Runs functions somewhere else; results come back in completion order."""

    slots: int
    """How many tasks are worth keeping in flight (the workers' total CPUs for simulations)."""

    def submit(self, fn: Callable[[Any], Any], arg: Any, resources: Mapping[str, float] | None = None) -> int:
        """Start `fn(arg)` on a worker holding `resources` ({"CPU": n} CPUs, 1 when not named; {"GPU": n} GPUs;
        any other name a custom resource); returns the task's id."""
        ...

    def next_done(self) -> tuple[int, Any]:
        """Block until a task ends; its id and its return value, or the exception it raised (TaskLost when
        it never returned)."""
        ...

    def cancel_all(self) -> None:
        """Stop every task still running (their processes go with them)."""
        ...
