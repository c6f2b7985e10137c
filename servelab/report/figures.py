"""The report's plots, each a plotly Figure built from `ReportInputs` alone.

Styling carries meaning so overlays read without a key: each top-level input
(run or sweep) has its own colour in curves and its own dash pattern in
distributions; within a sweep, colour darkens as load rises, so the same
point of a simulated and a measured sweep share a colour and differ in dash.
The server timeline, whose dashes tell running from waiting, gives each run a colour of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypedDict

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative, sample_colorscale
from plotly.subplots import make_subplots

from servelab.metrics import timeline as tl
from servelab.metrics.records import RequestRecord
from servelab.metrics.server_timings import ttft_split
from servelab.schemas.diagnosis import TtftSplit
from servelab.metrics.slo import tpot_seconds
from servelab.report.inputs import ReportInputs, ReportRun, ReportSweep, planned_warmup

PALETTE = qualitative.Plotly
DASHES = ("solid", "dot", "dash", "dashdot", "longdash", "longdashdot")
PHASE_COLORS = {"queued": "#bab0ac", "prefill": "#f58518", "decode": "#4c78a8", "failed": "#e45756"}
SPLIT_PARTS: tuple[tuple[str, str, str], ...] = (
    ("api_server", "API server & network", "#72b7b2"),
    ("queue", "queued in the engine", PHASE_COLORS["queued"]),
    ("prefill", "prefill", PHASE_COLORS["prefill"]),
)
"""The parts of a mean TTFT as the server's own histograms split it (metrics.server_timings), in time order."""
CEILING_LINES: tuple[tuple[str, str, str], ...] = (
    ("decode_bandwidth_tps_at_max_batch", "output_throughput", "decode ceiling"),
    ("prefill_compute_rps", "request_throughput", "prefill-compute ceiling"),
    ("saturation_rps", "request_throughput", "all limits at once (simulated)"),
    ("slo_max_rps", "request_throughput", "highest rate meeting the SLO"),
)
"""Which diagnosis ceilings are drawn on which sweep throughput panel, and their labels."""

SWEEP_AXES = {"max-concurrency": "Max concurrency (requests in flight)", "request-rate": "Offered request rate (req/s)"}
"""Axis titles, with units, of the swept parameters; any other parameter is shown by its name."""

REQUEST_SAMPLE = 60
"""Bars in the per-request timeline: enough to see the pattern, few enough to read each one."""


class Margin(TypedDict):
    l: int  # noqa: E741  (plotly's own key)
    r: int
    t: int
    b: int


class LegendPlacement(TypedDict):
    orientation: str
    yanchor: str
    y: float
    xanchor: str
    x: float


class HoverLabel(TypedDict):
    namelength: int


class Layout(TypedDict):
    """The layout every figure shares, as keyword arguments of plotly's `update_layout`."""

    template: str
    margin: Margin
    legend: LegendPlacement
    hoverlabel: HoverLabel


LAYOUT = Layout(
    template="plotly_white",
    margin=Margin(l=70, r=30, t=60, b=60),
    legend=LegendPlacement(orientation="h", yanchor="top", y=-0.18, xanchor="left", x=0),
    hoverlabel=HoverLabel(namelength=-1),
)


def legend_below(height: int) -> LegendPlacement:
    """Legend placement a fixed distance under the x-axis title, whatever the figure's height."""
    plot_area = height - LAYOUT["margin"]["t"] - LAYOUT["margin"]["b"]
    placed = LAYOUT["legend"].copy()
    placed["y"] = -75 / plot_area
    return placed


def series_color(series: int) -> str:
    return PALETTE[series % len(PALETTE)]


def run_color(run: ReportRun, inputs: ReportInputs) -> str:
    """A standalone run's series colour; a sweep point's shade by its position in the sweep."""
    sweep = next((s for s in inputs.sweeps if s.series == run.series), None)
    if sweep is None or len(sweep.points) == 1:
        return series_color(run.series)
    position = next(i for i, p in enumerate(sweep.points) if p is run) / (len(sweep.points) - 1)
    return sample_colorscale("Viridis", [0.8 - 0.75 * position])[0]


