"""How close servelab's GPU step time is to vLLM's measured kernels: datasheet roofline (before) vs kernel fit (after).

A forward pass is rebuilt from aiconfigurator-core's measured tables (per layer:
the qkv, o, gate_up and down GEMMs, attention, the elementwise kernels, two
all-reduces at TP > 1; then the LM head) for Llama-3.1-8B, Qwen2.5-7B, CodeLlama-34B at TP=2 and
Llama-3.1-70B at TP=4, on decode batches 1-512 at contexts 512-8k and prefills
256-16k, and set beside `RooflineCostModel.step_time` with the CPU overheads
zeroed. "held-out" rows use only table sizes the fit never saw (every other
size); "all" adds the fitted sizes. Also prints the op-level residuals of the
fit, and the datasheet model's error on the same held-out op rows.

    pip install -e '.[kernels]'
    .venv/bin/python benchmarks/kernel_accuracy.py [--rows]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from servelab.perf import kernel_fit as kf
from servelab.perf.cost_model import CostCoefficients, RooflineCostModel, StepBatch
from servelab.perf.engine_args import resolve
from servelab.perf.engine_config import EngineConfig
from servelab.perf.hardware import Hardware, get_gpu
from servelab.perf.models import get_model

MODELS = (("Llama-3.1-8B", 1), ("Qwen2.5-7B", 1), ("CodeLlama-34B", 2), ("Llama-3.1-70B", 4))
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
DECODE_CONTEXTS = (512, 1024, 2048, 4096, 8192)
PREFILLS = (256, 512, 1024, 2048, 4096, 8192, 16384)
GPU_ONLY = CostCoefficients(step_overhead_s=0, per_request_overhead_s=0)
"""Kernel time only: the CPU overheads are not in the tables."""


@dataclass(frozen=True)
class Row:
    gpu: str
    model: str
    regime: str
    size: str
    table_s: float
    before_s: float
    after_s: float
    held_out: bool
    extrapolated: bool

    @property
    def before_err(self) -> float:
        return self.before_s / self.table_s - 1

    @property
    def after_err(self) -> float:
        return self.after_s / self.table_s - 1


def forward_rows(gpu: str) -> list[Row]:
    hw = get_gpu(gpu)
    tables = kf.load_tables(gpu)
    lookup = kf.TableLookup(tables)
    fit = kf.load_kernel_fit(hw)
    assert fit is not None, f"no kernel fit for {gpu}: run scripts/fit_kernels.py"
    gemm_sizes = {int(m) for m in kf.gemm_rows(tables).m.unique()}
    gemm_held, decode_held = (
        kf.held_out_sizes(kf.gemm_rows(tables).m),
        kf.held_out_sizes(kf.decode_rows(tables).context),
    )
    prefill_held = kf.held_out_sizes(kf.prefill_rows(tables).isl)
    rows = []
    for name, tp in MODELS:
        spec = get_model(name)
        config = resolve(EngineConfig(tensor_parallel_size=tp), hw, spec)
        before = RooflineCostModel(hw, spec, config, GPU_ONLY, kernels=False)
        after = RooflineCostModel(hw, spec, config, GPU_ONLY)
        assert after.cost_source == f"kernel-fit:{gpu}", after.cost_source_note
        label = f"{name} TP{tp}" if tp > 1 else name
        for b in DECODE_BATCHES:
            for ctx in DECODE_CONTEXTS:
                table = kf.forward_pass(lookup, fit.elementwise, hw, spec, tp, tokens=b, decode_context=ctx).total
                batch = StepBatch(decode_contexts=[ctx] * b)
                measured = lookup.decode_measured(b, ctx, max(1, spec.num_kv_heads // tp))
                rows.append(
                    Row(
                        gpu,
                        label,
                        "decode",
                        f"b={b} ctx={ctx}",
                        table,
                        before.step_time(batch),
                        after.step_time(batch),
                        measured and b in gemm_held and ctx in decode_held,
                        not measured,
                    )
                )
        for s in PREFILLS:
            table = kf.forward_pass(lookup, fit.elementwise, hw, spec, tp, tokens=s).total
            batch = StepBatch(prefill_chunks=[(s, 0)])
            rows.append(
                Row(
                    gpu,
                    label,
                    "prefill",
                    f"{s} tokens",
                    table,
                    before.step_time(batch),
                    after.step_time(batch),
                    s in gemm_held and s in prefill_held,
                    s not in gemm_sizes,
                )
            )
    return rows


def _stats(errors: list[float]) -> str:
    if not errors:
        return f"{'-':>6s} {'-':>6s}"
    e = np.abs(errors) * 100
    return f"{np.mean(e):5.1f}% {np.max(e):5.1f}%"


def print_forward(rows: list[Row]) -> None:
    print("\nForward pass vs measured tables: mean |err| / max |err| (CPU overheads excluded)")
    print(
        f"{'GPU':14s} {'model':18s} {'regime':8s} {'n':>3s} | {'before held-out':>15s} {'after held-out':>15s}"
        f" | {'n':>3s} {'before all':>15s} {'after all':>15s}"
    )
    keys = sorted(
        {(r.gpu, r.model, r.regime) for r in rows},
        key=lambda k: (k[0], [m for m, _ in MODELS].index(k[1].split()[0]), k[2]),
    )
    for key in keys:
        group = [r for r in rows if (r.gpu, r.model, r.regime) == key]
        held = [r for r in group if r.held_out]
        print(
            f"{key[0]:14s} {key[1]:18s} {key[2]:8s} {len(held):3d} | {_stats([r.before_err for r in held]):>15s} "
            f"{_stats([r.after_err for r in held]):>15s} | "
            f"{len(group):3d} {_stats([r.before_err for r in group]):>15s} {_stats([r.after_err for r in group]):>15s}"
        )
    for gpu in sorted({r.gpu for r in rows}):
        held = [r for r in rows if r.gpu == gpu and r.held_out]
        worst = max(held, key=lambda r: abs(r.after_err))
        print(
            f"{gpu}: held-out max |err| {abs(worst.after_err):.1%} after ({worst.model} {worst.regime} {worst.size}), "
            f"before {max(abs(r.before_err) for r in held):.1%}"
        )


def print_rows(rows: list[Row]) -> None:
    print(f"\n{'GPU':14s} {'model':18s} {'size':18s} {'table ms':>9s} {'before':>7s} {'after':>7s} held-out")
    for r in rows:
        mark = "yes" if r.held_out else ("extrapolated" if r.extrapolated else "")
        print(
            f"{r.gpu:14s} {r.model:18s} {r.size:18s} {r.table_s * 1e3:9.3f} {r.before_err:+7.1%} {r.after_err:+7.1%} "
            f"{mark}"
        )


def _datasheet_ops(hw: Hardware, tables: kf.KernelTables) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(prediction, table, held-out mask) of each op under the datasheet roofline's default efficiencies."""
    c = CostCoefficients()
    peak, bw = hw.peak_flops("bf16"), hw.memory_bandwidth
    g = kf.gemm_rows(tables)
    m, n, k = (g[col].to_numpy(float) for col in ("m", "n", "k"))
    gemm = kf.datasheet_gemm_time(hw, m, n, k, c.compute_efficiency, c.memory_efficiency)
    d = kf.decode_rows(tables)
    pairs = d.batch_size * d.context
    decode = np.maximum(
        4 * kf.HEAD_DIM * d.num_heads * pairs / (peak * c.attention_compute_efficiency),
        pairs * 2 * d.num_key_value_heads * kf.HEAD_DIM * 2 / (bw * c.attention_memory_efficiency),
    )
    p = kf.prefill_rows(tables)
    prefill = np.maximum(
        4
        * kf.HEAD_DIM
        * p.num_heads
        * p.batch_size
        * p.isl
        * (p.isl + 1)
        / 2
        / (peak * c.attention_compute_efficiency),
        p.batch_size * p.isl * 2 * p.num_key_value_heads * kf.HEAD_DIM * 2 / (bw * c.attention_memory_efficiency),
    )
    a = kf.allreduce_rows(tables)
    ring = 2 * (a.num_gpus - 1) / a.num_gpus
    allreduce = c.allreduce_latency_s + ring * a.nbytes / (hw.interconnect_bandwidth * c.interconnect_efficiency)
    return {
        "gemm": (gemm, g.latency.to_numpy(), kf.held_out(g.m)),
        "decode_attention": (decode.to_numpy(), d.latency.to_numpy(), kf.held_out(d.context)),
        "prefill_attention": (prefill.to_numpy(), p.latency.to_numpy(), kf.held_out(p.isl)),
        "allreduce": (allreduce.to_numpy(), a.latency.to_numpy(), kf.held_out(a.message_size)),
    }


