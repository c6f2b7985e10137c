"""tune's study in the report: what was searched, every simulated trial against the Pareto front, the ranking,
and stage 2's measurements beside their predictions.

Everything comes from tune.json, read as the typed TuneDocument (docs/schemas/tune.json), so a report can be
drawn from a study long after it ran, or while stage 2 is still measuring, and a misspelt field fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

import plotly.graph_objects as go

from servelab.report.figures import LAYOUT, legend_below
from servelab.report.inputs import ReportDocument
from servelab.cells import MISSING, number
from servelab.report.tables import html_table, plan_text
from servelab.schemas.tune import BASELINE, KeyMetrics, ObjectiveInfo, Trial, TuneDocument
from servelab.schemas.vocabulary import RecommendationSource

RANKED_ROWS = 15
"""Ranked trials listed under the plot; the plot shows them all."""

_METRIC_TITLES = {
    "output_throughput": "Output throughput (tokens/s)",
    "request_throughput": "Request throughput (req/s)",
    "p99_ttft_ms": "TTFT p99 (ms)",
    "median_ttft_ms": "TTFT p50 (ms)",
    "p99_tpot_ms": "TPOT p99 (ms)",
    "p99_e2el_ms": "E2E latency p99 (ms)",
}
_COLORS = {
    "met": "#4c78a8",
    "missed": "#e45756",
    "front": "#f58518",
    "baseline": "#222222",
    "recommended": "#2ca02c",
    "measured": "#9467bd",
}


def knobs(params: Mapping[str, int | float | bool | str | None]) -> str:
    """A trial's changes to the current flags, as tune prints them (`default` = vLLM's own value)."""
    return " ".join(f"{k}={'default' if v is None else v}" for k, v in params.items()) or "(current flags)"


def _score_title(objective: ObjectiveInfo) -> str:
    """What a trial's score is, with its unit: 'goodput (req/s)'."""
    return f"{objective.kind} ({objective.unit})"


def _slo_text(objective: ObjectiveInfo) -> str:
    bounds = objective.slo.model_dump(exclude_none=True) if objective.slo else {}
    if not bounds:
        return "none"
    within = ", ".join(f"{metric.upper()} ≤ {number(ms)} ms" for metric, ms in bounds.items())
    return f"{within} at p{number(objective.percentile, 'g')}"


def _recommendation_text(doc: TuneDocument) -> str:
    rec = doc.recommendation
    if rec is None:
        return "none: no configuration in the space can run"
    how = "measured on the real server" if rec.source == RecommendationSource.STAGE2 else "predicted by the simulator"
    gain = rec.gain_over_baseline
    times = "" if gain is None else f", {gain:.2f}× the baseline"
    return (
        f"{rec.engine_args or '(vLLM defaults)'}{rec.placement()}: {number(rec.score)} {doc.objective.unit} "
        f"({how}{times})"
    )


def study_table(doc: TuneDocument) -> str:
    """The study's parameters and its answer, as one two-column table."""
    objective, deployment, search = doc.objective, doc.deployment, doc.search
    space = "; ".join(
        f"{k}: {', '.join('default' if v is None else str(v) for v in vs)}" for k, vs in doc.space.items()
    )
    rows = [
        ("objective", f"{objective.kind} ({objective.unit}, {objective.direction})"),
        ("SLO", _slo_text(objective)),
        (
            "deployment",
            f"{deployment.model} on {deployment.gpu}; current flags: {deployment.engine_args or '(vLLM defaults)'}",
        ),
        (
            "simulator",
            f"calibrated by {deployment.calibration}"
            if deployment.calibration
            else "uncalibrated: the GPU catalogue's rates",
        ),
        ("search space", space or MISSING),
        ("search", f"{search.evaluated} of {search.space_size} configurations simulated ({search.sampler})"),
        ("workload per simulated run", plan_text(doc.workload.stage1)),
        ("recommended", _recommendation_text(doc)),
    ]
    launch = doc.recommendation.launch_line if doc.recommendation else None
    if launch:
        rows.append(("launch line", launch))
    return html_table(None, rows, "params", row_headers=True)


def _slo_verdict(trial: Trial) -> str:
    if not trial.ran:
        return "cannot run"
    return "met" if trial.feasible else "missed"


