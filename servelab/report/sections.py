"""The report as a list of independent sections, each drawn only when its data exists.

A section builder takes the loaded `ReportInputs` and returns a `Section`, or
None when the inputs hold nothing for it; the page never shows an empty
plot or a "no data" placeholder. A later verb that writes its own JSON into a
results directory (diagnose's findings) adds its view by writing one
builder that reads that file from `run.result.directory` / `sweep.directory`
and listing it in `SECTIONS`; a verb's JSON without records (tune.json,
validate's report, compare's result) is loaded by `inputs` as a document instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeAlias

import plotly.graph_objects as go

from servelab.report import figures, tables
from servelab.report.compare_results import compare_blocks
from servelab.report.diagnosis_html import diagnosed, diagnosis_html
from servelab.report.inputs import ReportInputs
from servelab.report.replicas import fleets_of, replicas_figure, replicas_table
from servelab.report.tune_results import tune_blocks
from servelab.report.validation_results import validation_blocks

Block: TypeAlias = str | go.Figure
"""A trusted HTML fragment (tables, headings) or a figure; a section shows its blocks in order."""


@dataclass
class Section:
    key: str
    """HTML id of the section (anchor in the table of contents)."""
    title: str
    lead: str
    """One or two sentences on how to read what follows."""
    blocks: list[Block] = field(default_factory=list)


SectionBuilder = Callable[[ReportInputs], Section | None]


def parameters_section(inputs: ReportInputs) -> Section | None:
    if not inputs.tops:
        return None
    return Section(
        key="parameters",
        title="What was run",
        lead="The header names each input's model, workload and sweep; here is every setting from its run.json "
        "(a sweep shows its first point's and the values it swept). Click to unfold.",
        blocks=[tables.parameters_table(inputs)],
    )


def summary_section(inputs: ReportInputs) -> Section | None:
    if not inputs.all_runs:
        return None
    return Section(
        key="summary",
        title="Summary",
        lead="Statistics over successful requests after warm-up, with the same definitions as vllm bench serve.",
        blocks=[tables.summary_table(inputs.all_runs)],
    )


def replicas_section(inputs: ReportInputs) -> Section | None:
    fleets = fleets_of(inputs)
    if not fleets:
        return None
    return Section(
        key="replicas",
        title="Replicas",
        lead="Each replica of a fleet: what it served, how fast, and what its prefix cache hit (where its /metrics "
        "was read). One replica far busier than the rest is the router's imbalance; low hit rates on every replica "
        "of a chat or shared-prompt workload are prompts sent where they were not cached.",
        blocks=[replicas_figure(fleets), *(replicas_table(run, rows) for run, rows in fleets)],
    )


def sweep_section(inputs: ReportInputs) -> Section | None:
    if not inputs.sweeps:
        return None
    by_parameter: dict[str, list] = {}
    for sweep in inputs.sweeps:
        by_parameter.setdefault(sweep.parameter, []).append(sweep)
    return Section(
        key="sweeps",
        title="Sweeps",
        lead="Each point is one run; solid lines are medians, dotted lines p99. "
        "Where a curve turns upward, more load buys latency, not throughput. "
        "Dashed horizontal lines are the ceilings servelab diagnose computed, where a sweep was diagnosed.",
        blocks=[figures.sweep_curves_figure(inputs.sweeps)]
        + [figures.sweep_throughput_figure(group) for group in by_parameter.values()],
    )


def latency_section(inputs: ReportInputs) -> Section | None:
    runs = [run for run in inputs.all_runs if figures.has_latencies(run)]
    if not runs:
        return None
    return Section(
        key="latency",
        title="Latency distributions",
        lead="The fraction of requests that finished within each latency. Steeper is more predictable; "
        "a curve further right is slower. Line style tells inputs apart; within a sweep, darker is more load.",
        blocks=[figures.latency_cdf_figure(inputs, runs)],
    )


def request_timeline_section(inputs: ReportInputs) -> Section | None:
    runs = [run for run in inputs.all_runs if run.result.records]
    if not runs:
        return None
    lead = (
        f"Up to {figures.REQUEST_SAMPLE} requests per run, evenly spaced in send order. Each bar starts when the "
        "request was sent: queued until the engine scheduled it (known for simulated runs), prefill until "
        "the first token, decode until the last."
    )
    if len(runs) > 1:
        lead += " Pick the run with the menu at the top right."
    return Section(
        key="requests", title="Per-request timeline", lead=lead, blocks=[figures.request_timeline_figure(runs)]
    )


def ttft_split_section(inputs: ReportInputs) -> Section | None:
    splits = [(run, split) for run in inputs.all_runs if (split := figures.run_ttft_split(run)) is not None]
    if not splits:
        return None
    return Section(
        key="ttft",
        title="Where the first token's time went",
        lead="Each run's mean TTFT from the client, split by the server's own histograms: time outside the engine "
        "(network, HTTP, tokenization, the API server), queued in the engine before it was first scheduled, and "
        "the prompt's prefill. Within a sweep, the part that grows with the load is what limits it.",
        blocks=[figures.ttft_split_figure(splits)],
    )


def server_timeline_section(inputs: ReportInputs) -> Section | None:
    runs = [run for run in inputs.all_runs if figures.has_server_timeline(run)]
    if not runs:
        return None
    lead = (
        "The engine's own metrics against time: queueing shows as waiting requests, memory pressure as KV usage "
        "near 100% and preemptions."
    )
    if len(runs) > 1:
        lead += " The menu at the top right shows one run at a time; click legend entries to hide lines."
    return Section(
        key="server",
        title="Server timeline",
        lead=lead,
        blocks=[figures.server_timeline_figure(runs)],
    )


def diagnosis_section(inputs: ReportInputs) -> Section | None:
    found = diagnosed(inputs)
    if not found:
        return None
    return Section(
        key="diagnosis",
        title="Diagnosis",
        lead="From servelab diagnose: what limits each deployment, the numbers it rests on, and the changes "
        "predicted (on the simulator) to lift it, best first.",
        blocks=[diagnosis_html(label, d) for label, d in found],
    )


def tune_section(inputs: ReportInputs) -> Section | None:
    if not inputs.tunes:
        return None
    return Section(
        key="tune",
        title="Tune",
        lead="From servelab tune. Each point is one configuration the simulator ran (stage 1), placed by the "
        "output throughput and p99 TTFT of the run its score rests on (for goodput: at the highest rate that met "
        "the SLO). The Pareto front joins the trials no other beats on both; the star is the recommendation. "
        "Triangles are stage 2: configurations measured on a real server at the bench workload (filled), dotted "
        "back to the simulator's prediction for that same workload (open).",
        blocks=[block for tune in inputs.tunes for block in tune_blocks(tune)],
    )


def validation_section(inputs: ReportInputs) -> Section | None:
    if not inputs.validations:
        return None
    return Section(
        key="validation",
        title="Simulated vs. measured (validate)",
        lead="From servelab validate: held-out workloads run on the live server and simulated with the calibration "
        "profile on the very same requests. Blue is measured, orange simulated; the label on each orange bar is the "
        "simulation's error relative to the measurement (+ = the simulator says more).",
        blocks=[block for validation in inputs.validations for block in validation_blocks(validation)],
    )


def compare_section(inputs: ReportInputs) -> Section | None:
    if not inputs.comparisons:
        return None
    return Section(
        key="engines",
        title="Engines compared (compare)",
        lead="From servelab compare: the same deployment and load points simulated on each engine (one colour per "
        "engine). Each curve joins an engine's load points by the output throughput they reached; solid is mean, "
        "dotted p99. A curve that stays low further right serves more at the same latency. The bars are the "
        "requests/s that met every SLO bound; the memory plan says how many of these requests fit in each engine's "
        "KV cache at once, and the sentences under it the scheduler differences behind the gap.",
        blocks=[block for comparison in inputs.comparisons for block in compare_blocks(comparison)],
    )


SECTIONS: tuple[SectionBuilder, ...] = (
    parameters_section,
    summary_section,
    replicas_section,
    diagnosis_section,
    tune_section,
    validation_section,
    compare_section,
    sweep_section,
    latency_section,
    ttft_split_section,
    request_timeline_section,
    server_timeline_section,
)
