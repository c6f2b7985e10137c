"""A linear step-time model: fixed overhead + per token + per attended context token.

Deterministic and transparent; used by tests and as a stand-in where no
roofline is wanted. Coefficients are seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.perf.cost_model import StepBatch


@dataclass(frozen=True, slots=True)
class LinearCostModel:
    overhead: float = 0.005
    per_token: float = 60e-6
    per_context_token: float = 5e-9

    def step_time(self, batch: StepBatch) -> float:
        tokens = len(batch.decode_contexts)
        context = sum(batch.decode_contexts)
        for new, before in batch.prefill_chunks:
            tokens += new
            context += new * before + new * (new + 1) // 2
        return self.overhead + self.per_token * tokens + self.per_context_token * context
