"""How close servelab's price of one MoE layer is to vLLM's measured fused-MoE kernels.

aiconfigurator-core ships vLLM fused-MoE latencies per GPU (systems/<gpu>/moe/vllm/<version>/moe_perf.parquet):
one MoE layer's routed experts for a number of tokens, an expert shape and a weight format, at TP=EP=1. Their
"balanced" routing spreads the tokens over min(E, B k) distinct experts; this script asks
`RooflineCostModel.moe_layer_time` for the same token and expert counts (so routing statistics are held equal and
only the kernel price is scored) and prints the median |error| per GPU, model and format. The serving price
itself assumes uniform random routing (docs/moe.md).

    pip install -e '.[kernels]'
    .venv/bin/python benchmarks/moe_kernel_check.py [--rows]
    .venv/bin/python benchmarks/moe_kernel_check.py --write-rates   # servelab/perf/data/moe_kernels.yaml

`--write-rates` writes the measured large-batch throughput per GPU of the fused-MoE kernels vLLM's weight-only MoE
experts (FP8 or 4-bit weights dequantized into bf16 MMAs) run in, the rate they cannot exceed: Marlin and OpenAI's
Triton MXFP4 kernel (gpt-oss's experts on Hopper), each at 2,048 tokens or more, balanced routing, over every row of
the kernel (all formats) and over the rows of each weight format the tables measure it in (MXFP4, int4), the MXFP4
rows, and any selection of one format measured in one release's table, also as a rate against each rank's expert width
(intermediate / TP).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from mla_fp8_moe_kernels import width_fit  # the sibling script's fit, the same form for FP8 experts

from servelab.perf.cost_model import RooflineCostModel
from servelab.perf.engine_config import EngineConfig
from servelab.perf.hardware import get_gpu
from servelab.perf.kernel_fit import AIC_VERSION, SYSTEMS, aiconfigurator_data_root
from servelab.perf.moe_kernels import RATES_FILE, TABLE_FORMATS, MoeKernel
from servelab.perf.models import ModelSpec, load_hf_config

CONFIGS = Path(__file__).parents[1] / "tests" / "fixtures" / "moe_configs"
GPUS = {"H100-SXM": ("h100_sxm", "0.24.0"), "H200": ("h200_sxm", "0.24.0"), "B200": ("b200_sxm", "0.24.0")}
CASES = (  # (model fixture, table moe_dtype, servelab quantization)
    ("qwen3-30b-a3b", "bfloat16", None),
    ("mixtral-8x7b", "bfloat16", None),
    ("qwen3-30b-a3b", "fp8_block", "fp8"),  # Qwen3-30B-A3B-FP8 ships 128x128 block scales
    ("gpt-oss-20b", "w4a16_mxfp4", "mxfp4"),
    ("gpt-oss-20b", "w4a8_mxfp4_mxfp8", "mxfp4"),
)


def measured(table: pd.DataFrame, model: ModelSpec, moe_dtype: str) -> pd.DataFrame:
    moe = model.moe
    assert moe is not None
    keep = (
        (table.moe_dtype == moe_dtype)
        & (table.distribution == "balanced")
        & (table.moe_tp_size == 1)
        & (table.moe_ep_size == 1)
        & (table.hidden_size == model.hidden_size)
        & (table.inter_size == moe.expert_intermediate_size)
        & (table.num_experts == moe.num_experts)
        & (table.topk == moe.experts_per_token)
    )
    return table[keep].sort_values("num_tokens")


LARGE_BATCH_FROM_TOKENS = 2048
"""Rows at this many tokens or more: every expert runs hundreds of rows, the kernel is compute-bound."""

KERNEL_SOURCES = {MoeKernel.MARLIN: "marlin", MoeKernel.OAI_TRITON_MXFP4: "oaitritonmxfp4"}
"""What each kernel's rows carry in aiconfigurator-core's `kernel_source`."""

WIDTH_FITTED_FORMATS = ("w4a16_mxfp4",)
"""Formats whose rate is fitted against each rank's expert width on every GPU: their rows are one expert shape per
kernel and table, measured at TP 1 to 32, so the rate's fall with width is not mixed with a change of hidden size."""


def one_table(rows: pd.DataFrame) -> bool:
    """Whether the rows come from one engine release's table and one weight format. Other selections (int4_wo, all
    formats) are fitted against width only then: on the A100 the int4 rows' fall within each shape measured at
    several TPs matches the fit across all shapes (a 256-wide slice against the whole expert: 7,168 x 2,048 with 256
    and 384 experts 0.73, fit 0.72; 6,144 x 2,048 0.73, fit 0.72; 4,096 x 1,024 0.75, fit 0.76), while releases
    whose rates differ at one width (the H200's int4 rows at TP 1: vLLM 0.19 at 113 TFLOP/s, vLLM 0.24 and SGLang at
    245-267) make the medians per width follow the mix, as formats running at different rates do."""
    return len(set(zip(rows.framework, rows.version, rows.moe_dtype))) == 1


