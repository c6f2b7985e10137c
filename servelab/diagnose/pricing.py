"""What a GPU-hour costs, so alternatives can be compared in dollars per million tokens.

Defaults are the middle of the on-demand range that specialty clouds
(Lambda, CoreWeave, RunPod, Crusoe...) list, from two public price surveys;
prices move every quarter and differ 2-3x between providers, so the user's
own price (`--gpu-cost-per-hour`) always wins, and a chip without a
sourced price gets none ("—") rather than a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

MERCATUS = "mercatus-ai.com/blog/cloud-gpu-pricing (May 2026, specialty-cloud on-demand range, midpoint)"
AIHARDWAREINDEX = "aihardwareindex.com/blog/h100-vs-a100-vs-l40s-the-cost-per-token-analysis (Dec 2025 on-demand)"


@dataclass(frozen=True, slots=True)
class Price:
    usd_per_hour: float
    source: str


DEFAULT_PRICES: dict[str, Price] = {
    "A100-80GB-SXM": Price(1.30, MERCATUS + ": $1.10-1.50"),
    "A100-80GB-PCIe": Price(1.35, AIHARDWAREINDEX),
    "H100-SXM": Price(3.00, MERCATUS + ": $2.50-3.50"),
    "H200": Price(4.00, MERCATUS + ": $3.50-4.50"),
    "L40S": Price(0.87, AIHARDWAREINDEX),
}
"""Per GPU, by catalogue name (servelab/perf/data/gpus.yaml); other chips have no default."""


def price_of(gpu: str, given: float | None = None, given_for: str | None = None) -> Price | None:
    """The hourly price of one `gpu`: the user's (`given`, for the chip `given_for`) or the sourced default, or None."""
    if given is not None and gpu == given_for:
        return Price(given, "--gpu-cost-per-hour")
    return DEFAULT_PRICES.get(gpu)


def usd_per_million_tokens(usd_per_hour: float, gpus: int, tokens_per_s: float) -> float | None:
    """Dollars for a million tokens when `gpus` GPUs at `usd_per_hour` each produce `tokens_per_s`."""
    if tokens_per_s <= 0:
        return None
    return usd_per_hour * gpus / (tokens_per_s * 3600) * 1e6