def ranking_table(doc: TuneDocument) -> str:
    """The baseline, then the best trials in tune's ranking (SLO met by score, then nearest misses)."""
    trials = {t.number: t for t in doc.trials}
    head = (
        "configuration",
        "rank",
        "trial",
        _score_title(doc.objective),
        "SLO",
        "achieved req/s",
        "output tok/s",
        "TTFT p99 (ms)",
        "TPOT p99 (ms)",
    )

    def row(config: str, rank: str, trial_number: str, trial: Trial) -> list[str]:
        m = trial.metrics
        return [
            config,
            rank,
            trial_number,
            number(trial.score),
            _slo_verdict(trial),
            number(m.request_throughput),
            number(m.output_throughput),
            number(m.p99_ttft_ms),
            number(m.p99_tpot_ms),
        ]

    base = doc.baseline
    rows = [row(f"baseline: {base.engine_args or '(vLLM defaults)'}", MISSING, MISSING, base)]
    ranked = doc.ranking
    rows += [row(knobs(trials[n].params), str(i), str(n), trials[n]) for i, n in enumerate(ranked[:RANKED_ROWS], 1)]
    table = html_table(head, rows, "summary", row_headers=True)
    hidden = len(ranked) - RANKED_ROWS
    return table + (
        f'<p class="confirm">… and {hidden} more trials, all in the plot and in tune.json.</p>' if hidden > 0 else ""
    )


def stage2_table(doc: TuneDocument) -> str | None:
    """Measured on the real server vs predicted, per confirmed configuration; None when stage 2 did not run."""
    if doc.stage2 is None or not doc.stage2.results:
        return None
    score = _score_title(doc.objective)
    head = (
        "configuration",
        f"predicted {score}",
        f"measured {score}",
        "predicted TTFT p99 (ms)",
        "measured TTFT p99 (ms)",
        "measured throughput (req/s)",
        "SLO (measured)",
    )
    rows = []
    for r in doc.stage2.results:
        measured = r.measured or KeyMetrics()
        violation = r.measured_violation
        slo = MISSING if violation is None else ("met" if violation <= 0 else "missed")
        rows.append(
            [
                f"{r.label}: {knobs(r.params)}",
                number(r.predicted_score),
                "failed: " + r.error.splitlines()[0] if r.error else number(r.measured_score),
                number(r.predicted.p99_ttft_ms),
                number(measured.p99_ttft_ms),
                number(measured.request_throughput),
                slo,
            ]
        )
    return "<h4>Stage 2: measured on the real server vs. predicted</h4>" + html_table(
        head, rows, "summary", row_headers=True
    )


def _place(metrics: KeyMetrics | None, x: str, y: str) -> tuple[float, float] | None:
    """Where a run sits on the plot's axes (metric names from tune.json's pareto); None without both."""
    if metrics is None:
        return None
    px, py = metrics.statistic(x), metrics.statistic(y)
    return None if px is None or py is None else (px, py)


def _point(trial: Trial, x: str, y: str) -> tuple[float, float] | None:
    return _place(trial.metrics, x, y) if trial.ran else None


def _hover(trial: Trial, name: str, unit: str) -> str:
    return f"{name}: {knobs(trial.params)}<br>score {number(trial.score)} {unit}, SLO {_slo_verdict(trial)}"


def _scatter(trials: Sequence[tuple[Trial, str]], x: str, y: str, unit: str, **style: Any) -> go.Scatter:
    """One trace of (trial, name) pairs placed by their metrics; those without both metrics are left out."""
    placed = [(p, t, name) for t, name in trials if (p := _point(t, x, y)) is not None]
    return go.Scatter(
        x=[p[0] for p, _, _ in placed],
        y=[p[1] for p, _, _ in placed],
        text=[_hover(t, name, unit) for _, t, name in placed],
        hovertemplate="%{text}<br>%{x:,.4g} / %{y:,.4g}<extra></extra>",
        **style,
    )


def pareto_figure(tune: ReportDocument) -> go.Figure:
    """Every runnable trial by throughput and tail latency; the front, the baseline and the recommendation marked."""
    doc = tune.tune
    x, y = doc.pareto.x, doc.pareto.y
    trials = {t.number: t for t in doc.trials}
    fig = go.Figure()
    _add_trials(fig, doc, trials)
    fig.add_trace(
        _scatter(
            [(doc.baseline, "baseline")],
            x,
            y,
            doc.objective.unit,
            mode="markers",
            name="baseline (current flags)",
            marker=dict(color=_COLORS["baseline"], symbol="diamond", size=13),
        )
    )
    _add_recommended(fig, doc, trials)
    _add_measured(fig, doc, x, y)
    height = 520
    fig.update_layout(
        title=f"Simulated trials of {tune.label}: {_METRIC_TITLES.get(y, y)} vs. {_METRIC_TITLES.get(x, x)}",
        height=height,
        **LAYOUT,
    )
    fig.update_layout(legend=legend_below(height))
    fig.update_xaxes(title_text=_METRIC_TITLES.get(x, x), rangemode="tozero")
    fig.update_yaxes(title_text=_METRIC_TITLES.get(y, y), rangemode="tozero")
    return fig


