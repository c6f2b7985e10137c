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


class Placed(Protocol):
    """An object living on a worker and holding its resources until released (on Ray: an actor), for work that
    outlasts one call: a fleet's replica keeps its server up while the driver measures the fleet."""

    @property
    def address(self) -> str:
        """The address of the node it lives on, where a server it starts can be reached from the driver."""
        ...

    def call(self, method: str, *args: Any) -> Any:
        """Call one of its methods there and wait for the answer; the method's exception is raised here (TaskLost
        when the worker or its node died)."""
        ...

    def release(self) -> None:
        """Let it go, whatever it is doing; its worker (and any process group it watches) goes with it."""
        ...


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

    def place(self, cls: Callable[..., Any], args: tuple[Any, ...], resources: Mapping[str, float]) -> Placed:
        """`cls(*args)` on a worker holding `resources` (as `submit` reads them) until released."""
        ...
