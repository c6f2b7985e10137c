"""The step model at prefill-heavy sizes, beside the measured kernel tables it rests on.

Why: bursts of long prompts (2k-32k tokens) are where saturated throughput is most
over-predicted, so the step model is checked where those bursts put it: 8,192-token
chunks and contexts up to 32k, where causal attention's quadratic term grows to
rival the GEMMs. Three parts, per GPU with tables (docs/kernels.md):

1. prefill attention (FlashAttention, one sequence, no cache) at 4k-16k tokens, the
   tables' top: measured and fitted TFLOP/s (causal FLOPs, 4 d h s(s+1)/2) and the error;
2. the layer GEMMs of a 14B and a 32B model at 8,192 and 16,384 tokens: table
   (interpolated between its widths) and fit;
3. one 8,192-token chunk after 0-24k cached tokens (a 32k prompt's four chunks) in
   the fitted cost model, CPU overheads zeroed: GEMM and attention parts, and what
   the attention runs at. The tables stop at 16k and have no cached prefix, so this
   part is the model's extrapolation (its FLOPs count each new token against the
   cache and the chunk up to itself).

Needs aiconfigurator-core (pip install -e '.[kernels]'):

    PYTHONPATH=. .venv/bin/python benchmarks/prefill_step_check.py
"""

from __future__ import annotations

import numpy as np

from servelab.perf.cost_model import CostCoefficients, RooflineCostModel, StepBatch
from servelab.perf.engine_args import resolve
from servelab.perf.engine_config import EngineConfig
from servelab.perf.hardware import get_gpu
from servelab.perf.kernel_fit import (
    SYSTEMS,
    TableLookup,
    gemm_time,
    load_kernel_fit,
    load_tables,
    prefill_attention_time,
)
from servelab.perf.models import get_model

LAYOUTS = ((40, 8), (64, 8))
"""(query heads, KV heads) of Qwen2.5/Qwen3 14B and 32B at TP 1."""
MODELS = ("Qwen2.5-14B", "Qwen2.5-32B")
CPU_FREE = CostCoefficients(step_overhead_s=0, per_request_overhead_s=0)


def _causal_flops(length: float, heads: float) -> float:
    return 4 * 128 * heads * length * (length + 1) / 2


def attention_rows(gpu: str, lookup: TableLookup) -> list[str]:
    hw, fit = get_gpu(gpu), load_kernel_fit(get_gpu(gpu))
    assert fit is not None
    rows = []
    for heads, kv_heads in LAYOUTS:
        for length in (4096, 6144, 8192, 12288, 16384):
            table = lookup.prefill_attention(length, heads, kv_heads)
            model = float(
                prefill_attention_time(
                    fit.prefill_attention, hw, np.array(1.0), np.array(float(length)), np.array(float(heads))
                )
            )
            flops = _causal_flops(length, heads)
            rows.append(
                f"| {gpu} | {heads}/{kv_heads} | {length:,} | {table * 1e3:.3f} | {model * 1e3:.3f} | "
                f"{model / table - 1:+.1%} | {flops / table / 1e12:.0f} | {flops / model / 1e12:.0f} |"
            )
        for length in (24576, 32768):  # beyond the tables: the fit's extrapolation only
            model = float(
                prefill_attention_time(
                    fit.prefill_attention, hw, np.array(1.0), np.array(float(length)), np.array(float(heads))
                )
            )
            rows.append(
                f"| {gpu} | {heads}/{kv_heads} | {length:,} | – | {model * 1e3:.3f} | – | – | "
                f"{_causal_flops(length, heads) / model / 1e12:.0f} |"
            )
    return rows


def gemm_rows(gpu: str, lookup: TableLookup) -> list[str]:
    hw, fit = get_gpu(gpu), load_kernel_fit(get_gpu(gpu))
    assert fit is not None
    rows = []
    for name in MODELS:
        m = get_model(name)
        h, d, inter = m.hidden_size, m.head_dim, m.intermediate_size
        shapes = {
            "qkv": ((m.num_heads + 2 * m.num_kv_heads) * d, h),
            "o": (h, m.num_heads * d),
            "gate_up": (2 * inter, h),
            "down": (h, inter),
        }
        for tokens in (8192, 16384):
            table = sum(lookup.gemm(tokens, n, k) for n, k in shapes.values())
            model = sum(
                float(gemm_time(fit.gemm, hw, np.array(float(tokens)), np.array(float(n)), np.array(float(k))))
                for n, k in shapes.values()
            )
            flops = sum(2.0 * tokens * n * k for n, k in shapes.values())
            rows.append(
                f"| {gpu} | {name} | {tokens:,} | {table * 1e3:.2f} | {model * 1e3:.2f} | "
                f"{model / table - 1:+.1%} | {flops / table / 1e12:.0f} | {flops / model / 1e12:.0f} |"
            )
    return rows


def chunk_rows(gpu: str) -> list[str]:
    hw = get_gpu(gpu)
    rows = []
    for name in MODELS:
        spec = get_model(name)
        cost = RooflineCostModel(hw, spec, resolve(EngineConfig(max_model_len=32768), hw, spec), CPU_FREE)
        rest = _no_attention_time(cost)
        for cached in (0, 8192, 16384, 24576):
            step = cost.step_time(StepBatch(prefill_chunks=[(8192, cached)]))
            pairs = 8192 * cached + 8192 * 8193 // 2
            attention_flops = pairs * spec.attention_flops_per_pair
            attention = step - rest
            rows.append(
                f"| {gpu} | {name} | {cached:,} | {step * 1e3:.0f} | {attention * 1e3:.0f} | "
                f"{attention / step:.0%} | {attention_flops / attention / 1e12:.0f} |"
            )
    return rows


def _no_attention_time(cost: RooflineCostModel) -> float:
    """The step's GEMM, elementwise and LM-head time for 8,192 tokens: the step at a context of 0 less its attention."""
    fit = cost.kernel_fit
    assert fit is not None
    hw = cost.hardware
    heads = cost.model.num_heads
    attention = cost.model.num_layers * float(
        prefill_attention_time(fit.prefill_attention, hw, np.array(1.0), np.array(8192.0), np.array(float(heads)))
    )
    return cost.step_time(StepBatch(prefill_chunks=[(8192, 0)])) - attention


def main() -> None:
    print("Prefill attention, one sequence, per layer: table ms / fit ms, error, causal TFLOP/s (table / fit)\n")
    print("| GPU | heads/KV | tokens | table ms | fit ms | fit error | table TFLOP/s | fit TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    tables = {gpu: TableLookup(load_tables(gpu)) for gpu in SYSTEMS}
    for gpu, lookup in tables.items():
        print("\n".join(attention_rows(gpu, lookup)))
    print("\nOne layer's four GEMMs (qkv, o, gate_up, down), summed: table ms / fit ms, TFLOP/s\n")
    print("| GPU | model | tokens | table ms | fit ms | fit error | table TFLOP/s | fit TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    for gpu, lookup in tables.items():
        print("\n".join(gemm_rows(gpu, lookup)))
    print("\nOne 8,192-token chunk after a cached prefix, fitted cost model (CPU overheads zeroed)\n")
    print("| GPU | model | cached tokens | step ms | attention ms | attention share | attention TFLOP/s |")
    print("|---|---|---|---|---|---|---|")
    for gpu in tables:
        print("\n".join(chunk_rows(gpu)))


if __name__ == "__main__":
    main()
