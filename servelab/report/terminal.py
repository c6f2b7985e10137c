"""What a run shows on the terminal: a live progress bar while it runs, tables when it ends.

The progress bar is a record sink: it sees each record as the target writes
it, so it needs nothing from the target, and it reads the rates off the
records' own clock (the run's, real or simulated).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from servelab.metrics.intervals import interval_suffix
from servelab.metrics.records import RequestRecord
from servelab.cells import MISSING, number
from servelab.schemas.results import Summary, SweepIndex
from servelab.schemas.vocabulary import Limit


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


def _ms(summary: Summary, name: str, percentiles: Sequence[str]) -> list[tuple[str, float | None]]:
    """mean, median (fields: a misspelt name is an AttributeError) and the percentile columns the summary has.

    The p50 column is left out: summary.json keeps it beside median (vLLM's keys have both), but it is the
    median under another name, and one statistic gets one row."""
    keys = [f"mean_{name}_ms", f"median_{name}_ms", *(f"p{p}_{name}_ms" for p in percentiles if float(p) != 50)]
    return [(k, summary.statistic(k)) for k in keys]


def _cell(value: Any) -> str:
    """A table cell: floats to two decimals, None as MISSING (never 0.00, which would read as instant)."""
    return number(value, ".2f") if value is None or isinstance(value, float) else str(value)


def _iv(summary: Summary, key: str) -> str:
    """A simulated statistic's 80% interval after its value (a measured one has none)."""
    return interval_suffix(summary.intervals, key)


def summary_table(summary: Summary, title: str = "Serving benchmark result") -> Table:
    """vLLM bench serve's result block, as a table with the same key names."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in _totals(summary):
        table.add_row(key, str(value))
    _add_latencies(table, summary)
    _add_http_phases(table, summary)
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
        table.add_row("Client send lag p99 (ms)", number(lag, ".2f"))
        table.add_row("Client CPU (share of a core)", f"{stats.cpu_share or 0:.0%}")
    return table


def _totals(summary: Summary) -> list[tuple[str, Any]]:
    """The counts and throughputs of vLLM's block, then goodput, errors by kind and abandoned requests."""
    rows: list[tuple[str, Any]] = [
        ("Successful requests", summary.completed),
        ("Failed requests", summary.failed),
        ("Benchmark duration (s)", f"{summary.duration:.2f}"),
        ("Total input tokens", summary.total_input_tokens),
        ("Total generated tokens", summary.total_output_tokens),
        ("Request throughput (req/s)", f"{summary.request_throughput:.2f}{_iv(summary, 'request_throughput')}"),
        ("Output token throughput (tok/s)", f"{summary.output_throughput:.2f}{_iv(summary, 'output_throughput')}"),
        ("Total token throughput (tok/s)", f"{summary.total_token_throughput:.2f}"),
    ]
    if summary.interval_basis is not None:
        basis = summary.interval_basis
        bound = {Limit.API_SERVER: ", API-server-bound", Limit.ENGINE: ", engine-bound"}
        limit = "" if basis.limit is None else bound[basis.limit]
        rows.append(("80% intervals from", f"{basis.tier} predictions, {basis.regime}{limit} (docs/accuracy.md)"))
    if summary.request_goodput is not None:
        rows.append(("Request goodput (req/s)", f"{summary.request_goodput:.2f}"))
    for kind, count in sorted(summary.errors_by_kind.items()):
        rows.append((f"  errors: {kind}", count))
    if summary.abandoned:
        rows.append(("Abandoned requests (not errors)", summary.abandoned))
        rows.append(("  chunks they had received", summary.abandoned_output_chunks or 0))
    return rows


def _add_latencies(table: Table, summary: Summary) -> None:
    """A section per latency metric: mean, median, std and the percentiles the run asked for."""
    percentiles = sorted(
        {k.split("_")[0][1:] for k in summary.model_extra or {} if k.startswith("p") and k.endswith("_ttft_ms")},
        key=float,
    )
    for name, label in (
        ("ttft", "Time to first token"),
        ("tpot", "Time per output token (excl. 1st)"),
        ("itl", "Inter-token latency"),
        ("e2el", "End-to-end latency"),
    ):
        table.add_section()
        table.add_row(f"[bold]{label}[/]", "")
        for key, value in _ms(summary, name, percentiles):
            table.add_row(f"  {key}", _cell(value) + _iv(summary, key))


def _add_http_phases(table: Table, summary: Summary) -> None:
    """Where a measured request's time went on the wire (bench only: the simulator has no HTTP)."""
    phases = summary.http_phases
    if phases:
        table.add_section()
        table.add_row("[bold]HTTP phases, median / p99 (ms)[/]", f"reused {phases.connection_reused_share:.0%}")
        for phase in ("connect", "send", "wait", "receive"):
            median, p99 = getattr(phases, f"median_{phase}_ms"), getattr(phases, f"p99_{phase}_ms")
            table.add_row(f"  {phase}", f"{_cell(median)} / {_cell(p99)}")


def sweep_table(index: SweepIndex) -> Table:
    """The throughput-latency curve, one row per point."""
    key = index.sweep.key
    table = Table(title=f"Sweep over {key}", title_justify="left")
    columns = [
        (key, key),
        ("req/s", "request_throughput"),
        ("out tok/s", "output_throughput"),
        ("mean TTFT ms", "mean_ttft_ms"),
        ("p99 TTFT ms", "p99_ttft_ms"),
        ("mean TPOT ms", "mean_tpot_ms"),
        ("mean E2EL ms", "mean_e2el_ms"),
        ("failed", "failed"),
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
    rate = lambda value: MISSING if value is None else f"{value:.3g} req/s"  # noqa: E731
    lines = [
        f"Knee (highest offered rate the server kept up with): {rate(auto.knee_rate)}; "
        f"one at a time {rate(auto.synchronous_rate)}, all at once {rate(auto.throughput_rate)}"
    ]
    if auto.slo_attainment is not None:
        lines.append(
            f"Highest rate with >= {auto.slo_attainment:.0%} of requests meeting --goodput: "
            f"{rate(auto.max_goodput_rate)}"
        )
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
