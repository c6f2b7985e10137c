"""Length distributions for prompts and outputs, sampled in one numpy call.

`spread` means the same thing for every shape so that one flag
(`--random-range-ratio`) drives them all: for `uniform` it is vLLM's range
ratio (lengths in [mean*(1-r), mean*(1+r)]); for `normal` and `lognormal` it
is the coefficient of variation (std / mean). Every length is rounded and
clipped to >= 1, because a zero-token prompt or output is not a request.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

import numpy as np

from servelab.workload.errors import WorkloadError
from servelab.schemas.vocabulary import DISTRIBUTIONS


@dataclass(frozen=True, slots=True)
class LengthDistribution:
    mean: int
    shape: str = "uniform"
    spread: float = 0.0

    def __post_init__(self) -> None:
        if self.shape not in DISTRIBUTIONS:
            raise WorkloadError(f"unknown length distribution {self.shape!r}; use one of {', '.join(DISTRIBUTIONS)}")
        if self.mean < 1:
            raise WorkloadError(f"a length must be at least 1 token, got {self.mean}")
        if not math.isfinite(self.spread) or self.spread < 0 or (self.shape == "uniform" and self.spread >= 1):
            raise WorkloadError(
                f"--random-range-ratio must be in [0, 1) for uniform lengths and >= 0 otherwise, got {self.spread}"
            )

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` lengths as int64; `fixed` (or spread 0) draws nothing so the rng stream stays comparable."""
        if self.shape == "fixed" or self.spread == 0:
            return np.full(n, self.mean, dtype=np.int64)
        if self.shape == "uniform":
            # vLLM draws integers from [floor(mean*(1-r)), ceil(mean*(1+r))], both ends included.
            low = int(np.floor(self.mean * (1 - self.spread)))
            high = int(np.ceil(self.mean * (1 + self.spread)))
            values = rng.integers(low, high + 1, size=n).astype(float)
        elif self.shape == "normal":
            values = rng.normal(self.mean, self.spread * self.mean, size=n)
        else:
            # Parameters of the underlying normal that give this mean and coefficient of variation.
            sigma2 = np.log1p(self.spread**2)
            values = rng.lognormal(np.log(self.mean) - sigma2 / 2, np.sqrt(sigma2), size=n)
        return np.maximum(np.rint(values), 1).astype(np.int64)

    def describe(self) -> dict[str, object]:
        return {"shape": self.shape, "mean": self.mean, "spread": self.spread}
