"""Prediction intervals: every simulated summary says how sure it is; a measured one says nothing of the kind."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab import api
from servelab.cli import app
from servelab.experiment.runner import point_summary
from servelab.metrics.intervals import (
    API_SERVER_BOUND_SHARE,
    MIN_RUNS,
    Limit,
    Regime,
    Residual,
    Tier,
    classify_limit,
    classify_regime,
    conformal_bounds,
    prediction_intervals,
    published_residuals,
)
from servelab.metrics.records import MemorySink, RequestRecord
from servelab.metrics.results import SUMMARY
from servelab.schemas.results import Summary
from servelab.metrics.summary import summarize
from servelab.targets.base import TargetRun
from servelab.targets.deployment import build_deployment
from servelab.workload.spec import LoadPlan, RequestSpec

runner = CliRunner()
A100 = ["--gpu", "a100-80gb", "--model", "qwen2.5-7b"]
SMALL = ["--random-input-len", "512", "--random-output-len", "32", "--num-prompts", "40"]


def assert_ordered(summary: dict) -> None:
    """Every interval holds its statistic, low <= value <= high, and the intervals' metrics are ones it predicted."""
    intervals = summary["intervals"]
    assert {"request_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms"} <= set(intervals)
    for key, (low, high) in intervals.items():
        assert 0 < low <= summary[key] <= high, (key, low, summary[key], high)
    Summary.model_validate_json(json.dumps(summary))  # the published schema's model


@pytest.mark.parametrize(
    ("arrival", "regime"),
    [
        (["--request-rate", "inf"], Regime.SATURATED),
        (["--request-rate", "2"], Regime.UNDER_CAPACITY),
        (["--max-concurrency", "1"], Regime.CONCURRENCY_1),
    ],
)
def test_simulate_writes_ordered_intervals_for_its_regime(tmp_path: Path, arrival: list[str], regime: Regime):
    out = tmp_path / "run"
    result = runner.invoke(app, ["simulate", *A100, *SMALL, *arrival, "--result-dir", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / SUMMARY).read_text())
    assert_ordered(summary)
    basis = summary["interval_basis"]
    assert basis["tier"] == Tier.SPECS_ONLY and basis["regime"] == regime and basis["limit"] == Limit.ENGINE
    low, high = summary["intervals"]["request_throughput"]
    assert f"80%: {low:.3g}–{high:.3g}" in result.output  # the terminal shows them beside the number


def test_the_python_api_summary_has_intervals(tmp_path: Path):
    run = api.simulate(
        "a100-80gb",
        "qwen2.5-7b",
        result_dir=tmp_path,
        input_len=256,
        output_len=32,
        request_rate=math.inf,
        num_prompts=30,
    )
    assert run.summary is not None and run.summary.intervals is not None
    assert run.summary.interval_basis is not None and run.summary.interval_basis.regime == Regime.SATURATED
    assert_ordered(run.summary.model_dump())


def test_a_sweep_gives_every_point_intervals(tmp_path: Path):
    out = tmp_path / "sweep"
    result = runner.invoke(
        app, ["simulate", *A100, *SMALL, "--sweep", "max-concurrency=1,32", "--result-dir", str(out)]
    )
    assert result.exit_code == 0, result.output
    index = json.loads((out / "sweep.json").read_text())
    for point in index["points"]:
        assert_ordered(point["summary"])


def test_a_measured_summary_has_no_intervals():
    """A target that is not the simulator (bench's HttpTarget reports no `simulated`): no intervals, no basis."""
    sink = MemorySink()
    plan = LoadPlan([RequestSpec(i, [1] * 64, 8, 0.0) for i in range(8)])
    build_deployment("a100-80gb", "qwen2.5-7b").sim_target().run(plan, sink)
    measured = point_summary(
        sink.records, TargetRun(duration=1.0, server_info={"model": "x"}), plan, None, (50, 99), False
    )
    assert measured.intervals is None and measured.interval_basis is None
    assert "intervals" not in measured.model_dump(exclude_unset=True)


def _record(i: int, send: float, scheduled: float, finish: float) -> RequestRecord:
    first = scheduled + 0.01
    return RequestRecord(
        index=i,
        intended_time=send,
        send_time=send,
        finish_time=finish,
        first_token_time=first,
        chunk_times=[first + 0.01 * k for k in range(10)],
        prompt_tokens=100,
        output_tokens=10,
        schedule_time=scheduled,
    )


def _classify(records: list[RequestRecord], cap: int | None) -> Regime:
    return classify_regime(records, cap, summarize(records).model_dump())