def all_tables(root: Path, system: str) -> pd.DataFrame:
    """Every fused-MoE table of one GPU, any engine and release."""
    tables = [pd.read_parquet(path) for path in sorted((root / system / "moe").glob("*/*/moe_perf.parquet"))]
    return pd.concat(tables, ignore_index=True)


def kernel_rows(table: pd.DataFrame, kernel: MoeKernel) -> pd.DataFrame:
    """Every large-batch row of `kernel`, any TP (no expert parallelism), with each rank's expert width
    (intermediate / TP) and its throughput per rank in TFLOP/s (gated experts: gate, up and down,
    3 x hidden x width multiply-adds per routed token)."""
    keep = (
        table.kernel_source.str.contains(KERNEL_SOURCES[kernel])
        & (table.distribution == "balanced")
        & (table.moe_ep_size == 1)
        & (table.num_tokens >= LARGE_BATCH_FROM_TOKENS)
    )
    rows = table[keep]
    width = rows.inter_size / rows.moe_tp_size
    flops = 2 * 3 * rows.num_tokens * rows.topk * rows.hidden_size * width
    return rows.assign(width=width, tflops=flops / (rows.latency * 1e-3) / 1e12)


MEMORY_BOUND_MAX_TOKENS = 256
"""Rows at this many tokens or fewer, with every expert routed TOUCHES_PER_EXPERT times or more: the kernel reads
every expert's weights once and does little arithmetic on them, so its time is its weight traffic."""
TOUCHES_PER_EXPERT = 4
WEIGHT_BYTES_PER_PARAM = {"int4_wo": 0.5 + 2 / 128, "w4a16_mxfp4": 0.5 + 1 / 32}
"""The tables' weight-only formats as stored: 4-bit values with an fp16 scale per 128 (int4_wo, GPTQ/AWQ-style) or
an e8m0 scale per 32 (MXFP4)."""


def bandwidth_rows(table: pd.DataFrame, system: str, kernel: MoeKernel) -> pd.DataFrame:
    """`kernel`'s memory-bound rows in vLLM's own table of the newest release measured on this GPU, with the share of
    the GPU's HBM bandwidth the kernel reached reading the experts' weights (`fraction`)."""
    keep = (
        table.kernel_source.str.contains(KERNEL_SOURCES[kernel])
        & (table.framework.str.lower() == "vllm")
        & table.moe_dtype.isin(list(WEIGHT_BYTES_PER_PARAM))
        & (table.distribution == "balanced")
        & (table.moe_tp_size == 1)
        & (table.moe_ep_size == 1)
        & (table.num_tokens <= MEMORY_BOUND_MAX_TOKENS)
        & (table.num_tokens * table.topk >= TOUCHES_PER_EXPERT * table.num_experts)
    )
    rows = table[keep]
    rows = rows[rows.version == rows.version.max()] if not rows.empty else rows
    bandwidth = get_gpu(next(g for g, s in SYSTEMS.items() if s == system)).memory_bandwidth
    bytes_per_param = rows.moe_dtype.astype(object).map(WEIGHT_BYTES_PER_PARAM).astype(float)
    weights = rows.num_experts * 3 * rows.hidden_size * rows.inter_size * bytes_per_param
    return rows.assign(fraction=weights / (rows.latency * 1e-3) / bandwidth)


def width_rate(rows: pd.DataFrame) -> dict[str, Any]:
    """The rate against each rank's expert width w, fitted as peak x w / (w + half_width) to the median TFLOP/s per
    width (as benchmarks/mla_fp8_moe_kernels.py fits FP8 experts): a narrow slice of each expert gives every MMA
    tile fewer columns to reuse the routed tokens' activations over, and the kernel runs further below its peak."""
    return width_fit(rows.tflops.groupby(rows.width).median(), rows=len(rows), peak_guess=300.0)


def rate_entry(rows: pd.DataFrame, memory: pd.DataFrame, *, by_width: bool) -> dict[str, Any]:
    """One selection's median rate at TP = 1 with where it comes from, its small-batch share of the HBM bandwidth
    where vLLM's newest table measures one, and (`by_width`) its rate against each rank's expert width."""
    whole = rows[rows.moe_tp_size == 1]
    tflops = whole.tflops
    entry: dict[str, Any] = {
        "tflops": round(float(tflops.median()), 1),
        "rows": len(whole),
        "range_tflops": [round(float(tflops.min()), 1), round(float(tflops.max()), 1)],
        "shapes": int(whole.groupby(["hidden_size", "inter_size", "topk", "num_experts"]).ngroups),
        "tables": sorted({f"{f} {v}" for f, v in zip(whole.framework, whole.version)}),
        "kernels": sorted(set(whole.kernel_source)),
    }
    if by_width and rows.width.nunique() >= 3:
        entry["width_rate"] = width_rate(rows) | {
            "tables": sorted({f"{f} {v}" for f, v in zip(rows.framework, rows.version)})
        }
    if not memory.empty:
        entry |= {
            "bandwidth_fraction": round(float(memory.fraction.median()), 3),
            "bandwidth_rows": len(memory),
            "bandwidth_table": f"VLLM {memory.version.iloc[0]}",
        }
    return entry