def run_dash(run: ReportRun) -> str:
    return DASHES[run.series % len(DASHES)]


def _summary_value(run: ReportRun, key: str) -> float | None:
    value = run.summary.statistic(key)
    return float(value) if isinstance(value, (int, float)) else None


# --- sweeps -------------------------------------------------------------------------------------

LatencyPanel = tuple[str, str, str]
"""(title, metric key in the statistic keys, y-axis title): one panel of a latency-vs-throughput figure."""
TTFT_TPOT: tuple[LatencyPanel, ...] = (
    ("TTFT", "ttft", "Time to first token (ms)"),
    ("TPOT", "tpot", "Time per output token (ms)"),
)
E2E: LatencyPanel = ("E2E", "e2el", "End-to-end latency (ms)")
SWEEP_STATISTICS = (("median", "p50"), ("p99", "p99"))
"""The statistics a latency-vs-throughput figure draws, (name in the statistic keys, legend name): solid, then
dotted."""


@dataclass
class LatencyCurve:
    """One series of a latency-vs-throughput figure: a sweep's points, or one engine's load points in a comparison."""

    label: str
    color: str
    throughput: Sequence[float | None]
    """Output tokens/s at each point: the x of every line."""
    points: Sequence[str]
    """Each point's name ("max-concurrency=4"), shown on hover."""
    latency: Callable[[str], Sequence[float | None]]
    """A statistic's key ("p99_ttft_ms") -> its value at each point, in ms."""
    marks: Sequence[str] | None = None
    """Text beside each solid-line marker (a sweep's value); None for none."""


def latency_curves_figure(
    curves: Sequence[LatencyCurve],
    statistics: Sequence[tuple[str, str]],
    title: str,
    panels: Sequence[LatencyPanel] = TTFT_TPOT,
) -> go.Figure:
    """Latency against achieved throughput, one panel per metric side by side (TTFT and TPOT unless `panels` says
    otherwise): where the knee is, and what it costs to go past it. Each curve keeps its colour; the first statistic
    is solid, the second dotted."""
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[f"{name} vs. throughput" for name, _, _ in panels])
    for curve in curves:
        for col, (name, key, _) in enumerate(panels, start=1):
            for (stat, label), dash in zip(statistics, ("solid", "dot")):
                text = list(curve.marks) if curve.marks is not None and dash == "solid" else None
                fig.add_trace(
                    go.Scatter(
                        x=list(curve.throughput),
                        y=list(curve.latency(f"{stat}_{key}_ms")),
                        mode="lines+markers+text" if text else "lines+markers",
                        text=text,
                        textposition="top left",
                        textfont=dict(size=10, color=curve.color),
                        customdata=list(curve.points),
                        name=f"{curve.label} — {label}",
                        legendgroup=f"{curve.label} — {label}",
                        showlegend=col == 1,
                        line=dict(color=curve.color, dash=dash),
                        marker=dict(symbol="circle" if dash == "solid" else "diamond-open", size=7),
                        hovertemplate=f"%{{customdata}}<br>%{{x:.1f}} tok/s<br>{name} {label} %{{y:.1f}} "
                        f"ms<extra>{curve.label}</extra>",
                    ),
                    row=1,
                    col=col,
                )
    for col, (_, _, axis) in enumerate(panels, start=1):
        fig.update_xaxes(title_text="Output throughput (tokens/s)", rangemode="tozero", row=1, col=col)
        fig.update_yaxes(title_text=axis, rangemode="tozero", row=1, col=col)
    fig.update_layout(title=title, height=480, **LAYOUT)
    return fig


def _sweep_statistic(sweep: ReportSweep, key: str) -> list[float | None]:
    return [_summary_value(p, key) for p in sweep.points]


