"""The part `bench` and `simulate` share after their target is built: run the point or the sweep, show it, exit.

The two verbs differ only in what serves the requests (a real server or the
simulator); from the plan on, the run, the tables, the warnings, the JSON on
stdout, the report and the exit code on interruption are one code path, so a
measured and a simulated run always read the same.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from servelab.cli.options import EXIT_INTERRUPTED, LoadFlags
from servelab.cli.report import report_into
from servelab.experiment.runner import run_point
from servelab.experiment.sweep import run_sweep
from servelab.metrics.results import SUMMARY, SWEEP
from servelab.metrics.slo import SLO
from servelab.report.terminal import (
    LiveProgress,
    print_warnings,
    summary_table,
    sweep_table,
)
from servelab.targets.base import Target
from servelab.workload.spec import LoadPlan


def run_and_show(
    target: Target,
    load: LoadFlags,
    first_plan: LoadPlan,
    result_dir: Path,
    run_info: dict[str, Any],
    out: Console,
    *,
    report: bool,
    title: str = "Serving benchmark result",
) -> None:
    """Run and print; raises typer.Exit(EXIT_INTERRUPTED) after writing what completed if the run was interrupted."""
    slo: SLO | None = load.slo()
    percentiles, sweep = load.percentiles(), load.parsed_sweep()

    @contextmanager
    def observe(label: str, plan: LoadPlan) -> Iterator[LiveProgress]:
        with LiveProgress(out, label, plan.description["amount"]["num_prompts"]) as progress:
            yield progress

    if sweep is None:
        with observe(run_info["verb"], first_plan) as progress:
            summary = run_point(target, first_plan, result_dir, run_info, slo, percentiles, [progress])
        out.print(summary_table(summary, title=title))
        print_warnings(out, summary)
        written, interrupted = SUMMARY, summary["interrupted"]
    else:
        index = run_sweep(target, sweep, load.arrival(), load.make_plan, result_dir, run_info, slo, percentiles, observe)
        out.print(sweep_table(index))
        for point in index["points"]:
            print_warnings(out, point["summary"])
        written, interrupted = SWEEP, index["interrupted"]
    if load.json:
        sys.stdout.write((result_dir / written).read_text())
    if report:
        report_into(result_dir, out)
    if interrupted:
        out.print(f"[bold red]interrupted[/]: what completed is in {result_dir}")
        raise typer.Exit(EXIT_INTERRUPTED)