def print_ops() -> None:
    print("\nOp level, held-out rows: rms |err| datasheet roofline (before) -> kernel fit (after)")
    print(f"{'GPU':14s} {'op':18s} {'rows':>5s} {'before':>7s} {'after':>7s}")
    for gpu in kf.SYSTEMS:
        hw = get_gpu(gpu)
        fit = kf.load_kernel_fit(hw)
        for op, (pred, table, held) in _datasheet_ops(hw, kf.load_tables(gpu)).items():
            before = float(np.sqrt(np.mean((pred[held] / table[held] - 1) ** 2)))
            r = fit.residuals[op]
            print(f"{gpu:14s} {op:18s} {r.holdout_rows:5d} {before:7.1%} {r.holdout_rms:7.1%}")
        r = fit.residuals["elementwise"]
        print(
            f"{gpu:14s} {'elementwise':18s} {r.fit_rows:5d} {'absent':>7s} {r.fit_rms:7.1%}  (Vidur rows, all fitted)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", action="store_true", help="print every forward-pass row")
    args = ap.parse_args()
    rows = [r for gpu in kf.SYSTEMS for r in forward_rows(gpu)]
    print(f"Source: {kf.SOURCE}")
    print_forward(rows)
    print_ops()
    if args.rows:
        print_rows(rows)


if __name__ == "__main__":
    main()
