"""Roofline cost model: physical limits, monotonicity, TP, and the coefficient round trip."""

from __future__ import annotations

import math

import pytest

from servelab.perf.cost_model import CostCoefficients, RooflineCostModel, StepBatch, prefill_attention_work
from servelab.perf.engine_args import resolve
from servelab.perf.engine_config import EngineConfig
from servelab.perf.hardware import get_gpu
from servelab.perf.memory import weight_bytes_per_rank
from servelab.perf.models import get_model


def _model(gpu="a100-80gb", model="llama-3.1-8b", coefficients=None, **config):
    hw, spec = get_gpu(gpu), get_model(model)
    return RooflineCostModel(hw, spec, resolve(EngineConfig(**config), hw, spec), coefficients)


def test_small_decode_batch_is_memory_bound():
    ideal = _model(coefficients=CostCoefficients.ideal())
    hw, spec = get_gpu("a100-80gb"), get_model("llama-3.1-8b")
    streamed = weight_bytes_per_rank(spec, None, hw, 1) - spec.embedding_params * 2
    t = ideal.step_time(StepBatch(decode_contexts=[100]))
    assert t == pytest.approx(streamed / hw.memory_bandwidth, rel=0.02)


def test_large_prefill_is_compute_bound():
    ideal = _model(coefficients=CostCoefficients.ideal())
    spec = get_model("llama-3.1-8b")
    tokens = 8192
    flops = tokens * spec.linear_flops_per_token + spec.lm_head_flops_per_token
    linear_only = flops / 312e12
    t = ideal.step_time(StepBatch(prefill_chunks=[(tokens, 0)]))
    assert linear_only < t < 1.25 * linear_only  # plus causal attention, ~10% at 8k


@pytest.mark.parametrize(
    "smaller, larger",
    [
        (StepBatch(decode_contexts=[1000] * 8), StepBatch(decode_contexts=[1000] * 128)),
        (StepBatch(decode_contexts=[500] * 32), StepBatch(decode_contexts=[4000] * 32)),
        (StepBatch(prefill_chunks=[(512, 0)]), StepBatch(prefill_chunks=[(2048, 0)])),
        (StepBatch(prefill_chunks=[(512, 0)]), StepBatch(prefill_chunks=[(512, 8000)])),
        (StepBatch(decode_contexts=[1000] * 8), StepBatch(prefill_chunks=[(256, 0)], decode_contexts=[1000] * 8)),
    ],
)
def test_step_time_grows_with_batch_and_context(smaller, larger):
    model = _model()
    assert model.step_time(smaller) < model.step_time(larger)


def test_decode_steps_are_monotonic_in_batch_size():
    model = _model()
    times = [model.step_time(StepBatch(decode_contexts=[2000] * n)) for n in (1, 2, 4, 16, 64, 256)]
    assert times == sorted(times) and times[-1] > times[0]


def test_tensor_parallel_lowers_decode_step_time():
    batch = StepBatch(decode_contexts=[1500] * 32)
    assert _model("h100", tensor_parallel_size=2).step_time(batch) < _model("h100").step_time(batch)


def test_pcie_all_reduce_costs_more_than_nvlink():
    batch = StepBatch(prefill_chunks=[(2048, 0)])
    nvlink = _model("a100-80gb", tensor_parallel_size=2, coefficients=CostCoefficients.ideal())
    pcie = _model("a100-80gb-pcie", tensor_parallel_size=2, coefficients=CostCoefficients.ideal())
    # Same compute, only bandwidth and interconnect differ; the PCIe card is slower by more than its HBM gap.
    assert pcie.step_time(batch) > nvlink.step_time(batch) * 1.05


def test_fp8_weights_speed_up_decode_on_h100_and_fall_back_on_a100():
    batch = StepBatch(decode_contexts=[1000] * 8)
    assert _model("h100", quantization="fp8").step_time(batch) < 0.7 * _model("h100").step_time(batch)
    a100_fp8 = _model("a100", quantization="fp8")
    assert a100_fp8.weight_format.compute_dtype == "bf16"
    assert a100_fp8.step_time(batch) < _model("a100").step_time(batch)


def test_aggregate_matches_per_item():
    model = _model()
    chunks, decodes = [(512, 1000), (100, 0)], [300, 700, 1200]
    batch = StepBatch(prefill_chunks=chunks, decode_contexts=decodes)
    work = sum(prefill_attention_work(n, c) for n, c in chunks)
    aggregate = model.step_time_aggregate(612, work, 3, sum(decodes), 5, prefill_context_tokens=1000)
    assert model.step_time(batch) == aggregate