def sweep_curves_figure(sweeps: Sequence[ReportSweep]) -> go.Figure:
    """Each sweep's latency against its achieved throughput, p50 and p99, labelled with the swept values."""
    curves = [
        LatencyCurve(
            label=sweep.label,
            color=series_color(sweep.series),
            throughput=[_summary_value(p, "output_throughput") for p in sweep.points],
            points=[f"{sweep.parameter}={p.sweep_value}" for p in sweep.points],
            latency=partial(_sweep_statistic, sweep),
            marks=[str(p.sweep_value) for p in sweep.points],
        )
        for sweep in sweeps
    ]
    return latency_curves_figure(curves, SWEEP_STATISTICS, "Latency vs. throughput (labels: swept value)")


def sweep_throughput_figure(sweeps: Sequence[ReportSweep]) -> go.Figure:
    """Throughput against the swept parameter: where adding load stops adding work done."""
    parameter = sweeps[0].parameter
    panels = (
        ("output_throughput", "Output throughput (tokens/s)", "tok/s", ".1f"),
        ("request_throughput", "Request throughput (requests/s)", "req/s", ".2f"),
    )
    fig = make_subplots(rows=1, cols=2, subplot_titles=[title for _, title, _, _ in panels])
    for sweep in sweeps:
        color = series_color(sweep.series)
        for col, (key, _, unit, fmt) in enumerate(panels, start=1):
            fig.add_trace(
                go.Scatter(
                    x=[p.sweep_value for p in sweep.points],
                    y=[_summary_value(p, key) for p in sweep.points],
                    mode="lines+markers",
                    name=sweep.label,
                    legendgroup=sweep.label,
                    showlegend=col == 1,
                    line=dict(color=color),
                    hovertemplate=f"{parameter}=%{{x}}<br>%{{y:{fmt}}} {unit}<extra>{sweep.label}</extra>",
                ),
                row=1,
                col=col,
            )
    for sweep in sweeps:
        _draw_ceilings(fig, sweep, [key for key, _, _, _ in panels])
    # request-rate sweeps may end at "inf" (all at once), which only a category axis can place.
    numeric = all(isinstance(p.sweep_value, (int, float)) for sweep in sweeps for p in sweep.points)
    for col, (_, title, _, _) in enumerate(panels, start=1):
        fig.update_xaxes(
            title_text=SWEEP_AXES.get(parameter, parameter), type=None if numeric else "category", row=1, col=col
        )
        fig.update_yaxes(title_text=title, rangemode="tozero", row=1, col=col)
    fig.update_layout(title=f"Throughput vs. {parameter}", height=420, **LAYOUT)
    return fig


def _draw_ceilings(fig: go.Figure, sweep: ReportSweep, panel_keys: Sequence[str]) -> None:
    """diagnose's ceilings as dashed lines in the sweep's colour on the panel of their unit."""
    if sweep.diagnosis is None:
        return
    for key, panel, label in CEILING_LINES:
        value = getattr(sweep.diagnosis.ceilings, key)
        if isinstance(value, (int, float)) and value > 0:
            fig.add_hline(
                y=value,
                line=dict(color=series_color(sweep.series), dash="dash", width=1),
                annotation_text=f"{label} ({sweep.label})",
                annotation_position="top left",
                annotation_font=dict(size=10, color=series_color(sweep.series)),
                row=1,
                col=panel_keys.index(panel) + 1,
            )


# --- latency distributions ----------------------------------------------------------------------

_CDF_METRICS: tuple[tuple[str, str, Callable[[RequestRecord], float | None]], ...] = (
    ("TTFT", "Time to first token (ms)", lambda r: r.ttft),
    ("TPOT", "Time per output token (ms)", tpot_seconds),
    ("E2E latency", "End-to-end latency (ms)", lambda r: r.e2el),
)


def _counted_ok(run: ReportRun) -> list[RequestRecord]:
    """The requests the run's statistics count: completed, sent after the warm-up."""
    warmup = run.summary.warmup if run.summary.warmup is not None else planned_warmup(run.info)
    return [r for r in run.result.records if r.ok and r.send_time >= warmup]


def has_latencies(run: ReportRun) -> bool:
    return bool(_counted_ok(run))


