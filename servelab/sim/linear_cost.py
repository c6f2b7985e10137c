"""A linear step-time model: fixed overhead + per token + per attended query-key pair.

Deterministic and transparent; used by tests and as a stand-in where no
roofline is wanted. Coefficients are seconds. It offers the same
totals-based entry point as RooflineCostModel, so the engine treats both alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.perf.cost_model import StepBatch, prefill_attention_work


@dataclass(frozen=True, slots=True)
class LinearCostModel:
    overhead: float = 0.005
    per_token: float = 60e-6
    per_context_token: float = 5e-9

    def step_time_aggregate(
        self,
        num_prefill_tokens: int,
        prefill_attn_work: int,
        num_decodes: int,
        sum_decode_context: int,
        num_sampled: int,
        prefill_context_tokens: int = 0,
    ) -> float:
        tokens = num_prefill_tokens + num_decodes
        return (
            self.overhead + self.per_token * tokens + self.per_context_token * (prefill_attn_work + sum_decode_context)
        )

    def step_time(self, batch: StepBatch) -> float:
        work = sum(prefill_attention_work(n, c) for n, c in batch.prefill_chunks)
        prefill = sum(n for n, _ in batch.prefill_chunks)
        decodes = len(batch.decode_contexts)
        return self.step_time_aggregate(
            prefill, work, decodes, sum(batch.decode_contexts), decodes + len(batch.prefill_chunks)
        )

    def wake_time(self, idle_s: float) -> float:
        """No wake-up cost: an idle engine starts its next step at full speed."""
        return 0.0