def test_regimes_of_clear_cases():
    one_at_a_time = [_record(i, i * 1.0, i * 1.0 + 0.005, i * 1.0 + 0.2) for i in range(10)]
    assert _classify(one_at_a_time, 1) == Regime.CONCURRENCY_1
    assert _classify(one_at_a_time[:1], None) == Regime.CONCURRENCY_1
    burst = [_record(i, 0.0, 0.005, 1.0 + i * 0.1) for i in range(20)]
    assert _classify(burst, None) == Regime.SATURATED
    light = [_record(i, i * 0.5, i * 0.5 + 0.005, i * 0.5 + 0.2) for i in range(40)]
    assert _classify(light, None) == Regime.UNDER_CAPACITY
    # offered 10 req/s, served one every 0.5 s: the queue grows through the run
    overloaded = [_record(i, i * 0.1, i * 0.5, i * 0.5 + 0.2) for i in range(40)]
    assert _classify(overloaded, None) == Regime.SATURATED
    # a closed loop of 8 whose requests each wait a second in the engine's queue: past the knee
    queued = [_record(i, i * 0.3, i * 0.3 + 1.0, i * 0.3 + 1.2) for i in range(40)]
    assert _classify(queued, 8) == Regime.SATURATED
    unqueued = [_record(i, i * 0.3, i * 0.3 + 0.005, i * 0.3 + 1.2) for i in range(40)]
    assert _classify(unqueued, 8) == Regime.UNDER_CAPACITY


def test_the_limit_is_the_api_server_when_its_core_is_busy_most_of_the_run():
    assert classify_limit({"api_server_busy_share": API_SERVER_BOUND_SHARE}) == Limit.API_SERVER
    assert classify_limit({"api_server_busy_share": 0.75}) == Limit.ENGINE
    assert classify_limit({}) == Limit.ENGINE  # no API server modelled: nothing but the engine


def _rows(values: list[float], source: str = "s") -> list[Residual]:
    return [Residual(f"{source}-{i}", source, v) for i, v in enumerate(values)]


def _engine(cells: dict) -> dict:
    """Every regime's metrics filed under the engine's limit."""
    return {regime: {Limit.ENGINE: metrics} for regime, metrics in cells.items()}


def test_a_thin_cell_pools_with_its_neighbour_and_says_so():
    thin = _rows([0.1, 0.2])
    table = {
        Tier.SPECS_ONLY: _engine(
            {
                Regime.SATURATED: {"request_throughput": thin},
                Regime.UNDER_CAPACITY: {"request_throughput": _rows([0.0] * MIN_RUNS, "t")},
            }
        )
    }
    out = prediction_intervals({"request_throughput": 10.0}, Tier.SPECS_ONLY, Regime.SATURATED, Limit.ENGINE, table)
    low, high = out["intervals"]["request_throughput"]
    assert low == pytest.approx(10.0) and high == pytest.approx(10.0 * math.exp(0.2))
    assert out["interval_basis"]["notes"] == [
        f"request_throughput: {MIN_RUNS + 2} runs from 2 sources, pooled from saturated engine, under_capacity engine"
    ]


def test_an_engine_bound_prediction_leaves_out_the_api_server_bound_runs_of_its_regime():
    """The API server's misses (its host's CPU) are wide; a run the GPU limits has enough runs of its own."""
    table = {
        Tier.SPECS_ONLY: {
            Regime.SATURATED: {
                Limit.ENGINE: {"request_throughput": _rows([0.1] * 4, "a") + _rows([-0.1] * 4, "b")},
                Limit.API_SERVER: {"request_throughput": _rows([0.6] * 6, "c")},
            }
        }
    }
    engine = prediction_intervals({"request_throughput": 10.0}, Tier.SPECS_ONLY, Regime.SATURATED, Limit.ENGINE, table)
    assert engine["intervals"]["request_throughput"] == pytest.approx([10.0 * math.exp(-0.1), 10.0 * math.exp(0.1)])
    assert engine["interval_basis"]["notes"] == [] and engine["interval_basis"]["limit"] == Limit.ENGINE
    # one publisher's API-bound runs are thin: they pool with their regime's engine-bound runs, and say so
    api = prediction_intervals({"request_throughput": 10.0}, Tier.SPECS_ONLY, Regime.SATURATED, Limit.API_SERVER, table)
    assert api["intervals"]["request_throughput"] == pytest.approx([10.0 * math.exp(-0.1), 10.0 * math.exp(0.6)])
    assert api["interval_basis"]["notes"] == [
        "request_throughput: 14 runs from 3 sources, pooled from saturated api_server, saturated engine"
    ]


def test_a_cell_from_one_publisher_pools_with_its_sibling_metric_before_other_regimes():
    """Many runs of one host are still one host: the ITL cell pools, and first with TPOT in its own regime (the same
    quantity counted another way), not with ITL under another load."""
    one_host = _rows([0.3] * (MIN_RUNS + 4), "host-a")
    table = {
        Tier.SPECS_ONLY: _engine(
            {
                Regime.SATURATED: {"mean_itl_ms": one_host, "mean_tpot_ms": _rows([-0.2, 0.1], "host-b")},
                Regime.UNDER_CAPACITY: {"mean_itl_ms": _rows([5.0] * MIN_RUNS, "host-c")},
            }
        )
    }
    out = prediction_intervals({"mean_itl_ms": 10.0}, Tier.SPECS_ONLY, Regime.SATURATED, Limit.ENGINE, table)
    low, high = out["intervals"]["mean_itl_ms"]
    assert low == pytest.approx(10.0 * math.exp(-0.2)) and high == pytest.approx(10.0 * math.exp(0.3))
    assert out["interval_basis"]["notes"] == [
        f"mean_itl_ms: {MIN_RUNS + 6} runs from 2 sources, pooled from saturated engine, saturated engine mean_tpot_ms"
    ]


