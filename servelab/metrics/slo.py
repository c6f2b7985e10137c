"""Service-level objectives as vLLM spells them: `ttft:500 tpot:50 e2el:10000` (ms)."""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import TYPE_CHECKING

from servelab.errors import InputError

if TYPE_CHECKING:  # the flags read SLO: their --help imports no result model
    from servelab.metrics.records import RequestRecord
    from servelab.schemas.results import SLOTerms

SLO_METRICS = ("ttft", "tpot", "e2el")


class SLOError(InputError):
    """A --goodput term that cannot be parsed or names an unknown metric."""


@dataclass(frozen=True, slots=True)
class SLO:
    """Upper bounds in milliseconds; a request is 'good' when it meets all of them."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @classmethod
    def parse(cls, items: list[str] | str | None) -> SLO | None:
        if not items:
            return None
        if isinstance(items, str):
            items = items.split()
        bounds: dict[str, float] = {}
        for item in items:
            name, sep, value = item.partition(":")
            if not sep or name not in SLO_METRICS:
                raise SLOError(
                    f"invalid --goodput item {item!r}: expected NAME:MS with NAME in {', '.join(SLO_METRICS)}"
                )
            try:
                bound = float(value)
            except ValueError:
                raise SLOError(f"invalid --goodput item {item!r}: {value!r} is not a number of ms") from None
            if not (
                bound > 0 and math.isfinite(bound)
            ):  # nan and inf compare false, and would be written as invalid JSON
                raise SLOError(f"invalid --goodput item {item!r}: the bound must be a finite number of ms > 0")
            bounds[f"{name}_ms"] = bound
        return cls(**bounds)

    def terms(self) -> SLOTerms:
        """The SLO as summary.json records it: the terms given, in ms (`model_dump(exclude_unset=True)` for a dict)."""
        from servelab.schemas.results import SLOTerms

        given = (("ttft", self.ttft_ms), ("tpot", self.tpot_ms), ("e2el", self.e2el_ms))
        return SLOTerms(**{name: bound for name, bound in given if bound is not None})

    def is_met(self, record: RequestRecord) -> bool:
        if not record.ok:
            return False
        if self.ttft_ms is not None and (record.ttft is None or record.ttft * 1e3 > self.ttft_ms):
            return False
        if self.tpot_ms is not None:
            tpot = tpot_seconds(record)
            if tpot is not None and tpot * 1e3 > self.tpot_ms:
                return False
        return self.e2el_ms is None or record.e2el * 1e3 <= self.e2el_ms


def tpot_seconds(record: RequestRecord) -> float | None:
    """Time per output token after the first, as `vllm bench serve` defines it."""
    if record.first_token_time is None or record.output_tokens < 2:
        return None
    return (record.finish_time - record.first_token_time) / (record.output_tokens - 1)
