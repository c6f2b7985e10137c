"""`servelab calibrate` and `servelab validate`: fit the simulator to a live server, then test it on unseen runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from servelab.cli import app
from servelab.cli.checks import real
from servelab.cli.options import (
    ApiKeyFlag,
    BaseUrlFlag,
    EngineArgsFlag,
    RequiredCalibrationFlag,
    RequiredGpuFlag,
    RequiredModelFlag,
    ServedModelFlag,
)
from servelab.experiment.calibrate import calibrate as run_calibration
from servelab.experiment.schema import ValidationReport
from servelab.metrics.schema import checked
from servelab.experiment.validate import METRICS, points_named, validate as run_validation
from servelab.perf.calibration import CalibrationProfile, load_profile

_console = Console()


def _pct(value: float | None) -> str:
    """Signed percentage, '-' where there is nothing to compare."""
    return "-" if value is None else f"{value:+.0f}%"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def fit_table(profile: CalibrationProfile) -> Table:
    table = Table(title="probes: measured / simulated with the fitted profile (error)")
    table.add_column("probe", no_wrap=True)
    for column in ("TTFT p50 ms", "TPOT p50 ms", "output tok/s"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in profile.simulated_probes:
        m, s, e = row["measured"], row["simulated"], row["error_pct"]
        cells = [row["probe"]]
        for key in ("median_ttft_ms", "median_tpot_ms", "output_throughput"):
            cells.append("-" if m[key] is None else f"{_num(m[key])} / {_num(s[key])} ({_pct(e[key])})")
        table.add_row(*cells)
    return table


def validation_table(report: ValidationReport) -> Table:
    table = Table(title=f"held-out points: measured / predicted (engine args: {report.engine_args or 'as calibrated'})",
                  caption="each metric from its best repeat, against the simulation of that repeat's requests; "
                          "repeats in which the client stalled (tokens read in bunches) or that ran while the server's "
                          "speed differed from calibration (disturbed) are not judged")
    table.add_column("point", no_wrap=True)
    for key in METRICS:
        table.add_column(key, justify="right", no_wrap=True)
    for row in report.points:
        set_aside = [f"{n} {why}" for why, n in (("stalled", row.stalled_repeats), ("disturbed", row.disturbed_repeats)) if n]
        name = row.point + (f" ({', '.join(set_aside)})" if set_aside else "")
        table.add_row(name, *(
            "-" if row.measured[k] is None else
            f"{row.measured[k]:.1f} / {row.simulated[k]:.1f} ({_pct(row.error_pct[k])})" for k in METRICS
        ))
    medians, bounds = report.median_abs_error_pct, report.bounds_pct
    table.add_row("median |error|", *(
        "-" if medians[k] is None else f"{medians[k]:.1f}%" + (f" (<= {bounds[k]:g}%)" if k in bounds else "")
        for k in METRICS
    ), style="bold")
    return table


@app.command()
def calibrate(
    base_url: BaseUrlFlag,
    gpu: RequiredGpuFlag,
    model: RequiredModelFlag,
    out: Annotated[Path, typer.Option(help="Profile JSON to write; raw probe runs go to <out>.probes/.")],
    engine_args: EngineArgsFlag = "",
    budget: Annotated[float, typer.Option(callback=real(gt=0), help="Seconds of probing (repeated passes until spent).")] = 300.0,
    served_model: ServedModelFlag = None,
    api_key: ApiKeyFlag = None,
) -> None:
    """Probe a live server, fit the cost model to it, check the fit in the simulator, write a profile."""
    profile = run_calibration(
        base_url, gpu, model, out, engine_args=engine_args, budget_s=budget, served_model=served_model,
        api_key=api_key, progress=lambda m: _console.print(f"[dim]{m}[/]"),
    )
    _console.print(fit_table(profile))
    rates = profile.rates
    _console.print(
        f"fitted: step overhead {rates['step_overhead_s'] * 1e3:.2f} ms, per request {rates['per_request_overhead_s'] * 1e6:.0f} us, "
        f"per prefill step {rates['prefill_step_overhead_s'] * 1e3:.2f} ms, "
        f"wake from idle {rates['idle_wake_s'] * 1e3:.2f} ms (time constant {rates['idle_wake_time_constant_s'] * 1e3:.0f} ms), "
        f"linear {rates['linear_flops'] / 1e9:.1f} GFLOP/s, attention {rates['attention_flops'] / 1e9:.1f} GFLOP/s, "
        f"latency {profile.network_latency_s * 1e3:.2f} ms one way, API server {profile.frontend_s_per_request * 1e3:.2f} ms "
        f"per request; step-model rms error {100 * profile.fit['rms_rel_error']:.1f}%"
    )
    ref = profile.reference
    if ref is not None and ref.median_ms is not None:
        _console.print(f"reference step ({ref.workload}): {ref.median_ms:.2f} ms, run-to-run spread {ref.spread_pct:.1f}% "
                       f"over {len(ref.runs_ms)} runs; validate re-times it to check the host")
    else:
        _console.print("reference step: not measured (the client stalled in every run); validate cannot check the host")
    _console.print(f"profile written to {out}")


@app.command()
def validate(
    calibration: RequiredCalibrationFlag,
    base_url: BaseUrlFlag,
    points: Annotated[str, typer.Option(help="Point set: default (7 points) or quick (6 shorter ones).")] = "default",
    engine_args: EngineArgsFlag = "",
    repeats: Annotated[int, typer.Option(min=1, max=1000, help="Runs of each point; each metric is judged on its best run.")] = 3,
    out: Annotated[Path, typer.Option(help="Report JSON; the measured runs go to <out>.runs/.")] = Path("validation.json"),
    served_model: ServedModelFlag = None,
    api_key: ApiKeyFlag = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON instead of a table.")] = False,
) -> None:
    """Run held-out workloads on the server and in the simulator with the profile; print % error per metric."""
    profile = load_profile(calibration)
    report = run_validation(
        profile, base_url, out.with_name(out.stem + ".runs"), engine_args=engine_args,
        points=points_named(points), repeats=repeats, served_model=served_model,
        api_key=api_key,
        progress=lambda m: None if json_out else _console.print(f"[dim]{m}[/]"),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(checked(ValidationReport, report), indent=2) + "\n", encoding="utf-8")
    if json_out:
        typer.echo(json.dumps(report, indent=2))
        return
    typed = ValidationReport.model_validate(report)
    _console.print(validation_table(typed))
    for warning in typed.warnings:
        _console.print(f"[bold yellow]warning:[/] {warning}")
    verdict = "[green]within[/]" if typed.within_bounds else "[red]outside[/]"
    _console.print(f"{verdict} the bounds (median |error|: output throughput <= 10%, TTFT p50 <= 20%, TPOT p50 <= 10%); report in {out}")
