"""`servelab calibrate` and `servelab validate`: fit the simulator to a live server, then test it on unseen runs."""

from __future__ import annotations

import json
import shutil
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

from servelab.cli import app
from servelab.cli.checks import real
from servelab.cli.options import (
    ApiKeyFlag,
    BaseUrlFlag,
    EngineArgsFlag,
    LoadFlags,
    OptionalBaseUrlFlag,
    RequiredCalibrationFlag,
    RequiredGpuFlag,
    RequiredModelFlag,
    ServedModelFlag,
    VllmVersionFlag,
    load_options,
)
from servelab.errors import InputError
from servelab.report.console import make_console

if TYPE_CHECKING:
    from servelab.schemas.validation import ValidationReport
    from servelab.metrics.imports import WorkloadFlags
    from servelab.perf.calibration import CalibrationProfile, RunFit

_console = make_console()


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
    from servelab.calibrate.validate import METRICS

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


FromFlag = Annotated[Optional[list[Path]], typer.Option(
    "--from", help="A benchmark you already ran (repeat for more): a servelab results directory, a `vllm bench serve "
                   "--save-result` JSON, a GuideLLM benchmarks JSON or AIPerf's profile_export_aiperf.json. No server needed.")]
OutFlag = Annotated[Path, typer.Option("--out", "-o", help="Profile JSON to write (live: raw probe runs go to <out>.probes/).")]
_WORKLOAD_FLAGS = ("random_input_len", "random_output_len", "num_prompts", "request_rate", "max_concurrency",
                   "dataset_name", "dataset_path", "random_range_ratio", "seed")
"""The load flags `calibrate --from` reads: the workload of a result that holds only aggregates."""


def _refuse_other_load_flags(load: LoadFlags, used: tuple[str, ...], mode: str) -> None:
    default = LoadFlags()
    for name in (f.name for f in fields(LoadFlags)):
        if name not in (*used, "overwrite") and getattr(load, name) != getattr(default, name):
            raise InputError(f"--{name.replace('_', '-')} does not apply to calibrate {mode}")


def _workload(load: LoadFlags) -> WorkloadFlags:
    from servelab.metrics.imports import WorkloadFlags

    return WorkloadFlags(
        random_input_len=load.random_input_len, random_output_len=load.random_output_len, num_prompts=load.num_prompts,
        request_rate=load.request_rate, max_concurrency=load.max_concurrency,
        dataset_name=None if load.dataset_name == LoadFlags().dataset_name and load.dataset_path is None else load.dataset_name,
        dataset_path=load.dataset_path, random_range_ratio=load.random_range_ratio, seed=load.seed,
    )


