"""The HTML report without a browser: inputs, sections present only with their data, figure contents, CLI."""

from __future__ import annotations

import json
import re
from html import escape
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.compare.compare import EngineComparison
from servelab.metrics import timeline as tl
from servelab.metrics.records import RequestRecord
from servelab.metrics.results import SWEEP, load_run
from servelab.schemas.results import Summary
from servelab.metrics.summary import summarize
from servelab.metrics.timeline import TimelineSample
from servelab.report import figures, tune_results, validation_results
from servelab.report.html import default_title, render_report, write_report
from servelab.report.inputs import ReportInputError, load_inputs
from servelab.report.tables import headline
from support.synthetic_results import TOY_DIAGNOSIS, toy_validation, write_toy_run, write_toy_sweep


def _section_ids(page: str) -> list[str]:
    return re.findall(r'<section id="([a-z0-9]+)">', page)


def test_sweep_and_runs_get_unique_labels_with_their_source(tmp_path: Path) -> None:
    write_toy_sweep(tmp_path / "a" / "curve", (1, 4), source="http")
    write_toy_sweep(tmp_path / "b" / "curve", (1, 4), source="sim")
    write_toy_run(tmp_path / "plain", source=None)
    inputs = load_inputs([tmp_path / "a" / "curve", tmp_path / "b" / "curve", tmp_path / "plain"])
    assert [s.label for s in inputs.sweeps] == ["a/curve (measured)", "b/curve (simulated)"]
    assert [r.label for r in inputs.runs] == ["plain"]
    assert [r.label for r in inputs.all_runs] == [
        "a/curve (measured) · max-concurrency=1",
        "a/curve (measured) · max-concurrency=4",
        "b/curve (simulated) · max-concurrency=1",
        "b/curve (simulated) · max-concurrency=4",
        "plain",
    ]
    assert [p.sweep_value for p in inputs.sweeps[0].points] == [1, 4]


def test_summary_comes_from_sweep_json_then_summary_json_then_the_records(tmp_path: Path) -> None:
    sweep = write_toy_sweep(tmp_path / "s", (2,))
    index = json.loads((sweep / SWEEP).read_text())
    stored = json.loads((sweep / index["points"][0]["directory"] / "summary.json").read_text())
    index["points"][0]["summary"] = stored | {"output_throughput": 123.0}
    (sweep / SWEEP).write_text(json.dumps(index))
    no_summary = write_toy_run(tmp_path / "raw", with_summary=False)
    inputs = load_inputs([sweep, no_summary])
    assert inputs.sweeps[0].points[0].summary.output_throughput == 123.0
    assert inputs.runs[0].summary == Summary.model_validate(summarize(load_run(no_summary).records))


def _with_sweep_json(text: str):
    def make(directory: Path) -> Path:
        (directory / SWEEP).write_text(text)
        return directory

    return make


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing", "is not a directory"),
        (lambda d: d, "is not a servelab results directory"),
        (_with_sweep_json('{"sweep": {"key": "max-concurrency"}, "points": []}'), "lists no points"),
        (_with_sweep_json('{"points": [{"directory": "x"}]}'), "names no swept parameter"),
        (
            _with_sweep_json('{"sweep": {"key": "request-rate"}, "points": [{"request-rate": 1}]}'),
            "point 0 names no results directory",
        ),
        (_with_sweep_json("{not json"), "cannot read"),
        (
            _with_sweep_json('{"sweep": {"key": "request-rate"}, "points": [{"directory": "gone"}]}'),
            "gone is not a servelab",
        ),
    ],
)
def test_bad_input_is_one_clear_error_and_no_file(tmp_path: Path, make, message: str) -> None:
    directory = make(tmp_path)
    out = tmp_path / "report.html"
    with pytest.raises(ReportInputError, match=message):
        write_report([directory], out)
    assert not out.exists()


def test_a_sweep_json_whose_points_load_but_whose_fields_are_not_sweep_json_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    sweep = write_toy_sweep(tmp_path / "sweep", (1, 2))
    index = json.loads((sweep / SWEEP).read_text())
    assert load_inputs([sweep]).sweeps[0].index.interrupted is None
    (sweep / SWEEP).write_text(json.dumps(index | {"interrupted": [True]}))
    with pytest.raises(
        ReportInputError, match=r"sweep.json is not a sweep.json this servelab reads: \('interrupted',\)"
    ):
        load_inputs([sweep])