def latency_cdf_figure(inputs: ReportInputs, runs: Sequence[ReportRun]) -> go.Figure:
    """Whole distributions, not two percentiles: tails and bimodality show at a glance."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=[name for name, _, _ in _CDF_METRICS])
    for run in runs:
        records = _counted_ok(run)
        color, dash = run_color(run, inputs), run_dash(run)
        for col, (name, axis, metric) in enumerate(_CDF_METRICS, start=1):
            values = np.sort([v for v in map(metric, records) if v is not None]) * 1e3
            if values.size == 0:
                continue
            fractions = np.arange(1, values.size + 1) / values.size
            fig.add_trace(
                go.Scatter(
                    x=values,
                    y=fractions,
                    mode="lines",
                    line=dict(color=color, dash=dash, shape="hv"),
                    name=run.label,
                    legendgroup=run.label,
                    showlegend=col == 1,
                    hovertemplate=f"{name} %{{x:.1f}} ms<br>%{{y:.1%}} of requests at or "
                    f"below<extra>{run.label}</extra>",
                ),
                row=1,
                col=col,
            )
            fig.update_xaxes(title_text=axis, rangemode="tozero", row=1, col=col)
    fig.update_yaxes(title_text="Fraction of requests", range=[0, 1.02], tickformat=".0%", row=1, col=1)
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%")
    fig.update_layout(title="Latency distributions (CDF, successful requests)", height=460, **LAYOUT)
    return fig


# --- per-request timeline -----------------------------------------------------------------------


def sample_requests(records: Sequence[RequestRecord], count: int = REQUEST_SAMPLE) -> list[RequestRecord]:
    """Evenly spaced in send order, so the sample spans the whole run, warm-up to drain."""
    ordered = sorted(records, key=lambda r: r.send_time)
    if len(ordered) <= count:
        return ordered
    picks = np.linspace(0, len(ordered) - 1, count).round().astype(int)
    return [ordered[i] for i in picks]


def request_phases(record: RequestRecord) -> list[tuple[str, float, float]]:
    """(phase, start, end) spans, seconds: queued (if the schedule time is known), prefill, decode.

    A failed request is one 'failed' span: its phase boundaries are not trustworthy.
    """
    if not record.ok:
        return [("failed", record.send_time, record.finish_time)]
    spans = []
    prefill_start = record.send_time
    if record.schedule_time is not None and record.schedule_time > record.send_time:
        spans.append(("queued", record.send_time, record.schedule_time))
        prefill_start = record.schedule_time
    first = record.first_token_time if record.first_token_time is not None else record.finish_time
    spans.append(("prefill", prefill_start, first))
    if record.finish_time > first:
        spans.append(("decode", first, record.finish_time))
    return spans


def _run_selector(labels: Sequence[str], traces_per_run: Sequence[int], with_all: bool) -> list[go.layout.Updatemenu]:
    """A dropdown that shows one run's traces at a time (or all of them), for figures that cannot overlay.

    It sits at the top right, above the plot area, clear of the title and the subplot titles.
    """
    total = sum(traces_per_run)
    Button = go.layout.updatemenu.Button
    buttons = []
    if with_all:
        buttons.append(Button(label="All runs", method="restyle", args=[{"visible": [True] * total}]))
    offset = 0
    for label, n in zip(labels, traces_per_run):
        visible = [offset <= i < offset + n for i in range(total)]
        buttons.append(Button(label=label, method="restyle", args=[{"visible": visible}]))
        offset += n
    return [
        go.layout.Updatemenu(
            buttons=buttons,
            direction="down",
            x=1,
            xanchor="right",
            y=1,
            yanchor="bottom",
            pad=dict(b=8),
            showactive=True,
        )
    ]


def request_timeline_figure(runs: Sequence[ReportRun]) -> go.Figure:
    """Where each request's time went; a dropdown picks the run when there are several.

    Rows are positions in the sample (1 = sent first), not request ids, so that
    every run's sample fills the same rows and hover names the request.
    """
    fig = go.Figure()
    traces_per_run = []
    shown = 0
    for position, run in enumerate(runs):
        sample = sample_requests(run.result.records)
        shown = max(shown, len(sample))
        spans: dict[str, list[tuple[int, float, float, RequestRecord]]] = {p: [] for p in PHASE_COLORS}
        for row, record in enumerate(sample, start=1):
            for phase, start, end in request_phases(record):
                spans[phase].append((row, start, end, record))
        added = 0
        for phase, rows in spans.items():
            if not rows:
                continue
            fig.add_trace(
                go.Bar(
                    orientation="h",
                    y=[row[0] for row in rows],
                    base=[row[1] for row in rows],
                    x=[row[2] - row[1] for row in rows],
                    width=0.8,
                    marker=dict(color=PHASE_COLORS[phase], line=dict(width=0)),
                    name=phase,
                    legendgroup=phase,
                    visible=position == 0,
                    customdata=[
                        [row[3].index, row[3].prompt_tokens, row[3].output_tokens, row[3].error_kind or ""]
                        for row in rows
                    ],
                    hovertemplate=(
                        f"request #%{{customdata[0]}}: {phase} from %{{base:.3f}} s for %{{x:.3f}} s<br>"
                        "%{customdata[1]} prompt / %{customdata[2]} output tokens %{customdata[3]}"
                        f"<extra>{run.label}</extra>"
                    ),
                )
            )
            added += 1
        traces_per_run.append(added)
    height = max(420, 170 + 12 * shown)
    fig.update_layout(
        title="Per-request timeline (sample of requests in send order)", barmode="overlay", height=height, **LAYOUT
    )
    fig.update_layout(legend=legend_below(height))
    fig.update_xaxes(title_text="Time since start of run (s)", rangemode="tozero")
    fig.update_yaxes(title_text="Request (in send order)", autorange="reversed", zeroline=False)
    if len(runs) > 1:
        fig.update_layout(
            updatemenus=_run_selector([r.label for r in runs], traces_per_run, with_all=False), margin=dict(t=110)
        )
    return fig


# --- server timeline ----------------------------------------------------------------------------


def prefix_hit_rate_series(samples: Sequence[tl.TimelineSample]) -> tuple[list[float], list[float]]:
    """Hit rate over each scrape interval (hits/queries of that interval), skipping idle intervals."""
    points = [
        (s.t, s.values[tl.PREFIX_HITS], s.values[tl.PREFIX_QUERIES])
        for s in samples
        if tl.PREFIX_HITS in s.values and tl.PREFIX_QUERIES in s.values
    ]
    times, rates = [], []
    for (_, h0, q0), (t1, h1, q1) in zip(points, points[1:]):
        if q1 > q0:
            times.append(t1)
            rates.append(100.0 * (h1 - h0) / (q1 - q0))
    return times, rates


def _gauge_series(
    samples: Sequence[tl.TimelineSample], name: str, scale: float = 1.0
) -> tuple[list[float], list[float]]:
    seen = [(s.t, s.values[name] * scale) for s in samples if name in s.values]
    return [t for t, _ in seen], [v for _, v in seen]


def _counter_since_start(samples: Sequence[tl.TimelineSample], name: str) -> tuple[list[float], list[float]]:
    seen = [(s.t, s.values[name]) for s in samples if name in s.values]
    return [t for t, _ in seen], [v - seen[0][1] for _, v in seen]


_ServerLine = tuple[str, str, Callable[[Sequence[tl.TimelineSample]], tuple[list[float], list[float]]]]
_SERVER_PANELS: tuple[tuple[str, str, tuple[_ServerLine, ...]], ...] = (
    (
        "Requests in the engine (solid: running, dotted: waiting)",
        "requests",
        (
            ("running", "solid", lambda s: _gauge_series(s, tl.RUNNING)),
            ("waiting", "dot", lambda s: _gauge_series(s, tl.WAITING)),
        ),
    ),
    ("KV-cache usage", "% of KV cache", (("KV usage", "solid", lambda s: _gauge_series(s, tl.KV_USAGE, 100.0)),)),
    (
        "Preemptions since the start of the run",
        "preemptions",
        (("preemptions", "solid", lambda s: _counter_since_start(s, tl.PREEMPTIONS)),),
    ),
    (
        "Prefix-cache hit rate per scrape interval",
        "% of prompt tokens",
        (("prefix hit rate", "solid", prefix_hit_rate_series),),
    ),
)


def server_timeline_figure(runs: Sequence[ReportRun]) -> go.Figure:
    """The engine's state against time, one panel per metric the runs actually have.

    One legend entry per run (clicking it hides all of that run's lines); the
    panel titles say which line is which. Dashes tell running from waiting
    here, so each run gets a colour of its own rather than its sweep shade
    (a measured and a simulated point must not look alike).
    """
    panels = [p for p in _SERVER_PANELS if any(fn(r.result.timeline)[0] for r in runs for _, _, fn in p[2])]
    fig = make_subplots(
        rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=[p[0] for p in panels]
    )
    traces_per_run = []
    for position, run in enumerate(runs):
        color = PALETTE[position % len(PALETTE)]
        added = 0
        for row, (_, _, lines) in enumerate(panels, start=1):
            for name, dash, fn in lines:
                t, v = fn(run.result.timeline)
                if not t:
                    continue
                fig.add_trace(
                    go.Scatter(
                        x=t,
                        y=v,
                        mode="lines",
                        line=dict(color=color, dash=dash, shape="hv" if name != "prefix hit rate" else "linear"),
                        name=run.label,
                        legendgroup=run.label,
                        showlegend=added == 0,
                        hovertemplate=f"%{{x:.1f}} s: %{{y:.3g}} {name}<extra>{run.label}</extra>",
                    ),
                    row=row,
                    col=1,
                )
                added += 1
        traces_per_run.append(added)
    for row, (_, axis, _) in enumerate(panels, start=1):
        fig.update_yaxes(title_text=axis, rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text="Time since start of run (s)", showticklabels=True, row=len(panels), col=1)
    height = 200 + 210 * len(panels)
    fig.update_layout(title="Server timeline (scraped from /metrics, or simulated)", height=height, **LAYOUT)
    fig.update_layout(legend=legend_below(height))
    if len(runs) > 1:
        fig.update_layout(
            updatemenus=_run_selector([r.label for r in runs], traces_per_run, with_all=True), margin=dict(t=110)
        )
    return fig


def has_server_timeline(run: ReportRun) -> bool:
    return any(fn(run.result.timeline)[0] for _, _, lines in _SERVER_PANELS for _, _, fn in lines)


def run_ttft_split(run: ReportRun) -> TtftSplit | None:
    """The run's mean TTFT split by the server's own timings; None without a first token or the server's histograms."""
    return ttft_split(run.result.records, run.result.timeline)


def ttft_split_figure(splits: Sequence[tuple[ReportRun, TtftSplit]]) -> go.Figure:
    """One stacked bar per run: where its mean TTFT went, in time order.

    Runs of a sweep come in their sweep order, so the bars show which part
    grows with the load (a queue that grows is a server past its capacity; an
    API-server part that grows is its frontend).
    """
    labels = [run.label for run, _ in splits]
    fig = go.Figure()
    for key, name, color in SPLIT_PARTS:
        values = [1e3 * split.parts[key] for _, split in splits]
        fig.add_trace(
            go.Bar(
                y=labels,
                x=values,
                orientation="h",
                name=name,
                marker_color=color,
                hovertemplate=f"%{{x:.1f}} ms {name}<extra>%{{y}}</extra>",
            )
        )
    height = 220 + 32 * len(splits)
    fig.update_layout(
        title="Mean TTFT split by the server's own timings",
        barmode="stack",
        height=height,
        xaxis_title="Mean time to first token (ms)",
        yaxis=dict(autorange="reversed"),
        **LAYOUT,
    )
    fig.update_layout(legend=legend_below(height))
    return fig
