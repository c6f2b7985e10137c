"""`write_report`: one self-contained HTML file from any mix of run and sweep directories.

plotly.js is inlined once in the page head (about 5 MB), so the file opens
offline, can be mailed or attached to a ticket, and needs no server.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from html import escape
from pathlib import Path

from plotly.offline import get_plotlyjs

from servelab.atomic import write_text_atomic
from servelab import __version__
from servelab.report.inputs import ReportInputError, ReportInputs, load_inputs
from servelab.report.sections import SECTIONS, Section, SectionBuilder
from servelab.report.tables import headline

PLOT_CONFIG = {"displaylogo": False, "responsive": True, "toImageButtonOptions": {"format": "svg"}}

_CSS = """
body {
  font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #222; background: #fafafa;
}
header { background: #1f2937; color: #f9fafb; padding: 18px 32px; }
header h1 { margin: 0 0 4px 0; font-size: 24px; }
header p { margin: 0; color: #d1d5db; font-size: 13px; }
header ul.inputs { margin: 6px 0; padding-left: 18px; color: #e5e7eb; font-size: 14px; }
header ul.inputs b { color: #ffffff; }
nav { padding: 8px 32px; background: #e5e7eb; font-size: 14px; }
nav a { margin-right: 18px; color: #1f2937; text-decoration: none; }
nav a:hover { text-decoration: underline; }
main { padding: 8px 32px 40px 32px; max-width: 1500px; }
section { background: #fff; border: 1px solid #e5e7eb; border-radius: 6px; padding: 12px 20px; margin: 18px 0; }
section h2 { margin: 4px 0 6px 0; font-size: 19px; }
section p.lead { margin: 0 0 10px 0; color: #4b5563; font-size: 14px; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border-bottom: 1px solid #e5e7eb; padding: 4px 10px; text-align: left; vertical-align: top; }
thead th { background: #f3f4f6; position: sticky; top: 0; }
table.summary td { text-align: right; font-variant-numeric: tabular-nums; }
table.params td {
  font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 12px;
  max-width: 460px; overflow-wrap: anywhere;
}
table.params tr.differs { background: #fef3c7; }
details summary { cursor: pointer; font-size: 14px; color: #1f2937; margin: 4px 0 8px 0; }
.plot { margin: 10px 0 18px 0; }
.diagnosis { margin: 10px 0 22px 0; }
.diagnosis h3 { margin: 12px 0 2px 0; font-size: 16px; }
.diagnosis p.headline { margin: 0 0 8px 0; color: #4b5563; font-size: 13px; }
.finding { border-left: 4px solid #f59e0b; padding: 2px 12px; margin: 10px 0; }
.finding.first { border-left-color: #dc2626; }
.finding h4, .diagnosis h4 { margin: 6px 0; font-size: 14px; }
.finding ul, ul.notes { margin: 4px 0 8px 0; padding-left: 20px; font-size: 13px; }
p.confirm { font-size: 12px; color: #6b7280; margin: 4px 0; }
code {
  font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 12px; background: #f3f4f6; padding: 0 3px;
}
"""


def _section_html(section: Section, first_plot: int) -> tuple[str, int]:
    parts = [f'<section id="{section.key}"><h2>{escape(section.title)}</h2><p class="lead">{escape(section.lead)}</p>']
    n = first_plot
    for block in section.blocks:
        if isinstance(block, str):
            parts.append(f'<div class="table-wrap">{block}</div>')
            continue
        n += 1
        body = block.to_html(full_html=False, include_plotlyjs=False, div_id=f"plot-{n}", config=PLOT_CONFIG)
        parts.append(f'<div class="plot">{body}</div>')
    parts.append("</section>")
    return "".join(parts), n


def default_title(inputs: ReportInputs) -> str:
    labels = [item.label for item in inputs.given if getattr(item, "within", None) is None]
    return "servelab report: " + (" vs. ".join(labels) if len(labels) <= 3 else f"{len(labels)} inputs")


def render_report(inputs: ReportInputs, title: str | None = None, builders: Sequence[SectionBuilder] = SECTIONS) -> str:
    """The whole page as a string: header, contents, then every section that has data."""
    title = title or default_title(inputs)
    sections = [s for s in (build(inputs) for build in builders) if s is not None]
    body, plots = [], 0
    for section in sections:
        html, plots = _section_html(section, plots)
        body.append(html)
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    n_runs = len(inputs.all_runs)
    nav = "".join(f'<a href="#{s.key}">{escape(s.title)}</a>' for s in sections)
    given = "".join(f"<li><b>{escape(item.label)}</b>: {escape(headline(item))}</li>" for item in inputs.given)
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style>'
        f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>'
        f'<header><h1>{escape(title)}</h1><ul class="inputs">{given}</ul>'
        f"<p>{n_runs} run{'s' if n_runs != 1 else ''} · generated {generated} by servelab "
        f"{escape(__version__)}</p></header>"
        f"<nav>{nav}</nav><main>{''.join(body)}</main></body></html>\n"
    )


def write_report(dirs: list[Path], out: Path, title: str | None = None) -> Path:
    """Loads the directories (raising ReportInputError on bad input, before writing anything) and writes the page."""
    inputs = load_inputs([Path(d) for d in dirs])
    page = render_report(inputs, title)
    out = Path(out)
    if out.is_dir():
        raise ReportInputError(f"-o {out} is a directory: name the HTML file to write, e.g. {out / 'report.html'}")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, page)
    return out
