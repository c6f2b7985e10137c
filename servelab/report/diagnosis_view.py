"""How a Diagnosis reads: findings first, their evidence beneath, then ceilings.

One function builds the content as plain rows; the terminal (rich) and the
Markdown renderers only lay it out, so the two never disagree. They read the
typed model (servelab.schemas.diagnosis), so a misspelt field is an error, not a "—".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from servelab.targets.engine_terms import Terms
from servelab.schemas.diagnosis import (
    AdviceRow,
    Alternative,
    Diagnosis,
    EngineSwitch,
    Finding,
    Lever,
    Recommendation,
    WorkloadShape,
)
from servelab.metrics.intervals import interval_text
from servelab.cells import MISSING, number
from servelab.sim.engines import LABELS

CEILING_ROWS = (
    ("prefill_compute_rps", "prefill_compute", "Prefill compute", "req/s"),
    ("decode_bandwidth_tps_at_max_batch", "decode_bandwidth", "Decode (at the largest batch)", "tok/s"),
    ("kv_capacity_seqs", "kv_capacity", "KV capacity", "seqs/replica"),
    ("max_num_seqs", "max_num_seqs", "max_num_seqs", "seqs/replica"),
    ("saturation_rps", "saturation", "All limits at once (simulated)", "req/s"),
    ("slo_max_rps", "slo_max_rps", "Highest rate meeting the SLO (simulated)", "req/s"),
)


def _num(x: float | None, unit: str = "") -> str:
    """Whole numbers from 100 up, two decimals below; the unit after it, none after MISSING."""
    if x is None:
        return MISSING
    return f"{number(x, ',.0f' if abs(x) >= 100 else ',.2f')} {unit}".strip()


def _metric(name: str) -> tuple[str, str]:
    return {
        "capacity_rps": ("ceiling", "req/s"),
        "request_throughput": ("throughput", "req/s"),
        "request_goodput": ("goodput", "req/s"),
        "p99_ttft_ms": ("TTFT p99", "ms"),
        "p99_tpot_ms": ("TPOT p99", "ms"),
        "p99_itl_ms": ("ITL p99", "ms"),
    }.get(name, (name, ""))


NEAR_ZERO = 0.05
"""A percentage change is shown only against a baseline at least this share of the larger side: +71,637% of a
near-zero baseline says nothing that before -> after does not say better."""


def change_pct(before: float, after: float) -> str:
    """ " (+12%)", or nothing when the baseline is near zero against the other side."""
    if not before or abs(before) < NEAR_ZERO * max(abs(before), abs(after)):
        return ""
    return f" ({(after - before) / before:+.0%})"


def recommendation_row(r: Recommendation) -> list[str]:
    label, unit = _metric(r.metric)
    effects = ", ".join(f"{_metric(m)[0]} {_num(a)}→{_num(b)}" for m, (a, b) in r.effects.items())
    return [
        r.change + (f" (you tried this: {r.tried})" if r.tried else ""),
        f"{label} {_num(r.before, unit)} → {_num(r.after, unit)}{change_pct(r.before, r.after)}",
        effects,
    ]


def arrival(w: WorkloadShape) -> str:
    """How the requests arrived: a rate, a concurrency, both, or all at once (a burst has neither)."""
    if w.offered_rate and w.max_concurrency:
        return f"{w.offered_rate:.2f} req/s offered, at most {w.max_concurrency} in flight"
    if w.offered_rate:
        return f"{w.offered_rate:.2f} req/s offered"
    if w.max_concurrency:
        return f"concurrency {w.max_concurrency}"
    return "every request sent at once (no rate, no concurrency cap)"


def headline(d: Diagnosis) -> str:
    dep, w = d.deployment, d.workload
    label = LABELS.get(dep.engine, dep.engine)
    return (
        f"{dep.model} on {dep.gpu} · {label} {dep.engine_args or 'defaults'} · "
        f"{w.mean_input_tokens:.0f} in / {w.mean_output_tokens:.0f} out · {arrival(w)} · {d.source}"
    )


def ceiling_rows(d: Diagnosis) -> list[tuple[str, str, str]]:
    """(limit, ceiling, where it stands) per CEILING_ROWS, formatted; an unknown ceiling name is an AttributeError."""
    rows = []
    for key, stand, label, unit in CEILING_ROWS:
        share = d.standing.get(stand)
        label = Terms(d.deployment.engine).knob(label) if key == "max_num_seqs" else label
        rows.append((label, _num(getattr(d.ceilings, key), unit) + _interval(d, key), number(share, ".0%")))
    return rows


def _interval(d: Diagnosis, key: str) -> str:
    """ ", 80%: 6.9–9.8" after a simulated ceiling that has an interval."""
    text = interval_text(getattr(d.ceilings, f"{key}_interval", None))
    return f", {text}" if text else ""


LEVER_COLUMNS = ("change", "before → after", "why, and what it costs")


def lever_title(d: Diagnosis) -> str:
    at = d.levers_at or "the described load"
    if d.verdict and d.goal == "latency":
        return (
            "Your question is latency, but the load is above the ceiling, where every latency is the queue's: "
            f"what raises the ceiling (simulated at {at})"
        )
    return (
        f"Your question is latency: what shortens the answer (simulated at {at})"
        if d.goal == "latency"
        else f"Your question is throughput: what raises the ceiling (simulated at {at})"
    )


def assumption_lines(d: Diagnosis) -> list[str]:
    """One line per assumption: what was assumed, and the ceiling and E2E p50 across its range."""
    out = []
    for a in d.assumptions:
        # Overloaded, the E2E is the unstable queue's, not the server's: the ceiling alone then.
        moves = "; ".join(
            f"{p.value}: ceiling {_num(p.ceiling_rps)} req/s"
            + ("" if d.verdict else f", E2E p50 {_num(p.median_e2el_ms)} ms")
            for p in a.points
        )
        out.append(f"Assumed {a.what}: {a.assumed}" + (f". Across its range: {moves}" if moves else ""))
    return out


def lever_row(lever: Lever) -> list[str]:
    unit = lever.metric.split()[-1]
    figure = f"{lever.metric.rsplit(' ', 1)[0]} {_num(lever.before)} → {_num(lever.after)} {unit}"
    return [
        lever.change + (f" (you tried this: {lever.tried})" if lever.tried else ""),
        figure + change_pct(lever.before, lever.after),
        lever.note,
    ]


ALTERNATIVE_COLUMNS = ("option", "GPUs", "TTFT p50 ms", "E2E p50 ms", "E2E p99 ms", "$/M out tok", "E2E verdict")
"""The terminal's columns; TTFT p99, TPOT and throughput are in the JSON."""


