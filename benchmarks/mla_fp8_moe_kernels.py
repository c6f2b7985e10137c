"""The fixed costs of DeepSeek's MLA decode block and of an FP8 block-quantized fused-MoE layer, from measured tables.

At a few requests in flight, a DeepSeek step is not set by the bytes it reads: every one of its 61 layers runs an
MLA block (the fused q/kv down projection, the q up projection, the absorbed key and value BMMs, the MLA decode
kernel, the output projection) and a fused-MoE kernel chain whose launches and synchronisations cost more than their
weights' traffic. aiconfigurator-core measures both in vLLM on the H100 and H200:

- `systems/data/<gpu>/mla/vllm/<v>/mla_generation_module_perf.parquet`: one layer's whole MLA decode block for
  DeepSeek-V3's shapes (`num_heads` heads per GPU, `batch_size` requests, `step` tokens of context each), with
  bf16 or FP8 block-scaled projections (`gemm_type`). Per GPU, projection format and heads per GPU this script fits
  latency - (projection weights + cached latents) / HBM bandwidth = fixed + per_request x batch
  over the rows of at most 1,024 requests and 8,192 tokens of context, bf16 KV cache (FLASH_ATTN_MLA).
- `.../mla_context_module_perf.parquet`: the whole MLA prefill block (the same projections, the key and value up
  projection, FlashAttention over the decompressed heads) for `batch_size` prompts of `isl` tokens; fitted as
  latency = fixed + per_token x tokens + per_pair x causal query-key pairs over the rows of up to 32,768 tokens.
- `systems/data/<gpu>/moe/vllm/<v>/moe_perf.parquet`: one MoE layer's routed experts. Per GPU, for the FP8
  block-scaled format (DeepSeek's, Qwen3-FP8's), the fixed cost is the median over the one-token rows (balanced
  routing, no expert parallelism, any TP) of latency - the k experts' weight bytes on one rank / HBM bandwidth.

    PYTHONPATH=. .venv/bin/python benchmarks/mla_fp8_moe_kernels.py          # print the derivation
    PYTHONPATH=. .venv/bin/python benchmarks/mla_fp8_moe_kernels.py --write  # perf/data/mla_fp8_moe_kernels.yaml

tests/test_moe_mla_small_batch.py checks that the file is what this script derives from the installed tables.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import curve_fit

from servelab.perf.hardware import get_gpu
from servelab.perf.kernel_fit import AIC_VERSION, aiconfigurator_data_root
from servelab.perf.moe_kernels import MLA_FP8_MOE_FILE

SYSTEMS = {"H100-SXM": "h100_sxm", "H200": "h200_sxm"}
"""The GPUs whose vLLM tables measure both the MLA decode block and FP8 block-scaled fused MoE."""

MLA_TABLE = "mla/vllm/0.24.0/mla_generation_module_perf.parquet"
MLA_PREFILL_TABLE = "mla/vllm/0.24.0/mla_context_module_perf.parquet"
MOE_TABLES = ("moe/vllm/0.19.0/moe_perf.parquet", "moe/vllm/0.24.0/moe_perf.parquet")
HIDDEN, Q_LORA, KV_LORA, ROPE, NOPE, V_HEAD = 7168, 1536, 512, 64, 128, 128
"""DeepSeek-V3's attention shapes, the model the MLA tables were timed on."""
MAX_BATCH, MAX_CONTEXT = 1024, 8192
RATE_FROM_TOKENS = 512
"""The fused-MoE rate is fitted over steps of at least this many tokens: below it the experts' weight reads and the
kernel chain's fixed cost (moe_fixed) set a layer's time."""
MAX_PREFILL_TOKENS = 32768
FORMAT_BYTES = {"bfloat16": 2.0, "fp8_block": 1.0}
MOE_RATE_FORMATS = ("fp8_block", "bfloat16")
"""The expert formats whose large-batch rate is fitted: FP8 block-scaled (DeepSeek's, Qwen3-FP8's) and bf16."""


def mla_weight_bytes(heads: int, bytes_per_param: float) -> float:
    """Projection weights one GPU reads per MLA decode layer: the replicated q/kv down projection, and its heads'
    share of the q up projection, the absorbed key/value up projection and the output projection."""
    down = HIDDEN * (Q_LORA + KV_LORA + ROPE)
    per_head = Q_LORA * (NOPE + ROPE) + KV_LORA * (NOPE + V_HEAD) + V_HEAD * HIDDEN
    return (down + heads * per_head) * bytes_per_param