def test_prefill_attention_work_is_causal():
    assert prefill_attention_work(1, 0) == 1
    assert prefill_attention_work(4, 0) == 10
    assert prefill_attention_work(2, 10) == 23


def test_empty_step_costs_nothing():
    assert _model().step_time(StepBatch()) == 0.0


def test_coefficients_round_trip_through_json():
    custom = CostCoefficients(compute_efficiency=0.55, step_overhead_s=1.5e-3)
    assert CostCoefficients.from_json(custom.to_json()) == custom
    with pytest.raises(ValueError):
        CostCoefficients(memory_efficiency=1.5)


def test_overheads_are_added_per_step_and_per_request():
    base = CostCoefficients()
    slow = CostCoefficients(
        step_overhead_s=base.step_overhead_s + 1e-3, per_request_overhead_s=base.per_request_overhead_s + 1e-4
    )
    batch = StepBatch(decode_contexts=[100] * 10)
    assert _model(coefficients=slow).step_time(batch) - _model(coefficients=base).step_time(batch) == pytest.approx(
        2e-3
    )


def test_prefill_step_overhead_is_charged_once_per_step_that_admits_prefills():
    base = _model()
    extra = _model(coefficients=CostCoefficients(prefill_step_overhead_s=1e-3))
    one = StepBatch(prefill_chunks=[(64, 0)], decode_contexts=[500] * 8)
    three = StepBatch(prefill_chunks=[(64, 0), (64, 0), (64, 128)], decode_contexts=[500] * 8)
    decode = StepBatch(decode_contexts=[500] * 8)
    assert extra.step_time(one) - base.step_time(one) == pytest.approx(1e-3)
    assert extra.step_time(three) - base.step_time(three) == pytest.approx(1e-3)
    assert extra.step_time(decode) == base.step_time(decode)


def test_wake_time_grows_with_idleness_toward_its_ceiling():
    model = _model(coefficients=CostCoefficients(idle_wake_s=2e-3, idle_wake_time_constant_s=0.02))
    assert model.wake_time(0.0) == 0.0
    assert model.wake_time(0.02) == pytest.approx(2e-3 * (1 - math.exp(-1)))
    times = [model.wake_time(t) for t in (0.001, 0.01, 0.05, 0.2, math.inf)]
    assert times == sorted(times) and times[-1] == pytest.approx(2e-3)
    assert _model().wake_time(math.inf) == 0.0  # catalogue defaults: not known, not charged
    assert _model(coefficients=CostCoefficients.ideal()).wake_time(math.inf) == 0.0


@pytest.mark.parametrize("kernels", [True, False])
def test_an_eager_step_takes_at_least_the_hosts_launch_time(kernels):
    """Without CUDA graphs a step ends no sooner than the host launches every layer's kernels; a step whose kernels
    take longer than that is unchanged (the launches run ahead of the GPU)."""
    hw, spec = get_gpu("a100-80gb"), get_model("llama-3.1-8b")
    c = CostCoefficients(step_overhead_s=0, per_request_overhead_s=0)

    def model(**config):
        return RooflineCostModel(hw, spec, resolve(EngineConfig(**config), hw, spec), c, kernels=kernels)

    graphs, eager = model(), model(enforce_eager=True)
    launch = spec.num_layers * c.eager_launch_s_per_layer
    decode, prefill = StepBatch(decode_contexts=[512]), StepBatch(prefill_chunks=[(8192, 0)])
    assert graphs.step_time(decode) < launch
    assert eager.step_time(decode) == pytest.approx(launch)
    assert graphs.step_time(prefill) > launch and eager.step_time(prefill) == graphs.step_time(prefill)


def test_sglang_runs_prefill_and_decode_batches_past_its_graphs_eagerly():
    """SGLang captures decode batches up to cuda_graph_max_bs; its extend (prefill) batches and larger decode
    batches launch op by op."""
    hw, spec = get_gpu("h100"), get_model("llama-3.1-8b")
    config = resolve(EngineConfig(cuda_graph_max_batch=8, eager_prefill=True), hw, spec)
    sglang, vllm = RooflineCostModel(hw, spec, config), RooflineCostModel(hw, spec, resolve(EngineConfig(), hw, spec))
    for batch in (StepBatch(decode_contexts=[512] * 8), StepBatch(prefill_chunks=[(8192, 0)])):
        assert sglang.step_time(batch) == vllm.step_time(batch)
    for batch in (StepBatch(decode_contexts=[512] * 9), StepBatch(prefill_chunks=[(64, 0)])):
        assert sglang.step_time(batch) > vllm.step_time(batch)