def alternative_row(a: Alternative) -> list[str]:
    dollars = MISSING if a.usd_per_mtok is None else f"${a.usd_per_mtok:.2f}"
    return [
        a.change + (f" (you tried this: {a.tried})" if a.tried else ""),
        str(a.gpus or MISSING),
        _num(a.median_ttft_ms),
        _num(a.median_e2el_ms),
        _num(a.p99_e2el_ms),
        dollars,
        a.verdict,
    ]


def price_notes(alternatives: list[Alternative]) -> list[str]:
    """Each option's reason where it does not help, then where each price came from."""
    whys = [f"{a.change}: {a.why}" for a in alternatives if a.why]
    sources = sorted(
        {f"{a.gpu} at ${a.usd_per_hour:.2f}/h ({a.price_source})" for a in alternatives if a.usd_per_hour is not None}
    )
    return whys + (
        ["prices per GPU-hour: " + "; ".join(sources)]
        if sources
        else ["no price for these GPUs: give --gpu-cost-per-hour"]
    )


ENGINE_COLUMNS = (
    "engine",
    "output tok/s",
    "req/s",
    "mean TTFT ms",
    "mean TPOT ms",
    "mean E2E ms",
    "p99 E2E ms",
    "goodput req/s",
    "fit in KV",
    "preempt",
)


