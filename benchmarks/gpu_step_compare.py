"""Set the H200 measurements of `benchmarks/gpu_step_probe.py` beside servelab's kernel model: markdown tables.

Why: the H200 kernel fit (servelab/perf/kernel_fit.py, docs/kernels.md) rests on aiconfigurator-core's
tables of vLLM's kernels; the probe timed the same cuBLAS bf16 GEMMs and whole decode steps on a lent H200,
a second, independent measurement. Runs here, on CPU, from the probe's JSON:

1. GEMMs: each measured GEMM beside the kernel fit (`kernel_fit.gemm_time`), the datasheet roofline
   (`kernel_fit.datasheet_gemm_time` with CostCoefficients' default efficiencies) and, when
   aiconfigurator-core is installed, the table's own interpolated value (`TableLookup.gemm`). The first
   run timed back-to-back calls from Python, so a GEMM whose GPU time is under the host's enqueue cost of
   one call was timed at the host's pace: such rows (no `"graph": true`) whose datasheet floor (peak
   FLOP/s and bandwidth, no launch) is under the measured `launch.linear_us` are marked host-bound and
   summarised apart. Rows timed inside a CUDA graph (`"graph": true`, the second run) are GPU time.
2. Decode step: the lean decoder's CUDA-graph replay (GPU time of a whole step) beside the simulator's
   GPU-only step (RooflineCostModel, CPU overheads zeroed, fitted and datasheet forms), the forward pass
   rebuilt from the tables part by part (`kernel_fit.forward_pass`), and transformers' summed kernel time
   (runs with an `hf` stage).
3. Eager launch cost: eager step, host enqueue and GPU time per row, per layer, against the host's per-op
   cost; then per model the median eager ms per layer over every batch and round (`--rounds` runs key
   their steps `lean/<model>/round<N>`).

Each file given is set out in turn; by default both H200 runs of 2026-12-04 (two machines).

    PYTHONPATH=. .venv/bin/python benchmarks/gpu_step_compare.py [--rows] [--measured PATH ...]
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

import numpy as np

from servelab.perf import kernel_fit as kf
from servelab.perf.cost_model import CostCoefficients, RooflineCostModel, StepBatch
from servelab.perf.engine_args import resolve
from servelab.perf.engine_config import EngineConfig
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import Hardware, get_gpu
from servelab.perf.models import ModelSpec, get_model

MEASURED = tuple(
    Path(__file__).parent / "measured" / f"gpu_step_probe-h200-2026-12-04{run}.json" for run in ("", "-b", "-c")
)
"""The first H200 machine's run (GEMMs timed by back-to-back calls, hf stage) and the second's (GEMMs timed
inside a CUDA graph, lean steps in three rounds)."""
GPU = "H200"
GPU_ONLY = CostCoefficients(step_overhead_s=0, per_request_overhead_s=0)
"""Kernel time only: a graph replay and summed kernel times hold no CPU step overhead."""
TOKEN_RANGES = (("m ≤ 64", 1, 64), ("128-1024", 128, 1024), ("≥ 2048", 2048, math.inf))
"""Decode-sized (memory-bound), the knee, prefill-sized (compute-bound)."""


def markdown(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def _pct(error: float | None) -> str:
    return "-" if error is None else f"{error:+.1%}"


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.1f}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def table_lookup() -> kf.TableLookup | None:
    """aiconfigurator-core's H200 tables, or None when the optional package (or pandas) is absent."""
    try:
        return kf.TableLookup(kf.load_tables(GPU))
    except (PerfConfigError, ImportError) as error:
        print(f"(no aiconfigurator tables: {error}; table columns left out)\n")
        return None


# ---------------------------------------------------------------- 1. GEMMs


@dataclass(frozen=True)
class GemmRow:
    model: str
    gemm: str
    m: int
    n: int
    k: int
    measured_s: float
    fit_s: float
    datasheet_s: float
    table_s: float | None
    host_bound: bool
    """Timed by back-to-back calls (not in a CUDA graph) and the GPU's hard floor (datasheet peaks, no launch)
    is under the host's enqueue cost of one call: the probe's loop may time the host."""

    def error(self, predicted_s: float | None) -> float | None:
        return None if predicted_s is None else predicted_s / self.measured_s - 1

    @property
    def weight_tbps(self) -> float:
        return kf.BF16 * self.n * self.k / self.measured_s / 1e12