@app.command()
@load_options
def calibrate(
    gpu: RequiredGpuFlag,
    model: RequiredModelFlag,
    base_url: OptionalBaseUrlFlag = None,
    from_results: FromFlag = None,
    out: OutFlag = Path("profile.json"),
    engine_args: EngineArgsFlag = "",
    vllm_version: VllmVersionFlag = None,
    budget: Annotated[float, typer.Option(callback=real(gt=0), help="Live: seconds of probing (repeated passes until spent).")] = 300.0,
    served_model: ServedModelFlag = None,
    api_key: ApiKeyFlag = None,
    *,
    load: LoadFlags,
) -> None:
    """Fit the simulator to your server: probe it live (--base-url), or fit to benchmarks you already ran (--from)."""
    # The probes, the HTTP client and the fits: imported when a calibration runs, not for --help.
    from servelab.calibrate.calibrate import CalibrationUnreliable, calibrate as run_calibration
    from servelab.calibrate.calibrate_from import CalibrateFromRequest, calibrate_from

    if (base_url is None) == (not from_results):
        raise InputError("give --base-url (probe a live server) or --from RESULT (benchmarks you already ran), one of them")
    if out.exists() and not load.overwrite:  # the load flags' --overwrite: here, the profile at --out
        raise InputError(f"{out} exists: give --overwrite to replace it, or another --out")
    if from_results:
        _refuse_other_load_flags(load, _WORKLOAD_FLAGS, "--from")
        request = CalibrateFromRequest(tuple(from_results), gpu, model, out, engine_args=engine_args,
                                       vllm_version=vllm_version, workload=_workload(load), overwrite=load.overwrite)
        show_runs_fit(calibrate_from(request, progress=lambda m: _console.print(f"[dim]{m}[/]")))
        _console.print(f"profile written to {out}; use it with --calibration {out} (add --model to predict another model)")
        return
    assert base_url is not None
    _refuse_other_load_flags(load, (), "--base-url (its probes are its own workload)")
    if vllm_version is not None:
        raise InputError("--vllm-version describes the runs of calibrate --from; a live server is probed as it is")
    profile = run_calibration(
        base_url, gpu, model, out, engine_args=engine_args, budget_s=budget, served_model=served_model,
        api_key=api_key, progress=lambda m: _console.print(f"[dim]{m}[/]"),
    )
    show_probe_fit(profile)
    _console.print(f"profile written to {out}")
    if (why := profile.unreliable) is not None:
        raise CalibrationUnreliable(f"{why}. The profile is written but marked unreliable: validate cannot judge a "
                                    "server's speed against it. Re-run calibrate when the host is quiet.")


def show_probe_fit(profile: CalibrationProfile) -> None:
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
        table.add_row(key, _num(m.measured), f"{_num(m.fitted)} ({_pct(m.fitted_error_pct)})",
                      f"{_num(m.specs_only)} ({_pct(m.specs_only_error_pct)})")
    return table


def show_runs_fit(profile: CalibrationProfile) -> None:
    env = profile.environment
    assert env is not None
    for run in env.runs:
        _console.print(f"{run.source} ({run.format}, {run.requests} requests, lengths from {run.lengths_from}):",
                       highlight=False, soft_wrap=True)
        _console.print(runs_table(run))
        for note in run.notes:
            _console.print(f"  note: {note}", highlight=False)
    for name, (words, fmt) in _PARAMETER_WORDS.items():
        value, spec = getattr(env, name), env.specs_only[name]
        scale = 1e3 if name == "outside_engine_s" else 1.0
        line = f"{words}: {fmt.format(value * scale)} (specs-only {fmt.format(spec * scale)})"
        if name in env.unconstrained:
            line += (f": kept, the runs cannot constrain it (its test step moves no figure by more than "
                     f"{100 * env.sensitivity[name]:.1f}%)")
        _console.print(line, highlight=False)
    _console.print(f"fit: mean squared log error {env.objective:.4f} after {env.evaluations} simulations of every run")


def replace_earlier_validation(out: Path, runs: Path, overwrite: bool) -> None:
    """An earlier validation's report and measured runs are data: refused unless --overwrite, which removes them."""
    earlier = [str(p) for p in (out, runs) if p.exists()]
    if earlier and not overwrite:
        raise InputError(f"--out {out}: {' and '.join(earlier)} already hold an earlier validation; pass --overwrite "
                         "to replace them, or choose another --out")
    if overwrite and runs.is_dir():
        shutil.rmtree(runs)


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
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an earlier validate's report at --out and its "
                                            "measured runs in <out>.runs/.")] = False,
) -> None:
    """Run held-out workloads on the server and in the simulator with the profile; print % error per metric."""
    from servelab.schemas.validation import ValidationReport  # the runs and the simulator: not for --help
    from servelab.calibrate.validate import points_named, validate as run_validation
    from servelab.schemas.results import checked
    from servelab.perf.calibration import load_profile

    profile = load_profile(calibration)
    runs = out.with_name(out.stem + ".runs")
    replace_earlier_validation(out, runs, overwrite)
    report = run_validation(
        profile, base_url, runs, engine_args=engine_args,
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