def engine_title(s: EngineSwitch) -> str:
    c = s.comparison
    return (
        f"Other engines at this load (simulated: {c.mean_prompt_tokens:,.0f} prompt + {c.mean_output_tokens:,.0f} "
        f"output tokens per request; {LABELS.get(s.current, s.current)} with your flags, the others at their defaults)"
    )


def engine_rows(s: EngineSwitch) -> list[list[str]]:
    """One row per engine at the diagnosed load, the diagnosed engine first."""
    rows = []
    for r in s.comparison.engines:
        p = r.points[0]
        rows.append(
            [
                r.label + (" (yours)" if r.engine == s.current else ""),
                _num(p.output_throughput),
                _num(p.request_throughput),
                _num(p.mean_ttft_ms),
                _num(p.mean_tpot_ms),
                _num(p.mean_e2el_ms),
                _num(p.p99_e2el_ms),
                _num(p.request_goodput),
                f"{r.memory.sequences_fit:,}",
                str(p.preemptions),
            ]
        )
    return rows


def engine_lines(s: EngineSwitch) -> list[str]:
    """What switching would buy, per engine, then the scheduler and memory differences behind it."""
    return [*s.verdicts, *s.comparison.explanations]


SUMMARY_EVIDENCE = 3
"""Evidence lines of the first finding in the default view; the rest is behind --details."""


def summary_evidence(evidence: list[str]) -> list[str]:
    """The first SUMMARY_EVIDENCE lines, with what was tried beneath the likeliest explanation (indented lines)."""
    out: list[str] = []
    head = ""
    for line in evidence:
        if not line.startswith("   "):
            if len([x for x in out if not x.startswith("   ")]) == SUMMARY_EVIDENCE:
                break
            head = line
            out.append(line)
        elif head.startswith("1. "):
            out.append(line)
    return out


def render_summary(d: Diagnosis, console: Console) -> None:
    """The default view, ~40 lines: what the answer rests on, the levers of the question asked, what limits the
    server and the one change that lifts it most; everything else is behind --details."""
    console.print(Panel(headline(d), title="servelab diagnose", expand=False))
    if d.verdict:
        console.print(Text(d.verdict, style="bold red"))
    for line in assumption_lines(d):
        console.print(Text(line, style="yellow"))
    for c in d.caveats:
        console.print(Text(f"Caveat: {c.title}: {c.evidence[0]}", style="magenta"))
    if d.levers:
        t = Table(title=lever_title(d), header_style="bold", title_justify="left", box=None, pad_edge=False)
        for i, col in enumerate(LEVER_COLUMNS[:2]):
            t.add_column(col, overflow="fold", ratio=(3, 2)[i])
        for lever in d.levers:
            t.add_row(*lever_row(lever)[:2])
        console.print(t)
    if not d.findings:
        console.print("No bottleneck stands out: the deployment runs within its ceilings for this workload.")
    for i, f in enumerate(d.findings, 1):
        console.print(Text(f"{i}. {f.title} [{f.kind}]", style="bold red" if i == 1 else "bold"))
        if i == 1:
            for line in summary_evidence(f.evidence):
                console.print(Text("  • " + line.strip()))
        if f.recommendations:
            r = f.recommendations[0]
            cells = recommendation_row(r)
            console.print(Text(f"  → {cells[0]}: {cells[1]}", style="green"))
    console.print(
        Text("Every piece of evidence, the options priced, the ceilings and notes: add --details.", style="dim")
    )


