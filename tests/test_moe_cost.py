"""Physics of a mixture-of-experts step: weights read grow with the experts a batch touches; FP4 formats save compute
only on chips with the tensor cores for them; `servelab simulate` runs MoE configs end to end."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from servelab.cli import app
from servelab.perf.cost_model import MOE_LAYER_FIXED_S, CostCoefficients, RooflineCostModel
from servelab.perf.engine_config import EngineConfig
from servelab.perf.hardware import Hardware, get_gpu
from servelab.perf.models import get_model, load_hf_config
from servelab.perf.moe_kernels import (
    RATES_FILE,
    MoeKernel,
    MoeWidthRate,
    expert_kernel,
    marlin_linear_flops,
    moe_kernel_flops,
    moe_kernel_rates,
    mxfp4_padding,
)
from servelab.perf.quantization import weight_format
from servelab.perf.vllm_versions import version_defaults
from support.benchmark_script import load_benchmark

CONFIGS = Path(__file__).parent / "fixtures" / "moe_configs"
QWEN3_MOE = load_hf_config(CONFIGS / "qwen3-30b-a3b")
GPT_OSS = load_hf_config(CONFIGS / "gpt-oss-20b")
assert GPT_OSS.moe is not None
GPT_OSS_WIDTH = GPT_OSS.moe.expert_intermediate_size
"""Each expert's width on one GPU (TP = 1)."""


def mxfp4_flops(kernel: MoeKernel, hardware: Hardware, width: int = GPT_OSS_WIDTH) -> float | None:
    """`kernel`'s priced rate for gpt-oss's MXFP4 experts on `hardware`, each rank's experts `width` wide."""
    return moe_kernel_flops(kernel, hardware, weight_format(None, GPT_OSS, hardware), width)


def decode_step(cost: RooflineCostModel, batch: int, context: int = 1000) -> float:
    return cost.step_time_aggregate(0, 0, batch, batch * context, batch)


def test_batch_one_reads_the_active_experts_and_a_large_batch_reads_them_all():
    cost = RooflineCostModel(get_gpu("h100"), QWEN3_MOE, EngineConfig())
    params_read = {b: cost.weight_bytes_read(b) / QWEN3_MOE.dtype_bytes / 1e9 for b in (1, 8, 256)}
    assert params_read[1] == pytest.approx(3.0, abs=0.15)  # "A3B": ~3B of weights besides the embedding
    all_weights = (QWEN3_MOE.params - QWEN3_MOE.embedding_params) / 1e9
    assert params_read[256] == pytest.approx(all_weights, rel=0.01)
    assert params_read[1] < params_read[8] < params_read[256]


@pytest.mark.parametrize("kernels", [True, False])
def test_moe_tpot_is_far_below_a_dense_model_of_the_same_size(kernels):
    dense = RooflineCostModel(get_gpu("h100"), get_model("Qwen3-32B"), EngineConfig(), kernels=kernels)
    moe = RooflineCostModel(get_gpu("h100"), QWEN3_MOE, EngineConfig(), kernels=kernels)
    assert moe.cost_source == dense.cost_source
    assert decode_step(moe, 1) < 0.4 * decode_step(dense, 1)
    # At a large batch every expert is read: the advantage shrinks to the ratio of all weights (~30B vs ~32B).
    assert decode_step(moe, 256) > 0.5 * decode_step(dense, 256)


