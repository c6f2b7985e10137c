"""The one exception a target raises for a problem the user must fix before any load is sent."""

from __future__ import annotations

from typing import TYPE_CHECKING

from servelab.errors import ServerFault

if TYPE_CHECKING:  # numpy: not for the command line's help, which lists the endpoints
    from servelab.workload.spec import RequestSpec


class TargetError(ServerFault):
    """A target that cannot be used as configured: unreachable URL, missing endpoint, unknown model.

    The message names the URL, endpoint or model at fault and is meant to be
    printed as-is by the CLI.
    """


def unmet_dependency(spec: RequestSpec) -> TargetError:
    """A later chat turn whose earlier turn is not before it in the plan: the plan cannot be served in order."""
    return TargetError(
        f"request {spec.index} depends on request {spec.depends_on}, which does not come before it in the plan"
    )