def test_sections_appear_only_where_their_data_exists(tmp_path: Path) -> None:
    bare = write_toy_run(tmp_path / "bare", with_timeline=False)
    assert _section_ids(render_report(load_inputs([bare]))) == ["parameters", "summary", "latency", "requests"]
    sweep = write_toy_sweep(tmp_path / "sweep", (1, 2))
    page = render_report(load_inputs([sweep, bare]))
    assert _section_ids(page) == ["parameters", "summary", "sweeps", "latency", "requests", "server"]
    assert page.count('class="plotly-graph-div"') == 5


def test_page_is_self_contained(tmp_path: Path) -> None:
    out = write_report([write_toy_run(tmp_path / "run")], tmp_path / "r.html", title="My <title>")
    page = out.read_text()
    assert "<script src" not in page and "<link" not in page
    assert "<title>My &lt;title&gt;</title>" in page
    assert "Plotly.newPlot" in page and len(page) > 3_000_000  # plotly.js itself is inlined


def test_parameters_table_highlights_what_differs(tmp_path: Path) -> None:
    a = write_toy_run(tmp_path / "a", concurrency=4)
    b = write_toy_run(tmp_path / "b", concurrency=8)
    page = render_report(load_inputs([a, b]))
    differs = re.findall(r'<tr class="differs"><th scope="row">([^<]+)</th>', page)
    assert "arrival.max_concurrency" in differs
    assert "model" not in differs
    folded = re.search(r"<details><summary>All (\d+) settings from run.json, (\d+) differ between inputs", page)
    assert folded and int(folded.group(2)) == len(differs) < int(folded.group(1))


def _record(index: int, send: float, first: float | None, finish: float, **kw) -> RequestRecord:
    return RequestRecord(
        index=index, intended_time=send, send_time=send, first_token_time=first, finish_time=finish, **kw
    )


def test_request_phases_split_queueing_prefill_decode() -> None:
    sim = _record(0, 1.0, 3.0, 7.0, schedule_time=2.0, output_tokens=5)
    assert figures.request_phases(sim) == [("queued", 1.0, 2.0), ("prefill", 2.0, 3.0), ("decode", 3.0, 7.0)]
    http = _record(1, 1.0, 3.0, 7.0, output_tokens=5)
    assert figures.request_phases(http) == [("prefill", 1.0, 3.0), ("decode", 3.0, 7.0)]
    failed = _record(2, 1.0, None, 1.5, status="error", error_kind="http_500")
    assert figures.request_phases(failed) == [("failed", 1.0, 1.5)]


def test_request_sample_spans_the_run_in_send_order() -> None:
    records = [_record(i, float(100 - i), None, 200.0) for i in range(100)]
    sample = figures.sample_requests(records, count=10)
    assert len(sample) == 10
    assert [r.send_time for r in sample] == sorted(r.send_time for r in sample)
    assert (sample[0].send_time, sample[-1].send_time) == (1.0, 100.0)


def test_prefix_hit_rate_is_per_interval_and_skips_idle_intervals() -> None:
    samples = [
        TimelineSample(0.0, {tl.PREFIX_QUERIES: 0, tl.PREFIX_HITS: 0}),
        TimelineSample(1.0, {tl.PREFIX_QUERIES: 100, tl.PREFIX_HITS: 50}),
        TimelineSample(2.0, {tl.PREFIX_QUERIES: 100, tl.PREFIX_HITS: 50}),
        TimelineSample(3.0, {tl.PREFIX_QUERIES: 300, tl.PREFIX_HITS: 200}),
    ]
    assert figures.prefix_hit_rate_series(samples) == ([1.0, 3.0], [50.0, 75.0])


def test_run_menu_shows_exactly_one_runs_traces(tmp_path: Path) -> None:
    inputs = load_inputs([write_toy_run(tmp_path / "a", seed=1), write_toy_run(tmp_path / "b", seed=2)])
    fig = figures.request_timeline_figure(inputs.all_runs)
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["a (measured)", "b (measured)"]
    for button, run in zip(buttons, inputs.all_runs):
        shown = [trace for trace, visible in zip(fig.data, button.args[0]["visible"]) if visible]
        assert shown and all(run.label in trace.hovertemplate for trace in shown)
    assert [t.visible for t in fig.data] == list(buttons[0].args[0]["visible"])


