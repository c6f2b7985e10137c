"""Kernel costs per engine: the step model scaled by the engine's measured tables over vLLM's."""

from __future__ import annotations

import pytest

from servelab.perf.cost_model import StepBatch
from servelab.perf.engine_kernels import KernelRatio, ScaledCostModel, kernel_ratio
from servelab.perf.hardware import get_gpu
from servelab.perf.models import get_model
from servelab.sim.linear_cost import LinearCostModel
from servelab.targets.engine_deployment import build_engine_deployment


def test_decode_and_prefill_steps_scale_by_their_own_ratio():
    base = LinearCostModel()
    scaled = ScaledCostModel(base, KernelRatio(decode=0.5, prefill=2.0, note="test"))
    decode, prefill = StepBatch(decode_contexts=[100, 200]), StepBatch(prefill_chunks=[(512, 0)], decode_contexts=[100])
    assert scaled.step_time(decode) == pytest.approx(0.5 * base.step_time(decode))
    assert scaled.step_time(prefill) == pytest.approx(2.0 * base.step_time(prefill))
    assert scaled.step_time_aggregate(0, 0, 2, 300, 2) == pytest.approx(0.5 * base.step_time_aggregate(0, 0, 2, 300, 2))
    assert scaled.step_time_aggregate(512, 1000, 1, 100, 2) == pytest.approx(
        2.0 * base.step_time_aggregate(512, 1000, 1, 100, 2)
    )


def test_ratio_is_one_where_no_tables_and_measured_where_there_are():
    model = get_model("llama-3.1-8b")
    assert kernel_ratio("vllm", get_gpu("h100-sxm"), model, None, 1) == KernelRatio()
    assert kernel_ratio("sglang", get_gpu("l40s"), model, None, 1) == KernelRatio()  # no aiconfigurator tables for it
    ratio = kernel_ratio("trtllm", get_gpu("h100-sxm"), model, None, 1)
    assert ratio.decode != 1.0 and ratio.prefill != 1.0 and "trtllm kernel tables (bfloat16)" in ratio.note


def test_an_engine_run_says_its_cost_source():
    deployment = build_engine_deployment("sglang", "h100-sxm", "llama-3.1-8b")
    target = deployment.sim_target()
    assert "sglang kernel tables" in target.cost_model.cost_source