def gemm_rows(
    probe: dict[str, Any], hw: Hardware, fit: kf.GpuKernelFit, lookup: kf.TableLookup | None
) -> list[GemmRow]:
    c = CostCoefficients()
    host_s = probe["launch"]["linear_us"] * 1e-6
    rows = []
    for key, measured in probe.items():
        if not key.startswith("gemm/"):
            continue
        for r in measured:
            m, n, k = (np.asarray(float(r[x])) for x in ("m", "n", "k"))
            floor = float(kf.datasheet_gemm_time(hw, m, n, k, 1.0, 1.0))
            rows.append(
                GemmRow(
                    model=key.split("/", 1)[1],
                    gemm=r["gemm"],
                    m=r["m"],
                    n=r["n"],
                    k=r["k"],
                    measured_s=r["ms"] * 1e-3,
                    fit_s=float(kf.gemm_time(fit.gemm, hw, m, n, k)),
                    datasheet_s=float(kf.datasheet_gemm_time(hw, m, n, k, c.compute_efficiency, c.memory_efficiency)),
                    table_s=lookup.gemm(r["m"], r["n"], r["k"]) if lookup else None,
                    host_bound=not r.get("graph", False) and floor < host_s,
                )
            )
    return rows


def _abs_errors(rows: Sequence[GemmRow], model: str) -> list[float]:
    errors = [r.error(getattr(r, f"{model}_s")) for r in rows]
    return [abs(e) for e in errors if e is not None]


def _median_max(errors: list[float]) -> str:
    return f"{np.median(errors):.1%} / {max(errors):.1%}" if errors else "-"


def print_gemm_summary(rows: list[GemmRow], with_table: bool, host_us: float) -> None:
    """Rows split into all and GPU-bound only when some are host-bound (a run timed by back-to-back calls)."""
    models = ("fit", "datasheet") + (("table",) if with_table else ())
    split = any(r.host_bound for r in rows)
    timing = (
        f"host-bound: timed by back-to-back calls, datasheet floor < {host_us:.1f} µs, the host's F.linear enqueue"
        if split
        else "no row host-bound"
    )
    print(f"\n### GEMMs: predicted vs measured, median / max |error| ({timing})\n")
    out = []
    for label, low, high in TOKEN_RANGES:
        in_range = [r for r in rows if low <= r.m <= high]
        subsets = (
            ((in_range, "all"), ([r for r in in_range if not r.host_bound], "GPU-bound"))
            if split
            else ((in_range, "all"),)
        )
        for subset, which in subsets:
            out.append([label, which, len(subset)] + [_median_max(_abs_errors(subset, m)) for m in models])
    print(markdown(["tokens m", "rows", "n"] + list(models), out))


def print_gemm_rows(rows: list[GemmRow]) -> None:
    print("\n### GEMMs, every row (µs; error = predicted / measured − 1)\n")
    print(
        markdown(
            [
                "model",
                "gemm",
                "m",
                "n × k",
                "measured",
                "weights TB/s",
                "fit",
                "err",
                "datasheet",
                "err",
                "table",
                "err",
                "host-bound",
            ],
            [
                [
                    r.model,
                    r.gemm,
                    r.m,
                    f"{r.n} × {r.k}",
                    _us(r.measured_s),
                    f"{r.weight_tbps:.2f}",
                    _us(r.fit_s),
                    _pct(r.error(r.fit_s)),
                    _us(r.datasheet_s),
                    _pct(r.error(r.datasheet_s)),
                    _us(r.table_s),
                    _pct(r.error(r.table_s)),
                    "yes" if r.host_bound else "",
                ]
                for r in rows
            ],
        )
    )


# ---------------------------------------------------------------- 2. decode step