def test_sim_timeline_shows_queueing_and_server_panels_follow_the_metrics(tmp_path: Path) -> None:
    inputs = load_inputs([write_toy_run(tmp_path / "sim", concurrency=16, source="sim")])
    phases = {trace.name for trace in figures.request_timeline_figure(inputs.all_runs).data}
    assert phases == {"queued", "prefill", "decode", "failed"}
    server = figures.server_timeline_figure(inputs.all_runs)
    titles = [a.text for a in server.layout.annotations]
    assert len(titles) == 4 and titles[0].startswith("Requests in the engine")
    for sample in inputs.runs[0].result.timeline:
        del sample.values[tl.PREEMPTIONS]
    fewer = figures.server_timeline_figure(inputs.all_runs)
    assert not any("Preemptions" in a.text for a in fewer.layout.annotations)


def test_cli_writes_the_report_or_says_why_not(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "r.html"
    ok = runner.invoke(app, ["report", str(write_toy_run(tmp_path / "run")), "-o", str(out)])
    assert ok.exit_code == 0, ok.output
    assert out.is_file()
    bad = runner.invoke(app, ["report", str(tmp_path / "nope"), "-o", str(tmp_path / "x.html")])
    assert bad.exit_code == 2
    assert "is not a directory" in " ".join(bad.output.split())


def test_diagnosis_findings_and_ceilings_show_where_diagnose_ran(tmp_path: Path) -> None:
    sweep = write_toy_sweep(tmp_path / "sweep", (1, 4))
    (sweep / "diagnosis.json").write_text(json.dumps(TOY_DIAGNOSIS))
    plain = write_toy_run(tmp_path / "plain")
    inputs = load_inputs([sweep, plain])
    page = render_report(inputs)
    assert _section_ids(page)[:3] == ["parameters", "summary", "diagnosis"]
    assert "max_num_seqs caps the batch while requests queue" in page
    assert "ceiling 8.00 req/s → 12.00 req/s (+50%)" in page
    lines = {(shape.xref, round(shape.y0, 1)) for shape in figures.sweep_throughput_figure(inputs.sweeps).layout.shapes}
    assert lines == {("x domain", 7135.0), ("x2 domain", 10.7), ("x2 domain", 8.4)}
    (plain / "diagnosis.json").write_text('{"findings": "none"}')
    with pytest.raises(ReportInputError, match="not a servelab diagnosis"):
        load_inputs([plain])


# --- tune and validate --------------------------------------------------------------------------

TUNE_ARGS = (
    "--gpu",
    "a100-80gb",
    "--model",
    "qwen2.5-7b",
    "--space",
    "max_num_seqs=8,64",
    "--space",
    "max_num_batched_tokens=2048,8192",
    "--sim-prompts",
    "40",
    "--random-input-len",
    "512",
    "--random-output-len",
    "64",
    "--goodput",
    "ttft:300",
)


@pytest.fixture(scope="module")
def tune_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real stage-1 study on the simulator (seconds), written by `servelab tune --report`."""
    out = tmp_path_factory.mktemp("tune") / "study"
    result = CliRunner().invoke(app, ["tune", *TUNE_ARGS, "--result-dir", str(out), "--report"])
    assert result.exit_code == 0, result.output
    return out


def _trace(fig, name: str):
    return next(t for t in fig.data if t.name == name)


def test_tune_study_shows_trials_front_baseline_and_recommendation(tune_dir: Path) -> None:
    assert _section_ids((tune_dir / "report.html").read_text()) == ["tune"]  # written by tune --report
    doc = json.loads((tune_dir / "tune.json").read_text())
    inputs = load_inputs([tune_dir])
    assert [t.label for t in inputs.tunes] == ["study"] and not inputs.tops
    fig = tune_results.pareto_figure(inputs.tunes[0])
    trials = {t["number"]: t["metrics"] for t in doc["trials"]}
    front = sorted(doc["pareto"]["trials"], key=lambda n: trials[n]["output_throughput"])
    line = _trace(fig, "Pareto front (no other trial is better on both)")
    assert list(line.x) == [trials[n]["output_throughput"] for n in front]
    assert list(line.y) == [trials[n]["p99_ttft_ms"] for n in front]
    placed = sum(len(t.x) for t in fig.data if t.name.startswith("trial, SLO"))
    assert placed == len(doc["trials"])
    base = _trace(fig, "baseline (current flags)")
    assert (base.x[0], base.y[0]) == (
        doc["baseline"]["metrics"]["output_throughput"],
        doc["baseline"]["metrics"]["p99_ttft_ms"],
    )
    rec = doc["recommendation"]
    star = _trace(fig, "recommended")
    assert star.x[0] == trials[int(rec["label"].removeprefix("trial-"))]["output_throughput"]
    assert (
        fig.layout.xaxis.title.text == "Output throughput (tokens/s)" and fig.layout.yaxis.title.text == "TTFT p99 (ms)"
    )
    page = render_report(inputs)
    ranked = re.findall(r'<tr><th scope="row">(max_num_seqs=[^<]+)</th><td>(\d+)</td><td>(\d+)</td>', page)
    assert [int(number) for _, _, number in ranked] == doc["ranking"]
    assert rec["engine_args"] in page and "Stage 2" not in page


def test_tune_stage2_measurements_sit_beside_their_predictions(tune_dir: Path, tmp_path: Path) -> None:
    doc = json.loads((tune_dir / "tune.json").read_text())
    best = doc["trials"][doc["ranking"][0]]
    results = [
        {
            "label": label,
            "params": trial["params"],
            "engine_args": trial["engine_args"],
            "launch_line": f"vllm serve m {trial['engine_args']}",
            "predicted": trial["metrics"],
            "predicted_score": trial["score"],
            "predicted_violation": 0.0,
            "measured": {k: v * 0.5 for k, v in trial["metrics"].items() if k != "intervals"},
            "measured_score": trial["score"] * 0.5,
            "measured_violation": 0.0,
            "error": None,
        }
        for label, trial in (("baseline", doc["baseline"]), (f"trial-{best['number']}", best))
    ]
    doc["stage2"] = {
        "server_cmd": "vllm serve m {engine_args}",
        "env": {},
        "top_k": 1,
        "configs": [],
        "results": results,
    }
    (tmp_path / "tune.json").write_text(json.dumps(doc))
    for r in results[
        :1
    ]:  # stage 2's bench run of the baseline, as tune/confirm writes it (no source, kind tune-stage2)
        run = write_toy_run(tmp_path / "stage2" / r["label"], source=None)
        info = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps({**info, "kind": "tune-stage2", "label": r["label"]}))
    inputs = load_inputs([tmp_path / "tune.json"])  # the file itself works as well as its directory
    assert inputs.tunes[0].label == tmp_path.name
    assert [r.label for r in inputs.runs] == [f"{tmp_path.name} · stage 2 baseline (measured)"]
    assert default_title(inputs) == f"servelab report: {tmp_path.name}"
    fig = tune_results.pareto_figure(inputs.tunes[0])
    measured = _trace(fig, "measured on the real server (stage 2)")
    assert list(measured.text) == ["baseline", f"trial-{best['number']}"]
    assert measured.x[1] == best["metrics"]["output_throughput"] * 0.5
    joins = _trace(fig, "predicted → measured")
    assert list(joins.x[:3]) == [doc["baseline"]["metrics"]["output_throughput"], measured.x[0], None]
    assert "Stage 2: measured on the real server vs. predicted" in render_report(inputs)


def test_a_tune_study_is_read_typed_so_a_misspelt_statistic_fails_and_a_wrong_one_is_refused_on_loading(
    tune_dir: Path, tmp_path: Path
) -> None:
    doc = json.loads((tune_dir / "tune.json").read_text())
    study = load_inputs([tune_dir]).tunes[0].tune
    assert study.baseline.metrics.statistic("p99_ttft_ms") == doc["baseline"]["metrics"]["p99_ttft_ms"]
    for misspelt in ("ttft_p99_ms", "p99_ttft", "engine_args"):
        with pytest.raises(AttributeError, match=misspelt):
            study.baseline.metrics.statistic(misspelt)
    (tmp_path / "tune.json").write_text(json.dumps(doc | {"search": {"sampler": "grid"}}))
    with pytest.raises(
        ReportInputError, match=r"tune.json is not a tune.json this servelab reads: \('search', 'space_size'\)"
    ):
        load_inputs([tmp_path])


def test_the_header_reads_run_json_typed_and_a_run_json_it_cannot_read_is_refused_naming_it(tmp_path: Path) -> None:
    run = tmp_path / "sim"
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--gpu",
            "a100-80gb",
            "--model",
            "qwen2.5-7b",
            "--random-input-len",
            "256",
            "--random-output-len",
            "32",
            "--num-prompts",
            "20",
            "--request-rate",
            "8",
            "--result-dir",
            str(run),
        ],
    )
    assert result.exit_code == 0, result.output
    [item] = load_inputs([run]).runs
    assert (
        headline(item)
        == f"Qwen2.5-7B on A100-80GB-SXM · random prompts of 256 → 32 tokens, poisson, 8.0 req/s, 20 requests · {run}"
    )
    info = json.loads((run / "run.json").read_text())
    info["workload"]["arrival"]["max_concurrency"] = "four"
    (run / "run.json").write_text(json.dumps(info))
    with pytest.raises(
        ReportInputError, match=r"sim/run.json is not one this servelab reads: workload.arrival.max_concurrency"
    ):
        load_inputs([run])


def test_the_warm_up_run_json_records_is_left_out_of_the_plots_and_of_a_partial_runs_summary(tmp_path: Path) -> None:
    """--warmup sits in run.json's plan (workload.amount.warmup): the latency plots count what summary.json
    counts, and a partial run's derived summary leaves the warm-up out as the run would have."""
    run = tmp_path / "warm"
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--gpu",
            "a100-80gb",
            "--model",
            "qwen2.5-7b",
            "--random-input-len",
            "256",
            "--random-output-len",
            "32",
            "--num-prompts",
            "40",
            "--request-rate",
            "8",
            "--warmup",
            "1",
            "--result-dir",
            str(run),
        ],
    )
    assert result.exit_code == 0, result.output
    [item] = load_inputs([run]).runs
    records = item.result.records
    assert item.info.workload.amount.warmup == 1.0 and any(r.send_time < 1.0 for r in records)
    assert len(figures._counted_ok(item)) == item.summary.completed < len(records)
    (run / "summary.json").unlink()
    [partial] = load_inputs([run]).runs
    assert partial.result.partial and partial.summary.completed == item.summary.completed
    assert len(figures._counted_ok(partial)) == item.summary.completed


