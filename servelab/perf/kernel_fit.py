"""Per-GPU kernel coefficients fitted from measured vLLM kernel timings, and the forward pass those timings add up to.

Why: the datasheet roofline multiplies peak rates by guessed efficiencies and
takes a hard max of compute and memory time. Real kernels have launch floors,
GEMMs that reach their peak only at large token counts, a gradual knee between
memory- and compute-bound, and attention whose efficiency grows with length.
This module fits those terms, per GPU, to public measurements:

- aiconfigurator-core 0.12.0 (NVIDIA, Apache-2.0; the `kernels` extra) ships
  tables of vLLM's own kernels timed on real chips: bf16 GEMMs
  (`gemm/vllm/<v>/gemm_perf.parquet`), FlashAttention prefill and decode
  (`attention/vllm/<v>/{context,generation}_attention_perf.parquet`) and the
  custom all-reduce under CUDA graphs (`comm/vllm/<v>/custom_allreduce_perf.parquet`).
  Only the data is read, never its code.
- Vidur (github.com/microsoft/vidur, MIT, commit 7d47513, data/profiling/compute)
  timed the elementwise ops the GEMM tables lack; `VIDUR_ELEMENTWISE` is the small
  table derived from it.
- The same package's L40S tables (`l40s/attention/vllm/0.24.0`) time vLLM's Triton
  attention backend beside FlashAttention 2 on the same shapes: `TritonPrefillScale`,
  the prefill of a model with attention sinks on an Ampere GPU (docs/moe.md).

The cost model reads only the YAML this writes (`load_kernel_fit`), so pandas
and pyarrow (needed to read the tables) are imported by the fitting code alone.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field

from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import Hardware, get_gpu

Times = TypeVar("Times", float, np.ndarray)
"""Seconds: one time, or an array of them (the fits evaluate whole tables at once)."""

if TYPE_CHECKING:
    import pandas as pd

    from servelab.perf.models import ModelSpec

COEFFICIENTS_FILE = Path(__file__).parent / "data" / "kernel_coefficients.yaml"
AIC_VERSION = "0.12.0"
SOURCE = (
    f"aiconfigurator-core=={AIC_VERSION} (NVIDIA, Apache-2.0): systems/data/<system>/"
    "{gemm,attention,comm}/vllm/<version>/*.parquet; elementwise ops: Vidur (microsoft/vidur, MIT, "
    "commit 7d47513363ec447a741ac5e47241580b47724fbf, data/profiling/compute)"
)

SYSTEMS = {
    "A100-80GB-SXM": "a100_sxm",
    "H100-SXM": "h100_sxm",
    "H200": "h200_sxm",
    "B200": "b200_sxm",
    "GB200": "gb200",
    "B300": "b300_sxm",
}
"""Catalogue GPU -> aiconfigurator system folder. The A100 tables were timed on an
A100-SXM4-80GB; the 40GB part has 24% less bandwidth, so it keeps the datasheet model.
The GB200 tables time one GPU of an NVL72 rack and hold all-reduce at TP 2 and 4 only."""

HEAD_DIM = 128
"""Every model the catalogue fits here uses 128-wide heads; the fit reads only those rows."""

SINK_TRITON_SYSTEMS = frozenset({"a100_sxm"})
"""Fitted GPUs on which vLLM runs a model with attention sinks (gpt-oss) in its Triton backend: FlashAttention 2, the
only FlashAttention on compute capability 8.x, has no sinks. vllm/platforms/cuda.py, get_attn_backend_cls (0.10.1, the
first release with gpt-oss, to 0.11): `if has_sink and not cls.is_device_capability(90): return TRITON_ATTN_VLLM_V1`,
after Blackwell (SM100) has taken FlashInfer; later releases validate each backend and FlashAttention's supports_sink
is `flash_attn_supports_sinks()`, FA3 and up. Hopper runs FA3, which has sinks; the B200 family, FlashInfer."""
TRITON_SIBLING = "l40s"
"""The system whose vLLM tables time the Triton backend (`vllm_triton_attn`) beside FlashAttention 2 on the same
shapes: an L40S (Ada, compute capability 8.9), which runs the same warp-level mma.sync tensor-core instructions that
both kernels compile to on an A100 (8.0). No table times the Triton backend on an A100."""
TRITON_SIBLING_HEAD_DIM = 192
"""The head size of the sibling's Triton rows (the only one timed; FlashAttention 2 has the same shapes)."""

BF16 = 2

# Per-layer elementwise time (ms) of the four kernels vLLM runs between the GEMMs
# (input RMSNorm, RoPE, post-attention RMSNorm, SiLU-and-mul; the residual add is
# fused into vLLM's RMSNorm), TP=1: medians of Vidur's data/profiling/compute/
# <gpu>/<model>/mlp.csv, columns time_stats.{input_layernorm,attn_rope,
# post_attention_layernorm,mlp_act}.median, summed per num_tokens.
# Shape: (hidden, heads, kv_heads, intermediate) of the profiled model.
VIDUR_ELEMENTWISE: dict[str, tuple[tuple[int, int, int, int], dict[int, float]]] = {
    "a100": (
        (4096, 32, 8, 14336),
        {  # meta-llama/Meta-Llama-3-8B
            1: 0.025,
            8: 0.024,
            32: 0.024,
            128: 0.032,
            256: 0.051,
            512: 0.082,
            1024: 0.16,
            2048: 0.3357,
            4096: 0.655,
            8192: 1.2963,
            16384: 2.6027,
        },
    ),
    "h100": (
        (4096, 32, 32, 11008),
        {  # meta-llama/Llama-2-7b-hf
            1: 0.018,
            8: 0.019,
            32: 0.02,
            128: 0.017,
            256: 0.023,
            512: 0.042,
            1024: 0.085,
            2048: 0.165,
            4096: 0.3558,
        },
    ),
}
VIDUR_GPU = {
    "A100-80GB-SXM": "a100",
    "H100-SXM": "h100",
    "H200": "h100",
    "B200": "h100",
    "GB200": "h100",
    "B300": "h100",
}
"""Vidur has no H200 or Blackwell profile. Its elementwise kernels (norms, RoPE, activation) stream a few bytes per
token and are memory-bound: the H200 (the H100's die with faster HBM) and the Blackwell GPUs take the H100's launch
floor (a fixed per-kernel cost, not a bandwidth) and the same fraction of their own HBM bandwidth, so the per-token
part scales with bandwidth (8 TB/s on B200, GB200 and B300: 2.4x the H100's)."""


