"""The report's per-replica view of a fleet: what each replica served, how fast, and what its prefix cache hit.

A run spread over several replicas (bench's several --base-url or --replica-metrics-url, simulate --replicas N)
records which replica served each request (the records' base_url, summarised in summary.json's `replicas`) and,
where each replica's /metrics was read (a real fleet's scrapes, a simulated fleet's own), each replica's load over
the run (run.json's `server_info.replicas`). A router that sends too much to one replica shows as one bar taller
than the rest in requests served and waiting; one that scatters conversations shows as low prefix-cache hit rates
on every replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from pydantic import ValidationError

from servelab.cells import MISSING, number
from servelab.report.figures import LAYOUT, legend_below, series_color
from servelab.report.inputs import ReportInputs, ReportRun
from servelab.schemas.fleet import ReplicaLoad
from servelab.schemas.results import ReplicaShare


@dataclass(frozen=True)
class ReplicaRow:
    """One replica of one run: its share from the records, and its load from its /metrics where read."""

    name: str
    share: ReplicaShare | None
    load: ReplicaLoad | None

    @property
    def completed(self) -> int | None:
        return self.share.completed if self.share else self.load.requests_served if self.load else None


def _loads(run: ReportRun) -> dict[str, ReplicaLoad]:
    """run.json's `server_info.replicas` by replica name; a load this servelab cannot read is left out (its cells
    show as missing, as any value that is not a number does)."""
    server = run.info.server_info
    loads = {}
    for raw in (server.replicas if server is not None else None) or []:
        try:
            load = ReplicaLoad.model_validate(raw)
        except ValidationError:
            continue
        loads[load.name] = load
    return loads


def replica_rows(run: ReportRun) -> list[ReplicaRow]:
    """The run's replicas, by name (a URL without its /metrics, or a simulated replica-i); none for one server."""
    shares = run.summary.replicas or {}
    loads = _loads(run)
    names = sorted(loads or shares)  # behind a router, the records name the router and the loads its replicas
    if len(names) < 2:
        return []
    return [ReplicaRow(name, shares.get(name), loads.get(name)) for name in names]


def _percent(value: float | None) -> str:
    return MISSING if value is None else f"{100 * value:.0f}%"


def replicas_table(run: ReportRun, rows: Sequence[ReplicaRow]) -> str:
    """One row per replica: requests, latency, and the load its /metrics showed."""
    head = (
        "<th>replica</th><th>completed</th><th>failed</th><th>mean TTFT (ms)</th><th>mean E2E (ms)</th>"
        "<th>prefix-cache hits</th><th>waiting, mean / peak</th><th>KV cache used, mean</th>"
    )
    body = "".join(
        f'<tr><th scope="row">{escape(r.name)}</th>'
        f"<td>{number(r.completed, ',.0f')}</td>"
        f"<td>{number(r.share.failed if r.share else None, ',.0f')}</td>"
        f"<td>{number(r.share.mean_ttft_ms if r.share else None, ',.1f')}</td>"
        f"<td>{number(r.share.mean_e2el_ms if r.share else None, ',.0f')}</td>"
        f"<td>{_percent(r.load.prefix_cache_hit_rate if r.load else None)}</td>"
        f"<td>{number(r.load.mean_waiting if r.load else None, '.1f')} / "
        f"{number(r.load.max_waiting if r.load else None, '.0f')}</td>"
        f"<td>{_percent(r.load.mean_kv_usage if r.load else None)}</td></tr>"
        for r in rows
    )
    return (
        f"<h3>{escape(run.label)}</h3>"
        f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    )


def replicas_figure(fleets: Sequence[tuple[ReportRun, list[ReplicaRow]]]) -> go.Figure:
    """Requests completed, mean TTFT and prefix-cache hit rate per replica, one colour per run."""
    panels = ("requests completed", "mean TTFT (ms)", "prefix-cache hit rate")
    fig = make_subplots(rows=1, cols=3, subplot_titles=panels)
    for run, rows in fleets:
        names = [r.name for r in rows]
        values = (
            [r.completed for r in rows],
            [r.share.mean_ttft_ms if r.share else None for r in rows],
            [r.load.prefix_cache_hit_rate if r.load else None for r in rows],
        )
        for col, ys in enumerate(values, 1):
            fig.add_trace(
                go.Bar(
                    x=names,
                    y=ys,
                    name=run.label,
                    legendgroup=run.label,
                    showlegend=col == 1,
                    marker_color=series_color(run.series),
                ),
                row=1,
                col=col,
            )
    fig.update_yaxes(tickformat=".0%", range=[0, 1], row=1, col=3)
    fig.update_layout(**LAYOUT)
    fig.update_layout(barmode="group", title="Replicas", height=420, legend=legend_below(420))
    return fig


def fleets_of(inputs: ReportInputs) -> list[tuple[ReportRun, list[ReplicaRow]]]:
    """Every run of the report that was spread over several replicas, with its replicas."""
    return [(run, rows) for run in inputs.all_runs if (rows := replica_rows(run))]