def test_validation_overlays_measured_and_simulated_with_the_error(tmp_path: Path) -> None:
    doc = toy_validation()
    path = tmp_path / "validation.json"
    path.write_text(json.dumps(doc))
    inputs = load_inputs([path])
    page = render_report(inputs)
    assert _section_ids(page) == ["validation"]
    fig = validation_results.overlay_figure(inputs.validations[0])
    metrics = validation_results.metrics_of(inputs.validations[0].report)
    assert len(metrics) == 5 and len(fig.data) == 2 * len(metrics)
    for i, metric in enumerate(metrics):
        measured, simulated = fig.data[2 * i], fig.data[2 * i + 1]
        assert (measured.name, simulated.name) == ("measured", "simulated")
        assert list(measured.y) == [p["measured"][metric] for p in doc["points"]]
        assert list(simulated.y) == [p["simulated"][metric] for p in doc["points"]]
    ttft = fig.data[2 * metrics.index("median_ttft_ms") + 1]
    assert list(ttft.text) == ["-14%"] * 3  # the toy simulator is 14% fast on TTFT p50
    assert "median |error|" in page and "14.0% (bound 20%)" in page and "outside the bounds" in page


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"kind": "calibration"}', "neither a tune.json nor"),
        ('{"kind": "tune", "trials": [], "pareto": {}, "objective": {}}', "has no trials, pareto, objective"),
        ('{"kind": "servelab.validation", "points": [{"point": "a"}]}', "has no median_abs_error_pct"),
    ],
)
def test_documents_that_are_not_tune_or_validate_output_are_refused(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "doc.json"
    path.write_text(content)
    with pytest.raises(ReportInputError, match=message):
        load_inputs([path])


def test_header_says_what_each_input_ran(tmp_path: Path, tune_dir: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--gpu",
            "a100-80gb",
            "--model",
            "qwen2.5-7b",
            "--random-input-len",
            "300",
            "--random-output-len",
            "20",
            "--num-prompts",
            "8",
            "--sweep",
            "max-concurrency=1,2",
            "--result-dir",
            str(tmp_path / "sim"),
            "--report",
        ],
    )
    assert result.exit_code == 0, result.output
    header = (tmp_path / "sim" / "report.html").read_text().split("</header>")[0]
    assert (
        "Qwen2.5-7B on A100-80GB-SXM · random prompts of 300 → 20 tokens, 8 requests · sweep max-concurrency = 1, 2"
        in header
    )
    header = render_report(load_inputs([tmp_path / "sim", tune_dir])).split("</header>")[0]
    assert "<b>study</b>: tune of Qwen2.5-7B on A100-80GB-SXM for goodput, 4 configurations simulated" in header


