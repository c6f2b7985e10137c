"""What tune needs from a pool of workers to run its trials side by side (Ray's is in servelab.cluster).

Declared here, implemented above: tune keeps its one sequential code path
and, given a pool, the same functions submit work to it instead of calling
it. The pool decides where work runs; tune decides what runs and records
every outcome, so the optuna study and tune.json stay the single truth.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol


class TaskLost(Exception):
    """A task that never returned: its worker or node died, or it was cancelled. The message says which."""


class TaskPool(Protocol):
    """Runs functions somewhere else; results come back in completion order."""

    slots: int
    """How many tasks are worth keeping in flight (the workers' total CPUs for simulations)."""

    def submit(self, fn: Callable[[Any], Any], arg: Any, resources: Mapping[str, float] | None = None) -> int:
        """Start `fn(arg)` on a worker holding `resources`; returns the task's id."""
        ...

    def next_done(self) -> tuple[int, Any]:
        """Block until a task ends; its id and its return value, or the exception it raised (TaskLost when
        it never returned)."""
        ...

    def pending(self) -> int:
        ...

    def cancel_all(self) -> None:
        """Stop every task still running (their processes go with them)."""
        ...
