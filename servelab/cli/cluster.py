"""The Ray flags (`--ray-address`, `--ray-gpu-resource`), kept apart from the shared load flags.

Ray is imported only when `--ray-address` is given (servelab.cluster is the
one place that imports it), so the single-machine commands never pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

if TYPE_CHECKING:
    from servelab.pool import TaskPool

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


def ray_pool(address: str | None) -> TaskPool | None:
    """The cluster's task pool, or None (and no Ray import) without an address."""
    if address is None:
        return None
    from servelab.cluster.ray_pool import RayPool

    return RayPool(address)
