"""`calibrate --from` without a server: each reader on its fixture, each refusal, the fit on runs the simulator made.

The fixtures (tests/fixtures/results, README there): a servelab results
directory and `vllm bench serve --save-result` JSONs (with and without
--save-detailed) measured on the vLLM CPU server with the tiny model; a
GuideLLM benchmarks JSON and an AIPerf profile export built from those
projects' schemas (their tools are not installed here). The real-server
path is tests/test_calibrate_from_vllm.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.calibrate.request import CalibrateRequest
from servelab.cli import app
from servelab.errors import InputError
from servelab.calibrate.calibrate_from import (
    CalibrateFromError,
    Environment,
    fit_from_runs,
    simulated,
)
from servelab.targets.profile import profile_deployment, with_environment
from servelab.calibrate.validate import speed_warnings
from servelab.metrics.imports import (
    MeasuredRun,
    ResultFormat,
    ResultImportError,
    WorkloadFlags,
    read_measured_runs,
)
from servelab.metrics.results import load_run
from servelab.perf.calibration import load_profile
from servelab.schemas.profile import MAX_REFERENCE_SPREAD_PCT, CalibrationOrigin, ReferenceTiming, reference_too_wide
from servelab.targets.deployment import build_deployment
from servelab.workload.spec import RequestSpec

FIXTURES = Path(__file__).parent / "fixtures" / "results"
GUIDELLM = FIXTURES / "guidellm-benchmarks.json"
AIPERF = FIXTURES / "aiperf-profile_export_aiperf.json"
VLLM_DETAILED = FIXTURES / "vllm-bench-detailed.json"
VLLM_AGGREGATE = FIXTURES / "vllm-bench.json"
SERVELAB_RUN = FIXTURES / "servelab-closed-c4"
runner = CliRunner()


def _cli(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "250"})


# -- readers ----------------------------------------------------------------------------------------------------------


def test_servelab_directory_gives_every_completed_request_and_the_summary() -> None:
    (run,) = read_measured_runs(SERVELAB_RUN)
    summary = json.loads((SERVELAB_RUN / "summary.json").read_text())
    records = [json.loads(line) for line in (SERVELAB_RUN / "records.jsonl").read_text().splitlines()]
    assert run.format == ResultFormat.SERVELAB and run.lengths_from == "file"
    assert len(run.requests) == summary["completed"] == len(records)
    assert sorted(r.prompt_len for r in run.requests) == sorted(r["prompt_tokens"] for r in records)
    assert run.max_concurrency == 4 and run.burst
    assert run.measured["mean_ttft_ms"] == pytest.approx(summary["mean_ttft_ms"])


def test_vllm_detailed_json_lists_every_request_and_inf_means_a_burst() -> None:
    data = json.loads(VLLM_DETAILED.read_text())
    (run,) = read_measured_runs(VLLM_DETAILED)
    assert run.format == ResultFormat.VLLM_BENCH and run.lengths_from == "file"
    assert [r.prompt_len for r in run.requests] == data["input_lens"]
    assert [r.max_tokens for r in run.requests] == data["output_lens"]
    assert data["request_rate"] == "inf" and run.burst and run.max_concurrency == data["max_concurrency"]
    for key in ("request_throughput", "mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "duration"):
        assert run.measured[key] == pytest.approx(data[key])


def test_vllm_aggregate_json_takes_its_lengths_from_its_totals() -> None:
    data = json.loads(VLLM_AGGREGATE.read_text())
    assert "input_lens" not in data  # as vLLM writes it without --save-detailed
    (run,) = read_measured_runs(VLLM_AGGREGATE)
    assert run.lengths_from == "file totals" and len(run.requests) == data["num_prompts"]
    assert sum(r.prompt_len for r in run.requests) == pytest.approx(data["total_input_tokens"], rel=0.02)


def test_vllm_aggregate_json_takes_the_workload_flags_that_agree_with_it() -> None:
    data = json.loads(VLLM_AGGREGATE.read_text())
    mean_in = round(data["total_input_tokens"] / data["completed"])
    (run,) = read_measured_runs(
        VLLM_AGGREGATE, WorkloadFlags(random_input_len=mean_in, num_prompts=data["num_prompts"])
    )
    assert run.lengths_from == "flags" and {r.prompt_len for r in run.requests} == {mean_in}


def test_guidellm_report_is_one_run_per_benchmark_with_its_strategy() -> None:
    closed, constant = read_measured_runs(GUIDELLM)
    assert closed.format == ResultFormat.GUIDELLM and closed.source.endswith("#benchmark0")
    assert closed.max_concurrency == 4 and closed.burst and len(closed.requests) == 32
    assert {r.prompt_len for r in closed.requests} == {128} and {r.max_tokens for r in closed.requests} == {64}
    assert closed.measured["mean_e2el_ms"] == pytest.approx(1500.0)  # GuideLLM's request latency is in seconds
    assert closed.measured["mean_tpot_ms"] == pytest.approx(22.0) and closed.measured["duration"] == pytest.approx(12.5)
    assert constant.max_concurrency is None and not constant.burst
    gaps = [b.arrival_time - a.arrival_time for a, b in zip(constant.requests, constant.requests[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(0.5, rel=0.5)  # 2 req/s


def test_aiperf_export_reads_its_aggregates_and_input_config() -> None:
    (run,) = read_measured_runs(AIPERF)
    assert run.format == ResultFormat.AIPERF and run.max_concurrency == 4 and len(run.requests) == 32
    assert run.measured["mean_tpot_ms"] == pytest.approx(23.6)  # AIPerf's inter_token_latency is vLLM's TPOT
    assert run.measured["median_ttft_ms"] == pytest.approx(98.0) and run.measured[
        "request_throughput"
    ] == pytest.approx(2.4)


# -- refusals, each naming its input, before any fitting
# ----------------------------------------------------------------


@pytest.mark.parametrize("content", ["not json at all", json.dumps({"hello": 1}), json.dumps([1, 2])])
def test_an_unknown_file_is_refused_naming_it(tmp_path: Path, content: str) -> None:
    path = tmp_path / "mystery.json"
    path.write_text(content)
    with pytest.raises(ResultImportError, match="mystery.json"):
        read_measured_runs(path)


def test_an_unreadable_file_and_a_plain_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ResultImportError, match="absent.json"):
        read_measured_runs(tmp_path / "absent.json")
    with pytest.raises(ResultImportError, match="no run.json"):
        read_measured_runs(tmp_path)


def test_a_result_with_no_completed_requests_is_refused(tmp_path: Path) -> None:
    data = json.loads(VLLM_AGGREGATE.read_text()) | {"completed": 0}
    path = tmp_path / "empty.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ResultImportError, match="empty.json has no completed requests"):
        read_measured_runs(path)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (WorkloadFlags(num_prompts=7), "--num-prompts 7"),
        (WorkloadFlags(max_concurrency=64), "--max-concurrency 64"),
        (WorkloadFlags(request_rate=3.0), "--request-rate 3"),
        (WorkloadFlags(random_input_len=4000), "--random-input-len 4000"),
    ],
)
def test_a_flag_that_contradicts_the_file_is_refused_naming_both(flags: WorkloadFlags, named: str) -> None:
    with pytest.raises(ResultImportError, match=named) as caught:
        read_measured_runs(VLLM_AGGREGATE, flags)
    assert "vllm-bench.json" in str(caught.value)


def test_workload_flags_beside_a_file_that_lists_every_request_are_refused() -> None:
    with pytest.raises(ResultImportError, match="twice"):
        read_measured_runs(VLLM_DETAILED, WorkloadFlags(random_input_len=128))
    with pytest.raises(ResultImportError, match="twice"):
        read_measured_runs(SERVELAB_RUN, WorkloadFlags(num_prompts=32))


def test_a_deployment_that_cannot_have_produced_the_run_is_refused(tmp_path: Path) -> None:
    result = _cli(
        "calibrate",
        "--from",
        str(VLLM_AGGREGATE),
        "--gpu",
        "l4",
        "--model",
        "llama-3.1-70b",
        "-o",
        str(tmp_path / "p.json"),
    )
    assert result.exit_code == 2 and "cannot have produced" in result.output and "vllm-bench.json" in result.output
    (run,) = read_measured_runs(VLLM_AGGREGATE)
    short = build_deployment("h100-sxm", "qwen2.5-7b", "--max-model-len 64")
    with pytest.raises(CalibrateFromError, match="max_model_len 64"):
        fit_from_runs([run], short)
    assert not (tmp_path / "p.json").exists()


def test_an_existing_profile_is_not_overwritten_unless_asked(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    out.write_text("mine")
    args = ("calibrate", "--from", str(AIPERF), "--gpu", "h100-sxm", "--model", "qwen2.5-7b", "-o", str(out))
    result = _cli(*args)
    assert result.exit_code == 2 and "--overwrite" in result.output and out.read_text() == "mine"
    assert _cli(*args, "--overwrite").exit_code == 0
    assert load_profile(out).origin == CalibrationOrigin.RUNS


@pytest.mark.parametrize("extra", [[], ["--base-url", "http://127.0.0.1:9", "--from", str(AIPERF)]])
def test_calibrate_needs_exactly_one_of_a_server_and_results(tmp_path: Path, extra: list[str]) -> None:
    result = _cli("calibrate", "--gpu", "cpu", "--model", "qwen2.5-7b", "-o", str(tmp_path / "p.json"), *extra)
    assert result.exit_code == 2 and "--base-url" in result.output and "--from" in result.output


def test_load_flags_that_do_not_describe_a_workload_are_refused(tmp_path: Path) -> None:
    result = _cli(
        "calibrate",
        "--from",
        str(AIPERF),
        "--gpu",
        "h100-sxm",
        "--model",
        "qwen2.5-7b",
        "-o",
        str(tmp_path / "p.json"),
        "--sweep",
        "request-rate=1,2",
    )
    assert result.exit_code == 2 and "--sweep does not apply" in result.output


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            {"base_url": "http://127.0.0.1:9", "vllm_version": "0.11.0"},
            "--vllm-version describes the runs of calibrate --from",
        ),
        ({"base_url": "http://127.0.0.1:9", "budget_s": 5.0}, "too small"),
        ({}, "one of them"),
    ],
)
def test_the_request_refuses_what_the_cli_refuses_before_any_work(tmp_path: Path, given: dict, message: str) -> None:
    """One request for the CLI and the Python API: its refusals come on construction, before a probe or a file read."""
    with pytest.raises(InputError, match=message):
        CalibrateRequest("cpu", "qwen2.5-7b", tmp_path / "p.json", **given)


def test_a_live_calibrate_refuses_workload_flags_naming_them(tmp_path: Path) -> None:
    result = _cli(
        "calibrate",
        "--base-url",
        "http://127.0.0.1:9",
        "--gpu",
        "cpu",
        "--model",
        "qwen2.5-7b",
        "-o",
        str(tmp_path / "p.json"),
        "--num-prompts",
        "10",
    )
    assert result.exit_code == 2 and "--num-prompts does not apply to calibrate --base-url" in result.output


# -- the fit ----------------------------------------------------------------------------------------------------------


def _synthetic_run(deployment, prompt: int, output: int, n: int, concurrency: int | None, name: str) -> MeasuredRun:
    """A run the simulator measured on `deployment`: the fit's ground truth is then known exactly."""
    import numpy as np

    rng = np.random.default_rng(n)
    requests = tuple(RequestSpec(i, rng.integers(0, 30_000, prompt), output) for i in range(n))
    run = MeasuredRun(name, ResultFormat.SERVELAB, requests, concurrency, {}, "file")
    measured = {k: v for k, v in simulated(deployment, run).items() if v is not None}
    return MeasuredRun(name, ResultFormat.SERVELAB, requests, concurrency, {**measured, "completed": n}, "file")