def test_diagnose_report_draws_the_diagnosed_run_and_refuses_a_described_deployment(tmp_path: Path) -> None:
    deployment = ["--gpu", "a100-80gb", "--model", "qwen2.5-7b", "--engine-args", "--max-num-seqs 4"]
    run = tmp_path / "run"
    simulated = CliRunner().invoke(
        app,
        [
            "simulate",
            *deployment,
            "--random-input-len",
            "300",
            "--random-output-len",
            "20",
            "--num-prompts",
            "24",
            "--max-concurrency",
            "16",
            "--result-dir",
            str(run),
        ],
    )
    assert simulated.exit_code == 0, simulated.output
    diagnosed = CliRunner().invoke(app, ["diagnose", str(run), *deployment, "--report", "--json"])
    assert diagnosed.exit_code == 0, diagnosed.output
    page = (run / "report.html").read_text()
    assert _section_ids(page)[:3] == ["parameters", "summary", "diagnosis"]
    assert escape(json.loads((run / "diagnosis.json").read_text())["findings"][0]["title"]) in page
    refused = CliRunner().invoke(app, ["diagnose", "--report"])
    assert refused.exit_code == 2
    assert "--report draws a results directory" in " ".join(refused.output.split())


def test_server_timeline_never_draws_two_runs_alike(tmp_path: Path) -> None:
    """A measured and a simulated sweep's same point share a shade elsewhere; here dashes mean running/waiting."""
    measured = write_toy_sweep(tmp_path / "m", (1, 4), source="http")
    simulated = write_toy_sweep(tmp_path / "s", (1, 4), source="sim")
    inputs = load_inputs([measured, simulated])
    fig = figures.server_timeline_figure(inputs.all_runs)
    styles = {(t.line.color, t.line.dash, t.yaxis) for t in fig.data}
    assert len(styles) == len(fig.data)
    colors = {t.legendgroup: t.line.color for t in fig.data}
    assert len(set(colors.values())) == len(inputs.all_runs) == 4


