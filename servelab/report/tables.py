"""The report's HTML tables: what was run (parameters) and what came out (summary statistics)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from servelab.report.inputs import ReportInputs, ReportRun, ReportSweep

HIDDEN_PARAMETERS = frozenset({"schema_version"})
MAX_CELL = 120
"""Characters of one parameter value; longer values (lists of prompts...) are cut with an ellipsis."""

SUMMARY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("completed", "Completed", "{:.0f}"),
    ("failed", "Failed", "{:.0f}"),
    ("duration", "Duration (s)", "{:.1f}"),
    ("request_throughput", "Requests/s", "{:.2f}"),
    ("request_goodput", "Goodput (req/s)", "{:.2f}"),
    ("output_throughput", "Output tok/s", "{:.1f}"),
    ("median_ttft_ms", "TTFT p50 (ms)", "{:.1f}"),
    ("p99_ttft_ms", "TTFT p99 (ms)", "{:.1f}"),
    ("median_tpot_ms", "TPOT p50 (ms)", "{:.2f}"),
    ("p99_tpot_ms", "TPOT p99 (ms)", "{:.2f}"),
    ("median_e2el_ms", "E2E p50 (ms)", "{:.0f}"),
    ("p99_e2el_ms", "E2E p99 (ms)", "{:.0f}"),
)


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested run.json objects as dotted keys, so runs compare row by row."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if name in HIDDEN_PARAMETERS:
            continue
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def format_parameter(key: str, value: Any) -> str:
    if key == "started_at" and isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(value, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _parameters_of(item: ReportRun | ReportSweep) -> dict[str, str]:
    if isinstance(item, ReportRun):
        params = flatten(item.result.run_info)
        params["directory"] = str(item.directory)
    else:
        # A sweep's points differ only in the swept value, so the first point speaks for all of them.
        params = flatten(item.points[0].result.run_info)
        params.pop("started_at", None)
        params["directory"] = str(item.directory)
        params["sweep.parameter"] = item.parameter
        params["sweep.values"] = [p.sweep_value for p in item.points]
        if item.info.get("interrupted"):
            params["sweep.interrupted"] = True
    return {key: format_parameter(key, value) for key, value in params.items()}


def parameters_table(inputs: ReportInputs) -> str:
    """One column per input; rows whose values differ between inputs are highlighted."""
    items = inputs.tops
    columns = [_parameters_of(item) for item in items]
    keys = sorted({key for column in columns for key in column}, key=lambda k: (k != "source", k != "directory", k))
    head = "".join(f"<th>{escape(item.label)}</th>" for item in items)
    rows = []
    for key in keys:
        cells = [column.get(key, "") for column in columns]
        row_class = ' class="differs"' if len(columns) > 1 and len(set(cells)) > 1 else ""
        rows.append(
            f'<tr{row_class}><th scope="row">{escape(key)}</th>'
            + "".join(f"<td>{escape(cell)}</td>" for cell in cells)
            + "</tr>"
        )
    return f'<table class="params"><thead><tr><th>parameter</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _format_stat(value: Any, fmt: str) -> str:
    return fmt.format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "—"


def summary_table(runs: Sequence[ReportRun]) -> str:
    """The numbers behind the plots, in `vllm bench serve`'s terms, one row per run."""
    columns = [c for c in SUMMARY_COLUMNS if any(isinstance(r.summary.get(c[0]), (int, float)) for r in runs)]
    head = "".join(f"<th>{escape(title)}</th>" for _, title, _ in columns)
    rows = [
        f'<tr><th scope="row">{escape(run.label)}</th>'
        + "".join(f"<td>{_format_stat(run.summary.get(key), fmt)}</td>" for key, _, fmt in columns)
        + "</tr>"
        for run in runs
    ]
    return f'<table class="summary"><thead><tr><th>run</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