@pytest.mark.slow
def test_the_fit_recovers_an_environment_the_simulator_measured() -> None:
    """Three runs that each lean on other parameters: long prompts at once (compute), one request at a time (memory
    bandwidth, the outside time), hundreds of tiny requests at once (the API server). The engine core's CPU costs
    hide under an H100's GPU time (async scheduling overlaps them): that one is left at its specs-only value."""
    specs = build_deployment("h100-sxm", "qwen2.5-7b")
    truth = Environment(
        compute_scale=0.55, memory_scale=0.8, engine_cpu_factor=1.0, api_cpu_factor=1.6, outside_engine_s=0.04
    )
    host = with_environment(specs, truth)
    runs = [
        _synthetic_run(host, 2048, 64, 96, None, "long-prompt burst"),
        _synthetic_run(host, 64, 128, 8, 1, "one at a time"),
        _synthetic_run(host, 128, 4, 600, None, "many tiny requests at once"),
    ]
    env = fit_from_runs(runs, specs, max_evaluations=40).environment
    assert env is not None and env.unconstrained == ["engine_cpu_factor"]
    assert env.compute_scale == pytest.approx(truth.compute_scale, rel=0.1)
    assert env.memory_scale == pytest.approx(truth.memory_scale, rel=0.1)
    assert env.api_cpu_factor == pytest.approx(truth.api_cpu_factor, rel=0.1)
    assert env.outside_engine_s == pytest.approx(truth.outside_engine_s, abs=0.005)
    for run in env.runs:
        for key in ("request_throughput", "mean_ttft_ms"):
            m = run.metrics[key]
            assert abs(m.fitted_error_pct) < 5 < abs(m.specs_only_error_pct), (run.source, key)


