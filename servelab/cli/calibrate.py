"""`servelab calibrate` and `servelab validate`: fit the simulator to a live server, then test it on unseen runs."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from servelab.cli import app
from servelab.flags.checks import real
from servelab.flags.options import (
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
    from servelab.metrics.imports import WorkloadFlags

_console = make_console()


FromFlag = Annotated[
    Optional[list[Path]],
    typer.Option(
        "--from",
        help="A benchmark you already ran (repeat for more): a servelab results directory, a `vllm bench serve "
        "--save-result` JSON, a GuideLLM benchmarks JSON or AIPerf's profile_export_aiperf.json. No server needed.",
    ),
]
OutFlag = Annotated[
    Path, typer.Option("--out", "-o", help="Profile JSON to write (live: raw probe runs go to <out>.probes/).")
]
_WORKLOAD_FLAGS = (
    "random_input_len",
    "random_output_len",
    "num_prompts",
    "request_rate",
    "max_concurrency",
    "dataset_name",
    "dataset_path",
    "random_range_ratio",
    "seed",
)
"""The load flags `calibrate --from` reads: the workload of a result that holds only aggregates."""


def _refuse_other_load_flags(load: LoadFlags, used: tuple[str, ...], mode: str) -> None:
    default = LoadFlags()
    for name in (f.name for f in fields(LoadFlags)):
        if name not in (*used, "overwrite") and getattr(load, name) != getattr(default, name):
            raise InputError(f"--{name.replace('_', '-')} does not apply to calibrate {mode}")


def _workload(load: LoadFlags) -> WorkloadFlags:
    from servelab.metrics.imports import WorkloadFlags

    return WorkloadFlags(
        random_input_len=load.random_input_len,
        random_output_len=load.random_output_len,
        num_prompts=load.num_prompts,
        request_rate=load.request_rate,
        max_concurrency=load.max_concurrency,
        dataset_name=None
        if load.dataset_name == LoadFlags().dataset_name and load.dataset_path is None
        else load.dataset_name,
        dataset_path=load.dataset_path,
        random_range_ratio=load.random_range_ratio,
        seed=load.seed,
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
    budget: Annotated[
        float, typer.Option(callback=real(gt=0), help="Live: seconds of probing (repeated passes until spent).")
    ] = 300.0,
    served_model: ServedModelFlag = None,
    api_key: ApiKeyFlag = None,
    *,
    load: LoadFlags,
) -> None:
    """Fit the simulator to your server: probe it live (--base-url), or fit to benchmarks you already ran (--from)."""
    # The probes, the HTTP client and the fits: imported when a calibration runs, not for --help.
    from servelab.calibrate import calibrate as verb
    from servelab.calibrate.request import CalibrateRequest
    from servelab.report.calibration_tables import show_probe_fit, show_runs_fit

    request = CalibrateRequest(
        gpu,
        model,
        out,
        base_url=base_url,
        sources=tuple(from_results or ()),
        engine_args=engine_args,
        vllm_version=vllm_version,
        budget_s=budget,
        served_model=served_model,
        api_key=api_key,
        workload=_workload(load),
        overwrite=load.overwrite,  # the load flags' --overwrite: here, the profile at --out
    )
    if request.live:
        _refuse_other_load_flags(load, (), "--base-url (its probes are its own workload)")
    else:
        _refuse_other_load_flags(load, _WORKLOAD_FLAGS, "--from")
    profile = verb.run(request, progress=lambda m: _console.print(f"[dim]{m}[/]"))
    if not request.live:
        show_runs_fit(profile, _console)
        _console.print(
            f"profile written to {out}; use it with --calibration {out} (add --model to predict another model)"
        )
        return
    show_probe_fit(profile, _console)
    _console.print(f"profile written to {out}")
    if (why := profile.unreliable) is not None:
        raise verb.CalibrationUnreliable(
            f"{why}. The profile is written but marked unreliable: validate cannot judge a "
            "server's speed against it. Re-run calibrate when the host is quiet."
        )


@app.command()
def validate(
    calibration: RequiredCalibrationFlag,
    base_url: BaseUrlFlag,
    points: Annotated[str, typer.Option(help="Point set: default (7 points) or quick (6 shorter ones).")] = "default",
    engine_args: EngineArgsFlag = "",
    repeats: Annotated[
        int, typer.Option(min=1, max=1000, help="Runs of each point; each metric is judged on its best run.")
    ] = 3,
    out: Annotated[Path, typer.Option(help="Report JSON; the measured runs go to <out>.runs/.")] = Path(
        "validation.json"
    ),
    served_model: ServedModelFlag = None,
    api_key: ApiKeyFlag = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON instead of a table.")] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite", help="Replace an earlier validate's report at --out and its measured runs in <out>.runs/."
        ),
    ] = False,
) -> None:
    """Run held-out workloads on the server and in the simulator with the profile; print % error per metric."""
    from servelab.calibrate import validate as verb  # the runs and the simulator: not for --help
    from servelab.report.calibration_tables import show_validation

    request = verb.ValidateRequest(
        calibration,
        base_url,
        out,
        points=points,
        engine_args=engine_args,
        repeats=repeats,
        served_model=served_model,
        api_key=api_key,
        overwrite=overwrite,
    )
    report = verb.run(request, progress=lambda m: None if json_out else _console.print(f"[dim]{m}[/]"))
    if json_out:
        typer.echo(verb.report_json(report), nl=False)
    else:
        show_validation(report, out, _console)
