"""DeepSeek at a few requests in flight: MLA's replicated down projections, and the measured fixed costs of its MLA
decode block and FP8 block-scaled fused MoE (data/mla_fp8_moe_kernels.yaml) on the GPUs whose tables measure them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servelab.perf.cost_model import MOE_LAYER_FIXED_S, RooflineCostModel, prefill_attention_work
from servelab.perf.engine_config import EngineConfig
from servelab.perf.hardware import get_gpu
from servelab.perf.kernel_fit import load_kernel_fit
from servelab.perf.memory import weight_bytes_per_rank
from servelab.perf.models import get_model, load_hf_config
from servelab.perf.moe_kernels import MLA_FP8_MOE_FILE, mla_decode_cost, mla_prefill_cost, triton_moe_rate
from servelab.perf.quantization import weight_format
from support.benchmark_script import load_benchmark

CONFIGS = Path(__file__).parent / "fixtures" / "moe_configs"
DEEPSEEK_R1 = load_hf_config(CONFIGS / "deepseek-r1-0528")
V2_LITE = load_hf_config(CONFIGS / "deepseek-v2-lite")


def decode_step(cost: RooflineCostModel, batch: int, context: int = 1000) -> float:
    return cost.step_time_aggregate(0, 0, batch, batch * context, batch)


def test_the_small_batch_costs_are_what_the_script_derives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """data/mla_fp8_moe_kernels.yaml is exactly what benchmarks/mla_fp8_moe_kernels.py --write derives from the
    installed aiconfigurator-core tables: no number in it is typed by hand."""
    script = load_benchmark("mla_fp8_moe_kernels")
    derived = script.derive(script.aiconfigurator_data_root())
    assert yaml.safe_load(yaml.safe_dump(derived)) == yaml.safe_load(MLA_FP8_MOE_FILE.read_text())


def test_mla_down_projections_are_whole_on_every_rank():
    """vLLM builds MLA's q/kv down projection with disable_tp=True: eight ranks hold seven more copies of it than one
    rank's share, and nothing else changes."""
    h200 = get_gpu("H200")
    one, eight = (weight_bytes_per_rank(DEEPSEEK_R1, None, h200, tp) for tp in (1, 8))
    down = DEEPSEEK_R1.num_layers * DEEPSEEK_R1.hidden_size * (1536 + 512 + 64)  # FP8: one byte each
    assert DEEPSEEK_R1.replicated_attention_params * DEEPSEEK_R1.num_layers == down
    assert 8 * eight - one == pytest.approx(7 * down, abs=8)
    dense = get_model("Llama-3.1-8B")
    assert dense.replicated_attention_params == 0
    assert 2 * weight_bytes_per_rank(dense, None, h200, 2) == pytest.approx(weight_bytes_per_rank(dense, None, h200, 1))


