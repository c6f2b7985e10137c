"""Kernel fit: reproducible from the installed tables, honest fallback, a smooth roofline, accuracy on held-out sizes.

Needs aiconfigurator-core (the `kernels` extra, also in `test`): the measured tables the fit reads.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from servelab.perf import kernel_fit as kf
from servelab.perf.cost_model import CostCoefficients, RooflineCostModel, StepBatch
from servelab.perf.engine_args import resolve
from servelab.perf.engine_config import EngineConfig
from servelab.perf.hardware import get_gpu
from servelab.perf.models import get_model

GPU_ONLY = CostCoefficients(step_overhead_s=0, per_request_overhead_s=0)


def _model(gpu="h100", model="llama-3.1-8b", coefficients=None, **kwargs):
    hw, spec = get_gpu(gpu), get_model(model)
    config = {k: v for k, v in kwargs.items() if k != "kernels"}
    extra = {"kernels": kwargs["kernels"]} if "kernels" in kwargs else {}
    return RooflineCostModel(hw, spec, resolve(EngineConfig(**config), hw, spec), coefficients, **extra)


def test_committed_coefficients_are_reproduced_by_refitting_the_installed_tables():
    committed = kf.load_kernel_coefficients()
    assert committed is not None, "servelab/perf/data/kernel_coefficients.yaml is missing: run scripts/fit_kernels.py"
    fresh = kf.KernelCoefficients.model_validate(kf.yaml.safe_load(kf.dump_yaml(kf.fit_all())))
    assert set(committed.gpus) == set(kf.SYSTEMS)
    assert kf.refit_differences(committed.model_dump(), fresh.model_dump()) == []


def test_a_refit_difference_beyond_platform_noise_is_reported():
    committed = kf.load_kernel_coefficients().model_dump()
    moved = kf.yaml.safe_load(kf.yaml.safe_dump(committed))
    moved["gpus"]["B200"]["gemm"]["memory_efficiency"] *= 1.01
    moved["gpus"]["B200"]["gemm"]["half_tokens"] += 1e-4  # a size near 0: within noise
    assert kf.refit_differences(committed, moved) == [
        f".gpus.B200.gemm.memory_efficiency: committed {committed['gpus']['B200']['gemm']['memory_efficiency']:.6g}, "
        f"refit {moved['gpus']['B200']['gemm']['memory_efficiency']:.6g}"
    ]


def test_stored_residuals_are_what_the_fitted_formulas_give():
    """The residuals stored beside the coefficients are what the fitted formulas give on the tables."""
    gpu = "H100-SXM"
    hw, fit, tables = get_gpu(gpu), kf.load_kernel_fit(get_gpu(gpu)), kf.load_tables(gpu)
    rows = kf.gemm_rows(tables)
    pred = kf.gemm_time(fit.gemm, hw, *(rows[c].to_numpy(float) for c in ("m", "n", "k")))
    held = kf.held_out(rows.m)
    rms = float(np.sqrt(np.mean((pred[held] / rows.latency.to_numpy()[held] - 1) ** 2)))
    assert rms == pytest.approx(fit.residuals["gemm"].holdout_rms, rel=1e-3)
    assert fit.residuals["gemm"].holdout_rows == int(held.sum()) > 1000


@pytest.mark.parametrize("gpu", ["h100", "a100-80gb", "h200", "b200", "gb200", "b300"])
def test_gpu_with_tables_uses_the_fit_and_says_so(gpu):
    model = _model(gpu)
    assert model.cost_source == f"kernel-fit:{get_gpu(gpu).name}"
    assert "kernel tables" in model.cost_source_note


@pytest.mark.parametrize(
    "gpu, reason",
    [
        ("a100-40gb", "no measured kernel tables"),  # the tables were timed on the 80GB part
        ("l40s", "no measured kernel tables"),
    ],
)
def test_gpu_without_data_keeps_the_datasheet_roofline_and_says_so(gpu, reason):
    model = _model(gpu)
    assert model.cost_source == "datasheet-roofline"
    assert reason in model.cost_source_note
    datasheet = _model(gpu, kernels=False)
    batch = StepBatch(prefill_chunks=[(512, 0)], decode_contexts=[1000] * 16)
    assert model.step_time(batch) == datasheet.step_time(batch)


def test_gb200_at_tp8_keeps_the_datasheet_form_its_allreduce_table_stops_at_tp4():
    """The GB200 tables (an NVL72 rack) time the custom all-reduce at TP 2 and 4 only: TP 8 is not extrapolated."""
    assert set(kf.load_kernel_fit(get_gpu("gb200")).allreduce) == {2, 4}
    assert _model("gb200", "llama-3.1-70b", tensor_parallel_size=4).cost_source == "kernel-fit:GB200"
    tp8 = _model("gb200", "llama-3.1-70b", tensor_parallel_size=8)
    assert tp8.cost_source == "datasheet-roofline" and "no all-reduce table for TP=8" in tp8.cost_source_note


@pytest.mark.parametrize("gpu", ["h200", "b200", "gb200", "b300"])
def test_gpus_without_a_vidur_profile_borrow_the_h100s_elementwise_kernels_scaled_by_bandwidth(gpu):
    """Memory-bound norms, RoPE and activation: the H100's launch floor as it is, the per-token part at the same
    fraction of the GPU's own HBM bandwidth, so a token costs H100's time x (H100 bandwidth / this GPU's)."""
    h100, hw = get_gpu("h100"), get_gpu(gpu)
    mine, reference = kf.load_kernel_fit(hw).elementwise, kf.load_kernel_fit(h100).elementwise
    per_token = kf.elementwise_bytes_per_token(4096, 32, 8, 14336)
    tokens = np.array([0.0, 8192.0])
    own, borrowed = (
        kf.elementwise_time(mine, hw, tokens, per_token),
        kf.elementwise_time(reference, h100, tokens, per_token),
    )
    assert own[0] == pytest.approx(borrowed[0], rel=1e-3)  # the launch floor
    scale = h100.memory_bandwidth / hw.memory_bandwidth
    assert own[1] - own[0] == pytest.approx((borrowed[1] - borrowed[0]) * scale, rel=1e-3)


def test_calibrated_efficiencies_and_other_weight_formats_keep_the_datasheet_form():
    calibrated = _model(coefficients=CostCoefficients(compute_efficiency=0.6, memory_efficiency=0.75))
    assert calibrated.cost_source == "datasheet-roofline" and "calibrated" in calibrated.cost_source_note
    fp8 = _model(quantization="fp8")
    assert fp8.cost_source == "datasheet-roofline" and "fp8" in fp8.cost_source_note
    # CPU-side coefficients alone (what the engine defaults set) leave the kernel fit in place.
    assert _model(coefficients=GPU_ONLY).cost_source == "kernel-fit:H100-SXM"


def test_smooth_roofline_lies_between_max_and_sum():
    for c, m in [(1.0, 0.0), (1.0, 1.0), (2.0, 0.5), (1e-6, 3e-6)]:
        for p in (1.0, 1.7, 3.0, 12.0):
            s = kf.smooth_roofline(c, m, p)
            assert max(c, m) <= s <= c + m + 1e-18
    assert kf.smooth_roofline(1.0, 1.0, 1.0) == 2.0
    assert kf.smooth_roofline(1.0, 1.0, 60.0) == pytest.approx(1.0, rel=0.02)


@pytest.mark.parametrize(
    "gpu, model, tp",
    [
        ("h100", "llama-3.1-8b", 1),
        ("a100-80gb", "qwen2.5-7b", 1),
        ("h200", "llama-3.1-70b", 4),
        ("b200", "llama-3.1-70b", 8),
        ("gb200", "qwen2.5-7b", 1),
    ],
)
def test_fitted_step_time_is_continuous_and_monotone_in_tokens(gpu, model, tp):
    cost = _model(gpu, model, GPU_ONLY, tensor_parallel_size=tp)
    ideal = _model(gpu, model, CostCoefficients.ideal(), tensor_parallel_size=tp, kernels=False)
    assert cost.cost_source.startswith("kernel-fit:")
    decode, prefill = range(1, 1025), range(1, 16385, 7)
    for sizes, batch in (
        (decode, lambda n: StepBatch(decode_contexts=[2048] * n)),
        (prefill, lambda n: StepBatch(prefill_chunks=[(n, 0)])),
    ):
        times = np.array([cost.step_time(batch(n)) for n in sizes])
        added = np.diff(times)
        assert np.all(added > 0), "step time must grow with every added token"
        # No jump: the added tokens never cost more than 3x their own FLOPs and KV bytes at datasheet peak.
        own = np.diff([ideal.step_time(batch(n)) for n in sizes])
        assert added.max() < 3 * own.max()
    context = [cost.step_time(StepBatch(decode_contexts=[c] * 32)) for c in range(64, 16384, 64)]
    assert np.all(np.diff(context) > 0)


def test_cost_model_adds_the_fitted_ops_of_a_forward_pass():
    """The cost model's constants implement kernel_fit's op formulas: a decode step is their sum over layers."""
    hw, spec = get_gpu("h100"), get_model("llama-3.1-8b")
    cost = _model(coefficients=GPU_ONLY)
    fit = kf.load_kernel_fit(hw)
    b, ctx = 64, 2048
    h, d, heads, kv, inter = spec.hidden_size, spec.head_dim, spec.num_heads, spec.num_kv_heads, spec.intermediate_size
    f = np.float64
    layer = sum(
        kf.gemm_time(fit.gemm, hw, f(b), f(n), f(k))
        for n, k in (((heads + 2 * kv) * d, h), (h, heads * d), (2 * inter, h), (h, inter))
    )
    layer += kf.decode_attention_time(fit.decode_attention, hw, f(b), f(ctx), f(kv))
    layer += kf.elementwise_time(fit.elementwise, hw, f(b), kf.elementwise_bytes_per_token(h, heads, kv, inter))
    expected = spec.num_layers * layer + kf.gemm_time(fit.gemm, hw, f(b), f(spec.vocab_size), f(h))
    assert cost.step_time(StepBatch(decode_contexts=[ctx] * b)) == pytest.approx(float(expected), rel=1e-9)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_allreduce_follows_the_a100_table_on_both_sides_of_vllms_custom_allreduce_bound(tp):
    """On an A100 vLLM hands messages of 8 MiB and up from its custom all-reduce to NCCL, which takes 2-3x as long
    at that size: one line across the switch priced a 2,048-token step's 16 MiB message 23% under the table at TP 8.
    (Below the switch the custom all-reduce's own one-shot/two-shot change at 256-512 KiB stays inside one line.)"""
    fit, rows = (
        kf.load_kernel_fit(get_gpu("a100-80gb")).allreduce[tp],
        kf.allreduce_rows(kf.load_tables("A100-80GB-SXM")),
    )
    rows = rows[rows.num_gpus == tp]
    for mib in (16, 32, 64):
        measured = rows[rows.nbytes == mib * 2**20].latency.iloc[0]
        assert kf.allreduce_time(fit, np.array([mib * 2**20]))[0] == pytest.approx(measured, rel=0.1)
    below, at = kf.allreduce_time(fit, np.array([fit.switch_bytes - 16, fit.switch_bytes]))
    assert fit.switch_bytes == 8 * 2**20 and at > 1.3 * below


def test_gpus_with_a_symmetric_memory_allreduce_keep_one_line():
    """On Hopper and Blackwell vLLM switches at sizes that depend on TP (symmetric memory): one line, no split."""
    for gpu in ("h100", "h200", "b200", "gb200", "b300"):
        assert all(ar.switch_bytes is None for ar in kf.load_kernel_fit(get_gpu(gpu)).allreduce.values())


def test_cost_model_prices_each_side_of_the_allreduce_switch_with_its_own_piece():
    """Two all-reduces per layer of tokens x hidden bf16 values, on the fit's piece for that message size."""
    hw, spec = get_gpu("a100-80gb"), get_model("llama-3.1-70b")
    cost = _model("a100-80gb", "llama-3.1-70b", GPU_ONLY, tensor_parallel_size=2)
    fit = kf.load_kernel_fit(hw).allreduce[2]
    token_bytes = spec.hidden_size * spec.dtype_bytes
    for tokens in (fit.switch_bytes // token_bytes - 1, fit.switch_bytes // token_bytes, 2048):
        expected = 2 * spec.num_layers * kf.allreduce_time(fit, np.array([float(tokens * token_bytes)]))[0]
        assert cost._communication(tokens) == pytest.approx(expected, rel=1e-9)
    first_large = fit.switch_bytes // token_bytes
    assert cost._communication(first_large) > cost._communication(first_large - 1)


@pytest.mark.parametrize("gpu", list(kf.SYSTEMS))
def test_forward_pass_on_held_out_sizes_is_closer_than_the_datasheet(gpu):
    """Llama-3.1-8B decode (batches 1-512, contexts 512-8k) and prefill (256-16k) at sizes the fit never used."""
    hw, spec = get_gpu(gpu), get_model("llama-3.1-8b")
    tables = kf.load_tables(gpu)
    lookup, fit = kf.TableLookup(tables), kf.load_kernel_fit(hw)
    gemm_held = kf.held_out_sizes(kf.gemm_rows(tables).m)
    decode_held = kf.held_out_sizes(kf.decode_rows(tables).context)
    prefill_held = kf.held_out_sizes(kf.prefill_rows(tables).isl)
    fitted, datasheet = _model(gpu, coefficients=GPU_ONLY), _model(gpu, kernels=False)
    after, before = [], []
    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
        for ctx in (512, 1024, 2048, 4096, 8192):
            if b in gemm_held and ctx in decode_held and lookup.decode_measured(b, ctx, spec.num_kv_heads):
                table = kf.forward_pass(lookup, fit.elementwise, hw, spec, 1, tokens=b, decode_context=ctx).total
                batch = StepBatch(decode_contexts=[ctx] * b)
                after.append(fitted.step_time(batch) / table - 1)
                before.append(datasheet.step_time(batch) / table - 1)
    for s in (256, 512, 1024, 2048, 4096, 8192, 16384):
        if s in gemm_held and s in prefill_held:
            table = kf.forward_pass(lookup, fit.elementwise, hw, spec, 1, tokens=s).total
            batch = StepBatch(prefill_chunks=[(s, 0)])
            after.append(fitted.step_time(batch) / table - 1)
            before.append(datasheet.step_time(batch) / table - 1)
    after, before = np.abs(after), np.abs(before)
    assert len(after) >= 10
    assert after.mean() < 0.05 and after.max() < 0.12
    assert after.mean() < 0.6 * before.mean()
    assert math.isfinite(after.max())
