"""The roofline plus the one cost calibration finds that it lacks: a fixed CPU cost per prefill chunk.

On the vLLM CPU server a step that starts a request costs ~3 ms more than a
decode step of the same size (the engine's own prefill-time metric shows it:
4.4 ms for a 16-token prompt against 1.6 ms per decode step): the request
joins the persistent batch, gets block tables and sampling state. Charged
per scheduled prefill chunk, that cost slows every request decoding beside a
new arrival, which the roofline's per-step and per-request overheads cannot
express. It belongs in `CostCoefficients` (`per_prefill_overhead_s`, added in
`step_time_aggregate` as `(num_sampled - num_decodes) * c`); until it is
there, this wrapper adds it without changing the roofline.
"""

from __future__ import annotations

from servelab.perf.cost_model import RooflineCostModel, StepBatch


class PrefillOverheadCostModel:
    """`RooflineCostModel` + `per_prefill_chunk_s` for every prefill chunk in the step; the same two entry points."""

    def __init__(self, roofline: RooflineCostModel, per_prefill_chunk_s: float) -> None:
        if per_prefill_chunk_s < 0:
            raise ValueError(f"per_prefill_chunk_s cannot be negative, got {per_prefill_chunk_s}")
        self.roofline = roofline
        self.per_prefill_chunk_s = per_prefill_chunk_s

    def step_time_aggregate(
        self,
        num_prefill_tokens: int,
        prefill_attn_work: int,
        num_decodes: int,
        sum_decode_context: int,
        num_sampled: int,
        prefill_context_tokens: int = 0,
    ) -> float:
        base = self.roofline.step_time_aggregate(
            num_prefill_tokens, prefill_attn_work, num_decodes, sum_decode_context, num_sampled, prefill_context_tokens
        )
        return base + (num_sampled - num_decodes) * self.per_prefill_chunk_s if base else base

    def step_time(self, batch: StepBatch) -> float:
        base = self.roofline.step_time(batch)
        return base + len(batch.prefill_chunks) * self.per_prefill_chunk_s if base else base
