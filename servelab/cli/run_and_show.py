"""What `bench` and `simulate` show once their verb returns: the tables, the warnings, the JSON on stdout, the
report, and the exit code, one code path so a measured and a simulated run always read the same.

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
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from rich.console import Console

from servelab.runs.results import Results, SweepResults
from servelab.flags.options import LoadFlags
from servelab.cli.report import report_into
from servelab.errors import RunDisturbed, RunInterrupted, ServerFault
from servelab.metrics.records import ERROR, disturbances, read_records
from servelab.metrics.results import RECORDS, SUMMARY, SWEEP
from servelab.report.terminal import LiveProgress, auto_sweep_lines, print_warnings, summary_table, sweep_table
from servelab.schemas.results import Summary
from servelab.workload.spec import LoadPlan


def progress(out: Console) -> Callable[[str, LoadPlan], AbstractContextManager[LiveProgress]]:
    """The verbs' `observe`: a live progress bar per run, on `out`."""

    @contextmanager
    def observe(label: str, plan: LoadPlan) -> Iterator[LiveProgress]:
        with LiveProgress(out, label, plan.description["amount"]["num_prompts"]) as bar:
            yield bar

    return observe


def say(out: Console) -> Callable[[str], None]:
    """The verbs' `say`: one line on `out`, never wrapped or highlighted."""
    return lambda line: out.print(line, highlight=False, soft_wrap=True)


def show(
    result: Results | SweepResults,
    load: LoadFlags,
    out: Console,
    *,
    report: bool,
    title: str = "Serving benchmark result",
) -> None:
    """Print what a verb returned; after writing everything, raise RunInterrupted, RunDisturbed or ServerFault
    (exit codes 130, 3, 2)."""
    result_dir = result.directory
    if isinstance(result, SweepResults):
        index = result.index
        out.print(sweep_table(index))
        for line in auto_sweep_lines(index):
            out.print(line, highlight=False)
        summaries = [p.summary for p in index.points if p.summary is not None]
        for point_summary in summaries:
            print_warnings(out, point_summary)
        written, interrupted = SWEEP, bool(index.interrupted)
    else:
        assert result.summary is not None, "a run that returned wrote its summary"
        out.print(summary_table(result.summary, title=title))
        print_warnings(out, result.summary)
        written, interrupted, summaries = SUMMARY, bool(result.summary.interrupted), [result.summary]
    if load.json:
        sys.stdout.write((result_dir / written).read_text())
    if report:
        report_into(result_dir, out)
    _raise_for(summaries, interrupted, result_dir)


def _raise_for(summaries: list[Summary], interrupted: bool, result_dir: Path) -> None:
    if interrupted:
        raise RunInterrupted(f"what completed is in {result_dir}")
    disturbed = _disturbed(summaries)
    if disturbed:
        raise RunDisturbed(f"{disturbed}; every request sent has its record in {result_dir}")
    if summaries and all(s.completed == 0 and s.failed > 0 for s in summaries):
        raise ServerFault(
            f"every request failed ({_kinds(summaries)}), so nothing was measured; the server's first "
            f"error: {_first_error(result_dir)} (records in {result_dir})"
        )


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