def mla_fits(table: pd.DataFrame, bandwidth: float) -> dict[str, dict[int, dict[str, Any]]]:
    """gemm_type -> heads per GPU -> {fixed_s, per_request_s, rows, rms_s}."""
    rows = table[
        (table.kernel_source == "FLASH_ATTN_MLA")
        & (table.kv_cache_dtype == "bfloat16")
        & (table.batch_size <= MAX_BATCH)
        & (table.step <= MAX_CONTEXT)
    ]
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for (gemm, heads), part in rows.groupby(["gemm_type", "num_heads"]):
        kv = part.batch_size * part.step * (KV_LORA + ROPE) * 2
        residual = part.latency * 1e-3 - (mla_weight_bytes(int(heads), FORMAT_BYTES[str(gemm)]) + kv) / bandwidth
        design = np.column_stack([np.ones(len(part)), part.batch_size.to_numpy(float)])
        (fixed, per_request), *_ = np.linalg.lstsq(design, residual.to_numpy(), rcond=None)
        rms = float(np.sqrt(np.mean((design @ [fixed, per_request] - residual.to_numpy()) ** 2)))
        out.setdefault(str(gemm), {})[int(heads)] = {
            "fixed_s": float(f"{fixed:.4g}"),
            "per_request_s": float(f"{per_request:.4g}"),
            "rows": len(part),
            "rms_s": float(f"{rms:.3g}"),
        }
    return out


def mla_prefill_fits(table: pd.DataFrame) -> dict[str, dict[int, dict[str, Any]]]:
    """gemm_type -> heads per GPU -> {fixed_s, per_token_s, per_pair_s, rows, median_abs_error, max_abs_error}: the
    whole prefill block, latency = fixed + per_token x tokens + per_pair x causal query-key pairs, fitted to the
    rows of at most MAX_PREFILL_TOKENS tokens with a bf16 KV cache, whichever backend vLLM picked (FLASH_ATTN_MLA for
    short prompts, FLASH_ATTN from 1,024 tokens)."""
    tokens = table.batch_size * table.isl
    rows = table[(table.kv_cache_dtype == "bfloat16") & (tokens <= MAX_PREFILL_TOKENS)]
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for (gemm, heads), part in rows.groupby(["gemm_type", "num_heads"]):
        pairs = part.batch_size * part.isl * (part.isl + 1) / 2
        design = np.column_stack([np.ones(len(part)), (part.batch_size * part.isl).to_numpy(float), pairs])
        latency = part.latency.to_numpy() * 1e-3
        coef, *_ = np.linalg.lstsq(design, latency, rcond=None)
        error = np.abs(design @ coef / latency - 1)
        out.setdefault(str(gemm), {})[int(heads)] = {
            "fixed_s": float(f"{coef[0]:.4g}"),
            "per_token_s": float(f"{coef[1]:.4g}"),
            "per_pair_s": float(f"{coef[2]:.4g}"),
            "rows": len(part),
            "median_abs_error": float(f"{np.median(error):.3g}"),
            "max_abs_error": float(f"{np.max(error):.3g}"),
        }
    return out


def moe_fixed(tables: list[pd.DataFrame], bandwidth: float) -> dict[str, dict[str, Any]]:
    """{"fp8_block": {fixed_s, rows, shapes, range_s, tables}} from the one-token rows of vLLM's Triton fused-MoE
    kernel with FP8 block-scaled experts (bf16 experts keep cost_model.MOE_LAYER_FIXED_S, read off the same tables)."""
    rows = triton_rows(tables, "fp8_block")
    rows = rows[rows.num_tokens == 1]
    out = {}
    for dtype, part in rows.groupby("moe_dtype"):
        weights = part.topk * 3 * part.hidden_size * part.inter_size / part.moe_tp_size * FORMAT_BYTES[str(dtype)]
        residual = part.latency * 1e-3 - weights / bandwidth
        out[str(dtype)] = {
            "fixed_s": float(f"{residual.median():.4g}"),
            "rows": len(part),
            "shapes": int(part.groupby(["hidden_size", "inter_size", "topk", "num_experts"]).ngroups),
            "range_s": [float(f"{residual.min():.3g}"), float(f"{residual.max():.3g}")],
            "tables": sorted({f"{f} {v}" for f, v in zip(part.framework, part.version)}),
        }
    return out


def triton_rows(tables: list[pd.DataFrame], dtype: str) -> pd.DataFrame:
    """vLLM's Triton fused-MoE rows with `dtype` experts, balanced routing, no expert parallelism."""
    table = pd.concat(tables, ignore_index=True)
    return table[
        (table.distribution == "balanced")
        & (table.moe_ep_size == 1)
        & (table.moe_dtype == dtype)
        & table.kernel_source.str.contains("triton|vllm_fused_moe")
    ]


