"""calibrate's and validate's results in the terminal: the fit against what was measured, and the held-out errors."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from servelab.cells import MISSING, number, percent
from servelab.schemas.profile import CalibrationProfile, RunFit
from servelab.schemas.validation import ValidationReport


BOUND_WORDS = {"output_throughput": "output throughput", "median_ttft_ms": "TTFT p50", "median_tpot_ms": "TPOT p50"}
"""How the verdict line names each bounded metric."""


def fit_table(profile: CalibrationProfile) -> Table:
    table = Table(title="probes: measured / simulated with the fitted profile (error)")
    table.add_column("probe", no_wrap=True)
    for column in ("TTFT p50 ms", "TPOT p50 ms", "output tok/s"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in profile.simulated_probes:
        m, s, e = row["measured"], row["simulated"], row["error_pct"]
        cells = [row["probe"]]
        for key in ("median_ttft_ms", "median_tpot_ms", "output_throughput"):
            cells.append(
                MISSING if m[key] is None else f"{number(m[key], '.2f')} / {number(s[key], '.2f')} ({percent(e[key])})"
            )
        table.add_row(*cells)
    return table


def validation_table(report: ValidationReport) -> Table:
    table = Table(
        title=f"held-out points: measured / predicted (engine args: {report.engine_args or 'as calibrated'})",
        caption="each metric from its best repeat, against the simulation of that repeat's requests; "
        "repeats in which the client stalled (tokens read in bunches) or that ran while the server's "
        "speed differed from calibration (disturbed) are not judged",
    )
    metrics = list(report.median_abs_error_pct)
    table.add_column("point", no_wrap=True)
    for key in metrics:
        table.add_column(key, justify="right", no_wrap=True)
    for row in report.points:
        set_aside = [
            f"{n} {why}" for why, n in (("stalled", row.stalled_repeats), ("disturbed", row.disturbed_repeats)) if n
        ]
        name = row.point + (f" ({', '.join(set_aside)})" if set_aside else "")
        table.add_row(
            name,
            *(
                MISSING
                if row.measured[k] is None
                else f"{row.measured[k]:.1f} / {row.simulated[k]:.1f} ({percent(row.error_pct[k])})"
                for k in metrics
            ),
        )
    medians, bounds = report.median_abs_error_pct, report.bounds_pct
    table.add_row(
        "median |error|",
        *(
            MISSING if medians[k] is None else f"{medians[k]:.1f}%" + (f" (<= {bounds[k]:g}%)" if k in bounds else "")
            for k in metrics
        ),
        style="bold",
    )
    return table


def show_probe_fit(profile: CalibrationProfile, console: Console) -> None:
    console.print(fit_table(profile))
    rates = profile.rates
    wake_constant_ms = rates["idle_wake_time_constant_s"] * 1e3
    frontend_ms = profile.frontend_s_per_request * 1e3
    console.print(
        f"fitted: step overhead {rates['step_overhead_s'] * 1e3:.2f} ms, per request "
        f"{rates['per_request_overhead_s'] * 1e6:.0f} us, "
        f"per prefill step {rates['prefill_step_overhead_s'] * 1e3:.2f} ms, "
        f"wake from idle {rates['idle_wake_s'] * 1e3:.2f} ms (time constant {wake_constant_ms:.0f} ms), "
        f"linear {rates['linear_flops'] / 1e9:.1f} GFLOP/s, attention {rates['attention_flops'] / 1e9:.1f} GFLOP/s, "
        f"latency {profile.network_latency_s * 1e3:.2f} ms one way, API server {frontend_ms:.2f} ms "
        f"per request; step-model rms error {100 * profile.fit['rms_rel_error']:.1f}%"
    )
    ref = profile.reference
    if ref is not None and ref.median_ms is not None:
        console.print(
            f"reference step ({ref.workload}): {ref.median_ms:.2f} ms, run-to-run spread {ref.spread_pct:.1f}% "
            f"over {len(ref.runs_ms)} runs; validate re-times it to check the host"
        )
    else:
        console.print("reference step: not measured (the client stalled in every run); validate cannot check the host")


_PARAMETER_WORDS = {
    "compute_scale": ("GPU compute (peak FLOP/s x)", "{:.2f}"),
    "memory_scale": ("GPU memory bandwidth (x)", "{:.2f}"),
    "engine_cpu_factor": ("CPU-side costs, engine core (vLLM's measured x)", "{:.2f}"),
    "api_cpu_factor": ("CPU-side costs, API server (vLLM's measured x)", "{:.2f}"),
    "outside_engine_s": ("time outside the engine (added to TTFT)", "{:.1f} ms"),
}


def runs_table(fit: RunFit) -> Table:
    table = Table(title="measured / fitted / specs-only")
    for column in ("metric", "measured", "fitted", "specs-only"):
        table.add_column(column, justify="left" if column == "metric" else "right", no_wrap=True)
    for key, m in fit.metrics.items():
        table.add_row(
            key,
            number(m.measured, ".2f"),
            f"{number(m.fitted, '.2f')} ({percent(m.fitted_error_pct)})",
            f"{number(m.specs_only, '.2f')} ({percent(m.specs_only_error_pct)})",
        )
    return table


def show_runs_fit(profile: CalibrationProfile, console: Console) -> None:
    env = profile.environment
    assert env is not None
    for run in env.runs:
        console.print(
            f"{run.source} ({run.format}, {run.requests} requests, lengths from {run.lengths_from}):",
            highlight=False,
            soft_wrap=True,
        )
        console.print(runs_table(run))
        for note in run.notes:
            console.print(f"  note: {note}", highlight=False)
    for name, (words, fmt) in _PARAMETER_WORDS.items():
        value, spec = getattr(env, name), env.specs_only[name]
        scale = 1e3 if name == "outside_engine_s" else 1.0
        line = f"{words}: {fmt.format(value * scale)} (specs-only {fmt.format(spec * scale)})"
        if name in env.unconstrained:
            line += (
                f": kept, the runs cannot constrain it (its test step moves no figure by more than "
                f"{100 * env.sensitivity[name]:.1f}%)"
            )
        console.print(line, highlight=False)
    console.print(f"fit: mean squared log error {env.objective:.4f} after {env.evaluations} simulations of every run")


def show_validation(report: ValidationReport, out: Path, console: Console) -> None:
    """The held-out table, the warnings and the verdict against the bounds."""
    console.print(validation_table(report))
    for warning in report.warnings:
        console.print(f"[bold yellow]warning:[/] {warning}")
    verdict = "[green]within[/]" if report.within_bounds else "[red]outside[/]"
    bounds = ", ".join(f"{BOUND_WORDS[k]} <= {b:g}%" for k, b in report.bounds_pct.items())
    console.print(f"{verdict} the bounds (median |error|: {bounds}); report in {out}")
