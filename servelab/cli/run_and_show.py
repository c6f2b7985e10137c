"""The part `bench` and `simulate` share after their target is built: run the point or the sweep, show it, exit.

The two verbs differ only in what serves the requests (a real server or the
simulator); from the plan on, the run, the tables, the warnings, the JSON on
stdout, the report and the exit codes are one code path, so a measured and a
simulated run always read the same.

Exit codes: 0 for a run that measured what it set out to; 130 when it was
interrupted (Ctrl-C, SIGTERM); 2 when every request failed without a process
going away (the server refused them all, e.g. HTTP 400 for prompts longer than
its --max-model-len): nothing was measured, and the server's first error
message is printed; 3 when it ran to its end but was disturbed:
some requests failed because a process went away (the server refused or
dropped connections, a client worker died), or a client actor of a
`--clients N` run died, so its numbers do not describe the server under that
load. Either way every file is written.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from servelab.cli.options import LoadFlags
from servelab.cli.report import report_into
from servelab.errors import RunDisturbed, RunInterrupted, ServerFault
from servelab.experiment.runner import run_point
from servelab.experiment.auto_sweep import AutoSweep, run_auto_sweep
from servelab.experiment.sweep import run_sweep
from servelab.metrics.records import ERROR, disturbances, read_records
from servelab.metrics.results import RECORDS, SUMMARY, SWEEP
from servelab.schemas.results import Summary, SweepIndex
from servelab.metrics.slo import SLO
from servelab.pool import TaskPool
from servelab.report.terminal import (
    LiveProgress,
    auto_sweep_lines,
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
    pool: TaskPool | None = None,
) -> None:
    """Run and print; after writing everything, raises RunInterrupted or RunDisturbed (exit codes 130 and 3)."""
    slo: SLO | None = load.slo()
    percentiles, sweep = load.percentiles(), load.parsed_sweep()

    @contextmanager
    def observe(label: str, plan: LoadPlan) -> Iterator[LiveProgress]:
        with LiveProgress(out, label, plan.description["amount"]["num_prompts"]) as progress:
            yield progress

    if sweep is None:
        with observe(run_info["verb"], first_plan) as progress:
            summary = run_point(target, first_plan, result_dir, run_info, slo, percentiles, [progress])
        typed = Summary.model_validate(summary)
        out.print(summary_table(typed, title=title))
        print_warnings(out, typed)
        written, interrupted, summaries = SUMMARY, bool(typed.interrupted), [typed]
    else:
        args = (load.arrival(), load.make_plan, result_dir, run_info, slo, percentiles, observe)
        raw = (run_auto_sweep(target, sweep, *args) if isinstance(sweep, AutoSweep)
               else run_sweep(target, sweep, *args, pool=pool))
        index = SweepIndex.model_validate(raw)
        out.print(sweep_table(index))
        for line in auto_sweep_lines(index):
            out.print(line, highlight=False)
        summaries = [p.summary for p in index.points if p.summary is not None]
        for point_summary in summaries:
            print_warnings(out, point_summary)
        written, interrupted = SWEEP, bool(index.interrupted)
    if load.json:
        sys.stdout.write((result_dir / written).read_text())
    if report:
        report_into(result_dir, out)
    if interrupted:
        raise RunInterrupted(f"what completed is in {result_dir}")
    disturbed = _disturbed(summaries)
    if disturbed:
        raise RunDisturbed(f"{disturbed}; every request sent has its record in {result_dir}")
    if summaries and all(s.completed == 0 and s.failed > 0 for s in summaries):
        raise ServerFault(f"every request failed ({_kinds(summaries)}), so nothing was measured; the server's first "
                          f"error: {_first_error(result_dir)} (records in {result_dir})")


FIRST_ERROR_CHARS = 300
"""How much of the server's first error message a failed run prints (its JSON body can be long)."""


def _kinds(summaries: list[Summary]) -> str:
    counts: dict[str, int] = {}
    for summary in summaries:
        for kind, n in summary.errors_by_kind.items():
            counts[kind] = counts.get(kind, 0) + n
    return ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()))


def _first_error(result_dir: Path) -> str:
    """The first failed record's error text, on one line (a sweep's points each have a records file)."""
    for path in sorted(result_dir.rglob(RECORDS)):
        for record in read_records(path):
            if record.status == ERROR:
                text = " ".join((record.error or record.error_kind or "no message").split())
                return text[:FIRST_ERROR_CHARS] + ("..." if len(text) > FIRST_ERROR_CHARS else "")
    return "none recorded"


def _disturbed(summaries: list[Summary]) -> str:
    """What disturbed the run(s), in words ('' when nothing did): failures by kind, why release stopped, and the
    clients of a `--clients N` run that died (a death disturbs the run even if it left no failed request: with a
    --duration plan the driver cannot know what a dead client would still have sent)."""
    counts: dict[str, int] = {}
    notes = []
    dead = []
    for summary in summaries:
        for kind, n in disturbances(summary.errors_by_kind).items():
            counts[kind] = counts.get(kind, 0) + n
        stats = summary.client_stats
        if stats is None:
            continue
        if stats.server_gone:
            notes.append(f"the server went away ({stats.server_gone})")
        dead += [f"client {c.client} ({c.host}) died: {c.died}" for c in stats.clients or [] if c.died]
    if not counts and not dead:
        return ""
    failed = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
    return "; ".join([*([f"requests failed because a process went away: {failed}"] if counts else []), *dead, *notes])