def moe_rate(tables: list[pd.DataFrame], dtype: str) -> dict[str, Any]:
    """The kernel's rate with `dtype` experts against each rank's expert width w = intermediate / TP and the rows each
    expert multiplies r = tokens x k / experts, fitted as peak x w / (w + half_width) x r / (r + half_rows) to the
    median TFLOP/s of each (w, r) over the rows of >= 512 tokens (gated experts: 3 x hidden x w multiply-adds per
    routed token and rank): narrow TP slices and experts handed few rows run far below the peak."""
    rows = triton_rows(tables, dtype)
    rows = rows[rows.num_tokens >= RATE_FROM_TOKENS]
    width = rows.inter_size / rows.moe_tp_size
    per_expert = rows.num_tokens * rows.topk / rows.num_experts
    tflops = 6 * rows.num_tokens * rows.topk * rows.hidden_size * width / (rows.latency * 1e-3) / 1e12
    medians = tflops.groupby([width, per_expert]).median()
    w, r = (medians.index.get_level_values(i).to_numpy(float) for i in (0, 1))

    def rate(x: tuple[np.ndarray, np.ndarray], peak: float, half_width: float, half_rows: float) -> np.ndarray:
        return peak * x[0] / (x[0] + half_width) * x[1] / (x[1] + half_rows)

    (peak, half_width, half_rows), _ = curve_fit(rate, (w, r), medians.to_numpy(), p0=(600.0, 300.0, 50.0))
    residual = np.abs(medians.to_numpy() / rate((w, r), peak, half_width, half_rows) - 1)
    return {
        "peak_tflops": float(f"{peak:.4g}"),
        "half_width": float(f"{half_width:.4g}"),
        "half_rows": float(f"{half_rows:.4g}"),
        "rows": len(rows),
        "widths": len(set(w)),
        "cells": len(medians),
        "median_abs_error": float(f"{np.median(residual):.3g}"),
        "p90_abs_error": float(f"{np.quantile(residual, 0.9):.3g}"),
        "max_abs_error": float(f"{np.max(residual):.3g}"),
    }


def width_fit(medians: pd.Series, *, rows: int, peak_guess: float) -> dict[str, Any]:
    """peak x w / (w + half_width) fitted to the median TFLOP/s per expert width w (the Series' index), with the
    number of rows it rests on and its largest miss on a width."""
    w = medians.index.to_numpy(float)
    (peak, half_width), _ = curve_fit(lambda x, r, h: r * x / (x + h), w, medians.to_numpy(), p0=(peak_guess, 300.0))
    residual = medians.to_numpy() / (peak * w / (w + half_width)) - 1
    return {
        "peak_tflops": float(f"{peak:.4g}"),
        "half_width": float(f"{half_width:.4g}"),
        "rows": rows,
        "widths": len(w),
        "max_abs_error": float(f"{np.max(np.abs(residual)):.3g}"),
    }


def derive(root: Path) -> dict[str, Any]:
    """The document the data file holds."""
    gpus = {}
    for gpu, system in SYSTEMS.items():
        bandwidth = get_gpu(gpu).memory_bandwidth
        mla = pd.read_parquet(root / system / MLA_TABLE)
        moe = [pd.read_parquet(root / system / path) for path in MOE_TABLES if (root / system / path).is_file()]
        gpus[gpu] = {
            "mla_decode": mla_fits(mla, bandwidth),
            "mla_prefill": mla_prefill_fits(pd.read_parquet(root / system / MLA_PREFILL_TABLE)),
            "moe_fixed": moe_fixed(moe, bandwidth),
            "moe_rate": {dtype: moe_rate(moe, dtype) for dtype in MOE_RATE_FORMATS},
        }
    return {
        "source": f"aiconfigurator-core=={AIC_VERSION} (NVIDIA, Apache-2.0): systems/data/<system>/{MLA_TABLE}, "
        f"{MLA_PREFILL_TABLE} and {', '.join(MOE_TABLES)}",
        "generated_by": "benchmarks/mla_fp8_moe_kernels.py --write (do not edit by hand)",
        "mla_selection": f"FLASH_ATTN_MLA, bf16 KV cache, <= {MAX_BATCH} requests, <= {MAX_CONTEXT} tokens of context; "
        "residual = latency - (projection weights + latents) / HBM bandwidth = fixed + per_request x requests",
        "mla_prefill_selection": f"bf16 KV cache (FLASH_ATTN_MLA or FLASH_ATTN), <= {MAX_PREFILL_TOKENS} tokens; "
        "latency = fixed + per_token x tokens + per_pair x causal query-key pairs",
        "moe_rate_selection": f"the same kernels, >= {RATE_FROM_TOKENS} tokens; TFLOP/s = peak x w / (w + half_width) "
        "x r / (r + half_rows) over the median per expert width w = intermediate / TP and rows per expert r = tokens "
        "x k / experts",
        "moe_selection": "Triton fused-MoE kernels, one token, balanced routing, no expert parallelism, any TP; "
        "residual = latency - k experts' weights on one rank / HBM bandwidth, median",
        "gpus": gpus,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {MLA_FP8_MOE_FILE.name}")
    args = parser.parse_args()
    doc = derive(aiconfigurator_data_root())
    text = yaml.safe_dump(doc, sort_keys=False, width=120)
    if args.write:
        MLA_FP8_MOE_FILE.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
