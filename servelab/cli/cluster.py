"""The Ray flags (`--ray-address`, `--ray-gpu-resource`), kept apart from the shared load flags.

Ray is imported only when `--ray-address` is given (servelab.cluster is the
one place that imports it), so the single-machine commands never pay for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from servelab.flags.checks import MAX_INT
from servelab.errors import InputError

if TYPE_CHECKING:
    from servelab.pool import TaskPool
    from servelab.targets.base import Target
    from servelab.workload.spec import LoadPlan

_CLUSTER = "Ray cluster"

RayAddress = Annotated[
    Optional[str],
    typer.Option(
        help="Run on this Ray cluster (host:port of its head, ray://host:10001, or auto); needs `pip install "
        "'servelab\\[ray]'`.",
        rich_help_panel=_CLUSTER,
    ),
]
RayGpuResource = Annotated[
    str,
    typer.Option(
        help="The Ray resource a stage-2 trial holds, one per GPU of its configuration: GPU, or a custom resource "
        "name.",
        rich_help_panel=_CLUSTER,
    ),
]

Clients = Annotated[
    int,
    typer.Option(
        min=1,
        max=MAX_INT,
        help="With --ray-address: client actors sharing the load (spread over the nodes), each with --workers "
        "processes.",
        rich_help_panel=_CLUSTER,
    ),
]


def ray_pool(address: str | None) -> TaskPool | None:
    """The cluster's task pool, or None (and no Ray import) without an address."""
    if address is None:
        return None
    from servelab.cluster.ray_pool import RayPool

    return RayPool(address)


def check_clients(clients: int, address: str | None, sweep: str | None) -> None:
    """--clients needs a cluster to put its actors on; a sweep's points share one server, so they stay local."""
    if clients > 1 and address is None:
        raise InputError(
            "--clients puts client actors on a Ray cluster: give --ray-address (on one machine, --workers)"
        )
    if address is not None and sweep is not None:
        raise InputError(
            "--sweep with --ray-address: bench's sweep points share one server and run one after another; "
            "drop one of them"
        )


def ray_clients(address: str, clients: int, options: dict[str, Any], make_plan: Callable[[], LoadPlan]) -> Target:
    """The load of `clients` actors on the cluster, as one Target (Ray imported here, not before)."""
    from servelab.cluster.clients import RayClients

    return RayClients(address, clients, options, make_plan)