@dataclass(frozen=True)
class StepRun:
    """One stage's decode steps of one model: key `lean/<model>`, `hf/<model>` or, from a `--rounds` run,
    `lean/<model>/round<N>` (the rounds repeat every batch, so the host's drift between them shows)."""

    impl: str
    model: str
    round: int | None
    rows: list[dict[str, Any]]

    @property
    def round_label(self) -> str:
        return "-" if self.round is None else str(self.round)


def step_runs(probe: dict[str, Any]) -> list[StepRun]:
    """Every decode-step stage of the run, grouped per model, then implementation, then round."""
    runs = []
    for key, rows in probe.items():
        impl, _, rest = key.partition("/")
        if impl in ("lean", "hf"):
            model, _, round_ = rest.partition("/")
            runs.append(StepRun(impl, model, int(round_.removeprefix("round")) if round_ else None, rows))
    return sorted(runs, key=lambda run: (run.model, run.impl, run.round or 0))


DECODE_COLUMNS = [
    "model",
    "round",
    "batch",
    "lean graph",
    "fit",
    "err",
    "datasheet",
    "err",
    "tables",
    "err",
    "tables: GEMM / attention / elementwise / LM head",
    "hf kernels",
    "err",
]


def print_decode(runs: list[StepRun], hw: Hardware, fit: kf.GpuKernelFit, lookup: kf.TableLookup | None) -> None:
    print("\n### Decode step GPU time, context 512 (ms; error vs the lean decoder's graph replay)\n")
    hf = {
        (run.model, r["batch"]): r["kernel_ms"] * 1e-3
        for run in runs
        if run.impl == "hf"
        for r in run.rows
        if "kernel_ms" in r
    }
    out = []
    for model_name, lean in groupby((run for run in runs if run.impl == "lean"), key=lambda run: run.model):
        spec = get_model(model_name)
        config = resolve(EngineConfig(), hw, spec)
        fitted = RooflineCostModel(hw, spec, config, GPU_ONLY)
        datasheet = RooflineCostModel(hw, spec, config, GPU_ONLY, kernels=False)
        assert fitted.cost_source == f"kernel-fit:{GPU}", fitted.cost_source_note
        for run in lean:
            for r in run.rows:
                hf_s = hf.get((model_name, r["batch"]))
                out.append(_decode_row(run, r, (fitted, datasheet), hf_s, lookup, fit, hw, spec))
    print(markdown(DECODE_COLUMNS, out))


def _decode_row(
    run: StepRun,
    r: dict[str, Any],
    models: tuple[RooflineCostModel, RooflineCostModel],
    hf_s: float | None,
    lookup: kf.TableLookup | None,
    fit: kf.GpuKernelFit,
    hw: Hardware,
    spec: ModelSpec,
) -> list[Any]:
    """One measured decode step beside the kernel fit, the datasheet, the kernel tables and HF's own kernels."""
    fitted, datasheet = models
    graph_s, batch = r["graph_ms"] * 1e-3, r["batch"]
    step = StepBatch(decode_contexts=[r["context"]] * batch)
    fit_s, sheet_s = fitted.step_time(step), datasheet.step_time(step)
    parts = (
        kf.forward_pass(lookup, fit.elementwise, hw, spec, 1, tokens=batch, decode_context=r["context"])
        if lookup
        else None
    )
    tables = (
        (
            _ms(parts.total),
            _pct(parts.total / graph_s - 1),
            " / ".join(_ms(x) for x in (parts.gemm, parts.attention, parts.elementwise, parts.lm_head)),
        )
        if parts
        else ("-", "-", "-")
    )
    return [
        run.model,
        run.round_label,
        batch,
        _ms(graph_s),
        _ms(fit_s),
        _pct(fit_s / graph_s - 1),
        _ms(sheet_s),
        _pct(sheet_s / graph_s - 1),
        *tables,
        _ms(hf_s),
        _pct(None if hf_s is None else hf_s / graph_s - 1),
    ]


# ---------------------------------------------------------------- 3. eager launch cost