# ---------------------------------------------------------------- coefficients (what the cost model reads)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GemmFit(_Frozen):
    """t = launch + ((2 (m + half_tokens) n (k + half_depth) / (P e))^p + (bytes / (B e_mem))^p)^(1/p),
    e = peak_efficiency (1 - throttle f / (f + throttle_flops)), f = 2mnk.

    half_tokens: efficiency saturating in tokens, m / (m + half_tokens); half_depth:
    in the reduction depth, k / (k + half_depth) (each output tile pays a prologue
    and epilogue whatever its k: a 1k-deep GEMM reaches a third of the peak a 16k-deep one does).
    """

    peak_efficiency: float = Field(gt=0, le=1)
    half_tokens: float = Field(ge=0)
    half_depth: float = Field(ge=0)
    throttle: float = Field(ge=0, lt=1)
    """Fraction of the peak lost by GEMMs far larger than throttle_flops (sustained power draw lowers the clock)."""
    throttle_flops: float = Field(gt=0)
    memory_efficiency: float = Field(gt=0, le=1)
    knee_p: float = Field(ge=1)
    launch_s: float = Field(ge=0)


class DecodeAttentionFit(_Frozen):
    """Per layer: t = launch + cold (X^4 / (X^4 + cache_bytes^4))
    + (X + batch half_context bpt) / (B memory_efficiency).

    X is the KV bytes the batch reads, bpt the KV bytes of one token. The cold
    term is the step (~20 us in the H100 table, 7-10 us once smoothed by the fit)
    where the KV read outgrows the L2 cache (40 MB on A100, 50 MB on Hopper; the
    fit puts the knee at 26-70 MB): the tables time a kernel rerun on the same KV,
    which stays cache-resident below that size. half_context is the per-request
    cost of short contexts, in tokens.
    """

    launch_s: float = Field(ge=0)
    cold_s: float = Field(ge=0)
    cache_bytes: float = Field(gt=0)
    memory_efficiency: float = Field(gt=0, le=1)
    half_context: float = Field(ge=0)


class PrefillAttentionFit(_Frozen):
    """Per layer: t = launch + causal FLOPs (1 + half_length / length) / (P compute_efficiency)."""

    launch_s: float = Field(ge=0)
    compute_efficiency: float = Field(gt=0, le=1)
    half_length: float = Field(ge=0)


CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 1024 * 1024
"""vLLM runs its custom all-reduce on messages below 8 MiB and hands larger ones on:
`CustomAllreduce(..., max_size=8192 * 1024)` and `should_custom_ar`'s `return inp_size < self.max_size` in
vllm/distributed/device_communicators/custom_all_reduce.py (vllm-project/vllm@0ad80649d36672284c95b5e1ae73447d9d5f207f;
the same default since the first custom all-reduce)."""

CUSTOM_THEN_NCCL_SYSTEMS = frozenset({"a100_sxm"})
"""Fitted GPUs whose vLLM all-reduce is the custom one below `CUSTOM_ALLREDUCE_MAX_BYTES` and NCCL from there: compute
capability 8.x, which the symmetric-memory tables of all_reduce_utils.py (vllm@00d618aab60448acdf3fac3e9c4e2e22d0c6c753:
CUSTOM_ALL_REDUCE_MAX_SIZES, SYMM_MEM_ALL_REDUCE_MAX_SIZES, keyed "9.0", "10.0", "10.3") leave out. The A100 table
(vLLM 0.14.0) shows the switch: 25-45 us at 4 MiB, then 90-129 us at 8 MiB, NCCL's own time there (the package's
nccl_perf table: 87-128 us). On Hopper and Blackwell vLLM also runs torch's symmetric-memory all-reduce, from a custom
bound that depends on TP (256 KiB to 8 MiB) up to its own limit (4-128 MiB): switches that a split at 8 MiB does not
follow, so those GPUs keep one line over all sizes."""


class AllReduceFit(_Frozen):
    """One all-reduce of `bytes`: latency_s + bytes * seconds_per_byte, over all sizes or, where `switch_bytes` is set
    (`CUSTOM_THEN_NCCL_SYSTEMS`), below it (vLLM's custom all-reduce); at and above it, that line's time at the switch,
    plus switch_jump_s, plus large_seconds_per_byte per byte past it (NCCL). The jump is the measured step up where
    vLLM changes algorithm, never down: time grows with every byte. Fitted to vLLM's all-reduce timed under CUDA
    graphs."""

    latency_s: float = Field(ge=0)
    seconds_per_byte: float = Field(ge=0)
    switch_bytes: int | None = Field(default=None, gt=0)
    switch_jump_s: float = Field(default=0.0, ge=0)
    large_seconds_per_byte: float = Field(default=0.0, ge=0)


class ElementwiseFit(_Frozen):
    """Per layer: launch_s + tokens * bytes per token / (B memory_efficiency) (norms, RoPE, activation)."""

    launch_s: float = Field(ge=0)
    memory_efficiency: float = Field(gt=0, le=1)


