"""The statistics' names and defaults that the command line and the result files' schemas show, kept apart from the
numpy that computes them (so `--help` and `servelab schema` do not import it)."""

from __future__ import annotations

from enum import StrEnum

DEFAULT_PERCENTILES: tuple[float, ...] = (50, 90, 95, 99)
"""The percentiles of TTFT, TPOT, ITL and E2E latency a summary reports unless `--metric-percentiles` names others."""


class Regime(StrEnum):
    """Where on the load curve a prediction sits: its accuracy differs there, so its interval does."""

    UNDER_CAPACITY = "under_capacity"
    SATURATED = "saturated"
    CONCURRENCY_1 = "concurrency_1"


class Tier(StrEnum):
    """What the prediction was grounded in: specs only, the user's own runs (`calibrate --from`), or live probes."""

    SPECS_ONLY = "specs_only"
    CALIBRATED_FROM_RUNS = "calibrated_from_runs"
    CALIBRATED_LIVE = "calibrated_live"
