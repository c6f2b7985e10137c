"""What a run shows on the terminal: a live progress bar while it runs, tables when it ends.

The progress bar is a record sink: it sees each record as the target writes
it, so it needs nothing from the target, and it reads the rates off the
records' own clock (the run's, real or simulated).

Every console servelab prints through comes from `make_console()`, so output fits
where it goes: into a file or a pipe each print is laid out at its own full
width (nothing wrapped, cropped or elided: a script or a log reads every
digit), and on a terminal too narrow for a table, the table is printed row by
row, one `column: value` line per cell, rather than losing columns or cutting cells.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleDimensions, Group, RenderableType
from rich.measure import Measurement
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.protocol import is_renderable
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:  # annotations only: a console is made before any command imports the schemas
    from servelab.metrics.records import RequestRecord
    from servelab.metrics.schema import Summary, SweepIndex

UNBOUNDED = 100_000
"""The width a file or a pipe has: more than any line servelab prints."""
MIN_WIDTH = 80
"""The width a print into a file or a pipe takes at least (a panel spans it, as on an 80-column terminal)."""


class FittingConsole(Console):
    """A rich Console that never crops, elides or drops what it prints (see the module's docstring)."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return size if self.is_terminal else ConsoleDimensions(UNBOUNDED, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size

    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        if self.is_terminal:
            objects = tuple(fit(self, o) for o in objects)
        elif kwargs.get("width") is None:
            kwargs["width"] = max([MIN_WIDTH, *(natural_width(self, o) for o in objects if is_renderable(o))])
        super().print(*objects, **kwargs)


def make_console(stderr: bool = False) -> Console:
    """The console every command prints through: stdout, or stderr for messages and progress beside --json."""
    return FittingConsole(stderr=stderr)


def natural_width(out: Console, renderable: RenderableType) -> int:
    """The width `renderable` takes when nothing constrains it: its longest line, its table at full width."""
    return Measurement.get(out, out.options.update(width=UNBOUNDED), renderable).maximum


def fit(out: Console, renderable: Any) -> Any:
    """What the terminal prints for `renderable`: itself where it fits; a too-wide table row by row; a panel whose
    title would be cut, with the title on its own line above it."""
    if isinstance(renderable, Table) and natural_width(out, renderable) > out.width:
        return by_row(renderable)
    if isinstance(renderable, Panel) and renderable.title is not None:
        title = Text.from_markup(renderable.title) if isinstance(renderable.title, str) else renderable.title
        if title.cell_len > out.width - 6:  # the corners, the rule each side and a space each side
            untitled = copy.copy(renderable)
            untitled.title = None
            return Group(Text.assemble(title, style="bold"), untitled)
    return renderable


def by_row(table: Table) -> RenderableType:
    """A table too wide for the terminal, as one block per row: each cell on its own line after its column's
    header, wrapped at word boundaries; a table without headers keeps its columns, wrapping its cells instead."""
    if not table.show_header:
        for column in table.columns:
            column.overflow, column.no_wrap = "fold", False
        return table
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", overflow="fold")
    grid.add_column(overflow="fold")
    cells = [list(column.cells) for column in table.columns]
    for row in range(table.row_count):
        if row:
            grid.add_row("", "")
        for column, column_cells in zip(table.columns, cells):
            grid.add_row(Text.assemble(column.header, ":") if isinstance(column.header, (str, Text)) else column.header,
                         column_cells[row])
    title = [Text.from_markup(table.title, style="italic") if isinstance(table.title, str) else table.title] if table.title else []
    return Group(*title, grid)


class LiveProgress:
    """A rich progress bar fed by records: done/total, req/s, output tok/s, errors."""

    def __init__(self, console: Console, label: str, total: int | None) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task(label, total=total, rate="")
        self.done = self.errors = self.tokens = 0
        self.first_send: float | None = None
        self.last_finish = 0.0

    def __enter__(self) -> LiveProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def write(self, record: RequestRecord) -> None:
        self.done += 1
        if record.ok:
            self.tokens += record.output_tokens
        else:
            self.errors += 1
        self.first_send = record.send_time if self.first_send is None else min(self.first_send, record.send_time)
        self.last_finish = max(self.last_finish, record.finish_time)
        span = self.last_finish - self.first_send
        rate = f"{self.done / span:6.2f} req/s {self.tokens / span:8.1f} tok/s" if span > 0 else ""
        errors = f"  [red]{self.errors} errors[/]" if self.errors else "  0 errors"
        self.progress.update(self.task, completed=self.done, rate=rate + errors)


NO_DATA = "—"
"""A metric with nothing to measure (no request completed): a dash, never 0.00, which would read as instant."""


def _ms(summary: Summary, name: str, percentiles: Sequence[str]) -> list[tuple[str, float | None]]:
    """mean, median (fields: a misspelt name is an AttributeError) and the percentile columns the summary has.

    The p50 column is left out: summary.json keeps it beside median (vLLM's keys have both), but it is the
    median under another name, and one statistic gets one row."""
    keys = [f"mean_{name}_ms", f"median_{name}_ms", *(f"p{p}_{name}_ms" for p in percentiles if float(p) != 50)]
    return [(k, summary.statistic(k)) for k in keys]


def _cell(value: Any) -> str:
    """A table cell: floats to two decimals, None as NO_DATA."""
    if value is None:
        return NO_DATA
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def summary_table(summary: Summary, title: str = "Serving benchmark result") -> Table:
    """vLLM bench serve's result block, as a table with the same key names."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows: list[tuple[str, Any]] = [
        ("Successful requests", summary.completed),
        ("Failed requests", summary.failed),
        ("Benchmark duration (s)", f"{summary.duration:.2f}"),
        ("Total input tokens", summary.total_input_tokens),
        ("Total generated tokens", summary.total_output_tokens),
        ("Request throughput (req/s)", f"{summary.request_throughput:.2f}"),
        ("Output token throughput (tok/s)", f"{summary.output_throughput:.2f}"),
        ("Total token throughput (tok/s)", f"{summary.total_token_throughput:.2f}"),
    ]
    if summary.request_goodput is not None:
        rows.append(("Request goodput (req/s)", f"{summary.request_goodput:.2f}"))
    for kind, count in sorted(summary.errors_by_kind.items()):
        rows.append((f"  errors: {kind}", count))
    if summary.abandoned:
        rows.append(("Abandoned requests (not errors)", summary.abandoned))
        rows.append(("  chunks they had received", summary.abandoned_output_chunks or 0))
    for key, value in rows:
        table.add_row(key, str(value))
    percentiles = sorted(
        {k.split("_")[0][1:] for k in summary.model_extra or {} if k.startswith("p") and k.endswith("_ttft_ms")}, key=float
    )
    for name, label in (("ttft", "Time to first token"), ("tpot", "Time per output token (excl. 1st)"),
                        ("itl", "Inter-token latency"), ("e2el", "End-to-end latency")):
        table.add_section()
        table.add_row(f"[bold]{label}[/]", "")
        for key, value in _ms(summary, name, percentiles):
            table.add_row(f"  {key}", _cell(value))
    phases = summary.http_phases
    if phases:
        table.add_section()
        table.add_row("[bold]HTTP phases, median / p99 (ms)[/]", f"reused {phases.connection_reused_share:.0%}")
        for phase in ("connect", "send", "wait", "receive"):
            median, p99 = getattr(phases, f"median_{phase}_ms"), getattr(phases, f"p99_{phase}_ms")
            table.add_row(f"  {phase}", f"{_cell(median)} / {_cell(p99)}")
    replicas = summary.replicas or {}
    if replicas:
        table.add_section()
        table.add_row("[bold]Replicas[/]", "")
    for url, share in replicas.items():
        table.add_row(f"  {url}", f"{share.completed} ok, {share.failed} failed, TTFT {_cell(share.mean_ttft_ms)} ms")
    stats = summary.client_stats
    if stats is not None and "p99_schedule_lag_ms" in stats.model_fields_set:  # a bench client's self-report
        table.add_section()
        lag = stats.p99_schedule_lag_ms
        table.add_row("Client send lag p99 (ms)", "-" if lag is None else f"{lag:.2f}")
        table.add_row("Client CPU (share of a core)", f"{stats.cpu_share or 0:.0%}")
    return table


def sweep_table(index: SweepIndex) -> Table:
    """The throughput-latency curve, one row per point."""
    key = index.sweep.key
    table = Table(title=f"Sweep over {key}", title_justify="left")
    columns = [
        (key, key), ("req/s", "request_throughput"), ("out tok/s", "output_throughput"),
        ("mean TTFT ms", "mean_ttft_ms"), ("p99 TTFT ms", "p99_ttft_ms"), ("mean TPOT ms", "mean_tpot_ms"),
        ("mean E2EL ms", "mean_e2el_ms"), ("failed", "failed"),
    ]
    for header, _ in columns:
        table.add_column(header, justify="right")
    for point in index.points:
        table.add_row(*(_cell(getattr(point, field)) for _, field in columns))
    return table


def auto_sweep_lines(index: SweepIndex) -> list[str]:
    """What `--sweep auto` concluded, one line each: the knee, the peak, the rate meeting --goodput, early stops."""
    auto = index.auto
    if auto is None:
        return []
    rate = lambda value: "—" if value is None else f"{value:.3g} req/s"  # noqa: E731
    lines = [
        f"Knee (highest offered rate the server kept up with): {rate(auto.knee_rate)}; "
        f"one at a time {rate(auto.synchronous_rate)}, all at once {rate(auto.throughput_rate)}"
    ]
    if auto.slo_attainment is not None:
        lines.append(f"Highest rate with >= {auto.slo_attainment:.0%} of requests meeting --goodput: "
                     f"{rate(auto.max_goodput_rate)}")
    for point in index.points:
        if point.over_saturated:
            stop = "stopped early" if point.stopped_early else "ran to its end"
            lines.append(f"{point.directory}: {point.over_saturated} ({stop})")
    if auto.note:
        lines.append(auto.note)
    return lines


def print_warnings(console: Console, summary: Summary) -> None:
    for warning in summary.warnings or []:
        console.print(f"[bold red]WARNING:[/] {warning}", highlight=False)
