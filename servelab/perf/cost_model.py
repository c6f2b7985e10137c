"""Time of one engine step from its batch: the interface the simulator calls.

The concrete roofline model lives in this module too (see `RooflineCostModel`);
the protocol is what the simulator depends on, so calibration can swap
coefficients without the engine knowing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(slots=True)
class StepBatch:
    """What one engine step computes.

    prefill_chunks: (new tokens computed this step, tokens already in KV before them)
    decode_contexts: context length (tokens in KV) of each decoding request
    """

    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)
    decode_contexts: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for n, _ in self.prefill_chunks) + len(self.decode_contexts)


class CostModel(Protocol):
    def step_time(self, batch: StepBatch) -> float:
        """Seconds of wall time for one engine step (GPU work + fixed CPU overhead)."""
        ...
