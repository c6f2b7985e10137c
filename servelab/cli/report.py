"""`servelab report`: one self-contained HTML page of plots from results directories.

Also the `--report` flag of bench, simulate, diagnose and tune, which writes
the very page `servelab report RESULTS` would, into RESULTS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from servelab.cli import app
from servelab.report.console import make_console

REPORT_HTML = "report.html"
ReportFlag = Annotated[
    bool, typer.Option("--report", help=f"Also write {REPORT_HTML} (plots, opens offline) into the results directory.")
]


def _write(dirs: list[Path], out: Path, title: str | None, console: Console) -> Path:
    from servelab.report.html import write_report  # plotly, imported by the verbs that write a page

    path = write_report(dirs, out, title)
    console.print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)", highlight=False)
    return path


def report_into(results: Path, console: Console) -> Path:
    """`--report`: the report of one results directory (run, sweep or tune study), written inside it."""
    return _write([results], results / REPORT_HTML, None, console)


def report_beside(document: Path, console: Console) -> Path:
    """`--report` of a verb that writes one JSON file (compare --out X.json): its report as X.html, next to it, so
    two comparisons in one directory keep a page each."""
    return _write([document], document.with_suffix(".html"), None, console)


def _html_file(value: Path) -> Path:
    """-o names a file: an existing directory is refused before any input is read."""
    if value.is_dir():
        raise typer.BadParameter(f"{value} is a directory: name the HTML file to write, e.g. {value / REPORT_HTML}")
    return value


@app.command()
def report(
    dirs: Annotated[
        list[Path],
        typer.Argument(
            help="Results directories of runs, sweeps and tune studies, validate's JSON reports "
            "and compare's JSON (or a directory holding compare.json), in any mix; several overlay."
        ),
    ],
    out: Annotated[Path, typer.Option("-o", "--out", callback=_html_file, help="The HTML file to write.")] = Path(
        REPORT_HTML
    ),
    title: Annotated[Optional[str], typer.Option(help="Page title (default: the inputs' names).")] = None,
) -> None:
    """Write an HTML report (plotly, works offline): sweep curves, latency CDFs, request and server timelines,
    diagnose's findings, tune's trials and Pareto front, validate's simulated vs. measured, compare's engines
    overlaid."""
    from servelab.report.inputs import ReportInputError  # reads results with pydantic and yaml: not for --help

    try:
        _write(dirs, out, title, make_console())
    except (
        ReportInputError
    ) as exc:  # name the argument: `report ''` is the current directory, which the user never typed
        raise typer.BadParameter(str(exc), param_hint="DIRS") from exc
