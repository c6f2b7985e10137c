"""Kernel costs per engine: how much slower or faster SGLang's and TensorRT-LLM's measured kernels are than vLLM's.

servelab's step model is fitted to aiconfigurator-core's vLLM tables
(kernel_fit.py). The same package ships SGLang and TensorRT-LLM tables for the
same GPUs (GEMM per dtype, prefill and decode attention per kernel source), so
for another engine the step model is scaled by the ratio of that engine's
table forward pass to vLLM's (kernel_fit.forward_pass, the same sum of
per-layer GEMMs, attention, elementwise ops and LM head): one ratio for decode
steps (a batch of `DECODE_BATCH` at `DECODE_CONTEXT` tokens) and one for
steps with a prefill (a `PREFILL_TOKENS` chunk). Elementwise ops (Vidur's)
and all-reduces (vLLM's table) are the same for every engine. Where no table
covers the GPU, the engine, the dtype or the head layout, the ratio is 1 and
the cost source says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from servelab.perf.cost_model import CostModel, StepBatch
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import Hardware
from servelab.perf.kernel_fit import (
    HEAD_DIM,
    SYSTEMS,
    KernelTables,
    TableLookup,
    aiconfigurator_data_root,
    forward_pass,
    load_kernel_fit,
    load_tables,
)
from servelab.perf.models import ModelSpec

ATTENTION_KERNELS = {"vllm": "vllm_flash_attn_fa3", "sglang": "fa3", "trtllm": "torch_flow"}
"""The decode/prefill attention rows each engine's default backend on Hopper ran (FA3 for vLLM and SGLang)."""
DECODE_BATCH = 64
DECODE_CONTEXT = 1024
PREFILL_TOKENS = 2048


def _newest(root: Path, system: str, op: str, engine: str, filename: str) -> Path:
    folders = sorted(
        (root / system / op / engine).glob(f"*/{filename}"),
        key=lambda p: tuple(int(x) if x.isdigit() else -1 for x in p.parent.name.split(".")),
    )
    if not folders:
        raise PerfConfigError(f"no {engine} {op} table {filename} for {system}")
    return folders[-1]


@cache
def engine_tables(engine: str, gpu: str, gemm_dtype: str) -> KernelTables:
    """One engine's GEMM rows of `gemm_dtype` and bf16 128-wide-head attention rows of its default kernel."""
    import pandas as pd

    root = aiconfigurator_data_root()
    system = SYSTEMS[gpu]
    gemm = pd.read_parquet(_newest(root, system, "gemm", engine, "gemm_perf.parquet"))
    gemm = gemm[gemm.gemm_dtype == gemm_dtype].assign(latency=lambda f: f.latency * 1e-3)
    frames = []
    for name in ("context_attention_perf.parquet", "generation_attention_perf.parquet"):
        a = pd.read_parquet(_newest(root, system, "attention", engine, name))
        keep = (a.head_dim == HEAD_DIM) & (a.kv_cache_dtype == "bfloat16") & (a.attn_dtype == "bfloat16")
        keep &= a.kernel_source == ATTENTION_KERNELS[engine]
        if "window_size" in a:
            keep &= a.window_size == 0
        frames.append(a[keep].assign(latency=lambda f: f.latency * 1e-3).reset_index(drop=True))
    return KernelTables(
        gpu=gpu,
        system=system,
        device="",
        tables={},
        gemm=gemm.reset_index(drop=True),
        decode=frames[1],
        prefill=frames[0],
        allreduce=load_tables(gpu).allreduce,
    )


@dataclass(frozen=True, slots=True)
class KernelRatio:
    decode: float = 1.0
    prefill: float = 1.0
    note: str = "kernels as vLLM's"


def kernel_ratio(engine: str, hardware: Hardware, model: ModelSpec, quantization: str | None, tp: int) -> KernelRatio:
    """This engine's table forward pass over vLLM's, for a decode step and a prefill chunk (1, 1 where unknown)."""
    fit = load_kernel_fit(hardware)
    if engine == "vllm" or fit is None or hardware.name not in SYSTEMS:
        return KernelRatio()
    dtype = {None: "bfloat16", "fp8": "fp8"}.get(quantization)
    if dtype is None or model.head_dim != HEAD_DIM:
        return KernelRatio(
            note=f"no {engine} tables for {quantization} weights / head_dim {model.head_dim}: kernels as vLLM's"
        )
    try:
        mine = TableLookup(engine_tables(engine, hardware.name, dtype))
        base = TableLookup(engine_tables("vllm", hardware.name, dtype))
        decode = [
            forward_pass(t, fit.elementwise, hardware, model, tp, tokens=DECODE_BATCH, decode_context=DECODE_CONTEXT)
            for t in (mine, base)
        ]
        prefill = [forward_pass(t, fit.elementwise, hardware, model, tp, tokens=PREFILL_TOKENS) for t in (mine, base)]
    except (PerfConfigError, ValueError, KeyError) as exc:
        return KernelRatio(note=f"{engine} tables do not cover this model ({exc}): kernels as vLLM's")
    return KernelRatio(
        decode[0].total / decode[1].total,
        prefill[0].total / prefill[1].total,
        f"{engine} kernel tables ({dtype}): decode x{decode[0].total / decode[1].total:.3f}, "
        f"prefill x{prefill[0].total / prefill[1].total:.3f} of vLLM's",
    )


class ScaledCostModel:
    """A cost model whose decode-only steps take `ratio.decode` and prefill steps `ratio.prefill` times as long."""

    def __init__(self, base: CostModel, ratio: KernelRatio) -> None:
        self.base = base
        self.ratio = ratio
        self.coefficients = getattr(base, "coefficients", None)
        self.cost_source = f"{getattr(base, 'cost_source', type(base).__name__)} x {ratio.note}"
        aggregate = getattr(base, "step_time_aggregate", None)
        if aggregate is not None:
            self.step_time_aggregate = self._aggregate(aggregate)

    def _aggregate(self, aggregate: Any) -> Any:
        def scaled(new_tokens: int, *rest: int) -> float:
            return float(aggregate(new_tokens, *rest)) * (self.ratio.prefill if new_tokens else self.ratio.decode)

        return scaled

    def step_time(self, batch: StepBatch) -> float:
        scale = self.ratio.prefill if batch.prefill_chunks else self.ratio.decode
        return self.base.step_time(batch) * scale

    def wake_time(self, idle_s: float) -> float:
        return self.base.wake_time(idle_s)