def test_mxfp4_experts_save_compute_on_blackwell_and_only_bytes_on_ampere():
    bf16_experts = replace(GPT_OSS, quantization=None, quantized_experts_only=False)
    experts = GPT_OSS.moe
    assert experts is not None
    ratios = {}
    for gpu in ("b200", "a100"):
        mxfp4 = RooflineCostModel(get_gpu(gpu), GPT_OSS, EngineConfig(), CostCoefficients.ideal())
        bf16 = RooflineCostModel(get_gpu(gpu), bf16_experts, EngineConfig(), CostCoefficients.ideal())

        def grouped_gemm_ratio(tokens: int, touched: int) -> float:
            """MXFP4 over bf16 time of the experts' grouped GEMM (the kernel chain's fixed cost left out)."""
            fp4, bf = (m.moe_layer_time(tokens, touched) - MOE_LAYER_FIXED_S for m in (mxfp4, bf16))  # noqa: B023
            return fp4 / bf

        # A long prefill (every expert runs hundreds of rows: compute-bound), and one decoding token (bytes-bound).
        # vLLM pads MXFP4 experts for their kernel (3,072 x 3,072 on Blackwell, 3,072 x 2,944 in Marlin): per weight
        # of the published expert, the padded one computes and reads this much more.
        padding = mxfp4_padding(GPT_OSS, get_gpu(gpu), EngineConfig())
        long_prefill, one_token = (
            grouped_gemm_ratio(16384, experts.num_experts),
            grouped_gemm_ratio(1, experts.experts_per_token),
        )
        ratios[gpu] = (long_prefill / padding, one_token / padding)
    assert ratios["b200"][0] == pytest.approx(0.5, abs=0.05)  # MXFP4 x MXFP8 at the FP8 rate: half the bf16 time
    assert ratios["a100"][0] > 0.98  # dequantized to bf16: no compute saved (the Marlin kernel can cost more)
    for gpu in ("a100", "b200"):  # 4.25 bits per weight instead of 16
        assert ratios[gpu][1] == pytest.approx(0.53125 / 2, rel=0.02)


