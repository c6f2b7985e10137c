"""`servelab report`: one self-contained HTML page of plots from results directories."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from servelab.cli import app
from servelab.report.html import write_report
from servelab.report.inputs import ReportInputError


@app.command()
def report(
    dirs: Annotated[list[Path], typer.Argument(help="Results directories of runs and sweeps, in any mix; several overlay.")],
    out: Annotated[Path, typer.Option("-o", "--out", help="The HTML file to write.")] = Path("report.html"),
    title: Annotated[Optional[str], typer.Option(help="Page title (default: the inputs' names).")] = None,
) -> None:
    """Write an HTML report (plotly, works offline): sweep curves, latency CDFs, request and server timelines."""
    try:
        path = write_report(dirs, out, title)
    except ReportInputError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from None
    Console().print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