def test_a_parameter_the_runs_cannot_move_keeps_its_specs_only_value() -> None:
    specs = build_deployment("h100-sxm", "qwen2.5-7b")
    host = with_environment(specs, Environment(0.5, 0.9, 1.0, 1.0, 0.0))
    decode_only = _synthetic_run(host, 8, 200, 4, 1, "one request at a time, tiny prompts")
    env = fit_from_runs([decode_only], specs, max_evaluations=20).environment
    assert env is not None and "compute_scale" in env.unconstrained
    assert env.compute_scale == env.specs_only["compute_scale"] == 1.0
    assert env.sensitivity["compute_scale"] < 0.02 <= env.sensitivity["memory_scale"]


@pytest.mark.slow
def test_the_cli_prints_the_fit_and_its_residuals_and_the_profile_predicts_another_model(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    result = _cli("calibrate", "--from", str(GUIDELLM), "--gpu", "h100-sxm", "--model", "qwen2.5-7b", "-o", str(out))
    assert result.exit_code == 0, result.output
    for words in (
        "measured / fitted / specs-only",
        "#benchmark0",
        "#benchmark1",
        "GPU compute",
        "CPU-side costs",
        "time outside the engine",
        "mean_ttft_ms",
        "profile written",
    ):
        assert words in result.output, words
    profile = load_profile(out)
    assert profile.environment is not None and len(profile.environment.runs) == 2
    assert profile.server["from_runs"][0].endswith("#benchmark0")
    results = {}
    for model in ("qwen2.5-7b", "llama-3.1-8b"):
        args = [
            "--calibration",
            str(out),
            "--num-prompts",
            "20",
            "--random-input-len",
            "256",
            "--json",
            "--result-dir",
            str(tmp_path / model),
        ]
        sim = _cli("simulate", *args, *(["--model", model] if model != "qwen2.5-7b" else []))
        assert sim.exit_code == 0, sim.output
        results[model] = json.loads(sim.stdout[sim.stdout.index("{") :])
        assert all(
            math.isfinite(results[model][k]) and results[model][k] > 0
            for k in ("request_throughput", "mean_ttft_ms", "mean_tpot_ms")
        )
    assert results["llama-3.1-8b"]["mean_tpot_ms"] != results["qwen2.5-7b"]["mean_tpot_ms"]
    other = profile_deployment(profile, model=build_deployment("h100-sxm", "llama-3.1-8b").model)
    assert other.model.name != profile.model_spec["name"] and other.hardware == profile_deployment(profile).hardware


# -- a reference timing too noisy to judge by -------------------------------------------------------------------------


def _reference(*runs_ms: float) -> ReferenceTiming:
    return ReferenceTiming(workload="reference-b4-p16-o64", runs_ms=list(runs_ms))


def test_a_reference_spread_wider_than_the_limit_is_too_wide_to_judge_by() -> None:
    assert reference_too_wide(_reference(9.0, 10.0, 11.0)) is None  # 10%
    edge = 10.0 * MAX_REFERENCE_SPREAD_PCT / 100
    assert reference_too_wide(_reference(10.0 - edge, 10.0, 10.0 + edge)) is None
    why = reference_too_wide(_reference(5.7, 12.0, 30.0))
    assert why is not None and "5.7-30.0 ms" in why


def test_validate_says_when_the_profiles_own_reference_is_too_wide() -> None:
    wide = _reference(5.7, 12.0, 30.0)
    warnings = speed_warnings(
        wide, [("before repeat 1", _reference(10.0, 10.2, 10.4))], [wide.speed_change(_reference(10.0, 10.2, 10.4))]
    )
    assert any("unreliable" in w and "no round can be" in w for w in warnings), warnings
    steady = _reference(10.0, 10.1, 10.2)
    assert not any("unreliable" in w for w in speed_warnings(steady, [("x", steady)], [steady.speed_change(steady)]))


def test_live_calibrate_on_a_noisy_host_writes_the_profile_marked_unreliable_and_exits_3(
    tmp_path: Path, monkeypatch
) -> None:
    from servelab.calibrate import calibrate as experiment_calibrate
    from support.profiles import tiny_profile

    noisy = load_profile(tiny_profile(tmp_path / "src")).model_copy(
        update={
            "reference": _reference(5.7, 12.0, 30.0),
            "rates": {
                k: 1e-3
                for k in (
                    "step_overhead_s",
                    "per_request_overhead_s",
                    "prefill_step_overhead_s",
                    "idle_wake_s",
                    "idle_wake_time_constant_s",
                )
            }
            | {"linear_flops": 1e9, "attention_flops": 1e9},
            "fit": {"rms_rel_error": 0.05},
        }
    )

    def fake_probing(request, progress):  # the probing is what cannot be noisy on demand here
        noisy.save(request.out)
        return noisy

    monkeypatch.setattr(experiment_calibrate, "probe_server", fake_probing)
    out = tmp_path / "p.json"
    result = _cli(
        "calibrate", "--base-url", "http://127.0.0.1:9", "--gpu", "cpu", "--model", "qwen2.5-7b", "-o", str(out)
    )
    assert result.exit_code == 3, result.output
    assert "unreliable" in result.output and "5.7-30.0 ms" in result.output and out.exists()
    assert load_profile(out).unreliable is not None


def test_the_servelab_fixture_was_measured_not_simulated() -> None:
    run_info = load_run(SERVELAB_RUN).run_info
    assert run_info.verb == "bench" and run_info.source != "sim"


def test_a_servelab_sweep_is_one_measured_run_per_point(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    result = _cli(
        "simulate",
        "--gpu",
        "h100-sxm",
        "--model",
        "qwen2.5-7b",
        "--num-prompts",
        "12",
        "--random-input-len",
        "64",
        "--random-output-len",
        "16",
        "--sweep",
        "max-concurrency=1,4",
        "--result-dir",
        str(sweep),
    )
    assert result.exit_code == 0, result.output
    runs = read_measured_runs(sweep)
    assert [r.max_concurrency for r in runs] == [1, 4] and all(len(r.requests) == 12 and r.burst for r in runs)


def test_the_python_api_calibrates_from_the_same_files(tmp_path: Path) -> None:
    import servelab

    profile = servelab.calibrate_from(VLLM_DETAILED, "h100-sxm", "qwen2.5-7b", out=tmp_path / "p.json")
    assert (
        profile.origin == CalibrationOrigin.RUNS
        and load_profile(tmp_path / "p.json").environment == profile.environment
    )


def test_the_profile_keeps_the_servers_flags_as_given() -> None:
    (run,) = read_measured_runs(VLLM_DETAILED)
    args = "--max-model-len 4096 --max-num-seqs 32 --block-size 128 --kv-cache-memory-bytes 1073741824"
    specs = build_deployment("cpu", "qwen3-0.6b", args)
    profile = fit_from_runs([run], specs, engine_args=args, max_evaluations=5)
    again = profile_deployment(profile)
    assert profile.engine_args == args and again.memory.num_blocks == specs.memory.num_blocks


def test_guidellm_requests_listed_in_the_report_give_their_own_lengths(tmp_path: Path) -> None:
    data = json.loads(GUIDELLM.read_text())
    data["benchmarks"] = data["benchmarks"][1:]  # the constant-rate one
    data["benchmarks"][0]["requests"]["successful"] = [  # GenerativeRequestStats' computed token counts and start
        {
            "type_": "generative_request_stats",
            "request_id": str(i),
            "prompt_tokens": 100 + i,
            "output_tokens": 20 + i,
            "request_start_time": 1764892800.0 + 0.5 * i,
        }
        for i in range(6)
    ]
    path = tmp_path / "guidellm.json"
    path.write_text(json.dumps(data))
    (run,) = read_measured_runs(path)
    assert run.lengths_from == "file" and [r.prompt_len for r in run.requests] == [100 + i for i in range(6)]
    assert [r.arrival_time for r in run.requests] == pytest.approx([0.5 * i for i in range(6)])
