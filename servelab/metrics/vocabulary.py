"""The statistics' defaults that the command line shows in its help, kept apart from the numpy that computes them."""

from __future__ import annotations

DEFAULT_PERCENTILES: tuple[float, ...] = (50, 90, 95, 99)
"""The percentiles of TTFT, TPOT, ITL and E2E latency a summary reports unless `--metric-percentiles` names others."""
