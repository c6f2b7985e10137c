"""The Python API: the CLI's results directories and typed results, from a function call."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import servelab
from servelab.schemas.diagnosis import Diagnosis
from servelab.errors import InputError
from support.schemas import assert_files_match_schemas


def test_simulate_diagnose_and_load_as_dataframes(tmp_path: Path) -> None:
    run = servelab.simulate(
        "a100-80gb",
        "qwen2.5-7b",
        input_len=512,
        output_len=32,
        request_rate=8,
        num_prompts=60,
        goodput={"ttft": 200, "tpot": 50},
        result_dir=tmp_path / "run",
    )
    assert run.run_info.source == "sim" and run.run_info.deployment is not None
    assert run.summary is not None and run.summary.completed == 60 and run.summary.request_goodput is not None
    assert run.summary.p99_ttft_ms >= run.summary.median_ttft_ms > 0  # percentile keys are attributes too
    assert assert_files_match_schemas(tmp_path) == {"run": 1, "summary": 1, "record": 1, "timeline": 1}

    records = run.records()
    assert len(records) == 60 and (records["prompt_tokens"] == 512).all() and (records["ttft_s"] > 0).all()
    assert math.isclose(records["ttft_s"].median() * 1e3, run.summary.median_ttft_ms, rel_tol=1e-9)
    timeline = run.timeline()
    assert "t" in timeline and "vllm:num_requests_running" in timeline and len(timeline) >= 2

    again = servelab.load_results(tmp_path / "run")
    assert again.summary == run.summary and len(again.records()) == 60


def test_simulate_a_fleet_behind_a_weighted_router(tmp_path: Path) -> None:
    """A fleet from Python as from the CLI: replicas behind llm-d's scorers with the weights given, recorded in
    run.json, and refused with the CLI's error when the weights are wrong."""
    weights = "prefix=2,queue=0,kv=1,active=1,active_until=headers"
    run = servelab.simulate(
        "h100",
        "llama-3.1-8b",
        input_len=256,
        output_len=16,
        num_prompts=8,
        replicas=2,
        router="prefix-aware",
        router_weights=weights,
        result_dir=tmp_path / "fleet",
    )
    info = run.run_info.model_dump()
    assert info["flags"]["router"] == "prefix-aware" and info["flags"]["router_weights"] == weights
    assert len(info["server_info"]["replicas"]) == 2
    with pytest.raises(InputError, match="--router-weights .kv=x."):
        servelab.simulate(
            "h100",
            "llama-3.1-8b",
            replicas=2,
            router="prefix-aware",
            router_weights="kv=x",
            result_dir=tmp_path / "bad",
        )
    assert not (tmp_path / "bad" / "run.json").exists()

    dx = servelab.diagnosis(run, "a100-80gb", "qwen2.5-7b")
    assert isinstance(dx, Diagnosis) and dx.findings and dx.bottleneck == dx.findings[0].kind
    assert dx.ceilings.saturation_rps is not None and dx.ceilings.saturation_rps > 0


def test_bad_input_raises_the_clis_error_before_any_load(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--request-rate"):
        servelab.simulate("a100-80gb", "qwen2.5-7b", request_rate=0, result_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(AttributeError):
        servelab.no_such_function  # noqa: B018


def test_an_earlier_result_is_replaced_only_when_asked(tmp_path: Path) -> None:
    """The API keeps the CLI's rule: a result_dir holding a run is refused, and `overwrite` empties it first."""
    small = {"input_len": 64, "output_len": 8, "request_rate": 4, "num_prompts": 8}
    first = servelab.simulate("a100-80gb", "qwen2.5-7b", result_dir=tmp_path / "run", **small)
    stale = tmp_path / "run" / "report.html"
    stale.write_text("an earlier run's report")
    with pytest.raises(InputError, match="already holds a run.*--overwrite"):
        servelab.simulate("a100-80gb", "qwen2.5-7b", result_dir=tmp_path / "run", seed=1, **small)
    assert servelab.load_results(tmp_path / "run").summary == first.summary  # untouched by the refusal
    again = servelab.simulate("a100-80gb", "qwen2.5-7b", result_dir=tmp_path / "run", seed=1, overwrite=True, **small)
    assert again.summary is not None and again.summary.completed == 8 and not stale.exists()


def test_comparison_is_what_the_cli_writes_for_the_same_load(tmp_path: Path) -> None:
    """The Python face and the command line call the same verb: the same GPU, model, engines and load give the
    same compare.json (clock-free: the comparison is simulated)."""
    from typer.testing import CliRunner

    from servelab.cli import app

    load = {"input_len": 300, "output_len": 40, "num_prompts": 30, "request_rate": 4.0, "seed": 3}
    ours = servelab.comparison("a100-80gb", "qwen2.5-7b", engines=["vllm", "sglang"], **load)
    out = tmp_path / "compare.json"
    result = CliRunner().invoke(
        app,
        [
            "compare",
            "--gpu",
            "a100-80gb",
            "--model",
            "qwen2.5-7b",
            "--engines",
            "vllm,sglang",
            "--random-input-len",
            "300",
            "--random-output-len",
            "40",
            "--num-prompts",
            "30",
            "--request-rate",
            "4",
            "--seed",
            "3",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert ours.model_dump_json(indent=2) + "\n" == out.read_text()
    assert [e.engine for e in ours.engines] == ["vllm", "sglang"]


def test_calibration_validation_and_comparison_refuse_bad_input_before_any_request(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="too small"):
        servelab.calibration("http://127.0.0.1:9", "cpu", "qwen2.5-7b", out=tmp_path / "p.json", budget_s=5)
    with pytest.raises(InputError, match="cannot read calibration profile"):
        servelab.validation(tmp_path / "absent.json", "http://127.0.0.1:9", out=tmp_path / "v.json")
    with pytest.raises(InputError, match="subset of"):
        servelab.comparison("a100-80gb", "qwen2.5-7b", engines=["vllm", "tgi"])


def test_diagnosis_names_an_unknown_figure_goal_or_region_before_reading_anything(tmp_path: Path) -> None:
    missing = tmp_path / "never-written"  # the words are checked before the directory is read
    with pytest.raises(InputError, match=r"unknown figures \['qpss'\]"):
        servelab.diagnosis(missing, "a100-80gb", "qwen2.5-7b", observed={"qpss": 3.0})
    with pytest.raises(InputError, match="goal 'speed': choose latency or throughput"):
        servelab.diagnosis(missing, "a100-80gb", "qwen2.5-7b", goal="speed")
    with pytest.raises(InputError, match="region 'mars'"):
        servelab.diagnosis(missing, "a100-80gb", "qwen2.5-7b", region="mars")
