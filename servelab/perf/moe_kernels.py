"""The measured large-batch throughput of the Marlin fused-MoE kernel: what weight-only MoE experts run at.

On a GPU without tensor cores for its weights' format, vLLM runs a MoE checkpoint's experts through the Marlin
fused-MoE kernel (FP8 on Ampere; MXFP4 without FP4 tensor cores when OpenAI's Triton kernels are not installed,
which vLLM up to 0.11 did not ship; AWQ/GPTQ 4-bit), dequantizing the weights inside its bf16 MMAs. aiconfigurator-core
measures that kernel (its SGLang and vLLM fused-MoE tables, `marlin` kernel sources): at 2,048 tokens or more it runs
at ~45% of the A100's bf16 peak and ~25% of the H100's, while a dense bf16 GEMM of the same size runs near the peak
(the kernel fit), so a long prefill of weight-only experts costs up to ~3x the kernel fit's price. The median per
GPU is in data/moe_marlin.yaml, written by benchmarks/moe_kernel_check.py --write-marlin from the tables.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict

from servelab.perf.hardware import Hardware

MARLIN_FILE = Path(__file__).parent / "data" / "moe_marlin.yaml"


class MarlinMoeRate(BaseModel):
    """One GPU's measured Marlin fused-MoE throughput at large batches (gated experts' matmul FLOPs per second)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tflops: float
    """Median over the rows."""
    rows: int
    range_tflops: tuple[float, float]
    shapes: int
    """Distinct expert shapes (hidden, intermediate, top-k, experts) among the rows."""
    tables: list[str]
    kernels: list[str]


@cache
def _rates(path: Path = MARLIN_FILE) -> dict[str, MarlinMoeRate]:
    doc = yaml.safe_load(path.read_text())
    return {gpu: MarlinMoeRate.model_validate(rate) for gpu, rate in doc["gpus"].items()}


def marlin_moe_flops(hardware: Hardware) -> float | None:
    """FLOP/s of the Marlin fused-MoE kernel at large batches on `hardware`, or None where no table measures it."""
    rate = _rates().get(hardware.name)
    return rate.tflops * 1e12 if rate else None