class Residual(_Frozen):
    """Relative error |pred/table - 1| of one fitted op over the rows used and the rows held out."""

    fit_rows: int
    fit_rms: float
    fit_max: float
    holdout_rows: int
    holdout_rms: float
    holdout_max: float


class GpuKernelFit(_Frozen):
    system: str
    device: str
    tables: dict[str, str]
    """Op -> the aiconfigurator table it was fitted to (framework version folder)."""
    gemm: GemmFit
    decode_attention: DecodeAttentionFit
    prefill_attention: PrefillAttentionFit
    allreduce: dict[int, AllReduceFit]
    """By tensor-parallel size."""
    elementwise: ElementwiseFit
    residuals: dict[str, Residual]


class TritonPrefillScale(_Frozen):
    """vLLM's Triton attention backend (triton_unified_attention) against FlashAttention 2 in prefill, each fitted in
    the PrefillAttentionFit form to the same shapes of one GPU's tables (`TRITON_SIBLING`).

    The Triton kernel's 2D prefill path walks 16 query rows (BLOCK_M: a KV head's query group packed along them)
    against 32-key tiles (TILE_SIZE_PREFILL) in Triton's default four warps, skipping the tiles the causal mask hides
    (PR #20308, July 2025): its sustained efficiency is a fraction of FlashAttention 2's, reached after fewer keys
    (small tiles). The tables timed vLLM 0.24.0; the stored sources of triton_unified_attention.py launch prefill the
    same way from the sink-era 2D kernel to the newest, and a release whose tile is the 16-token KV block instead
    would be slower still. The sibling's Triton rows read an FP8 KV cache and FlashAttention 2's a bf16 one (each
    the only one timed); both multiply in bf16."""

    system: str
    device: str
    table: str
    triton: PrefillAttentionFit
    flash_attention: PrefillAttentionFit
    residuals: dict[str, Residual]

    @property
    def efficiency_ratio(self) -> float:
        """The Triton kernel's sustained efficiency over FlashAttention 2's on the same GPU."""
        return self.triton.compute_efficiency / self.flash_attention.compute_efficiency


class KernelCoefficients(_Frozen):
    source: str
    generated_by: str
    gpus: dict[str, GpuKernelFit]
    sink_prefill: TritonPrefillScale | None = None
    """The Triton backend's prefill against FlashAttention 2's, for GPUs in SINK_TRITON_SYSTEMS."""


@cache
def load_kernel_coefficients(path: Path = COEFFICIENTS_FILE) -> KernelCoefficients | None:
    """The committed fit; None when the file is absent (a checkout that never ran the fit)."""
    if not path.exists():
        return None
    return KernelCoefficients.model_validate(yaml.safe_load(path.read_text()))


def load_kernel_fit(hardware: Hardware) -> GpuKernelFit | None:
    """The fitted kernels of this GPU, or None when no measured tables exist for it."""
    coefficients = load_kernel_coefficients()
    return coefficients.gpus.get(hardware.name) if coefficients else None


def triton_prefill_attention(flash: PrefillAttentionFit, scale: TritonPrefillScale) -> PrefillAttentionFit:
    """The Triton backend's prefill on a GPU whose tables time FlashAttention 2 only: FlashAttention 2's launch floor
    and sustained efficiency times the ratio the sibling GPU measured, reached after the Triton kernel's half-length."""
    return PrefillAttentionFit(
        launch_s=flash.launch_s,
        compute_efficiency=flash.compute_efficiency * scale.efficiency_ratio,
        half_length=scale.triton.half_length,
    )


def vllm_prefill_attention(fit: GpuKernelFit, attention_sinks: bool) -> tuple[PrefillAttentionFit, str]:
    """The prefill attention vLLM runs on this fitted GPU, and a note naming it when it is not the fitted table's:
    a model with attention sinks on a GPU of SINK_TRITON_SYSTEMS runs the Triton backend."""
    coefficients = load_kernel_coefficients()
    scale = coefficients.sink_prefill if coefficients else None
    if not (attention_sinks and fit.system in SINK_TRITON_SYSTEMS and scale):
        return fit.prefill_attention, ""
    note = (
        f"; prefill attention in vLLM's Triton backend (attention sinks): x{scale.efficiency_ratio:.2f} of "
        f"FlashAttention 2's efficiency, measured on an {scale.device}"
    )
    return triton_prefill_attention(fit.prefill_attention, scale), note


# ---------------------------------------------------------------- op-level model (the fitted formulas)


def smooth_roofline(compute_s: Times, memory_s: Times, p: float) -> Times:
    """(c^p + m^p)^(1/p): continuous, monotone in both, max(c, m) as p grows, c + m at p = 1."""
    return (compute_s**p + memory_s**p) ** (1.0 / p)


