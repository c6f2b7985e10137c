"""A `TaskPool` on Ray: tasks with the resources they ask for, results in completion order.

Every task runs with `max_retries=0`: a trial whose node died must be
recorded as failed, not silently run again on another node while the driver
believes the first attempt is the one it is waiting for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from servelab.errors import InputError
from servelab.pool import Placed, TaskLost


class ClusterError(InputError):
    """--ray-address cannot be used: Ray is not installed, or no cluster answers there."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterError("--ray-address needs Ray: pip install 'servelab[ray]'") from None
    return ray


def connect(address: str) -> Any:
    """Join the cluster at `address` (`auto`: the one `ray start` runs on this host); returns the ray module.

    The driver's working directory is not shipped: workers import servelab from their own installation, as
    they would on a real cluster, so a node without servelab fails loudly rather than running another version.
    """
    ray = _ray()
    _errors_to_stderr(ray)
    if not ray.is_initialized():
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ClusterError(f"--ray-address {address}: no Ray cluster answers there ({exc})") from None
    return ray


def _errors_to_stderr(ray: Any) -> None:
    """Ray's driver prints the cluster's error messages (a raylet that died, with its log tail) on stdout, where
    `--json` writes its document; they are diagnostics, so they go to stderr. Ray offers no setting for it: its
    printer (private, in the pinned version) is wrapped to mark every message an error; absent, nothing changes."""
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    printer = getattr(worker, "print_to_stdstream", None)
    if worker is None or printer is None or getattr(printer, "servelab_stderr", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:  # Ray's own message, passed on as it is
        printer({**data, "is_err": True}, ignore_prefix=ignore_prefix)

    to_stderr.servelab_stderr = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr


def _call(fn: Callable[[Any], Any], arg: Any) -> Any:
    return fn(arg)


class _Host:
    """The actor that holds a placed object: it builds it on its worker and runs its methods there."""

    def __init__(self, cls: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.held = cls(*args)

    def address(self) -> str:
        import ray

        return str(ray.util.get_node_ip_address())

    def call(self, method: str, args: tuple[Any, ...]) -> Any:
        return getattr(self.held, method)(*args)


class RayPlaced:
    """A `Placed` object: one actor (never restarted: what it held is gone with its worker)."""

    def __init__(self, ray: Any, actor: Any) -> None:
        self.ray, self.actor = ray, actor
        self._address: str | None = None

    @property
    def address(self) -> str:
        if self._address is None:
            self._address = str(self.call_actor("address"))
        return self._address

    def call(self, method: str, *args: Any) -> Any:
        return self.call_actor("call", method, args)

    def call_actor(self, name: str, *args: Any) -> Any:
        exceptions = self.ray.exceptions
        try:
            return self.ray.get(getattr(self.actor, name).remote(*args))
        except exceptions.RayTaskError as exc:  # the method raised: its own exception, without Ray's traceback
            cause = getattr(exc, "cause", None)
            raise cause if isinstance(cause, Exception) else TaskLost(str(exc)) from None
        except exceptions.RayError as exc:  # the actor died, or its node
            raise TaskLost(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}") from None

    def release(self) -> None:
        self.ray.kill(self.actor, no_restart=True)


class RayPool:
    """Ray tasks, at most `slots` worth keeping in flight (the cluster's CPUs unless told)."""

    def __init__(self, address: str, slots: int | None = None) -> None:
        self.ray = connect(address)
        self.slots = slots or max(1, int(self.ray.cluster_resources().get("CPU", 1)))
        self._remote = self.ray.remote(max_retries=0)(_call)
        self._refs: dict[Any, int] = {}
        self._next = 0

    def submit(self, fn: Callable[[Any], Any], arg: Any, resources: Mapping[str, float] | None = None) -> int:
        custom = dict(resources or {})
        gpus, cpus = custom.pop("GPU", 0), custom.pop("CPU", 1)  # Ray's own options; any other is a custom resource
        ref = self._remote.options(num_gpus=gpus, num_cpus=cpus, resources=custom or None).remote(fn, arg)
        self._next += 1
        self._refs[ref] = self._next
        return self._next

    def next_done(self) -> tuple[int, Any]:
        if not self._refs:
            raise RuntimeError("next_done() with no task in flight")
        ready, _ = self.ray.wait(list(self._refs), num_returns=1)
        ref = ready[0]
        number = self._refs.pop(ref)
        exceptions = self.ray.exceptions
        try:
            return number, self.ray.get(ref)
        except exceptions.RayTaskError as exc:  # the task raised: its own exception, with the remote traceback
            cause = exc.as_instanceof_cause()
            return number, cause if isinstance(cause, Exception) else TaskLost(str(exc))
        except exceptions.RayError as exc:  # never returned: worker crashed, node died, cancelled, result lost
            return number, TaskLost(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}")

    def place(self, cls: Callable[..., Any], args: tuple[Any, ...], resources: Mapping[str, float]) -> Placed:
        custom = dict(resources)
        gpus, cpus = custom.pop("GPU", 0), custom.pop("CPU", 1)
        host = self.ray.remote(max_restarts=0, max_concurrency=2)(_Host)
        actor = host.options(num_gpus=gpus, num_cpus=cpus, resources=custom or None).remote(cls, args)
        return RayPlaced(self.ray, actor)

    def cancel_all(self) -> None:
        for ref in list(self._refs):
            self.ray.cancel(ref, force=True)  # the worker dies; each server's watchdog then stops its group
        self._refs.clear()