def render_terminal(d: Diagnosis, console: Console, details: bool = True) -> None:
    """The whole diagnosis (`--details`); `details=False` is the default ~40-line view."""
    if not details:
        render_summary(d, console)
        return
    console.print(Panel(headline(d), title="servelab diagnose", expand=False))
    if d.verdict:
        console.print(Text(d.verdict, style="bold red"))
    for line in assumption_lines(d):  # what the answer rests on, said before the answer
        console.print(Text(line, style="yellow"))
    if d.levers:  # the question asked is answered first; the findings say why
        t = Table(title=lever_title(d), header_style="bold", title_justify="left")
        for i, col in enumerate(LEVER_COLUMNS):
            t.add_column(col, overflow="fold", ratio=(3, 2, 3)[i])
        for lever in d.levers:
            t.add_row(*lever_row(lever))
        console.print(t)
    for c in d.caveats:  # a doubt on the figures comes before anything read from them
        console.print(
            Panel(
                Group(*[Text("• " + line) for line in c.evidence]),
                title=f"Caveat: {c.title} [{c.kind}]",
                border_style="magenta",
            )
        )
    if not d.findings:
        console.print("No bottleneck stands out: the deployment runs within its ceilings for this workload.")
    for i, f in enumerate(d.findings, 1):
        console.print(finding_panel(i, f))
    if d.alternatives:
        t = Table(title="Options at this load (simulated)", header_style="bold")
        for i, col in enumerate(ALTERNATIVE_COLUMNS):
            t.add_column(col, overflow="fold", no_wrap=i > 0, min_width=24 if i == 0 else None)
        for a in d.alternatives:
            t.add_row(*alternative_row(a))
        console.print(t)
        for line in price_notes(d.alternatives):
            console.print(Text("• " + line, style="dim"))
    if d.engine_comparison is not None:
        t = Table(title=engine_title(d.engine_comparison), header_style="bold")
        for i, col in enumerate(ENGINE_COLUMNS):
            t.add_column(col, justify="left" if i == 0 else "right")
        for cells in engine_rows(d.engine_comparison):
            t.add_row(*cells)
        console.print(t)
        for line in engine_lines(d.engine_comparison):
            console.print(Text("• " + line), highlight=False)
    t = Table(title="Ceilings for this workload", header_style="bold")
    for col in ("limit", "ceiling", "where it stands"):
        t.add_column(col)
    for row in ceiling_rows(d):
        t.add_row(*row)
    console.print(t)
    for note in d.notes:
        console.print(Text("• " + note, style="cyan"))
    if d.advice:
        render_advice_terminal(d.advice, console)


def finding_panel(rank: int, f: Finding) -> Panel:
    """One finding: its evidence, then its changes as simulated, with the command that would confirm the first."""
    body: list[Any] = [Text("• " + line) for line in f.evidence]
    if f.recommendations:
        t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        for col in ("change", "predicted (simulated)", "side effects at this load"):
            t.add_column(col, overflow="fold")
        for r in f.recommendations:
            t.add_row(*recommendation_row(r))
        body.append(t)
        body.append(Text("confirm: " + f.recommendations[0].confirm, style="dim"))
    return Panel(Group(*body), title=f"{rank}. {f.title} [{f.kind}]", border_style="red" if rank == 1 else "yellow")


def render_advice_terminal(advice: list[AdviceRow], console: Console) -> None:
    t = Table(title="Common advice, checked against this deployment", header_style="bold", show_lines=False)
    for col in ("#", "advice", "in vLLM", "Δ throughput", "Δ TTFT p99", "Δ TPOT p99", "verdict", "why"):
        t.add_column(col, overflow="fold")
    for a in advice:
        t.add_row(
            str(a.id),
            a.advice,
            a.flag_status,
            _pct(a.d_throughput),
            _pct(a.d_p99_ttft),
            _pct(a.d_p99_tpot),
            a.verdict,
            a.why,
        )
    console.print(t)


def _pct(x: float | None) -> str:
    """A relative change; past 20x (a baseline under 5% of the result) a ratio, as a percentage of it says nothing."""
    if x is None:
        return MISSING
    return f"x{1 + x:,.0f}" if x >= 1 / NEAR_ZERO - 1 else f"{x:+.0%}"