@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_weight_only_formats_run_on_the_measured_bf16_kernels(gpu: str):
    """FP8 weights on an A100 (Marlin) and MXFP4 experts on an A100 or H100 compute in bf16: the kernel fit prices
    them, so a long prefill costs at least what the bf16 model's does, while one decoding token reads fewer bytes."""
    fp8, bf16 = (load_hf_config(CONFIGS / name) for name in ("qwen3-235b-a22b-fp8", "qwen3-235b-a22b"))
    pairs = [(GPT_OSS, replace(GPT_OSS, quantization=None, quantized_experts_only=False))]
    if gpu == "a100":
        pairs.append((fp8, bf16))
    for quantized, full in pairs:
        low, high = (RooflineCostModel(get_gpu(gpu), m, EngineConfig()) for m in (quantized, full))
        assert low.weight_format.compute_dtype == "bf16" and low.weight_format.bytes_per_param < 2
        assert low.cost_source == high.cost_source == f"kernel-fit:{get_gpu(gpu).name}"
        prefill = [m.step_time_aggregate(8192, 4 * 2048 * 2049 // 2, 0, 0, 4) for m in (low, high)]
        assert prefill[0] > 0.95 * prefill[1]  # no compute saved on a long prefill
        assert decode_step(low, 1) < 0.8 * decode_step(high, 1)


@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_weight_only_experts_run_no_faster_than_the_measured_marlin_kernel(gpu: str):
    """A long prefill of weight-only experts on a release that runs them in Marlin (vLLM 0.11) runs at the Marlin
    fused-MoE kernel's measured rate (data/moe_kernels.yaml), not at a dense bf16 GEMM's; bf16 experts, and a decode
    step's few rows, are not held to it."""
    hardware = get_gpu(gpu)
    marlin = mxfp4_flops(MoeKernel.MARLIN, hardware)
    assert marlin is not None and 0.2 * hardware.peak_flops("bf16") < marlin < 0.6 * hardware.peak_flops("bf16")
    bf16_experts = replace(GPT_OSS, quantization=None, quantized_experts_only=False)
    mxfp4, bf16 = (RooflineCostModel(hardware, m, version_defaults((0, 11))) for m in (GPT_OSS, bf16_experts))
    moe = GPT_OSS.moe
    assert moe is not None
    tokens = 8192
    padding = mxfp4_padding(GPT_OSS, hardware, version_defaults((0, 11)))
    routed_flops = GPT_OSS.routed_expert_flops_per_token * padding / GPT_OSS.num_moe_layers * tokens
    layer = mxfp4.moe_layer_time(tokens, moe.num_experts) - MOE_LAYER_FIXED_S
    assert layer == pytest.approx(routed_flops / marlin, rel=0.01)
    assert bf16.moe_layer_time(tokens, moe.num_experts) < 0.7 * layer
    one_token = (m.moe_layer_time(1, moe.experts_per_token) for m in (mxfp4, bf16))
    assert next(one_token) < next(one_token)  # one token reads 4.25-bit weights: bytes, not the kernel's rate


def test_mxfp4_experts_on_hopper_run_in_openais_triton_kernel_from_the_release_that_ships_it():
    """gpt-oss's MXFP4 experts on an H100: Marlin's rate on vLLM 0.11, OpenAI's Triton kernel's measured rate (about
    2.2x) on the modelled release; an A100, whose tables do not measure the Triton kernel, stays on Marlin's."""
    h100, a100 = get_gpu("h100"), get_gpu("a100")
    tokens, moe = 8192, GPT_OSS.moe
    assert moe is not None

    def layer(hardware: Hardware, version: tuple[int, int] | None) -> float:
        cost = RooflineCostModel(hardware, GPT_OSS, version_defaults(version))
        return cost.moe_layer_time(tokens, moe.num_experts) - MOE_LAYER_FIXED_S

    triton, marlin = (mxfp4_flops(k, h100) for k in (MoeKernel.OAI_TRITON_MXFP4, MoeKernel.MARLIN))
    assert triton is not None and marlin is not None and triton > 1.5 * marlin
    routed_flops = GPT_OSS.routed_expert_flops_per_token / GPT_OSS.num_moe_layers * tokens
    marlin_padding = mxfp4_padding(GPT_OSS, h100, version_defaults((0, 11)))
    assert marlin_padding > 1.05 and mxfp4_padding(GPT_OSS, h100, EngineConfig()) == 1
    assert layer(h100, (0, 11)) == pytest.approx(routed_flops * marlin_padding / marlin, rel=0.01)
    assert layer(h100, None) <= routed_flops / triton * 1.01 and layer(h100, None) < 0.7 * layer(h100, (0, 11))
    assert layer(a100, None) == pytest.approx(layer(a100, (0, 11)))
    fp8_on_a100 = weight_format("fp8", QWEN3_MOE, a100)
    assert expert_kernel(fp8_on_a100, a100, EngineConfig()) is MoeKernel.MARLIN
    assert expert_kernel(weight_format(None, GPT_OSS, a100), a100, EngineConfig()) is MoeKernel.MARLIN


def test_vllm_mxfp4_use_marlin_puts_mxfp4_experts_on_hopper_back_in_marlin():
    """VLLM_MXFP4_USE_MARLIN=1 (vLLM's mxfp4.py get_mxfp4_backend picks Marlin over OpenAI's Triton kernel on Hopper):
    a long prefill of gpt-oss's experts at Marlin's measured rate even on a release that ships the Triton kernel; no
    effect on Blackwell, whose FP4 tensor cores run the experts."""
    tokens, moe = 8192, GPT_OSS.moe
    assert moe is not None

    def layer(gpu: str, use_marlin: bool) -> float:
        cost = RooflineCostModel(get_gpu(gpu), GPT_OSS, EngineConfig(mxfp4_use_marlin=use_marlin))
        return cost.moe_layer_time(tokens, moe.num_experts)

    marlin = mxfp4_flops(MoeKernel.MARLIN, get_gpu("h100"))
    assert marlin is not None
    padding = mxfp4_padding(GPT_OSS, get_gpu("h100"), EngineConfig(mxfp4_use_marlin=True))
    routed_flops = GPT_OSS.routed_expert_flops_per_token * padding / GPT_OSS.num_moe_layers * tokens
    assert layer("h100", True) - MOE_LAYER_FIXED_S == pytest.approx(routed_flops / marlin, rel=0.01)
    assert layer("h100", False) < 0.7 * layer("h100", True)
    assert layer("b200", True) == layer("b200", False)
    mxfp4_on_h100 = weight_format("mxfp4", GPT_OSS, get_gpu("h100"))
    assert expert_kernel(mxfp4_on_h100, get_gpu("h100"), EngineConfig()) is MoeKernel.OAI_TRITON_MXFP4
    assert expert_kernel(mxfp4_on_h100, get_gpu("h100"), EngineConfig(mxfp4_use_marlin=True)) is MoeKernel.MARLIN


def test_marlin_prices_each_weight_format_at_its_own_rows_and_a_format_without_rows_at_all_of_them():
    """Marlin's MXFP4 and int4 rows run at different rates (data/moe_kernels.yaml): gpt-oss's MXFP4 experts in Marlin
    are priced at the MXFP4 rows, AWQ/GPTQ experts at the int4 rows; on a GPU whose tables have no MXFP4 Marlin row
    (the A100), and for a format the tables never measure in Marlin (FP8 weight-only), at every Marlin row there, as
    the data file says."""
    doc = yaml.safe_load(RATES_FILE.read_text())
    assert "all_formats" in doc["formats"]["rule"]
    h100, a100 = get_gpu("h100"), get_gpu("a100-80gb")
    marlin = doc["kernels"]["marlin"]["gpus"]
    mxfp4, int4 = (weight_format(q, GPT_OSS, h100) for q in ("mxfp4", "awq"))
    assert (
        moe_kernel_rates(MoeKernel.MARLIN, h100, mxfp4)[0].tflops
        == marlin["H100-SXM"]["formats"]["w4a16_mxfp4"]["tflops"]
    )
    assert (
        moe_kernel_rates(MoeKernel.MARLIN, h100, int4)[0].tflops == marlin["H100-SXM"]["formats"]["int4_wo"]["tflops"]
    )
    assert "w4a16_mxfp4" not in marlin["A100-80GB-SXM"]["formats"]
    fallback = MoeWidthRate.model_validate(marlin["A100-80GB-SXM"]["all_formats"]["width_rate"])
    for quantization in ("mxfp4", "fp8"):
        weights = weight_format(quantization, GPT_OSS, a100)
        flops = moe_kernel_flops(MoeKernel.MARLIN, a100, weights, GPT_OSS_WIDTH)
        assert flops == pytest.approx(fallback.flops(GPT_OSS_WIDTH))


def test_marlin_on_an_a100_runs_slower_on_narrower_slices_of_each_expert():
    """The A100's Marlin rows (one table, int4 weights, eleven expert shapes at TP 1 to 8) fall with each rank's expert
    width as the MXFP4 rows elsewhere do, so Qwen3-235B-FP8's experts at TP 4 (384 wide) run below their whole-expert
    rate (1,536 wide, what expert parallelism keeps), and both below the rate of 4-bit experts wider still."""
    a100 = get_gpu("A100-80GB-SXM")
    qwen = load_hf_config(CONFIGS / "qwen3-235b-a22b-fp8")
    fp8 = weight_format(None, qwen, a100)
    assert fp8.name == "fp8-weight-only"
    tp4, whole = (moe_kernel_flops(MoeKernel.MARLIN, a100, fp8, w) for w in (384, 1536))
    assert tp4 is not None and whole is not None
    assert tp4 < 0.85 * whole < 0.85 * moe_kernel_rates(MoeKernel.MARLIN, a100, fp8)[0].flops(16384)


@pytest.mark.parametrize("kernel", list(MoeKernel))
@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_mxfp4_kernels_run_slower_on_narrower_slices_of_each_expert(kernel: MoeKernel, gpu: str):
    """Tensor parallelism cuts each expert's intermediate width by TP; a narrower slice gives the kernel's MMA tiles
    fewer columns to reuse the routed tokens over, so both MXFP4 kernels run below their whole-expert rate (the tables
    measure it falling at TP 2 to 32), and a TP = 4 server's long prefill of the experts takes more than a quarter of
    one GPU's."""
    hardware = get_gpu(gpu)
    rates = [mxfp4_flops(kernel, hardware, GPT_OSS_WIDTH // tp) for tp in (1, 2, 4, 8)]
    assert all(r is not None for r in rates)
    assert rates == sorted(rates, reverse=True) and rates[-1] < 0.8 * rates[0]  # type: ignore[operator]
    version = (0, 11) if kernel is MoeKernel.MARLIN else None

    def layer(tp: int) -> float:
        cost = RooflineCostModel(hardware, GPT_OSS, version_defaults(version).with_(tensor_parallel_size=tp))
        return cost.moe_layer_time(8192, GPT_OSS.moe.num_experts) - MOE_LAYER_FIXED_S  # type: ignore[union-attr]

    one, four = layer(1), layer(4)
    assert four > 1.05 * one / 4


def test_the_kernel_rates_are_the_measured_tables_medians(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """data/moe_kernels.yaml is exactly what benchmarks/moe_kernel_check.py --write-rates derives from the installed
    aiconfigurator-core tables: no rate in it is typed by hand."""
    check = load_benchmark("moe_kernel_check")
    monkeypatch.setattr(check, "RATES_FILE", tmp_path / RATES_FILE.name)
    check.write_rates(check.aiconfigurator_data_root())
    assert yaml.safe_load((tmp_path / RATES_FILE.name).read_text()) == yaml.safe_load(RATES_FILE.read_text())


def test_gpt_oss_attention_stays_bf16_while_its_experts_are_mxfp4():
    cost = RooflineCostModel(get_gpu("b200"), GPT_OSS, EngineConfig())
    assert cost.weight_format.name == "mxfp4" and cost.weight_format.compute_dtype == "fp8"
    a100 = RooflineCostModel(get_gpu("a100"), GPT_OSS, EngineConfig())
    assert a100.weight_format.name == "mxfp4-weight-only" and "no FP4 tensor cores" in a100.weight_format.note
    attention_bytes = GPT_OSS.num_layers * GPT_OSS.attention_linear_params * 2
    assert cost.weight_bytes_read(1) > attention_bytes


def test_nvfp4_runs_at_the_fp4_rate_on_blackwell_only():
    assert weight_format("nvfp4", QWEN3_MOE, get_gpu("b200")).compute_dtype == "fp4"
    assert weight_format("nvfp4", QWEN3_MOE, get_gpu("h100")).compute_dtype == "bf16"
    assert get_gpu("b200").peak_flops("fp4") == 2 * get_gpu("b200").peak_flops("fp8")


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v2-lite"])
def test_simulate_runs_moe_configs_end_to_end(tmp_path: Path, name: str):
    out = tmp_path / name
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--model",
            str(CONFIGS / name),
            "--gpu",
            "H100",
            "--random-input-len",
            "512",
            "--random-output-len",
            "32",
            "--num-prompts",
            "30",
            "--request-rate",
            "4",
            "--result-dir",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 30 and 0 < summary["mean_tpot_ms"] < 50


def test_gpt_oss_on_blackwell_prices_its_bf16_layers_on_the_kernel_fit_and_its_experts_at_their_fp8_peak():
    """gpt-oss quantizes only its experts: on a B200 its attention, LM head and norms are bf16 GEMMs the fit covers,
    with their launch floors, and its MXFP4 experts compute on the FP8 tensor cores (vLLM's MXFP4 x MXFP8 path), so a
    compute-bound expert GEMM takes the bf16 fit's time scaled by the two peaks."""
    b200 = get_gpu("b200")
    fitted = RooflineCostModel(b200, GPT_OSS, EngineConfig())
    datasheet = RooflineCostModel(b200, GPT_OSS, EngineConfig(), kernels=False)
    assert fitted.cost_source == "kernel-fit:B200" and fitted.weight_format.compute_dtype == "fp8"
    # A decode step of 4 pays the fitted kernels' launch floors, which the datasheet form does not have.
    assert fitted.step_time_aggregate(0, 0, 4, 4 * 1000, 4) > 1.2 * datasheet.step_time_aggregate(0, 0, 4, 4000, 4)
    # A large prefill's experts: compute-bound, at the FP8 peak rather than the bf16 one.
    experts = GPT_OSS.moe.num_experts
    as_bf16 = RooflineCostModel(b200, GPT_OSS, EngineConfig())
    as_bf16._expert_gemms = tuple(  # the same GEMMs at the bf16 peak
        (c[0] * b200.peak_flops("fp8") / b200.peak_flops("bf16"), *c[1:]) for c in fitted._expert_gemms
    )
    ratio = as_bf16.moe_layer_time(16384, experts) / fitted.moe_layer_time(16384, experts)
    assert 1.5 < ratio <= b200.peak_flops("fp8") / b200.peak_flops("bf16")


def test_weight_only_experts_read_no_faster_than_their_kernel_s_measured_bandwidth():
    """At small batches a fused-MoE kernel reads every touched expert's weights once: vLLM's OpenAI Triton MXFP4
    kernel reaches a measured share of an H200's HBM bandwidth there (data/moe_kernels.yaml, vLLM's own table), well
    under what a dense GEMM of the same bytes reaches, and the layer takes at least that read."""
    from servelab.perf.moe_kernels import moe_kernel_bandwidth

    h200 = get_gpu("h200")
    kernel = expert_kernel(weight_format(None, GPT_OSS, h200), h200, EngineConfig())
    assert kernel == MoeKernel.OAI_TRITON_MXFP4
    mxfp4 = weight_format(None, GPT_OSS, h200)
    rate = moe_kernel_bandwidth(kernel, h200, mxfp4)
    assert rate is not None and 0.3 * h200.memory_bandwidth < rate < 0.7 * h200.memory_bandwidth
    cost = RooflineCostModel(h200, GPT_OSS, EngineConfig())
    experts = GPT_OSS.moe.num_experts
    per_expert = GPT_OSS.expert_params * cost.weight_format.bytes_per_param
    for tokens in (16, 64):
        assert cost.moe_layer_time(tokens, experts) >= experts * per_expert / rate
    a100 = get_gpu("a100-80gb")
    assert moe_kernel_bandwidth(MoeKernel.MARLIN, a100, mxfp4) is None  # no vLLM table measures it there


def test_fp8_linear_layers_run_in_marlin_only_where_vllm_runs_them_there():
    """vLLM runs FP8 linear layers in Marlin's W8A16 GEMM on a GPU without FP8 tensor cores (the A100), on FP8 tensor
    cores where there are some (the H100); bf16 and 4-bit weights take no Marlin floor on their dense layers."""
    a100, h100, dense = get_gpu("A100-80GB-SXM"), get_gpu("H100-SXM"), get_model("Qwen3-32B")
    fp8_on_a100 = weight_format("fp8", dense, a100)
    marlin = moe_kernel_rates(MoeKernel.MARLIN, a100, fp8_on_a100)[0].tflops * 1e12
    assert marlin_linear_flops(a100, fp8_on_a100) == pytest.approx(marlin)
    assert 130e12 < marlin < 150e12  # Marlin's measured large-batch rate on the A100, ~45% of its bf16 peak
    assert marlin_linear_flops(h100, weight_format("fp8", dense, h100)) is None
    assert marlin_linear_flops(a100, weight_format(None, dense, a100)) is None
    assert marlin_linear_flops(a100, weight_format("awq", dense, a100)) is None


def test_a_long_fp8_prefill_on_an_a100_runs_its_linear_layers_no_faster_than_marlin():
    """A step of 8,192 fresh tokens of Qwen3-32B in FP8 on an A100 takes at least its linear layers' FLOPs at Marlin's
    rate (on the bf16 GEMM fit alone the whole step prices below that), while a decode step still gains FP8's halved
    weight bytes over bf16."""
    a100, dense = get_gpu("A100-80GB-SXM"), get_model("Qwen3-32B")
    fp8 = RooflineCostModel(a100, dense, EngineConfig(quantization="fp8"))
    bf16 = RooflineCostModel(a100, dense, EngineConfig())
    tokens = 8192
    marlin = marlin_linear_flops(a100, fp8.dense_format)
    assert marlin is not None
    linear_floor = tokens * dense.non_expert_linear_flops_per_token / marlin
    assert fp8.step_time_aggregate(tokens, tokens * (tokens + 1) // 2, 0, 0, 1) > linear_floor
    assert decode_step(fp8, 8) < 0.7 * decode_step(bf16, 8)