def kernel_rates(root: Path, kernel: MoeKernel) -> dict[str, dict]:
    """One kernel's rates on every GPU whose tables measure it: over every row (all formats), and over the rows of
    each weight format the tables measure it in."""
    gpus = {}
    for gpu, system in SYSTEMS.items():
        table = all_tables(root, system)
        rows, memory = kernel_rows(table, kernel), bandwidth_rows(table, system, kernel)
        if rows[rows.moe_tp_size == 1].empty:
            continue
        gpus[gpu] = {"all_formats": rate_entry(rows, memory, by_width=one_table(rows)), "formats": {}}
        for moe_dtype in sorted(set(TABLE_FORMATS.values())):
            part = rows[rows.moe_dtype == moe_dtype]
            if not part[part.moe_tp_size == 1].empty:
                by_width = moe_dtype in WIDTH_FITTED_FORMATS or one_table(part)
                entry = rate_entry(part, memory[memory.moe_dtype == moe_dtype], by_width=by_width)
                gpus[gpu]["formats"][moe_dtype] = entry
        rates = ", ".join(f"{f} {e['tflops']}" for f, e in gpus[gpu]["formats"].items())
        print(f"{kernel} {gpu}: all formats {gpus[gpu]['all_formats']['tflops']} TFLOP/s; {rates or 'no format rows'}")
    return gpus


def write_rates(root: Path) -> None:
    doc = {
        "source": f"aiconfigurator-core=={AIC_VERSION} (NVIDIA, Apache-2.0): "
        "systems/data/<system>/moe/*/*/moe_perf.parquet",
        "generated_by": "benchmarks/moe_kernel_check.py --write-rates (do not edit by hand)",
        "selection": f"balanced routing, no expert parallelism, >= {LARGE_BATCH_FROM_TOKENS} tokens, any engine and "
        f"release; tflops: TP = 1; width_rate: every TP, peak x w / (w + half_width) over the median per expert width "
        f"w = intermediate / TP (formats {', '.join(WIDTH_FITTED_FORMATS)}, and any selection of one format from one "
        f"release's table); bandwidth: vLLM's newest table, "
        f"TP = 1, <= {MEMORY_BOUND_MAX_TOKENS} tokens, every expert routed >= {TOUCHES_PER_EXPERT} times",
        "formats": {
            "table_format": TABLE_FORMATS,
            "rule": "a weight format is priced at its own rows (formats.<table format>) where the GPU's tables "
            "measure the kernel in it; a format with no rows on a GPU, or one the tables never measure, at the "
            "kernel's rate over all its rows there (all_formats)",
        },
        "kernels": {
            str(kernel): {"kernel_source_contains": KERNEL_SOURCES[kernel], "gpus": kernel_rates(root, kernel)}
            for kernel in MoeKernel
        },
    }
    RATES_FILE.write_text(yaml.safe_dump(doc, sort_keys=False, width=120))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", action="store_true", help="print every (tokens, measured, predicted) row")
    parser.add_argument("--write-rates", action="store_true", help=f"write {RATES_FILE.name} and stop")
    args = parser.parse_args()
    root = aiconfigurator_data_root()
    if args.write_rates:
        write_rates(root)
        return
    print(
        f"{'GPU':9} {'model':15} {'table format':18} {'servelab format':22} {'rows':>4} "
        f"{'median |err|':>12} {'max |err|':>9}"
    )
    for gpu, (system, version) in GPUS.items():
        table = pd.read_parquet(root / system / "moe" / "vllm" / version / "moe_perf.parquet")
        for name, moe_dtype, quantization in CASES:
            model = load_hf_config(CONFIGS / name)
            rows = measured(table, model, moe_dtype)
            if rows.empty:
                continue
            cost = RooflineCostModel(get_gpu(gpu), model, EngineConfig(quantization=quantization))
            assert model.moe is not None
            tokens = rows.num_tokens.to_numpy()
            touched = np.minimum(model.moe.num_experts, tokens * model.moe.experts_per_token)
            predicted = np.array([cost.moe_layer_time(float(b), float(e)) for b, e in zip(tokens, touched)]) * 1e3
            error = predicted / rows.latency.to_numpy() - 1
            servelab_format = f"{cost.weight_format.name} ({cost.cost_source.split(':')[0]})"
            print(
                f"{gpu:9} {name:15} {moe_dtype:18} {servelab_format:22} "
                f"{len(rows):4d} {np.median(np.abs(error)):12.1%} {np.max(np.abs(error)):9.1%}"
            )
            if args.rows:
                for b, m, p in zip(tokens, rows.latency, predicted):
                    print(f"    {b:6d} tokens  measured {m:8.4f} ms  predicted {p:8.4f} ms  {p / m - 1:+.0%}")


if __name__ == "__main__":
    main()
