"""Configuration search: on the simulator first, then confirmed on real servers.

The verb is `servelab.tune.run(TuneRequest) -> TuneDocument` (servelab.tune.tuner), imported when first used so
that `servelab tune --help` loads none of the simulator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from servelab.tune.tuner import TuneProgress, TuneRequest, run

__all__ = ["TuneProgress", "TuneRequest", "run"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from servelab.tune import tuner

        return getattr(tuner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
