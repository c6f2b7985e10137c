"""The part bench and simulate share once their target is built: one point, a `--sweep` or `--sweep auto` into a
results directory, read back. The two verbs differ only in what serves the requests (a real server or the
simulator); from the plan on they are one code path, so a measured and a simulated run always read the same.

`say` receives the lines a person watching wants (what runs where, warnings); `observe` gives a live observer (a
progress bar) for each run. Both default to nothing, as the Python API wants.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from servelab.flags.options import LoadFlags
from servelab.experiment.auto_sweep import AutoSweep, run_auto_sweep
from servelab.experiment.runner import run_point
from servelab.experiment.sweep import run_sweep
from servelab.metrics.records import RecordSink
from servelab.pool import TaskPool
from servelab.runs.results import Results, SweepResults, load_results
from servelab.schemas.results import RunInfo, SweepIndex
from servelab.targets.base import Target
from servelab.workload.spec import LoadPlan

Say = Callable[[str], None]
Observe = Callable[[str, LoadPlan], AbstractContextManager[RecordSink | None]]
"""A run's live observer from its label and plan (experiment.sweep.Observe)."""


def silent(line: str) -> None:
    """The default `say`: the Python API prints nothing."""


@contextmanager
def unobserved(label: str, plan: LoadPlan) -> Iterator[RecordSink | None]:
    yield None


def run_load(
    target: Target,
    load: LoadFlags,
    first_plan: LoadPlan,
    result_dir: Path,
    run_info: RunInfo,
    observe: Observe = unobserved,
    pool: TaskPool | None = None,
) -> Results | SweepResults:
    """One point, a sweep or an auto sweep, as --sweep says; an interrupted run returns what it wrote."""
    slo, percentiles, sweep = load.slo(), load.percentiles(), load.parsed_sweep()
    if sweep is None:
        with observe(run_info.verb or "", first_plan) as observer:
            run_point(
                target, first_plan, result_dir, run_info, slo, percentiles, [observer] if observer is not None else []
            )
        return load_results(result_dir)
    args = (load.arrival(), load.make_plan, result_dir, run_info, slo, percentiles, observe)
    raw = (
        run_auto_sweep(target, sweep, *args)
        if isinstance(sweep, AutoSweep)
        else run_sweep(target, sweep, *args, pool=pool)
    )
    return SweepResults(result_dir, SweepIndex.model_validate(raw))
