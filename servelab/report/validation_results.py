"""validate's report in the report: per held-out point and metric, measured beside simulated, with the % error.

Reads the JSON `servelab validate --out` writes. Bars put the two numbers
side by side, which reads faster than a table when one point is far off;
the table under them has the exact numbers, the median |error| and the bounds.
"""

from __future__ import annotations

import datetime as dt
import math
from html import escape
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from servelab.schemas.validation import PointResult, ValidationReport
from servelab.report.figures import LAYOUT, legend_below
from servelab.report.inputs import ReportValidation
from servelab.cells import MISSING, number, percent
from servelab.report.tables import html_table

METRIC_TITLES = {
    "output_throughput": "Output throughput (tokens/s)",
    "median_ttft_ms": "TTFT p50 (ms)",
    "p99_ttft_ms": "TTFT p99 (ms)",
    "median_tpot_ms": "TPOT p50 (ms)",
    "median_e2el_ms": "E2E latency p50 (ms)",
}
"""validate's metric names -> titles with units; a metric not listed here is shown by its name."""
MEASURED_COLOR, SIMULATED_COLOR = "#4c78a8", "#f58518"
COLUMNS = 3


def metrics_of(doc: ValidationReport) -> list[str]:
    """The compared metrics, in the order validate reports them."""
    return list(doc.points[0].measured)


def _title(metric: str) -> str:
    return METRIC_TITLES.get(metric, metric)


def setup_table(doc: ValidationReport) -> str:
    """What was validated against what: the server, the profile, the flags, the verdict."""
    server, profile = doc.server, doc.profile
    created = profile.created_at
    when = dt.datetime.fromtimestamp(created, dt.UTC).strftime("%Y-%m-%d %H:%M UTC") if created else "?"
    repeats = max((len(p.repeats) for p in doc.points), default=0)
    rows = [
        ("server", f"{server.model or '?'} at {server.base_url or '?'}"),
        ("calibration profile", f"{profile.gpu or '?'}, fitted {when}, flags {profile.engine_args or MISSING}"),
        ("engine args validated", doc.engine_args or "as calibrated"),
        ("points", f"{len(doc.points)} held-out workloads, {repeats} repeat(s) each; each metric from its best repeat"),
        ("verdict", "within the bounds" if doc.within_bounds else "outside the bounds"),
    ]
    return html_table(None, rows, "params", row_headers=True)


def error_table(doc: ValidationReport) -> str:
    """Point by metric: measured / simulated (signed error), then the median |error| against its bound."""
    metrics = metrics_of(doc)

    def cell(point: PointResult, k: str) -> str:
        measured, simulated = number(point.measured.get(k), ",.1f"), number(point.simulated.get(k), ",.1f")
        return f"{measured} / {simulated} ({percent(point.error_pct.get(k))})"

    rows = [[p.point, *(cell(p, k) for k in metrics)] for p in doc.points]
    medians, bounds = doc.median_abs_error_pct, doc.bounds_pct
    rows.append(
        [
            "median |error|",
            *(
                (MISSING if (m := medians.get(k)) is None else f"{m:.1f}%")
                + (f" (bound {bounds[k]:g}%)" if k in bounds else "")
                for k in metrics
            ),
        ]
    )
    head = ("point: measured / simulated (error)", *(_title(k) for k in metrics))
    return html_table(head, rows, "summary", row_headers=True)


def overlay_figure(validation: ReportValidation) -> go.Figure:
    """One panel per metric: each held-out point's measured and simulated value side by side, error on top."""
    doc = validation.report
    metrics = metrics_of(doc)
    rows = math.ceil(len(metrics) / COLUMNS)
    fig = make_subplots(
        rows=rows,
        cols=COLUMNS,
        subplot_titles=[_title(k) for k in metrics],
        vertical_spacing=0.22,
        horizontal_spacing=0.07,
    )
    names = [p.point for p in doc.points]
    for i, metric in enumerate(metrics):
        row, col = i // COLUMNS + 1, i % COLUMNS + 1
        for side, color in (("measured", MEASURED_COLOR), ("simulated", SIMULATED_COLOR)):
            values = [(p.measured if side == "measured" else p.simulated).get(metric) for p in doc.points]
            errors = [percent(p.error_pct.get(metric)) for p in doc.points]
            fig.add_trace(
                go.Bar(
                    x=names,
                    y=values,
                    name=side,
                    legendgroup=side,
                    showlegend=i == 0,
                    marker_color=color,
                    text=errors if side == "simulated" else None,
                    textposition="outside",
                    cliponaxis=False,
                    textfont=dict(size=10),
                    customdata=errors,
                    hovertemplate=f"%{{x}}: {side} %{{y:,.1f}} (simulated error "
                    f"%{{customdata}})<extra>{_title(metric)}</extra>",
                ),
                row=row,
                col=col,
            )
        fig.update_yaxes(title_text=_title(metric), rangemode="tozero", row=row, col=col)
        fig.update_xaxes(title_text="held-out point", tickangle=-30, row=row, col=col)
    height = 120 + 330 * rows
    fig.update_layout(
        title=f"{validation.label}: measured vs. simulated per held-out point (label: simulated error)",
        barmode="group",
        height=height,
        **LAYOUT,
    )
    fig.update_layout(legend=legend_below(height), margin=dict(b=110))
    return fig


def validation_blocks(validation: ReportValidation) -> list[str | go.Figure]:
    """One validate report's part of the section: its setup, the bars, the numbers."""
    return [
        f"<h3>{escape(validation.label)}</h3>" + setup_table(validation.report),
        overlay_figure(validation),
        error_table(validation.report),
    ]