def render_markdown(d: Diagnosis) -> str:
    """The diagnosis as Markdown, in the terminal's order: verdict and levers, findings, options, ceilings, advice."""
    out = [f"# servelab diagnose\n\n{headline(d)}\n"]
    if d.verdict:
        out.append(f"**{d.verdict}**\n")
    out.extend(f"> {line}\n" for line in assumption_lines(d))
    if d.levers:
        out.append(f"## {lever_title(d)}\n\n| " + " | ".join(LEVER_COLUMNS) + " |\n|---|---|---|")
        out.extend("| " + " | ".join(lever_row(lever)) + " |" for lever in d.levers)
        out.append("")
    out += _md_findings(d) + _md_options(d)
    out.append("## Ceilings for this workload\n\n| limit | ceiling | where it stands |\n|---|---|---|")
    out.extend(f"| {label} | {ceiling} | {share} |" for label, ceiling, share in ceiling_rows(d))
    out.append("")
    out.extend(f"- {note}" for note in d.notes)
    out += _md_advice(d)
    return "\n".join(out) + "\n"


def _md_findings(d: Diagnosis) -> list[str]:
    """The caveats on the figures as quotes, then each finding with its evidence and its simulated fixes."""
    out = []
    for c in d.caveats:
        out.append(f"> **Caveat: {c.title}** (`{c.kind}`)")
        out.extend(f"> - {line}" for line in c.evidence)
        out.append("")
    for i, f in enumerate(d.findings, 1):
        out.append(f"## {i}. {f.title} (`{f.kind}`)\n")
        out.extend(f"- {line}" for line in f.evidence)
        if f.recommendations:
            out.append("\n| change | predicted (simulated) | side effects at this load |\n|---|---|---|")
            out.extend("| " + " | ".join(recommendation_row(r)) + " |" for r in f.recommendations)
            # The confirm line quotes a launch command in backticks: a fenced block, as nested inline code does not
            # render.
            out.append("\nConfirm:\n\n```\n" + f.recommendations[0].confirm.replace("`", "") + "\n```")
        out.append("")
    return out


def _md_table(title: str, columns: Sequence[str]) -> str:
    """A section heading and the head of its table."""
    return f"## {title}\n\n| " + " | ".join(columns) + " |\n|" + "---|" * len(columns)


def _md_options(d: Diagnosis) -> list[str]:
    """The options priced at this load and the engines compared on it, each a table and its notes."""
    out = []
    if d.alternatives:
        out.append(_md_table("Options at this load (simulated)", ALTERNATIVE_COLUMNS))
        out.extend("| " + " | ".join(alternative_row(a)) + " |" for a in d.alternatives)
        out.append("")
        out.extend(f"- {line}" for line in price_notes(d.alternatives))
        out.append("")
    if d.engine_comparison is not None:
        out.append(_md_table(engine_title(d.engine_comparison), ENGINE_COLUMNS))
        out.extend("| " + " | ".join(row) + " |" for row in engine_rows(d.engine_comparison))
        out.append("")
        out.extend(f"- {line}" for line in engine_lines(d.engine_comparison))
        out.append("")
    return out


def _md_advice(d: Diagnosis) -> list[str]:
    """The common tuning tips, each simulated here with its verdict (`--check-advice`)."""
    if not d.advice:
        return []
    out = [
        "\n## Common advice, checked\n\n"
        "| # | advice | in vLLM | Δ throughput | Δ TTFT p99 | Δ TPOT p99 | verdict | why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a in d.advice:
        out.append(
            f"| {a.id} | {a.advice} | {a.flag_status} | {_pct(a.d_throughput)} | "
            f"{_pct(a.d_p99_ttft)} | {_pct(a.d_p99_tpot)} | {a.verdict} | {a.why} |"
        )
    return out
