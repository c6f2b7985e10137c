"""Where a decode step sits on the roofline at the batch it runs: the reading a decode finding's title comes from.

A decode step does three things that take time: multiply every token through
the weights (FLOPs on the tensor cores), read the weights once, and read each
sequence's KV cache. The weight GEMMs do `batch` FLOPs per weight byte read
(two per parameter per token over the parameter's bytes), so above the chip's
ridge point (peak FLOP/s over bandwidth, ~150 on an A100) they are
compute-bound; the attention reads a sequence's whole context for a few FLOPs
per byte and is always bandwidth-bound. Which of the three is largest names
the class of the step, and so the finding's title and kind, from the same
figures its evidence prints: a compute-bound step is never titled
bandwidth-bound, and smaller weights are not offered as the cure of a step
that their read does not limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from servelab.perf.expert_parallel import step_weight_bytes
from servelab.perf.memory import kv_bytes_per_token_per_rank
from servelab.perf.quantization import weight_format
from servelab.targets.deployment import Deployment


class StepClass(StrEnum):
    COMPUTE = "compute"
    WEIGHTS = "weight bandwidth"
    KV = "KV bandwidth"


@dataclass(frozen=True)
class DecodeStep:
    batch: int
    context: int
    gemm_ms: float
    """The weight multiplications at the tensor cores' practical rate."""
    weights_ms: float
    """Reading the weights once at the practical bandwidth."""
    kv_ms: float
    """Reading the batch's KV cache."""
    weight_gb: float
    kv_gb: float
    ridge: float
    """The chip's FLOP per byte at which compute and bandwidth take the same time."""
    intensity: float
    """The weight GEMMs' FLOP per weight byte read: the batch, times 2 over the bytes per parameter."""
    compute_dtype: str

    @property
    def bound(self) -> StepClass:
        largest = max(self.gemm_ms, self.weights_ms, self.kv_ms)
        return (
            StepClass.COMPUTE
            if largest == self.gemm_ms
            else StepClass.WEIGHTS
            if largest == self.weights_ms
            else StepClass.KV
        )

    def evidence(self) -> str:
        gemm = "compute-bound" if self.gemm_ms >= self.weights_ms else "bound by the weight read"
        return (
            f"a decode step at ~{self.batch} sequences (~{self.context}-token contexts): the weight GEMMs take "
            f"{self.gemm_ms:.1f} ms on {self.compute_dtype} tensor cores and reading the {self.weight_gb:.1f} GB "
            f"of weights {self.weights_ms:.1f} ms ({self.intensity:.0f} FLOP per weight byte against the chip's "
            f"ridge of {self.ridge:.0f}: {gemm}); reading {self.kv_gb:.1f} GB of KV cache takes {self.kv_ms:.1f} ms"
        )

    def title(self) -> str:
        return {
            StepClass.COMPUTE: f"Token generation is compute-bound: at ~{self.batch} sequences a step's weight "
            "multiplications outlast its memory reads",
            StepClass.WEIGHTS: "Token generation is limited by how fast the GPU streams the weights",
            StepClass.KV: f"Token generation is limited by reading the KV cache of ~{self.batch} sequences each step",
        }[self.bound]


def decode_step(d: Deployment, batch: float, context: float) -> DecodeStep:
    """The parts of one decode step of `batch` sequences with `context` tokens each, per tensor-parallel rank."""
    model, cfg, hw, c = d.model, d.config, d.hardware, d.coefficients
    tp = cfg.tensor_parallel_size
    n, ctx = max(1, round(batch)), max(1, round(context))
    fmt = weight_format(cfg.quantization, model, hw)
    peak = hw.peak_flops(fmt.compute_dtype)
    weights = step_weight_bytes(model, cfg, hw, n)  # a MoE decode step reads only the experts its tokens use
    kv = n * ctx * kv_bytes_per_token_per_rank(model, cfg.kv_cache_dtype, tp)
    flops = n * (model.linear_flops_per_token + model.lm_head_flops_per_token) / tp
    return DecodeStep(
        batch=n,
        context=ctx,
        gemm_ms=1e3 * flops / (peak * c.compute_efficiency),
        weights_ms=1e3 * weights / (hw.memory_bandwidth * c.memory_efficiency),
        kv_ms=1e3 * kv / (hw.memory_bandwidth * c.attention_memory_efficiency),
        weight_gb=weights / 1e9,
        kv_gb=kv / 1e9,
        ridge=peak / hw.memory_bandwidth,
        intensity=flops / weights,
        compute_dtype=fmt.compute_dtype,
    )
