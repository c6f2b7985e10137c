"""compare's result in the report: each engine's latency–throughput curve overlaid, goodput, memory plan and why.

Reads the typed EngineComparison `servelab compare --out` writes. The curves
overlay on the axes the sweep curves use (output tokens/s across, TTFT and
TPOT up), one colour per engine, so where one engine's knee comes later shows
as its curve staying low further right. The tables under them hold the exact
numbers, the terminal's columns, and the sentences compare wrote on the gap.
"""

from __future__ import annotations

from functools import partial
from html import escape

import plotly.graph_objects as go

from servelab.schemas.compare import EngineComparison, EnginePoint, EngineResult
from servelab.metrics.intervals import interval_suffix
from servelab.report.figures import E2E, LAYOUT, PALETTE, TTFT_TPOT, LatencyCurve, latency_curves_figure, legend_below
from servelab.report.inputs import ReportComparison
from servelab.cells import number
from servelab.report.tables import html_table

STATISTICS = (("mean", "mean"), ("p99", "p99"))
"""compare records mean and p99 latencies (EnginePoint): solid mean, dotted p99."""
POINT_COLUMNS = (
    "engine",
    "point",
    "req/s",
    "output tok/s",
    "mean TTFT ms",
    "p99 TTFT ms",
    "mean TPOT ms",
    "goodput req/s",
    "preempt",
)
"""Per engine and load point, as `servelab compare` prints them and the report tabulates them."""
MEMORY_COLUMNS = (
    "engine",
    "launch flags",
    "KV cache GiB",
    "KV tokens",
    "block size",
    "max running",
    "token budget",
    "requests that fit",
)


def engine_color(position: int) -> str:
    """An engine's colour by its place in the comparison, the same in every figure of the section."""
    return PALETTE[position % len(PALETTE)]


def point_rows(c: EngineComparison) -> list[list[str]]:
    """One row per engine and load point: throughput, latency, goodput under the SLO, preemptions/retractions."""
    return [
        [
            r.label,
            p.label,
            number(p.request_throughput, ".2f") + interval_suffix(p.intervals, "request_throughput"),
            number(p.output_throughput, ",.0f"),
            number(p.mean_ttft_ms, ",.1f") + interval_suffix(p.intervals, "mean_ttft_ms"),
            number(p.p99_ttft_ms, ",.1f"),
            number(p.mean_tpot_ms, ",.1f") + interval_suffix(p.intervals, "mean_tpot_ms"),
            number(p.request_goodput, ".2f"),
            str(p.preemptions),
        ]
        for r in c.engines
        for p in r.points
    ]


def memory_rows(c: EngineComparison) -> list[list[str]]:
    """Each engine's memory plan: how much KV it keeps, how it pages it, and how many of these requests fit at once."""
    seq = c.mean_prompt_tokens + c.mean_output_tokens
    return [
        [
            r.label,
            r.launch_flags or "defaults",
            f"{r.memory.kv_cache_gib:.1f}",
            f"{r.memory.kv_token_capacity:,}",
            str(r.memory.block_size),
            f"{r.memory.max_running:,}",
            f"{r.memory.token_budget:,}",
            f"{r.memory.sequences_fit:,} of {seq:,.0f} tokens",
        ]
        for r in c.engines
    ]


def _statistic(engine: EngineResult, key: str) -> list[float | None]:
    values: list[float | None] = [getattr(p, key) for p in engine.points]
    return values


def curves_figure(item: ReportComparison) -> go.Figure:
    """Every engine's TTFT, TPOT and E2E against its output throughput, one point per load point, overlaid."""
    c = item.comparison
    curves = [
        LatencyCurve(
            label=r.label,
            color=engine_color(i),
            throughput=[p.output_throughput for p in r.points],
            points=[p.label for p in r.points],
            latency=partial(_statistic, r),
        )
        for i, r in enumerate(c.engines)
    ]
    # E2E is null in comparisons written before EnginePoint had it: its panel then stays empty, not wrong
    return latency_curves_figure(
        curves, STATISTICS, f"{item.label}: latency vs. throughput per engine (simulated)", panels=(*TTFT_TPOT, E2E)
    )


def _slo_text(c: EngineComparison) -> str:
    names = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2el_ms": "E2E"}
    return ", ".join(f"{names.get(k, k)} ≤ {v:,.0f} ms" for k, v in (c.slo or {}).items())


def _goodput_hover(point: EnginePoint) -> str:
    return f"{number(point.request_throughput, '.2f')} req/s completed, {point.preemptions} preempted"


def goodput_figure(item: ReportComparison) -> go.Figure | None:
    """Per load point, each engine's requests/s that met every SLO bound, side by side; None without an SLO."""
    c = item.comparison
    if not c.slo:
        return None
    fig = go.Figure()
    for i, r in enumerate(c.engines):
        fig.add_trace(
            go.Bar(
                x=[p.label for p in r.points],
                y=[p.request_goodput for p in r.points],
                name=r.label,
                marker_color=engine_color(i),
                customdata=[_goodput_hover(p) for p in r.points],
                hovertemplate="%{x}: goodput %{y:.2f} req/s<br>%{customdata}<extra>" + r.label + "</extra>",
            )
        )
    height = 420
    fig.update_layout(
        title=f"{item.label}: goodput under the SLO ({_slo_text(c)})",
        barmode="group",
        height=height,
        xaxis_title="load point",
        yaxis_title="Goodput (requests/s meeting the SLO)",
        **LAYOUT,
    )
    fig.update_layout(legend=legend_below(height))
    return fig


def compare_blocks(item: ReportComparison) -> list[str | go.Figure]:
    """One comparison's part of the section: the curves, goodput, the numbers, the memory plans, the explanation."""
    c = item.comparison
    by = {r.engine: r.label for r in c.engines}
    head = (
        f'<h3>{escape(item.label)}</h3><p class="lead">{escape(c.model)} on {escape(c.gpu)}, '
        f"{c.mean_prompt_tokens:,.0f} prompt + "
        f"{c.mean_output_tokens:,.0f} output tokens per request; by peak output throughput: "
        f"{escape(' > '.join(by[e] for e in c.ranking if e in by))}; SLO: {escape(_slo_text(c) or 'none given')}.</p>"
    )
    blocks: list[str | go.Figure] = [head, curves_figure(item)]
    goodput = goodput_figure(item)
    if goodput is not None:
        blocks.append(goodput)
    blocks.append(
        "<h4>Per engine and load point</h4>" + html_table(POINT_COLUMNS, point_rows(c), "summary", row_headers=True)
    )
    blocks.append("<h4>Memory plan</h4>" + html_table(MEMORY_COLUMNS, memory_rows(c), "summary", row_headers=True))
    warnings = [f"warning, {r.label}: {w}" for r in c.engines for w in r.warnings]
    blocks.append(
        '<h4>Why they differ</h4><ul class="notes">'
        + "".join(f"<li>{escape(line)}</li>" for line in [*c.explanations, *warnings])
        + "</ul>"
    )
    return blocks