def test_ttft_split_section_draws_each_sweep_points_split_in_sweep_order(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    simulated = CliRunner().invoke(
        app,
        [
            "simulate",
            "--gpu",
            "a100-80gb",
            "--model",
            "qwen2.5-7b",
            "--random-input-len",
            "1500",
            "--random-output-len",
            "50",
            "--num-prompts",
            "200",
            "--sweep",
            "request-rate=2,40",
            "--result-dir",
            str(out),
        ],
    )
    assert simulated.exit_code == 0, simulated.output
    inputs = load_inputs([out])
    page = render_report(inputs)
    assert "ttft" in _section_ids(page)
    splits = [(run, figures.run_ttft_split(run)) for run in inputs.all_runs]
    assert all(split is not None for _, split in splits)
    fig = figures.ttft_split_figure(splits)  # type: ignore[arg-type]
    assert [t.name for t in fig.data] == ["API server & network", "queued in the engine", "prefill"]
    assert list(fig.data[0].y) == [run.label for run, _ in splits]
    for position, (_, split) in enumerate(splits):
        stacked = sum(trace.x[position] for trace in fig.data)
        assert stacked == pytest.approx(1e3 * split.client_ttft_s, rel=1e-6)  # the parts tile the client's mean TTFT
    light, heavy = (split for _, split in splits)
    assert heavy.queue_s > light.queue_s  # past the A100's prefill capacity the queue is what grows


# --- compare ------------------------------------------------------------------------------------

COMPARE_ARGS = (
    "compare",
    "--gpu",
    "h100-sxm",
    "--model",
    "llama-3.1-8b",
    "--random-input-len",
    "600",
    "--random-output-len",
    "40",
    "--num-prompts",
    "20",
    "--sweep",
    "request-rate=4,inf",
    "--goodput",
    "ttft:2000",
)


@pytest.fixture(scope="module")
def compare_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real comparison of the three engines on the simulator (seconds), written by `servelab compare --out
    --report`."""
    out = tmp_path_factory.mktemp("compare") / "h100" / "compare.json"
    result = CliRunner().invoke(app, [*COMPARE_ARGS, "--out", str(out), "--report"])
    assert result.exit_code == 0, result.output
    return out.parent


def _plots(page: str) -> list[list[dict]]:
    """Each figure's traces as the page hands them to plotly.js, in page order."""
    decoder = json.JSONDecoder()
    found = []
    for match in re.finditer(r'Plotly\.newPlot\(\s*"plot-\d+",\s*', page):
        traces, _ = decoder.raw_decode(page, match.end())
        found.append(traces)
    return found


def test_compare_report_overlays_one_curve_per_engine_whose_points_are_the_jsons(compare_dir: Path) -> None:
    page = (compare_dir / "compare.html").read_text()  # written by compare --report, beside its JSON
    doc = EngineComparison.model_validate_json((compare_dir / "compare.json").read_text())
    assert _section_ids(page) == ["engines"]
    assert [item.comparison for item in load_inputs([compare_dir]).comparisons] == [
        doc
    ]  # a directory holding compare.json
    curves, goodput = _plots(page)
    for panel, axis in (("ttft", "x"), ("tpot", "x2"), ("e2el", "x3")):
        for stat in ("mean", "p99"):
            traces = [t for t in curves if t["xaxis"] == axis and t["name"].endswith(f" — {stat}")]
            assert [t["name"] for t in traces] == [f"{e.label} — {stat}" for e in doc.engines]
            for trace, engine in zip(traces, doc.engines):
                assert trace["x"] == [p.output_throughput for p in engine.points]
                assert trace["y"] == [getattr(p, f"{stat}_{panel}_ms") for p in engine.points]
                assert trace["customdata"] == ["request-rate=4", "request-rate=inf"]
    assert len(curves) == 6 * len(doc.engines) == 18
    assert [(t["name"], t["y"]) for t in goodput] == [
        (e.label, [p.request_goodput for p in e.points]) for e in doc.engines
    ]
    for line in doc.explanations:
        assert escape(line) in page
    for engine in doc.engines:
        assert f"<td>{engine.memory.sequences_fit:,} of 640 tokens</td>" in page
    header = page.split("</header>")[0]
    assert (
        "compare of Llama-3.1-8B on H100-SXM: vLLM, SGLang, TensorRT-LLM, 2 load points, 600 → 40 tokens per request"
        in header
    )


def test_a_compare_json_this_servelab_cannot_read_is_one_error_naming_the_file(
    compare_dir: Path, tmp_path: Path
) -> None:
    doc = json.loads((compare_dir / "compare.json").read_text())
    doc["engines"][1]["memory"]["sequences_fit"] = "many"
    bad = tmp_path / "cmp.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(
        ReportInputError,
        match=rf"{re.escape(str(bad))} is not a compare JSON this servelab reads: "
        r"\('engines', 1, 'memory', 'sequences_fit'\)",
    ):
        load_inputs([bad])
    (tmp_path / "compare.json").write_text(json.dumps({k: v for k, v in doc.items() if k != "kind"}))
    refused = CliRunner().invoke(app, ["report", str(tmp_path), "-o", str(tmp_path / "r.html")])
    assert refused.exit_code == 2 and not (tmp_path / "r.html").exists()
    assert (
        "compare.json is neither a tune.json nor a `servelab validate` report nor a `servelab compare` JSON (kind None)"
        in (" ".join(refused.output.split()))
    )


def test_compare_report_without_a_json_to_draw_is_refused_before_any_load(tmp_path: Path) -> None:
    for out in ([], ["--out", str(tmp_path / "c.html")]):
        refused = CliRunner().invoke(app, [*COMPARE_ARGS, *out, "--report"])
        assert refused.exit_code == 2
        assert "--report draws the comparison's JSON" in " ".join(refused.output.split())
    assert list(tmp_path.iterdir()) == []