def gemm_time(fit: GemmFit, hw: Hardware, m: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
    flops = 2.0 * m * n * k
    efficiency = fit.peak_efficiency * (1 - fit.throttle * flops / (flops + fit.throttle_flops))
    compute = 2.0 * (m + fit.half_tokens) * n * (k + fit.half_depth) / (hw.peak_flops("bf16") * efficiency)
    memory = BF16 * (n * k + m * (n + k)) / (hw.memory_bandwidth * fit.memory_efficiency)
    return fit.launch_s + smooth_roofline(compute, memory, fit.knee_p)


def datasheet_gemm_time(
    hw: Hardware, m: np.ndarray, n: np.ndarray, k: np.ndarray, compute_efficiency: float, memory_efficiency: float
) -> np.ndarray:
    """One GEMM in the datasheet roofline: max(FLOPs / (P e), weight bytes / (B e_mem)), no launch floor.

    The linear part of RooflineCostModel's datasheet form, op by op: its crossover, m = P e / (B e_mem),
    is the same for every shape, so these maxima add up to that model's. The efficiencies are
    CostCoefficients' (passed in: this module sits below the cost model); 1 and 1 give the GPU's hard floor.
    """
    return np.maximum(
        2.0 * m * n * k / (hw.peak_flops("bf16") * compute_efficiency),
        BF16 * n * k / (hw.memory_bandwidth * memory_efficiency),
    )


def decode_attention_time(
    fit: DecodeAttentionFit, hw: Hardware, batch: np.ndarray, context: np.ndarray, kv_heads: np.ndarray
) -> np.ndarray:
    kv_bytes_per_token = 2 * kv_heads * HEAD_DIM * BF16
    read = batch * context * kv_bytes_per_token
    return (
        fit.launch_s
        + fit.cold_s * read**4 / (read**4 + fit.cache_bytes**4)
        + (read + batch * fit.half_context * kv_bytes_per_token) / (hw.memory_bandwidth * fit.memory_efficiency)
    )


def prefill_attention_time(
    fit: PrefillAttentionFit,
    hw: Hardware,
    batch: np.ndarray,
    length: np.ndarray,
    heads: np.ndarray,
    head_dim: int = HEAD_DIM,
) -> np.ndarray:
    flops = 4 * head_dim * heads * batch * length * (length + 1) / 2
    return fit.launch_s + flops * (1 + fit.half_length / length) / (hw.peak_flops("bf16") * fit.compute_efficiency)


def allreduce_time(fit: AllReduceFit, nbytes: np.ndarray) -> np.ndarray:
    small = fit.latency_s + nbytes * fit.seconds_per_byte
    if fit.switch_bytes is None:
        return small
    at_switch = fit.latency_s + fit.switch_bytes * fit.seconds_per_byte + fit.switch_jump_s
    return np.where(
        nbytes < fit.switch_bytes, small, at_switch + (nbytes - fit.switch_bytes) * fit.large_seconds_per_byte
    )


def elementwise_bytes_per_token(hidden: int, heads: int, kv_heads: int, intermediate: int) -> int:
    """Bytes one token moves through vLLM's elementwise kernels of one layer, per rank (heads etc. already / TP).

    Two fused add+RMSNorms (read x and residual, write both), RoPE on q and k
    (read and write), SiLU-and-mul (read gate and up, write one).
    """
    return BF16 * (2 * 4 * hidden + 2 * (heads + kv_heads) * HEAD_DIM + 3 * intermediate)


def elementwise_time(fit: ElementwiseFit, hw: Hardware, tokens: np.ndarray, bytes_per_token: int) -> np.ndarray:
    return fit.launch_s + tokens * bytes_per_token / (hw.memory_bandwidth * fit.memory_efficiency)


# ---------------------------------------------------------------- the measured tables


def aiconfigurator_data_root() -> Path:
    """systems/data of the installed aiconfigurator-core, located without importing its compiled extension."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise PerfConfigError(
            f"aiconfigurator-core is not installed: pip install 'servelab[kernels]' "
            f"(aiconfigurator-core=={AIC_VERSION})"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "systems" / "data"


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else -1 for part in name.split("."))


def _newest_table(root: Path, system: str, op: str, filename: str) -> Path:
    folders = sorted((root / system / op / "vllm").glob(f"*/{filename}"), key=lambda p: _version_key(p.parent.name))
    if not folders:
        raise PerfConfigError(f"no vLLM {op} table {filename} for {system} under {root}")
    return folders[-1]


@dataclass(frozen=True)
class KernelTables:
    """The bf16, 128-wide-head rows of one GPU's vLLM tables, latencies in seconds."""

    gpu: str
    system: str
    device: str
    tables: dict[str, str]
    gemm: pd.DataFrame
    decode: pd.DataFrame
    prefill: pd.DataFrame
    allreduce: pd.DataFrame


def load_tables(gpu: str, root: Path | None = None) -> KernelTables:
    import pandas as pd

    root = root or aiconfigurator_data_root()
    system = SYSTEMS[gpu]
    paths = {
        "gemm": _newest_table(root, system, "gemm", "gemm_perf.parquet"),
        "prefill_attention": _newest_table(root, system, "attention", "context_attention_perf.parquet"),
        "decode_attention": _newest_table(root, system, "attention", "generation_attention_perf.parquet"),
        "allreduce": _newest_table(root, system, "comm", "custom_allreduce_perf.parquet"),
    }
    frames = {op: pd.read_parquet(p) for op, p in paths.items()}
    for frame in frames.values():
        frame["latency"] = frame["latency"] * 1e-3  # the tables are in milliseconds

    gemm = frames["gemm"].query("gemm_dtype == 'bfloat16'")

    def attention(frame: pd.DataFrame) -> pd.DataFrame:
        # FA3 is vLLM's default on Hopper (FA4 rows are an opt-in backend); FA2 on Ampere.
        keep = (frame.head_dim == HEAD_DIM) & (frame.kv_cache_dtype == "bfloat16") & (frame.attn_dtype == "bfloat16")
        keep &= frame.kernel_source != "vllm_flash_attn_fa4"
        if "window_size" in frame:
            keep &= frame.window_size == 0
        return frame[keep]

    allreduce = frames["allreduce"].query("backend == 'vllm_graph'")
    return KernelTables(
        gpu=gpu,
        system=system,
        device=str(gemm.device.iloc[0]),
        tables={op: f"{p.parent.parent.name} {p.parent.name}/{p.name}" for op, p in paths.items()},
        gemm=gemm.reset_index(drop=True),
        decode=attention(frames["decode_attention"]).reset_index(drop=True),
        prefill=attention(frames["prefill_attention"]).reset_index(drop=True),
        allreduce=allreduce.reset_index(drop=True),
    )


def held_out_sizes(values: pd.Series) -> set[int]:
    """The sizes at odd positions of a table's sorted sizes: every other size, never fitted."""
    return {int(v) for v in np.sort(values.unique())[1::2]}


def held_out(values: pd.Series) -> np.ndarray:
    """Rows whose size is held out (see `held_out_sizes`)."""
    return np.isin(values.to_numpy(), list(held_out_sizes(values)))


def gemm_rows(t: KernelTables) -> pd.DataFrame:
    """Layer-sized GEMMs (weight sides 2k-64k) at 1-16k tokens: what a 7-70B model runs at TP 1-8."""
    g = t.gemm
    return g[(g.n >= 2048) & (g.k >= 2048) & (g.m <= 16384)]


def _llm_heads(frame: pd.DataFrame) -> pd.Series:
    """Head layouts of 7-70B models at TP 1-8: 8+ query heads per rank, groups of at most 8 per KV head."""
    return (frame.num_heads >= 8) & (frame.num_heads <= 8 * frame.num_key_value_heads)


def decode_rows(t: KernelTables) -> pd.DataFrame:
    d = t.decode.assign(context=t.decode.step + 1)
    return d[(d.batch_size <= 1024) & (d.context >= 64) & (d.context <= 16384) & _llm_heads(d)]


def prefill_rows(t: KernelTables) -> pd.DataFrame:
    """Chunks of 128+ tokens (shorter ones cost little beside their GEMMs) with LLM head layouts."""
    p = t.prefill
    return p[(p.isl >= 128) & _llm_heads(p) & (p.batch_size * p.isl <= 32768)]


def allreduce_rows(t: KernelTables) -> pd.DataFrame:
    a = t.allreduce
    return a.assign(nbytes=a.message_size * BF16)  # message_size counts bf16 elements


# ---------------------------------------------------------------- the fit


def _fit_log(
    predict: Callable[[np.ndarray], np.ndarray],
    measured: np.ndarray,
    x0: Sequence[float],
    lower: Sequence[float],
    upper: Sequence[float],
) -> np.ndarray:
    """Least squares of log(pred / table): every row weighs by its relative error, small kernels as much as large."""
    from scipy.optimize import least_squares

    log_measured = np.log(measured)
    result = least_squares(
        lambda x: np.log(predict(x)) - log_measured,
        np.asarray(x0, dtype=float),
        bounds=(np.asarray(lower, dtype=float), np.asarray(upper, dtype=float)),
        x_scale="jac",
        xtol=1e-12,
        ftol=1e-12,
        gtol=1e-12,
        max_nfev=2000,
    )
    return result.x


def _residual(pred: np.ndarray, measured: np.ndarray, hold: np.ndarray) -> Residual:
    err = np.abs(pred / measured - 1)

    def stats(mask: np.ndarray) -> tuple[int, float, float]:
        e = err[mask]
        return (int(mask.sum()), float(np.sqrt(np.mean(e**2))), float(e.max())) if mask.any() else (0, 0.0, 0.0)

    f, h = stats(~hold), stats(hold)
    return Residual(fit_rows=f[0], fit_rms=f[1], fit_max=f[2], holdout_rows=h[0], holdout_rms=h[1], holdout_max=h[2])


def fit_gemm(t: KernelTables, hw: Hardware) -> tuple[GemmFit, Residual]:
    rows = gemm_rows(t)
    hold = held_out(rows.m)
    m, n, k = (rows[c].to_numpy(float) for c in ("m", "n", "k"))
    measured = rows.latency.to_numpy()

    def make(x: np.ndarray) -> GemmFit:
        return GemmFit(
            peak_efficiency=x[0],
            half_tokens=x[1],
            half_depth=x[2],
            memory_efficiency=x[3],
            knee_p=x[4],
            launch_s=x[5] * 1e-6,
            throttle=x[6],
            throttle_flops=x[7] * 1e9,
        )

    x = _fit_log(
        lambda x: gemm_time(make(x), hw, m[~hold], n[~hold], k[~hold]),
        measured[~hold],
        [0.8, 32, 512, 0.8, 3, 4, 0.1, 500],
        [0.05, 0, 0, 0.05, 1, 0, 0, 1],
        [1, 4096, 8192, 1, 30, 50, 0.9, 1e5],
    )
    fit = make(x)
    return fit, _residual(gemm_time(fit, hw, m, n, k), measured, hold)


def fit_decode_attention(t: KernelTables, hw: Hardware) -> tuple[DecodeAttentionFit, Residual]:
    rows = decode_rows(t)
    hold = held_out(rows.context)
    b, ctx, kv = (rows[c].to_numpy(float) for c in ("batch_size", "context", "num_key_value_heads"))
    measured = rows.latency.to_numpy()

    def make(x: np.ndarray) -> DecodeAttentionFit:
        return DecodeAttentionFit(
            launch_s=x[0] * 1e-6, cold_s=x[1] * 1e-6, cache_bytes=x[2] * 1e6, memory_efficiency=x[3], half_context=x[4]
        )

    x = _fit_log(
        lambda x: decode_attention_time(make(x), hw, b[~hold], ctx[~hold], kv[~hold]),
        measured[~hold],
        [8, 10, 40, 0.8, 64],
        [0, 0, 1, 0.05, 0],
        [100, 100, 1000, 1, 16384],
    )
    fit = make(x)
    return fit, _residual(decode_attention_time(fit, hw, b, ctx, kv), measured, hold)


def fit_prefill_attention(t: KernelTables, hw: Hardware) -> tuple[PrefillAttentionFit, Residual]:
    return fit_prefill_rows(prefill_rows(t), hw)


def fit_prefill_rows(
    rows: pd.DataFrame, hw: Hardware, head_dim: int = HEAD_DIM
) -> tuple[PrefillAttentionFit, Residual]:
    hold = held_out(rows.isl)
    b, s, heads = (rows[c].to_numpy(float) for c in ("batch_size", "isl", "num_heads"))
    measured = rows.latency.to_numpy()

    def make(x: np.ndarray) -> PrefillAttentionFit:
        return PrefillAttentionFit(launch_s=x[0] * 1e-6, compute_efficiency=x[1], half_length=x[2])

    x = _fit_log(
        lambda x: prefill_attention_time(make(x), hw, b[~hold], s[~hold], heads[~hold], head_dim),
        measured[~hold],
        [10, 0.5, 256],
        [0, 0.05, 0],
        [200, 1, 16384],
    )
    fit = make(x)
    return fit, _residual(prefill_attention_time(fit, hw, b, s, heads, head_dim), measured, hold)


TRITON_KERNELS = {"triton": "vllm_triton_attn", "flash_attention": "vllm_flash_attn_fa2"}


def sibling_prefill_rows(root: Path | None = None) -> tuple[Path, dict[str, pd.DataFrame]]:
    """The sibling's full-attention prefill rows (chunks of 128+ tokens, 8+ query heads, as prefill_rows) of the Triton
    backend and of FlashAttention 2, on the shapes both were timed at; latencies in seconds."""
    import pandas as pd

    path = _newest_table(
        root or aiconfigurator_data_root(), TRITON_SIBLING, "attention", "context_attention_perf.parquet"
    )
    frame = pd.read_parquet(path).assign(latency=lambda f: f.latency * 1e-3)
    keep = (frame.head_dim == TRITON_SIBLING_HEAD_DIM) & (frame.window_size == 0) & (frame.attn_dtype == "bfloat16")
    keep &= (frame.isl >= 128) & (frame.num_heads >= 8) & (frame.batch_size * frame.isl <= 32768)
    shape = ["batch_size", "isl", "num_heads", "num_key_value_heads"]
    by_kernel = {name: frame[keep & (frame.kernel_source == source)] for name, source in TRITON_KERNELS.items()}
    both = by_kernel["triton"][shape].merge(by_kernel["flash_attention"][shape])
    return path, {name: rows.merge(both).reset_index(drop=True) for name, rows in by_kernel.items()}


def sibling_time_ratios(scale: TritonPrefillScale, root: Path | None = None) -> dict[int, tuple[float, float]]:
    """Prompt length -> (measured, fitted) median of the Triton backend's time over FlashAttention 2's on the
    sibling's shapes: how far the two fitted forms carry the measured ratio."""
    _, rows = sibling_prefill_rows(root)
    shape = ["batch_size", "isl", "num_heads", "num_key_value_heads"]
    both = rows["triton"].merge(rows["flash_attention"], on=shape, suffixes=("_triton", "_fa2"))
    hw = get_gpu("L40S")
    b, s, h = (both[c].to_numpy(float) for c in ("batch_size", "isl", "num_heads"))

    def time(fit: PrefillAttentionFit) -> np.ndarray:
        return prefill_attention_time(fit, hw, b, s, h, TRITON_SIBLING_HEAD_DIM)

    both = both.assign(
        measured=both.latency_triton / both.latency_fa2, fitted=time(scale.triton) / time(scale.flash_attention)
    )
    medians = both.groupby("isl")[["measured", "fitted"]].median()
    return {int(length): (float(row.measured), float(row.fitted)) for length, row in medians.iterrows()}


def fit_triton_prefill_scale(root: Path | None = None) -> TritonPrefillScale:
    path, rows = sibling_prefill_rows(root)
    hw = get_gpu("L40S")
    fits = {name: fit_prefill_rows(r, hw, TRITON_SIBLING_HEAD_DIM) for name, r in rows.items()}
    return TritonPrefillScale(
        system=TRITON_SIBLING,
        device=str(rows["triton"].device.iloc[0]),
        table=f"{path.parent.parent.name} {path.parent.name}/{path.name}",
        triton=fits["triton"][0],
        flash_attention=fits["flash_attention"][0],
        residuals={name: fit[1] for name, fit in fits.items()},
    )


def _fit_allreduce_pieces(nbytes: np.ndarray, measured: np.ndarray, switch: int | None) -> AllReduceFit:
    """One line on the rows below the switch (all rows without one), then the jump and slope past it on the rest."""
    small = nbytes < (switch or np.inf)

    def make(x: np.ndarray, jump_us: float = 0.0, large_ps: float = 0.0) -> AllReduceFit:
        return AllReduceFit(
            latency_s=x[0] * 1e-6,
            seconds_per_byte=x[1] * 1e-12,
            switch_bytes=switch,
            switch_jump_s=jump_us * 1e-6,
            large_seconds_per_byte=large_ps * 1e-12,
        )

    line = _fit_log(lambda x: allreduce_time(make(x), nbytes[small]), measured[small], [5, 10], [0, 0], [100, 1e4])
    if switch is None:
        return make(line)
    x = _fit_log(
        lambda x: allreduce_time(make(line, *x), nbytes[~small]), measured[~small], [10, 10], [0, 0], [1e3, 1e4]
    )
    return make(line, *x)


def fit_allreduce(t: KernelTables) -> tuple[dict[int, AllReduceFit], Residual]:
    """Per TP size, two pieces split at vLLM's switch from its custom all-reduce to NCCL where that is the one switch
    (`CUSTOM_THEN_NCCL_SYSTEMS`: one line across it misses both sides), one line elsewhere; fitted on every other
    measured size, the rest held out."""
    rows = allreduce_rows(t)
    hold = held_out(rows.message_size)
    switch = CUSTOM_ALLREDUCE_MAX_BYTES if t.system in CUSTOM_THEN_NCCL_SYSTEMS else None
    fits: dict[int, AllReduceFit] = {}
    pred = np.zeros(len(rows))
    for tp, group in rows.groupby("num_gpus"):
        mask = (rows.num_gpus == tp).to_numpy()
        train = ~hold[mask]
        nbytes, measured = group.nbytes.to_numpy(float), group.latency.to_numpy()
        fits[int(tp)] = _fit_allreduce_pieces(nbytes[train], measured[train], switch)
        pred[mask] = allreduce_time(fits[int(tp)], nbytes)
    return fits, _residual(pred, rows.latency.to_numpy(), hold)


def fit_elementwise(gpu: str, hw: Hardware) -> tuple[ElementwiseFit, Residual]:
    """Vidur's per-layer elementwise times (its unfused kernels: each RMSNorm reads and writes x once)."""
    (hidden, heads, kv_heads, intermediate), table = VIDUR_ELEMENTWISE[VIDUR_GPU[gpu]]
    vidur_bytes = BF16 * (2 * 2 * hidden + 2 * (heads + kv_heads) * HEAD_DIM + 3 * intermediate)
    tokens = np.array(sorted(table), dtype=float)
    measured = np.array([table[int(n)] for n in tokens]) * 1e-3
    vidur_hw = get_gpu("H100-SXM") if VIDUR_GPU[gpu] == "h100" else hw

    def make(x: np.ndarray) -> ElementwiseFit:
        return ElementwiseFit(launch_s=x[0] * 1e-6, memory_efficiency=x[1])

    x = _fit_log(
        lambda x: elementwise_time(make(x), vidur_hw, tokens, vidur_bytes), measured, [20, 0.5], [0, 0.05], [200, 1]
    )
    fit = make(x)
    return fit, _residual(elementwise_time(fit, vidur_hw, tokens, vidur_bytes), measured, np.zeros(len(tokens), bool))


def fit_gpu(gpu: str, root: Path | None = None) -> GpuKernelFit:
    hw = get_gpu(gpu)
    t = load_tables(gpu, root)
    gemm, r_gemm = fit_gemm(t, hw)
    decode, r_decode = fit_decode_attention(t, hw)
    prefill, r_prefill = fit_prefill_attention(t, hw)
    allreduce, r_allreduce = fit_allreduce(t)
    elementwise, r_elementwise = fit_elementwise(gpu, hw)
    return GpuKernelFit(
        system=t.system,
        device=t.device,
        tables=t.tables,
        gemm=gemm,
        decode_attention=decode,
        prefill_attention=prefill,
        allreduce=allreduce,
        elementwise=elementwise,
        residuals={
            "gemm": r_gemm,
            "decode_attention": r_decode,
            "prefill_attention": r_prefill,
            "allreduce": r_allreduce,
            "elementwise": r_elementwise,
        },
    )


def fit_all(gpus: Sequence[str] = tuple(SYSTEMS), root: Path | None = None) -> KernelCoefficients:
    gpus_fitted = {gpu: fit_gpu(gpu, root) for gpu in gpus}
    sinks = any(fit.system in SINK_TRITON_SYSTEMS for fit in gpus_fitted.values())
    return KernelCoefficients(
        source=SOURCE,
        generated_by="scripts/fit_kernels.py",
        gpus=gpus_fitted,
        sink_prefill=fit_triton_prefill_scale(root) if sinks else None,
    )


def _rounded(value: Any) -> Any:
    """Six significant digits: a readable file, far finer than the fit's own residuals."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


TOKEN_FIELDS = {"half_tokens", "half_depth", "half_context", "half_length"}
"""Fitted sizes in tokens, some of which converge to ~0 at their bound: compared to 1e-3 token."""


def refit_differences(committed: Any, fresh: Any, path: str = "") -> list[str]:
    """Where a fresh fit differs from the committed one beyond what the optimiser's platform noise moves: 0.1%
    relative, 1e-3 token for sizes in tokens and 1e-6 for the throttle (both converge to ~0 at their bounds, where
    the last digits differ between machines). Empty when the committed file is reproduced."""
    if isinstance(committed, dict) and isinstance(fresh, dict):
        if committed.keys() != fresh.keys():
            return [f"{path}: keys {sorted(committed)} != {sorted(fresh)}"]
        return [d for key in committed for d in refit_differences(committed[key], fresh[key], f"{path}.{key}")]
    if isinstance(committed, float) and isinstance(fresh, float):
        field = path.rsplit(".", 1)[-1]
        absolute = 1e-3 if field in TOKEN_FIELDS else 1e-6 if field == "throttle" else 0.0
        close = abs(fresh - committed) <= max(1e-3 * abs(committed), absolute)
        return [] if close else [f"{path}: committed {committed:.6g}, refit {fresh:.6g}"]
    return [] if committed == fresh else [f"{path}: committed {committed!r}, refit {fresh!r}"]


def dump_yaml(coefficients: KernelCoefficients) -> str:
    header = (
        "# Per-GPU kernel coefficients of servelab's cost model, fitted to measured vLLM kernel tables.\n"
        "# Generated by scripts/fit_kernels.py; do not edit by hand (rerun the script). See docs/kernels.md.\n"
        "# Residuals are |predicted / table - 1| over the rows fitted and the rows held out (every other size).\n"
    )
    return header + yaml.safe_dump(_rounded(coefficients.model_dump()), sort_keys=False, width=120)


# ---------------------------------------------------------------- forward pass from the tables


def _interp_loglog(x: float, xs: np.ndarray, ys: np.ndarray) -> float:
    """Log-log interpolation on a grid; beyond its top, time scales in proportion (a wide GEMM, a long message)."""
    if x >= xs[-1]:
        return float(ys[-1] * x / xs[-1])
    if x <= xs[0]:
        return float(ys[0])
    return float(np.exp(np.interp(np.log(x), np.log(xs), np.log(ys))))


class TableLookup:
    """Latency of one op read off the measured tables, interpolated between measured sizes."""

    def __init__(self, tables: KernelTables) -> None:
        self.t = tables
        g = gemm_rows(tables)
        self._gemm = {m: frame.pivot_table(index="n", columns="k", values="latency") for m, frame in g.groupby("m")}
        self._decode = decode_rows(tables)
        self._prefill = tables.prefill
        self._allreduce = allreduce_rows(tables)

    def gemm(self, m: int, n: int, k: int) -> float:
        ms = np.array(sorted(self._gemm))
        if m not in self._gemm:
            if m > ms[-1]:
                return self.gemm(int(ms[-1]), n, k) * m / ms[-1]  # compute-bound: time in proportion to tokens
            raise PerfConfigError(f"no GEMM row at m={m} on {self.t.gpu}")
        grid = self._gemm[m]
        ns = grid.index.to_numpy(float)
        per_n = np.array(
            [_interp_loglog(k, grid.columns.to_numpy(float), grid.loc[nn].to_numpy()) for nn in grid.index]
        )
        return _interp_loglog(n, ns, per_n)

    def _attention(self, rows: pd.DataFrame, size_col: str, size: int, heads: float, kv_heads: int) -> float:
        rows = rows[(rows[size_col] == size) & (rows.num_key_value_heads == kv_heads)]
        if rows.empty:
            raise PerfConfigError(f"no attention row at {size_col}={size}, kv_heads={kv_heads} on {self.t.gpu}")
        by_heads = rows.groupby("num_heads").latency.median()
        return float(np.interp(heads, by_heads.index.to_numpy(float), by_heads.to_numpy()))  # few heads: linear

    def _largest_decode_batch(self, batch: int, context: int, kv_heads: int) -> int:
        d = self._decode
        measured = d[(d.context == context) & (d.batch_size <= batch) & (d.num_key_value_heads == kv_heads)]
        return int(measured.batch_size.max()) if len(measured) else batch

    def decode_measured(self, batch: int, context: int, kv_heads: int) -> bool:
        """Whether the decode table has this batch at this context (it stops near 2^18 KV tokens per batch)."""
        return self._largest_decode_batch(batch, context, kv_heads) == batch

    def decode_attention(self, batch: int, context: int, heads: int, kv_heads: int) -> float:
        """Measured, or for a batch past the table's edge at this context, the largest measured one scaled in
        proportion: at those sizes the kernel streams KV at full bandwidth, so time grows with the batch."""
        largest = self._largest_decode_batch(batch, context, kv_heads)
        rows = self._decode[self._decode.batch_size == largest]
        return self._attention(rows, "context", context, heads, kv_heads) * batch / largest

    def prefill_attention(self, length: int, heads: int, kv_heads: int) -> float:
        rows = self._prefill[self._prefill.batch_size == 1]
        return self._attention(rows, "isl", length, heads, kv_heads)

    def allreduce(self, nbytes: float, tp: int) -> float:
        a = self._allreduce[self._allreduce.num_gpus == tp].sort_values("nbytes")
        return _interp_loglog(nbytes, a.nbytes.to_numpy(float), a.latency.to_numpy())


@dataclass(frozen=True)
class ForwardPass:
    """One forward pass built from the tables, by part (seconds)."""

    gemm: float
    attention: float
    elementwise: float
    allreduce: float
    lm_head: float

    @property
    def total(self) -> float:
        return self.gemm + self.attention + self.elementwise + self.allreduce + self.lm_head


def forward_pass(
    lookup: TableLookup,
    fit: ElementwiseFit,
    hw: Hardware,
    model: ModelSpec,
    tp: int,
    *,
    tokens: int,
    decode_context: int | None = None,
) -> ForwardPass:
    """Sum of the per-layer kernels of a decode batch (`tokens` requests at `decode_context`) or one prefill of
    `tokens`.

    Per layer: qkv, o, gate_up and down GEMMs, attention, the elementwise kernels
    (Vidur-derived, the same formula the cost model uses: the GEMM tables lack them)
    and two all-reduces when TP > 1; then the LM head for the sampled tokens.
    """
    h, d = model.hidden_size, model.head_dim
    heads, kv_heads, inter = model.num_heads // tp, max(1, model.num_kv_heads // tp), model.intermediate_size // tp
    gemm = sum(
        lookup.gemm(tokens, n, k)
        for n, k in (
            ((heads + 2 * kv_heads) * d, h),
            (h, heads * d),
            (2 * inter, h),
            (h, inter),
        )
    )
    if decode_context is None:
        attention, sampled = lookup.prefill_attention(tokens, heads, kv_heads), 1
    else:
        attention, sampled = lookup.decode_attention(tokens, decode_context, heads, kv_heads), tokens
    elementwise = float(
        elementwise_time(fit, hw, np.asarray(float(tokens)), elementwise_bytes_per_token(h, heads, kv_heads, inter))
    )
    allreduce = 2 * lookup.allreduce(tokens * h * model.dtype_bytes, tp) if tp > 1 else 0.0
    layers = model.num_layers
    return ForwardPass(
        gemm=layers * gemm,
        attention=layers * attention,
        elementwise=layers * elementwise,
        allreduce=layers * allreduce,
        lm_head=lookup.gemm(sampled, model.vocab_size // tp, h),
    )