def _add_trials(fig: go.Figure, doc: TuneDocument, trials: dict[int | None, Trial]) -> None:
    """The trials that met the SLO and those that missed it, then the Pareto front joined by a line."""
    x, y, unit = doc.pareto.x, doc.pareto.y, doc.objective.unit
    named = {n: (t, f"trial {n}") for n, t in trials.items()}
    for verdict, symbol in (("met", "circle"), ("missed", "x")):
        chosen = [named[n] for n, t in trials.items() if _slo_verdict(t) == verdict]
        if chosen:
            fig.add_trace(
                _scatter(
                    chosen,
                    x,
                    y,
                    unit,
                    mode="markers",
                    name=f"trial, SLO {verdict} (simulated)",
                    marker=dict(color=_COLORS[verdict], symbol=symbol, size=8, opacity=0.75),
                )
            )
    front = sorted((named[n] for n in doc.pareto.trials if n in named), key=lambda tn: _point(tn[0], x, y) or (0, 0))
    if front:
        fig.add_trace(
            _scatter(
                front,
                x,
                y,
                unit,
                mode="lines+markers",
                name="Pareto front (no other trial is better on both)",
                line=dict(color=_COLORS["front"], width=2),
                marker=dict(color=_COLORS["front"], size=9),
            )
        )


def _add_recommended(fig: go.Figure, doc: TuneDocument, trials: dict[int | None, Trial]) -> None:
    """The recommended trial as a star with an arrow, where it has both coordinates."""
    x, y = doc.pareto.x, doc.pareto.y
    recommended = _recommended_trial(doc, trials)
    where = None if recommended is None else _point(recommended, x, y)
    if recommended is None or where is None:
        return
    fig.add_trace(
        _scatter(
            [(recommended, "recommended")],
            x,
            y,
            doc.objective.unit,
            mode="markers",
            name="recommended",
            marker=dict(color=_COLORS["recommended"], symbol="star", size=20, line=dict(color="#ffffff", width=1)),
        )
    )
    fig.add_annotation(
        x=where[0],
        y=where[1],
        text="recommended",
        showarrow=True,
        arrowhead=2,
        ax=0,
        ay=-36,
        font=dict(color=_COLORS["recommended"], size=12),
    )


def _recommended_trial(doc: TuneDocument, trials: dict[int | None, Trial]) -> Trial | None:
    """The trial the recommendation names ('baseline' or 'trial-N'), as simulated in stage 1."""
    rec = doc.recommendation
    if rec is None:
        return None
    if rec.label == BASELINE:
        return doc.baseline
    suffix = rec.label.removeprefix("trial-")
    return trials.get(int(suffix)) if suffix.isdigit() else None


def _add_measured(fig: go.Figure, doc: TuneDocument, x: str, y: str) -> None:
    """Stage 2: each measured configuration, joined by a dotted line to where the simulator put it."""
    results = [r for r in (doc.stage2.results if doc.stage2 else []) if r.measured]
    pairs = [
        (r, _place(r.predicted, x, y), measured) for r in results if (measured := _place(r.measured, x, y)) is not None
    ]
    if not pairs:
        return
    xs: list[float | None] = []
    ys: list[float | None] = []
    for _, predicted, measured in pairs:
        if predicted is not None:
            xs += [predicted[0], measured[0], None]
            ys += [predicted[1], measured[1], None]
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=ys,
            mode="lines",
            name="predicted → measured",
            hoverinfo="skip",
            line=dict(color=_COLORS["measured"], dash="dot", width=1),
        )
    )
    predicted_only = [(r, p) for r, p, _ in pairs if p is not None]
    fig.add_trace(
        go.Scatter(
            x=[p[0] for _, p in predicted_only],
            y=[p[1] for _, p in predicted_only],
            mode="markers",
            name="stage 2 predicted (its workload)",
            marker=dict(color=_COLORS["measured"], symbol="triangle-up-open", size=11),
            text=[r.label for r, _ in predicted_only],
            hovertemplate="%{text} predicted for the stage-2 workload<br>%{x:,.4g} / %{y:,.4g}<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[m[0] for _, _, m in pairs],
            y=[m[1] for _, _, m in pairs],
            mode="markers+text",
            text=[r.label for r, _, _ in pairs],
            textposition="top center",
            textfont=dict(color=_COLORS["measured"], size=10),
            cliponaxis=False,
            name="measured on the real server (stage 2)",
            marker=dict(color=_COLORS["measured"], symbol="triangle-up", size=12),
            customdata=[knobs(r.params) for r, _, _ in pairs],
            hovertemplate="%{text} measured: %{customdata}<br>%{x:,.4g} / %{y:,.4g}<extra></extra>",
        )
    )


def tune_blocks(tune: ReportDocument) -> list[str | go.Figure]:
    """One study's part of the section: its parameters, the plot, the ranking, stage 2."""
    blocks: list[str | go.Figure] = [
        f"<h3>{escape(tune.label)}</h3>" + study_table(tune.tune),
        pareto_figure(tune),
        "<h4>Ranking (simulated)</h4>" + ranking_table(tune.tune),
    ]
    stage2 = stage2_table(tune.tune)
    if stage2 is not None:
        blocks.append(stage2)
    return blocks