def print_eager(runs: list[StepRun], probe: dict[str, Any]) -> None:
    launch = probe["launch"]
    print(
        f"\n### Eager launch cost (host: {probe['host']['cpu']}, {probe['host']['cpus']} CPUs; per-op enqueue: "
        f"add {launch['add_us']:.1f} µs, small F.linear {launch['linear_us']:.1f} µs)\n"
    )
    out = []
    for run in runs:
        layers = get_model(run.model).num_layers
        for r in run.rows:
            gpu_ms = r.get("graph_ms", r.get("kernel_ms"))
            per_layer_us = r["eager_ms"] / layers * 1e3
            out.append(
                [
                    run.model,
                    run.impl,
                    run.round_label,
                    r["batch"],
                    f"{r['eager_ms']:.2f}",
                    f"{r['enqueue_ms']:.2f}",
                    *(
                        ("-", "-", "-")
                        if gpu_ms is None
                        else (f"{gpu_ms:.2f}", f"{r['eager_ms'] - gpu_ms:.2f}", f"{r['eager_ms'] / gpu_ms:.1f}")
                    ),
                    f"{per_layer_us:.0f}",
                    f"{per_layer_us / launch['add_us']:.0f}",
                    f"{r['kernels'] / layers:.0f}" if "kernels" in r else "-",
                ]
            )
    print(
        markdown(
            [
                "model",
                "impl",
                "round",
                "batch",
                "eager ms",
                "enqueue ms",
                "GPU ms (lean: graph, hf: kernels)",
                "eager − GPU ms",
                "eager / GPU",
                "eager µs / layer",
                "µs / layer ÷ add_us",
                "kernels / layer",
            ],
            out,
        )
    )
    print_eager_per_layer(runs)


def print_eager_per_layer(runs: list[StepRun]) -> None:
    """Eager ms per layer over every batch and round, per model and over all models: the figure an eager-mode
    launch floor per layer would be read from (docs/simulator.md, "Steps without CUDA graphs")."""
    print("\n### Eager ms per layer, every batch and round\n")
    out = []
    for impl in sorted({run.impl for run in runs}, reverse=True):
        of_impl = [run for run in runs if run.impl == impl]
        groups = [(model, list(group)) for model, group in groupby(of_impl, key=lambda run: run.model)]
        for model, group in groups + ([("all models", of_impl)] if len(groups) > 1 else []):
            per_layer = [r["eager_ms"] / get_model(run.model).num_layers for run in group for r in run.rows]
            rounds = len({run.round for run in group if run.round is not None}) or 1
            out.append(
                [
                    model,
                    impl,
                    rounds,
                    len(per_layer),
                    f"{min(per_layer):.2f}–{max(per_layer):.2f}",
                    f"{np.median(per_layer):.2f}",
                ]
            )
    print(markdown(["model", "impl", "rounds", "rows", "eager ms / layer", "median"], out))


def compare(path: Path, hw: Hardware, fit: kf.GpuKernelFit, lookup: kf.TableLookup | None, every_gemm: bool) -> None:
    """All three comparisons for one probe run."""
    probe = json.loads(path.read_text())
    host = probe["host"]
    print(
        f"## {path.name}: {host['gpu']} ({host['nvidia_smi']}), torch {host['torch']}, "
        f"transformers {host['transformers']}. Fit: {fit.tables['gemm']} of {fit.device}."
    )
    rows = gemm_rows(probe, hw, fit, lookup)
    print_gemm_summary(rows, lookup is not None, probe["launch"]["linear_us"])
    if every_gemm:
        print_gemm_rows(rows)
    runs = step_runs(probe)
    print_decode(runs, hw, fit, lookup)
    print_eager(runs, probe)
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--measured",
        type=Path,
        nargs="+",
        default=MEASURED,
        help="the probe's JSON files, each set out in turn (default: both H200 runs of 2026-12-04)",
    )
    ap.add_argument("--rows", action="store_true", help="print every GEMM row")
    args = ap.parse_args()
    hw = get_gpu(GPU)
    fit = kf.load_kernel_fit(hw)
    if fit is None:
        raise SystemExit(f"no kernel fit for {GPU}: run scripts/fit_kernels.py")
    lookup = table_lookup()
    for path in args.measured:
        compare(path, hw, fit, lookup, args.rows)


if __name__ == "__main__":
    main()