def test_a_cell_from_enough_publishers_stays_its_own():
    rows = _rows([0.1] * (MIN_RUNS // 2), "host-a") + _rows([0.2] * (MIN_RUNS // 2), "host-b")
    table = {
        Tier.SPECS_ONLY: _engine({Regime.SATURATED: {"mean_itl_ms": rows, "mean_tpot_ms": _rows([-3.0] * 4, "c")}})
    }
    out = prediction_intervals({"mean_itl_ms": 10.0}, Tier.SPECS_ONLY, Regime.SATURATED, Limit.ENGINE, table)
    assert out["interval_basis"]["notes"] == []
    assert out["intervals"]["mean_itl_ms"] == pytest.approx([10.0, 10.0 * math.exp(0.2)])


def test_a_tier_without_residuals_borrows_specs_only_and_says_so():
    table = {
        Tier.SPECS_ONLY: _engine({Regime.SATURATED: {"mean_tpot_ms": _rows([-0.1 + 0.02 * i for i in range(12)])}})
    }
    summary = {"mean_tpot_ms": 20.0, "completed": 5}
    out = prediction_intervals(summary, Tier.CALIBRATED_LIVE, Regime.SATURATED, Limit.ENGINE, table)
    assert set(out["intervals"]) == {"mean_tpot_ms"}
    assert out["interval_basis"]["residuals_tier"] == Tier.SPECS_ONLY
    assert any("no residuals for tier calibrated_live" in n for n in out["interval_basis"]["notes"])


def test_conformal_bounds_are_order_statistics_that_hold_the_prediction():
    values = [0.1 * i for i in range(1, 20)]  # 19 residuals, all above 0
    low, high = conformal_bounds(values)
    assert low == 0.0  # widened to hold the prediction itself
    assert high == pytest.approx(values[17])  # ceil(20 * 0.9) = 18th smallest
    assert conformal_bounds([-0.5, 0.5]) == (-0.5, 0.5)  # too few for 80%: the extremes


def test_the_published_residuals_name_their_runs_and_sources():
    table = published_residuals()
    rows = [
        r
        for regimes in table.values()
        for limits in regimes.values()
        for metrics in limits.values()
        for rs in metrics.values()
        for r in rs
    ]
    assert rows and all(r.run and r.source and math.isfinite(r.value) for r in rows)
    assert {limit for regimes in table.values() for limits in regimes.values() for limit in limits} <= set(Limit)
    assert not any(r.source == "staru09/llm_infra_bench" for r in rows)  # a constant was read off that source


@pytest.mark.slow
def test_compare_tune_and_diagnose_show_their_predictions_intervals(tmp_path: Path):
    h100 = ["--gpu", "h100-sxm", "--model", "llama-3.1-8b"]
    small = ["--random-input-len", "600", "--random-output-len", "40", "--num-prompts", "30"]
    wide = {"COLUMNS": "400"}
    out = tmp_path / "compare.json"
    compared = runner.invoke(
        app, ["compare", *h100, *small, "--sweep", "request-rate=2,inf", "--out", str(out)], env=wide
    )
    assert compared.exit_code == 0, compared.output
    points = [p for e in json.loads(out.read_text())["engines"] for p in e["points"]]
    assert all(
        p["intervals"]["request_throughput"][0] <= p["request_throughput"] <= p["intervals"]["request_throughput"][1]
        for p in points
    )
    assert "80%: " in compared.output

    tuned = runner.invoke(
        app,
        [
            "tune",
            *h100,
            "--space",
            "max_num_seqs=8,32",
            "--random-input-len",
            "256",
            "--random-output-len",
            "32",
            "--goodput",
            "ttft:2000",
            "--sim-prompts",
            "40",
            "--result-dir",
            str(tmp_path / "tune"),
        ],
        env=wide,
    )
    assert tuned.exit_code == 0, tuned.output
    doc = json.loads((tmp_path / "tune" / "tune.json").read_text())
    for trial in doc["trials"]:
        low, high = trial["metrics"]["intervals"]["request_throughput"]
        assert low <= trial["metrics"]["request_throughput"] <= high
    assert "80%: " in tuned.output

    diagnosed = runner.invoke(app, ["diagnose", "--json"], env=wide)
    assert diagnosed.exit_code == 0, diagnosed.output
    ceilings = json.loads(diagnosed.output)["ceilings"]
    low, high = ceilings["saturation_rps_interval"]
    assert low <= ceilings["saturation_rps"] <= high
    assert "80%: " in runner.invoke(app, ["diagnose"], env=wide).output


def test_the_html_report_shows_a_simulated_runs_intervals(tmp_path: Path):
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["simulate", *A100, *SMALL, "--request-rate", "4", "--result-dir", str(out), "--report"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / SUMMARY).read_text())
    low, high = summary["intervals"]["request_throughput"]
    html = (out / "report.html").read_text()
    assert f"{summary['request_throughput']:.2f}, 80%: {low:.3g}–{high:.3g}" in html
