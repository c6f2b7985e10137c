"""diagnose's findings in the HTML report: the same rows as the terminal and Markdown views, as HTML."""

from __future__ import annotations

from html import escape
from servelab.schemas.diagnosis import Diagnosis
from servelab.report.diagnosis_view import (
    ALTERNATIVE_COLUMNS,
    ENGINE_COLUMNS,
    LEVER_COLUMNS,
    alternative_row,
    assumption_lines,
    ceiling_rows,
    engine_lines,
    engine_rows,
    engine_title,
    headline,
    lever_row,
    lever_title,
    price_notes,
    recommendation_row,
)
from servelab.report.inputs import ReportInputs
from servelab.report.tables import html_table


def diagnosed(inputs: ReportInputs) -> list[tuple[str, Diagnosis]]:
    """(label, diagnosis) for each input, and for each sweep point diagnosed on its own."""
    out = [(item.label, item.diagnosis) for item in inputs.tops if item.diagnosis is not None]
    for sweep in inputs.sweeps:
        out += [
            (p.label, p.diagnosis)
            for p in sweep.points
            if p.diagnosis is not None and p.diagnosis is not sweep.diagnosis
        ]
    return out


def diagnosis_html(label: str, d: Diagnosis) -> str:
    parts = [f'<div class="diagnosis"><h3>{escape(label)}</h3><p class="headline">{escape(headline(d))}</p>']
    if d.verdict:  # an unstable queue is said before any figure read from it
        parts.append(f'<p class="verdict">{escape(d.verdict)}</p>')
    parts.extend(f'<p class="assumption">{escape(line)}</p>' for line in assumption_lines(d))
    if d.levers:  # the question asked is answered first, as in the terminal; the findings say why
        parts.append(
            f"<h4>{escape(lever_title(d))}</h4>"
            + html_table(LEVER_COLUMNS, [lever_row(lever) for lever in d.levers], "levers")
        )
    for caveat in d.caveats:  # a doubt on the figures comes before anything read from them
        parts.append(
            f'<div class="caveat"><h4>Caveat: {escape(caveat.title)} <code>{escape(caveat.kind)}</code></h4>'
            "<ul>" + "".join(f"<li>{escape(line)}</li>" for line in caveat.evidence) + "</ul></div>"
        )
    if not d.findings:
        parts.append("<p>No bottleneck stands out: the deployment runs within its ceilings for this workload.</p>")
    for i, finding in enumerate(d.findings, 1):
        parts.append(
            f'<div class="finding{" first" if i == 1 else ""}"><h4>{i}. {escape(finding.title)} '
            f"<code>{escape(finding.kind)}</code></h4><ul>"
            + "".join(f"<li>{escape(line)}</li>" for line in finding.evidence)
            + "</ul>"
        )
        if finding.recommendations:
            rows = [recommendation_row(r) for r in finding.recommendations]
            parts.append(
                html_table(("change", "predicted (simulated)", "side effects at this load"), rows, "recommendations")
            )
            parts.append(f'<p class="confirm">confirm: <code>{escape(finding.recommendations[0].confirm)}</code></p>')
        parts.append("</div>")
    if d.alternatives:
        parts.append(
            "<h4>Options at this load (simulated)</h4>"
            + html_table(ALTERNATIVE_COLUMNS, [alternative_row(a) for a in d.alternatives], "alternatives")
            + '<ul class="notes">'
            + "".join(f"<li>{escape(n)}</li>" for n in price_notes(d.alternatives))
            + "</ul>"
        )
    if d.engine_comparison is not None:
        parts.append(
            f"<h4>{escape(engine_title(d.engine_comparison))}</h4>"
            + html_table(ENGINE_COLUMNS, engine_rows(d.engine_comparison), "engines")
            + '<ul class="notes">'
            + "".join(f"<li>{escape(n)}</li>" for n in engine_lines(d.engine_comparison))
            + "</ul>"
        )
    parts.append(
        "<h4>Ceilings for this workload</h4>"
        + html_table(("limit", "ceiling", "where it stands"), ceiling_rows(d), "ceilings")
    )
    if d.notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{escape(n)}</li>" for n in d.notes) + "</ul>")
    parts.append("</div>")
    return "".join(parts)
