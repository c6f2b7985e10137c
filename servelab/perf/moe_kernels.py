"""The measured large-batch throughput of the fused-MoE kernels that weight-only experts run in.

On a GPU without tensor cores for its weights' format, vLLM dequantizes a MoE checkpoint's expert weights inside a
fused-MoE kernel's bf16 MMAs, and that kernel, not the dense GEMM fit, sets how fast a long prefill of the experts
runs. Which kernel depends on the format and the vLLM release:

- **Marlin** (FP8 on Ampere, AWQ/GPTQ 4-bit, and MXFP4 where OpenAI's Triton kernels are not installed):
  aiconfigurator-core measures it at 2,048 tokens or more at ~45% of the A100's bf16 peak and ~25% of the H100's.
- **OpenAI's Triton MXFP4 kernel** (`matmul_ogs`, gpt-oss's MXFP4 experts on Hopper): vLLM ships `triton_kernels` inside
  its wheel from 0.12.0 (PR #28788, `vllm/third_party/triton_kernels`), and from then on runs gpt-oss's MXFP4 experts
  on Hopper with it; before, neither the wheel nor the release image had it and vLLM ran them in Marlin (vLLM
  issue #23278 shows 0.10.1 doing so on an H100).
  aiconfigurator-core's vLLM 0.24 tables measure it at ~2.5x Marlin's MXFP4 rate on the H100 and H200. A server started
  with VLLM_MXFP4_USE_MARLIN=1 (EngineConfig.mxfp4_use_marlin) runs them in Marlin all the same, and so does a GPU
  below Hopper (an A100), which the Triton kernel does not support.

The rates per kernel, GPU and weight format are in data/moe_kernels.yaml, written by benchmarks/moe_kernel_check.py
--write-rates from the tables. Marlin's MXFP4 rows run at another rate than its int4 rows (~215 against ~255 TFLOP/s
on the H100), so a format is priced at its own rows where the GPU's tables measure the kernel in it, else at all the
kernel's rows there. The MXFP4 rows of both kernels, one expert shape measured at TP 1 to 32, and the rows of one
format from one release's table (the A100's Marlin rows, int4 on the GB200 and B300) also give the rate against each
rank's expert width (as for FP8 experts below): narrower slices run slower. A release and GPU the
tables do not measure for its kernel are held to Marlin's rate where that is measured, else to the kernel fit alone.
"""

from __future__ import annotations

from enum import StrEnum
from functools import cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict

from servelab.perf.engine_config import EngineConfig
from servelab.perf.hardware import Hardware
from servelab.perf.models import ModelSpec
from servelab.perf.quantization import WeightFormat, weight_format

RATES_FILE = Path(__file__).parent / "data" / "moe_kernels.yaml"

OAI_TRITON_CAPABILITIES = ((9, 0), (11, 0))
"""OpenAI's Triton MXFP4 kernels run from compute capability 9.0 up to, not including, 11.0 (vLLM's
quantization/mxfp4.py, get_mxfp4_backend: "only confirmed to work on SM90 and SM100"): Marlin elsewhere (an A100)."""


class MoeKernel(StrEnum):
    """A fused-MoE kernel that weight-only experts run in; the value is the data file's key."""

    MARLIN = "marlin"
    OAI_TRITON_MXFP4 = "oai_triton_mxfp4"


class MoeWidthRate(BaseModel):
    """A fused-MoE kernel's large-batch rate against each rank's expert width w: peak x w / (w + half_width), and where
    fitted, against the rows r each expert multiplies too: x r / (r + half_rows)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    peak_tflops: float
    half_width: float
    half_rows: float | None = None
    """None: the rate is a large-batch ceiling, whatever the rows."""
    rows: int
    widths: int
    cells: int | None = None
    median_abs_error: float | None = None
    p90_abs_error: float | None = None
    max_abs_error: float
    """Largest relative miss of the fit against the median rate of one width (and rows per expert, where fitted)."""
    tables: list[str] = []
    """The engines and releases whose rows the fit rests on, where the data file says."""

    def flops(self, width: float) -> float:
        """The rate at this width when experts are handed rows without bound."""
        return self.peak_tflops * 1e12 * width / (width + self.half_width)


class MoeKernelRate(BaseModel):
    """One kernel's measured throughput on one GPU at large batches (gated experts' matmul FLOPs per second per rank)
    over one selection of rows."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tflops: float
    """Median over the rows at TP = 1 (each expert whole on one GPU)."""
    rows: int
    range_tflops: tuple[float, float]
    shapes: int
    """Distinct expert shapes (hidden, intermediate, top-k, experts) among the rows."""
    tables: list[str]
    kernels: list[str]
    width_rate: MoeWidthRate | None = None
    """The rate against each rank's expert width, where the rows measure the kernel at several TPs of one shape."""
    bandwidth_fraction: float | None = None
    """Median share of the GPU's HBM bandwidth the kernel reaches reading the experts' weights at small batches (every
    expert routed to, a few rows each), in vLLM's newest table for this GPU; None where that table has no such row."""
    bandwidth_rows: int = 0
    bandwidth_table: str | None = None

    def flops(self, width: int) -> float:
        """FLOP/s per rank with each rank's experts `width` wide: the width fit where there is one, else the median."""
        return self.width_rate.flops(width) if self.width_rate else self.tflops * 1e12