def test_deepseek_decode_pays_the_measured_mla_and_fp8_moe_fixed_costs_on_h200():
    """At four requests DeepSeek-R1 on 8 x H200 reads ~13 GB per GPU per step (~2.6 ms at full bandwidth), and on
    top every layer runs a measured ~80 us MLA block and every MoE layer a ~45 us FP8 fused-MoE chain (~7.8 ms)."""
    h200 = get_gpu("H200")
    cost = RooflineCostModel(h200, DEEPSEEK_R1, EngineConfig(tensor_parallel_size=8))
    mla = mla_decode_cost(h200, cost.dense_format, DEEPSEEK_R1.num_heads // 8)
    prefill = mla_prefill_cost(h200, cost.dense_format, DEEPSEEK_R1.num_heads // 8)
    assert mla is not None and 60e-6 < mla.fixed_s < 120e-6 and prefill is not None and cost.mla_measured
    fit = load_kernel_fit(h200)
    assert fit is not None
    launches = 61 * fit.elementwise.launch_s + (3 * 2 + 58 * 3) * fit.gemm.launch_s  # router + shared gate_up, down
    assert cost.mla_block_time(4, 0, 0) == pytest.approx(launches + 61 * (mla.fixed_s + 4 * mla.per_request_s))
    chunk = 61 * (prefill.fixed_s + 512 * prefill.per_token_s + 1000 * prefill.per_pair_s)
    assert cost.mla_block_time(4, 512, 1000) == pytest.approx(cost.mla_block_time(4, 0, 0) + chunk)
    moe_fixed = cost.moe_layer_time(1, 8) - cost.moe_layer_time(0, 8)
    assert cost.moe_layer_time(0, 0) > MOE_LAYER_FIXED_S * 1.5 and moe_fixed >= 0
    bytes_time = cost.weight_bytes_read(4) / h200.memory_bandwidth
    assert 2e-3 < bytes_time < 3e-3
    assert decode_step(cost, 4) > cost.mla_block_time(4, 0, 0) + 58 * cost.moe_layer_time(0, 0) + bytes_time


def test_gpus_and_formats_the_tables_do_not_measure_keep_the_bytes_and_flops_price():
    """H20 has no tables: no MLA block cost is added, and FP8 experts keep the bf16 fixed cost; a bf16 DeepSeek on
    an H100 reads the bf16 row of the head count it runs."""
    h20 = get_gpu("H20")
    cost = RooflineCostModel(h20, DEEPSEEK_R1, EngineConfig(tensor_parallel_size=8))
    assert cost.mla_block_time(4, 512, 1000) == 0.0 and not cost.mla_measured
    assert cost.moe_layer_time(0, 0) == MOE_LAYER_FIXED_S
    h100 = get_gpu("H100")
    bf16 = weight_format(None, V2_LITE, h100)
    assert mla_decode_cost(h100, bf16, V2_LITE.num_heads) is not None
    dense = RooflineCostModel(h100, get_model("Llama-3.1-8B"), EngineConfig())
    assert dense.mla_block_time(8, 512, 1000) == 0.0


def test_fp8_experts_run_at_the_measured_triton_rate_which_falls_with_the_slice_width():
    """A long prefill of DeepSeek's FP8 experts is held to vLLM's measured Triton fused-MoE rate for each rank's
    expert width: TP 8 slices the 2,048-wide experts to 256 and runs them at under half the rate of whole ones."""
    h200 = get_gpu("H200")
    fp8 = weight_format(None, DEEPSEEK_R1, h200)
    rate = triton_moe_rate(h200, fp8)
    assert rate is not None
    narrow, wide = rate.flops(256), rate.flops(2048)
    assert narrow < 0.6 * wide < h200.peak_flops("fp8")
    cost = RooflineCostModel(h200, DEEPSEEK_R1, EngineConfig(tensor_parallel_size=8))
    routed_flops = 8192 * DEEPSEEK_R1.routed_expert_flops_per_token / DEEPSEEK_R1.num_moe_layers / 8
    assert cost.moe_layer_time(8192, 256) >= routed_flops / narrow
    assert triton_moe_rate(get_gpu("H20"), fp8) is None


def test_bf16_experts_on_hopper_run_at_the_measured_triton_rate_which_falls_with_fewer_rows_per_expert():
    """Qwen3-235B's bf16 experts at TP 8 on an H200 (128 experts sliced to 192, top 8) multiply at vLLM's measured
    Triton fused-MoE rate, not at a dense GEMM's: an 8,192-token step hands each expert 512 rows and the layer takes
    at least its FLOPs at that rate, and a 2,048-token step's 128 rows run at a lower rate still."""
    h200, qwen = get_gpu("H200"), load_hf_config(CONFIGS / "qwen3-235b-a22b")
    bf16 = weight_format(None, qwen, h200)
    rate = triton_moe_rate(h200, bf16)
    assert rate is not None and rate.half_rows
    cost = RooflineCostModel(h200, qwen, EngineConfig(tensor_parallel_size=8))
    per_token = qwen.routed_expert_flops_per_token / qwen.num_moe_layers / 8
    for tokens, rows in ((8192, 512), (2048, 128)):
        at_rate = tokens * per_token / (rate.flops(192) * rows / (rows + rate.half_rows))
        assert cost.moe_layer_time(tokens, 128) >= at_rate
    per_row_large = cost.moe_layer_time(8192, 128) / 8192
    assert cost.moe_layer_time(2048, 128) / 2048 > 1.1 * per_row_large


def test_a_measured_mla_prefill_block_replaces_the_datasheet_attention_price():
    """Where the MLA tables apply, a prefill chunk's attention projections and attention are the measured block's
    (per token and per query-key pair), not peak FLOPs x an assumed efficiency: for a 4,096-token DeepSeek-R1 prompt on
    8 x H200 the measured blocks take over twice their FLOPs at the FP8 (projections) and bf16 (attention) peaks."""
    h200 = get_gpu("H200")
    cost = RooflineCostModel(h200, DEEPSEEK_R1, EngineConfig(tensor_parallel_size=8))
    work = prefill_attention_work(4096, 0)
    prefill = mla_prefill_cost(h200, cost.dense_format, 16)
    assert prefill is not None
    block = cost.mla_block_time(0, 4096, work) - cost.mla_block_time(0, 0, 0)
    assert block == pytest.approx(61 * (prefill.fixed_s + 4096 * prefill.per_token_s + work * prefill.per_pair_s))
    replicated = DEEPSEEK_R1.replicated_attention_params
    projections = 2 * 61 * 4096 * (replicated + (DEEPSEEK_R1.attention_linear_params - replicated) / 8)
    attention = work * DEEPSEEK_R1.attention_flops_per_pair / 8
    assert block > 2 * (projections / h200.peak_flops("fp8") + attention / h200.peak_flops("bf16"))
    assert cost.step_time_aggregate(4096, work, 0, 0, 1) > block
