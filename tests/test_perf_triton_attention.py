"""gpt-oss's attention on an Ampere GPU: vLLM's Triton backend, priced from its measured ratio to FlashAttention 2.

Needs aiconfigurator-core (the `kernels` extra, also in `test`): the L40S tables time both kernels on the same shapes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.perf import kernel_fit as kf
from servelab.perf.cost_model import CostCoefficients, RooflineCostModel, StepBatch
from servelab.perf.engine_config import EngineConfig
from servelab.perf.hardware import get_gpu
from servelab.perf.models import get_model, load_hf_config

CONFIGS = Path(__file__).parent / "fixtures" / "moe_configs"
GPU_ONLY = CostCoefficients(step_overhead_s=0, per_request_overhead_s=0, prefill_step_overhead_s=0)


def _gpt_oss(gpu: str, name: str = "gpt-oss-20b") -> RooflineCostModel:
    return RooflineCostModel(get_gpu(gpu), load_hf_config(CONFIGS / name), EngineConfig(), GPU_ONLY)


def test_only_gpt_oss_has_attention_sinks():
    assert load_hf_config(CONFIGS / "gpt-oss-120b").attention_sinks
    assert not load_hf_config(CONFIGS / "qwen3-30b-a3b").attention_sinks
    assert not get_model("llama-3.1-8b").attention_sinks


def test_the_scale_reproduces_the_measured_triton_over_flash_attention_ratio():
    """On the sibling GPU, the two fitted kernels give the ratio its table measured (median over shapes)."""
    ratios = kf.sibling_time_ratios(kf.load_kernel_coefficients().sink_prefill)
    for length, (measured, fitted) in ratios.items():
        if length >= 1024:
            assert fitted == pytest.approx(measured, rel=0.08), length
    assert all(2.2 < ratios[n][0] < 2.6 for n in (8192, 12288, 16384))  # Triton: ~2.4x FlashAttention 2's time


def test_gpt_oss_prefill_on_an_a100_runs_the_triton_backend(monkeypatch):
    triton = _gpt_oss("A100-80GB-SXM")
    assert "Triton backend" in triton.cost_source_note
    monkeypatch.setattr(kf, "SINK_TRITON_SYSTEMS", frozenset())
    flash = _gpt_oss("A100-80GB-SXM")
    assert "Triton" not in flash.cost_source_note

    decode = StepBatch(decode_contexts=[4096] * 64)
    assert triton.step_time(decode) == flash.step_time(decode)  # decode attention: the fitted FA2 form either way

    def prefill_attention(model: RooflineCostModel, chunk: int, cached: int) -> float:
        """A prefill step less the same step without query-key work."""
        work = chunk * cached + chunk * (chunk + 1) // 2
        return model.step_time_aggregate(chunk, work, 0, 0, 1, cached) - model.step_time_aggregate(
            chunk, 0, 0, 0, 1, cached
        )

    ratio = prefill_attention(triton, 8192, 24576) / prefill_attention(flash, 8192, 24576)
    assert 2.0 < ratio < 2.7  # the sibling's ratio at ~30K keys, over the A100's own FlashAttention 2 fit


@pytest.mark.parametrize("gpu, name", [("H100-SXM", "gpt-oss-120b"), ("B200", "gpt-oss-120b")])
def test_gpus_with_sink_kernels_keep_their_fitted_prefill_attention(gpu, name):
    model = _gpt_oss(gpu, name)
    assert "Triton" not in model.cost_source_note


def test_models_without_sinks_on_an_a100_keep_flash_attention():
    hw, spec = get_gpu("A100-80GB-SXM"), get_model("llama-3.1-8b")
    assert "Triton" not in RooflineCostModel(hw, spec, EngineConfig()).cost_source_note