class MoeKernelGpu(BaseModel):
    """One kernel's rates on one GPU: over all its rows, and over the rows of each table weight format."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    all_formats: MoeKernelRate
    formats: dict[str, MoeKernelRate]


TABLE_FORMATS = {"mxfp4-weight-only": "w4a16_mxfp4", "w4a16": "int4_wo"}
"""servelab weight format -> the tables' `moe_dtype` of the same weights (MXFP4: e8m0 scale per 32; AWQ/GPTQ int4:
fp16 scale per 128)."""


@cache
def _rates(path: Path = RATES_FILE) -> dict[MoeKernel, dict[str, MoeKernelGpu]]:
    doc = yaml.safe_load(path.read_text())
    return {
        MoeKernel(kernel): {gpu: MoeKernelGpu.model_validate(rate) for gpu, rate in part["gpus"].items()}
        for kernel, part in doc["kernels"].items()
    }


def expert_kernel(weights: WeightFormat, hardware: Hardware, config: EngineConfig) -> MoeKernel:
    """The kernel vLLM runs weight-only experts in: OpenAI's Triton kernel for MXFP4 where it is installed
    (`EngineConfig.mxfp4_triton_kernels`) and the GPU runs it, unless VLLM_MXFP4_USE_MARLIN=1 asks for Marlin (vLLM's
    quantization/mxfp4.py, get_mxfp4_backend: on Hopper without a FlashInfer MXFP4 flag, Marlin if the variable is
    set or triton_kernels is missing); Marlin otherwise."""
    low, high = OAI_TRITON_CAPABILITIES
    runs_triton = hardware.capability is not None and low <= hardware.capability < high
    installed = config.mxfp4_triton_kernels and not config.mxfp4_use_marlin
    triton = weights.name == "mxfp4-weight-only" and installed and runs_triton
    return MoeKernel.OAI_TRITON_MXFP4 if triton else MoeKernel.MARLIN


MXFP4_ALIGNMENT = {MoeKernel.MARLIN: (256, 128), MoeKernel.OAI_TRITON_MXFP4: (1, 64)}
"""(hidden size, each rank's expert width) multiples vLLM pads an MXFP4 checkpoint's experts to, by kernel: Marlin's
tiles need n % 256 == 0 and k % 128 == 0 in both expert GEMMs; OpenAI's Triton kernel pads the width to 64 (vLLM's
quantization/mxfp4.py, Mxfp4MoEMethod.create_weights). The padded weights are what the GPU holds, reads and
multiplies: gpt-oss-120b's 2,880-wide experts become 3,072 x 2,944 in Marlin, 9% more (vllm#23278's start-up log:
65.97 GiB of weights on one H100)."""
BLACKWELL_MXFP4_ALIGNMENT = (256, 256)
"""The same for MXFP4 experts on Blackwell's FP4 tensor cores (FlashInfer's SM100 MXFP4 paths, ibid.)."""


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def mxfp4_alignment(model: ModelSpec, hardware: Hardware, config: EngineConfig) -> tuple[int, int]:
    """(hidden size, each rank's expert width) multiples vLLM pads this model's routed experts to for the kernel that
    runs them (MXFP4_ALIGNMENT); (1, 1), no padding, for every format but MXFP4 and for a dense model."""
    weights = weight_format(config.quantization, model, hardware)
    if model.moe is None or not weights.name.startswith("mxfp4"):
        return 1, 1
    if weights.weight_only:
        return MXFP4_ALIGNMENT[expert_kernel(weights, hardware, config)]
    return BLACKWELL_MXFP4_ALIGNMENT


def mxfp4_padding(model: ModelSpec, hardware: Hardware, config: EngineConfig) -> float:
    """Padded over published size of each rank's routed experts (mxfp4_alignment): what the GPU reads and multiplies
    per weight of the checkpoint's experts, and in every kernel but OpenAI's Triton one what it holds too
    (mxfp4_held_padding); 1 where nothing is padded."""
    if model.moe is None:
        return 1.0
    hidden_multiple, width_multiple = mxfp4_alignment(model, hardware, config)
    width, hidden = expert_width_per_rank(model, config), model.hidden_size
    return round_up(hidden, hidden_multiple) * round_up(width, width_multiple) / (hidden * width)


MXFP4_BLOCK = 32
"""Weights per e8m0 scale byte in an MXFP4 checkpoint; each weight is half a byte."""
TRITON_SCALE_ROW_MULTIPLE = 256
"""Rows of swizzled scales OpenAI's Triton kernel reads, per expert and GEMM: HopperMXScaleLayout.swizzle_data pads
each GEMM's output rows (2 x width in gate/up, hidden in down) to 2 x num_warps x 2 x 8, with the 8 warps vLLM asks for
(quantization/mxfp4.py, Mxfp4MoEMethod.process_weights_after_loading; 4 only in the batched layout of the pplx and
DeepEP low-latency all-to-alls), and their columns to an even count. The same in the triton_kernels of every vLLM
release that ships it (vllm/third_party/triton_kernels/tensor_details/layout_details/hopper_scale.py in the wheels
of 0.12.0 to 0.32.0, each minor release's first, and 0.14.1)."""


def _triton_gemm_bytes(reduced: int, rows: int, config: EngineConfig) -> int:
    """Bytes one expert's GEMM holds in OpenAI's Triton kernel, `rows` outputs of `reduced` MXFP4 weights each: the
    packed weights as HopperMXValueLayout.swizzle_data pads them (mx_axis 1: `reduced` / 2 bytes by `rows`) to its
    16-row x 32-byte tile, or first to 64 bytes each way (EngineConfig.mxfp4_triton_pads_values_to_64_bytes), the
    swizzled scales (TRITON_SCALE_ROW_MULTIPLE) and the checkpoint's where vLLM keeps them."""
    packed = reduced // 2
    if config.mxfp4_triton_pads_values_to_64_bytes:
        weights = round_up(packed, 64) * round_up(rows, 64)
    else:
        weights = round_up(packed, 32) * round_up(rows, 16)
    scale_columns = reduced // MXFP4_BLOCK
    scales = round_up(rows, TRITON_SCALE_ROW_MULTIPLE) * round_up(scale_columns, 2)
    kept = rows * scale_columns if config.mxfp4_triton_keeps_checkpoint_scales else 0
    return weights + scales + kept


def mxfp4_held_padding(model: ModelSpec, hardware: Hardware, config: EngineConfig) -> float:
    """Bytes one GPU holds of its routed experts over their published bytes: mxfp4_padding, except in OpenAI's Triton
    kernel, which holds each gated expert (width padded to 64, hidden as published) as two swizzled GEMMs
    (_triton_gemm_bytes): gate/up reduces hidden into 2 x width rows, down reduces width into hidden rows.

    Checked against vLLM's start-up log: gpt-oss-120b on one H100 under 0.14.1 (checkpoint scales kept, the swizzled
    ones padded from 5,760 and 2,880 rows to 5,888 and 3,072) logs 'Model loading took 64.38 GiB' (vllm#33155), where
    servelab plans 64.15 (benchmarks/memory_plan_check.py)."""
    weights = weight_format(config.quantization, model, hardware)
    if model.moe is None or expert_kernel(weights, hardware, config) is not MoeKernel.OAI_TRITON_MXFP4:
        return mxfp4_padding(model, hardware, config)
    width, hidden = expert_width_per_rank(model, config), model.hidden_size
    padded_width = round_up(width, mxfp4_alignment(model, hardware, config)[1])
    held = _triton_gemm_bytes(hidden, 2 * padded_width, config) + _triton_gemm_bytes(padded_width, hidden, config)
    published = 3 * hidden * width * weights.bytes_per_param  # gate, up and down, as ModelSpec.expert_params
    return held / published


def expert_width_per_rank(model: ModelSpec, config: EngineConfig) -> int:
    """Each rank's slice of an expert's intermediate: sharded over TP, whole under expert parallelism."""
    assert model.moe is not None
    return model.moe.expert_intermediate_size // (1 if config.enable_expert_parallel else config.tensor_parallel_size)


def moe_kernel_rates(kernel: MoeKernel, hardware: Hardware, weights: WeightFormat) -> list[MoeKernelRate]:
    """The measured selections that may price `weights` in `kernel` on `hardware`, best first: the kernel's rows of
    this weight format, then all its rows (a format with no rows here), then the same two of Marlin (the fallback
    every weight-only format has, for a kernel the GPU's tables do not measure)."""
    table_format = TABLE_FORMATS.get(weights.name)
    found = []
    for each in dict.fromkeys((kernel, MoeKernel.MARLIN)):
        gpu = _rates()[each].get(hardware.name)
        if gpu is not None:
            own = gpu.formats.get(table_format) if table_format else None
            found += [own, gpu.all_formats] if own else [gpu.all_formats]
    return found


def moe_kernel_flops(kernel: MoeKernel, hardware: Hardware, weights: WeightFormat, width: int) -> float | None:
    """FLOP/s per rank of `kernel` at large batches on `hardware` for `weights`, each rank's experts `width` wide
    (intermediate / TP; whole under expert parallelism): the first measured selection (moe_kernel_rates), by width
    where it is fitted so; None where no table measures the kernel or Marlin on this GPU."""
    rates = moe_kernel_rates(kernel, hardware, weights)
    return rates[0].flops(width) if rates else None


def moe_kernel_bandwidth(kernel: MoeKernel, hardware: Hardware, weights: WeightFormat) -> float | None:
    """Bytes/s `kernel` reads expert weights at when memory-bound on `hardware`: the measured share of the HBM
    bandwidth of the first selection (moe_kernel_rates) that measures one, or None where none does."""
    for rate in moe_kernel_rates(kernel, hardware, weights):
        if rate.bandwidth_fraction is not None:
            return rate.bandwidth_fraction * hardware.memory_bandwidth
    return None


MARLIN_LINEAR_FORMATS = frozenset({"fp8-weight-only"})
"""Weight formats whose linear layers (attention projections, dense MLPs) vLLM runs in Marlin's GEMM: FP8 weights on a
GPU without FP8 tensor cores. vLLM's quantization/fp8.py (Fp8LinearMethod) sets use_marlin where the device lacks
compute capability 8.9 and applies apply_fp8_marlin_linear (utils/marlin_utils_fp8.py, read at vllm-project/vllm commit
02d33ed1): gptq_marlin_gemm, the kernel of 4-bit GPTQ, with float8_e4m3fn weights, 128 x 128 scale blocks turned into
Marlin's per-group scales (its load-time warning: "This may degrade performance for compute-heavy workloads"). 4-bit
formats are left out: vLLM picks among several mixed-precision kernels for them (Machete on Hopper)."""


def marlin_linear_flops(hardware: Hardware, weights: WeightFormat) -> float | None:
    """FLOP/s that no linear layer of `weights` on `hardware` runs faster than at large batches: Marlin's measured
    large-batch rate on this GPU (its fused-MoE kernel, all formats: no table times Marlin with FP8 weights) where vLLM
    runs these layers in Marlin's dense GEMM, else None.

    The dense GEMM and the fused-MoE kernel share Marlin's main loop (weights dequantized into bf16 MMAs, tiles of 16
    rows); past 64 rows the dense kernel "will just run the batch 64 kernel repeatedly" (its author, IST-DASLab/marlin
    issue #2), and IST-DASLab's bench.py measured it flat at 141 TFLOP/s from 128 to 4,000 rows over Llama-13B's
    layers (vllm-project/vllm PR #2497, comment of 2024-01-24; the GPU is not named, but 1,159 GB/s at one row is
    above every other Ampere GPU's memory bandwidth), the 142 TFLOP/s aiconfigurator-core measures Marlin's fused-MoE
    kernel at on the A100 (data/moe_kernels.yaml)."""
    if weights.name not in MARLIN_LINEAR_FORMATS:
        return None
    rates = moe_kernel_rates(MoeKernel.MARLIN, hardware, weights)
    return rates[0].tflops * 1e12 if rates else None


MLA_FP8_MOE_FILE = Path(__file__).parent / "data" / "mla_fp8_moe_kernels.yaml"
"""Measured fixed costs of the MLA decode block and of FP8 block-scaled fused MoE, written by
benchmarks/mla_fp8_moe_kernels.py --write from aiconfigurator-core's vLLM tables (H100-SXM, H200)."""

MLA_GEMM_TYPES = {"bf16": "bfloat16", "fp8": "fp8_block"}
"""servelab weight format -> the tables' projection format (DeepSeek's FP8 checkpoints are 128x128 block-scaled)."""


class MlaDecodeCost(BaseModel):
    """One layer's MLA decode block beyond the bytes it reads: fixed + per_request x requests (seconds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fixed_s: float
    per_request_s: float
    rows: int
    rms_s: float


class MlaPrefillCost(BaseModel):
    """One layer's whole MLA prefill block: fixed + per_token x tokens + per_pair x causal query-key pairs (s)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fixed_s: float
    per_token_s: float
    per_pair_s: float
    rows: int
    median_abs_error: float
    max_abs_error: float


class MoeFixedCost(BaseModel):
    """One fused-MoE layer's kernel chain beyond the experts' weight traffic (seconds), from its one-token rows."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fixed_s: float
    rows: int
    shapes: int
    range_s: tuple[float, float]
    tables: list[str]


class MlaFp8MoeKernels(BaseModel):
    """One GPU's entry of mla_fp8_moe_kernels.yaml."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mla_decode: dict[str, dict[int, MlaDecodeCost]]
    """Projection format -> heads per GPU -> cost."""
    mla_prefill: dict[str, dict[int, MlaPrefillCost]]
    """Projection format -> heads per GPU -> cost."""
    moe_fixed: dict[str, MoeFixedCost]
    """Expert weight format -> cost."""
    moe_rate: dict[str, MoeWidthRate]
    """Expert weight format -> large-batch rate."""


@cache
def _mla_fp8_moe(path: Path = MLA_FP8_MOE_FILE) -> dict[str, MlaFp8MoeKernels]:
    doc = yaml.safe_load(path.read_text())
    return {gpu: MlaFp8MoeKernels.model_validate(entry) for gpu, entry in doc["gpus"].items()}


def _mla_entry(hardware: Hardware, weights: WeightFormat) -> tuple[MlaFp8MoeKernels, str] | None:
    """This GPU's tables and the tables' name of the projection format, or None where either is not measured."""
    entry = _mla_fp8_moe().get(hardware.name)
    gemm = MLA_GEMM_TYPES.get(weights.name)
    return (entry, gemm) if entry is not None and gemm is not None else None


def _triton_entry(hardware: Hardware, weights: WeightFormat) -> tuple[MlaFp8MoeKernels, str] | None:
    """This GPU's tables and the tables' name of the experts' format, where vLLM's Triton fused-MoE kernel multiplies
    them on tensor cores of their own type (TRITON_MOE_FORMATS) and the GPU is measured; else None."""
    table_format = TRITON_MOE_FORMATS.get(weights.name)
    entry = _mla_fp8_moe().get(hardware.name)
    if table_format is None or weights.compute_dtype != weights.name or entry is None:
        return None
    return entry, table_format


def mla_decode_cost(hardware: Hardware, weights: WeightFormat, heads_per_rank: int) -> MlaDecodeCost | None:
    """The measured MLA decode block's fixed costs for this GPU, projection format and heads per GPU, or None where
    the tables do not measure them (then only the block's bytes and FLOPs are priced)."""
    found = _mla_entry(hardware, weights)
    return found[0].mla_decode.get(found[1], {}).get(heads_per_rank) if found else None


def mla_prefill_cost(hardware: Hardware, weights: WeightFormat, heads_per_rank: int) -> MlaPrefillCost | None:
    """The measured MLA prefill block for this GPU, projection format and heads per GPU, or None where unmeasured."""
    found = _mla_entry(hardware, weights)
    return found[0].mla_prefill.get(found[1], {}).get(heads_per_rank) if found else None


def moe_fixed_cost(hardware: Hardware, weights: WeightFormat) -> float | None:
    """Seconds of a fused-MoE layer's fixed cost for FP8 experts on FP8 tensor cores where measured, else None (bf16
    experts keep cost_model.MOE_LAYER_FIXED_S: the tables hold no bf16 fixed cost)."""
    found = _triton_entry(hardware, weights)
    cost = found[0].moe_fixed.get(found[1]) if found else None
    return cost.fixed_s if cost else None


TRITON_MOE_FORMATS = {"fp8": "fp8_block", "bf16": "bfloat16"}
"""Expert formats vLLM's Triton fused-MoE kernel multiplies on the tensor cores of their own type (FP8 only where the
GPU has FP8 tensor cores), and the tables' name for each."""


def triton_moe_rate(hardware: Hardware, weights: WeightFormat) -> MoeWidthRate | None:
    """The rate of vLLM's Triton fused-MoE kernel for FP8 experts on FP8 tensor cores or bf16 experts, against each
    rank's expert width and the rows each expert multiplies, where measured on this GPU; else None."""
    found = _triton_entry(hardware, weights)
    return found[0].moe_rate.get(found[1]) if found else None
