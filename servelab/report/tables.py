"""The report's HTML tables and one-line descriptions: what was run (parameters) and what came out (statistics)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from html import escape
from pydantic import JsonValue

from servelab.metrics.intervals import interval_suffix
from servelab.cells import number
from servelab.schemas.results import AmountInfo, ArrivalInfo, DatasetInfo, LengthInfo, PlanInfo, RunFlags, RunInfo
from servelab.report.inputs import (
    Document,
    ReportComparison,
    ReportDocument,
    ReportInputs,
    ReportRun,
    ReportSweep,
    ReportValidation,
)

HIDDEN_PARAMETERS = frozenset({"schema_version"})
MAX_CELL = 120
"""Characters of one parameter value; longer values (lists of prompts...) are cut with an ellipsis."""

SUMMARY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("completed", "Completed", ".0f"),
    ("failed", "Failed", ".0f"),
    ("duration", "Duration (s)", ".1f"),
    ("request_throughput", "Requests/s", ".2f"),
    ("request_goodput", "Goodput (req/s)", ".2f"),
    ("output_throughput", "Output tok/s", ".1f"),
    ("median_ttft_ms", "TTFT p50 (ms)", ".1f"),
    ("p99_ttft_ms", "TTFT p99 (ms)", ".1f"),
    ("median_tpot_ms", "TPOT p50 (ms)", ".2f"),
    ("p99_tpot_ms", "TPOT p99 (ms)", ".2f"),
    ("median_e2el_ms", "E2E p50 (ms)", ".0f"),
    ("p99_e2el_ms", "E2E p99 (ms)", ".0f"),
)


def flatten(data: Mapping[str, JsonValue], prefix: str = "") -> dict[str, JsonValue]:
    """Nested run.json objects as dotted keys, so runs compare row by row."""
    out: dict[str, JsonValue] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if name in HIDDEN_PARAMETERS:
            continue
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def format_parameter(key: str, value: JsonValue) -> str:
    if key == "started_at" and isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(value, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _parameters_of(item: ReportRun | ReportSweep) -> dict[str, str]:
    if isinstance(item, ReportRun):
        params = flatten(item.info.model_dump(mode="json", exclude_unset=True))
        params["directory"] = str(item.directory)
    else:
        # A sweep's points differ only in the swept value, so the first point speaks for all of them.
        params = flatten(item.points[0].info.model_dump(mode="json", exclude_unset=True))
        params.pop("started_at", None)
        params["directory"] = str(item.directory)
        params["sweep.parameter"] = item.parameter
        params["sweep.values"] = [p.sweep_value for p in item.points]
        if item.index.interrupted:
            params["sweep.interrupted"] = True
    return {key: format_parameter(key, value) for key, value in params.items()}


def parameters_table(inputs: ReportInputs) -> str:
    """One column per input; rows whose values differ between inputs are highlighted.

    Folded: a run.json has a hundred settings, and the page header already
    names the ones that tell runs apart, so the table is there to look up, not to scroll past.
    """
    items = inputs.tops
    columns = [_parameters_of(item) for item in items]
    keys = sorted({key for column in columns for key in column}, key=lambda k: (k != "source", k != "directory", k))
    head = "".join(f"<th>{escape(item.label)}</th>" for item in items)
    rows = []
    differing = 0
    for key in keys:
        cells = [column.get(key, "") for column in columns]
        row_class = ' class="differs"' if len(columns) > 1 and len(set(cells)) > 1 else ""
        differing += bool(row_class)
        rows.append(
            f'<tr{row_class}><th scope="row">{escape(key)}</th>'
            + "".join(f"<td>{escape(cell)}</td>" for cell in cells)
            + "</tr>"
        )
    table = (
        f'<table class="params"><thead><tr><th>parameter</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )
    differ = f", {differing} differ between inputs (highlighted)" if len(columns) > 1 else ""
    return f"<details><summary>All {len(keys)} settings from run.json{differ}</summary>{table}</details>"


def html_table(head: Sequence[str] | None, rows: Sequence[Sequence[str]], css: str, row_headers: bool = False) -> str:
    """A plain table of text cells (all escaped); with `row_headers`, each row's first cell is its header.

    No `head` gives a key-value table without a header row.
    """
    header = "" if head is None else "<thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr></thead>"

    def row(cells: Sequence[str]) -> str:
        first, rest = (cells[0], cells[1:]) if row_headers else (None, cells)
        lead = "" if first is None else f'<th scope="row">{escape(first)}</th>'
        return "<tr>" + lead + "".join(f"<td>{escape(cell)}</td>" for cell in rest) + "</tr>"

    return f'<table class="{css}">{header}<tbody>{"".join(map(row, rows))}</tbody></table>'


def plan_text(plan: PlanInfo | None, with_arrival: bool = True) -> str:
    """One line from a load plan's description (run.json's `workload`): what was sent, how, how many."""
    if plan is None or not (plan.workload or plan.arrival or plan.amount):
        return "workload not recorded"
    workload, arrival, amount = (
        plan.workload or DatasetInfo(),
        plan.arrival or ArrivalInfo(),
        plan.amount or AmountInfo(),
    )
    input_len, output_len = workload.input_len or LengthInfo(), workload.output_len or LengthInfo()
    parts = [
        f"{workload.dataset_name or '?'} prompts of {number(input_len.mean, missing='?')} → "
        f"{number(output_len.mean, missing='?')} tokens"
    ]
    if with_arrival:
        parts.append(arrival.process or "")
        if arrival.max_concurrency:
            parts.append(f"max concurrency {arrival.max_concurrency}")
        if arrival.request_rate not in (None, "inf", float("inf")):
            parts.append(f"{arrival.request_rate} req/s")
    if amount.num_prompts:
        parts.append(f"{amount.num_prompts} requests")
    return ", ".join(p for p in parts if p)


def _served_text(info: RunInfo) -> str:
    """The simulated deployment, or the measured server and model."""
    deployment, flags = info.deployment, info.flags or RunFlags()
    if deployment:
        flags_text = f" with {deployment.engine_args}" if deployment.engine_args else ""
        return f"{deployment.model} on {deployment.gpu}{flags_text}"
    model = flags.model or (info.server_info.model if info.server_info else None) or info.model or "?"
    base_url = flags.base_url or info.base_url
    engine_args = f" with {info.engine_args}" if info.engine_args else ""
    return (f"{model} at {base_url}" if base_url else str(model)) + engine_args


def headline(item: ReportRun | ReportSweep | Document) -> str:
    """One line per input for the page header: what served which load, and where the files are."""
    if isinstance(item, ReportComparison):
        c = item.comparison
        n = len(c.engines[0].points)
        text = (
            f"compare of {c.model} on {c.gpu}: {', '.join(e.label for e in c.engines)}, {n} load "
            f"point{'s' if n != 1 else ''}, {c.mean_prompt_tokens:,.0f} → {c.mean_output_tokens:,.0f} tokens "
            "per request (simulated)"
        )
    elif isinstance(item, ReportValidation):
        server, points = item.report.server, item.report.points
        text = f"validate of {server.model or '?'} at {server.base_url or '?'}, {len(points)} held-out points"
    elif isinstance(item, ReportDocument):
        doc = item.tune
        text = (
            f"tune of {doc.deployment.model} on {doc.deployment.gpu} for {doc.objective.kind}, "
            f"{len(doc.trials)} configurations simulated" + (", stage 2 measured" if doc.stage2 else "")
        )
    elif isinstance(item, ReportSweep):
        info = item.points[0].info
        values = ", ".join(str(p.sweep_value) for p in item.points)
        text = (
            f"{_served_text(info)} · {plan_text(info.workload, with_arrival=False)} · sweep {item.parameter} = {values}"
        )
    else:
        info = item.info
        text = f"{_served_text(info)} · {plan_text(info.workload)}"
    return f"{text} · {item.directory}"


def summary_table(runs: Sequence[ReportRun]) -> str:
    """The numbers behind the plots, in `vllm bench serve`'s terms, one row per run."""
    columns = [c for c in SUMMARY_COLUMNS if any(isinstance(r.summary.statistic(c[0]), (int, float)) for r in runs)]
    head = "".join(f"<th>{escape(title)}</th>" for _, title, _ in columns)
    rows = [
        f'<tr><th scope="row">{escape(run.label)}</th>'
        + "".join(
            f"<td>{number(run.summary.statistic(key), fmt)}{escape(interval_suffix(run.summary.intervals, key))}</td>"
            for key, _, fmt in columns
        )
        + "</tr>"
        for run in runs
    ]
    return f'<table class="summary"><thead><tr><th>run</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
