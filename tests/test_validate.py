"""Validation without a server: held-out points, their plans, and the comparison on a simulated "server"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.errors import InputError
from servelab.targets.profile import deployment_from_profile, profile_sim_target
from servelab.calibrate.validate import (
    DEFAULT_POINTS,
    METRICS,
    QUICK_POINTS,
    Point,
    ValidateError,
    best_of,
    capacity,
    counted,
    point_plan,
    point_requests,
    points_named,
    validate_on,
)
from servelab.metrics.records import RequestRecord
from support.profiles import tiny_profile
from servelab.calibrate.reference import speed_check, time_reference
from servelab.perf.calibration import model_spec_dict
from servelab.schemas.profile import CalibrationProfile, ReferenceTiming
from servelab.perf.cost_model import CostCoefficients
from servelab.perf.hardware import get_gpu
from servelab.perf.models import get_model
from servelab.workload.spec import LoadPlan
from servelab.schemas.results import RunInfo

TINY_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "num_hidden_layers": 2,
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 352,
    "vocab_size": 4096,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
ENGINE_ARGS = "--max-num-seqs 32 --max-model-len 4096 --block-size 128 --kv-cache-memory-bytes 1073741824"


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> CalibrationProfile:
    directory = tmp_path_factory.mktemp("tiny-config")
    (directory / "config.json").write_text(json.dumps(TINY_CONFIG))
    model = get_model(directory)
    hardware = get_gpu("cpu").model_copy(update={"bf16_tflops": 0.3, "memory_bandwidth_gbs": 12, "placeholder": False})
    return CalibrationProfile(
        created_at=0.0,
        hardware=hardware,
        gpu="cpu",
        model_source=str(directory),
        model_spec=model_spec_dict(model),
        engine_args=ENGINE_ARGS,
        engine_config={},
        coefficients=CostCoefficients(
            compute_efficiency=0.4,
            step_overhead_s=1.5e-3,
            per_request_overhead_s=2e-4,
            prefill_step_overhead_s=3e-4,
            idle_wake_s=2e-3,
        ),
        network_latency_s=3e-3,
        rates={},
        fit={},
        simulated_probes=[],
        probes=[],
        budget_s=60,
        elapsed_s=60,
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"concurrency": 2, "load": 0.5}, "exactly one"),
        ({}, "exactly one"),
        ({"concurrency": 2, "prompt_len": (10, 5)}, "empty"),
        ({"load": 1.5}, "fraction"),
    ],
)
def test_bad_points_are_refused(kwargs: dict, message: str) -> None:
    shape = {"prompt_len": (10, 20), "output_len": (5, 10), **kwargs}
    with pytest.raises(ValidateError, match=message):
        Point("p", num_requests=4, **shape)


def test_point_sets_are_held_out_from_the_probes() -> None:
    assert points_named("quick") == QUICK_POINTS and len(QUICK_POINTS) >= 6 and len(DEFAULT_POINTS) >= 6
    with pytest.raises(ValidateError, match="unknown point set"):
        points_named("everything")
    for point in DEFAULT_POINTS + QUICK_POINTS:
        assert point.concurrency not in (1, 2, 4, 8, 16, 32, 64)  # the probed batch sizes
        assert point.prompt_len[0] < point.prompt_len[1] and point.output_len[0] < point.output_len[1]
    assert any(p.load is not None for p in QUICK_POINTS)  # Poisson open loop, never probed


def test_point_requests_respect_ranges_and_the_model_length() -> None:
    point = Point("p", (100, 300), (40, 120), 50, concurrency=3)
    specs = point_requests(point, 4096, 4096, seed=3)
    assert all(100 <= s.prompt_len <= 300 and 40 <= s.max_tokens <= 120 for s in specs)
    assert specs[0].prompt_ids == point_requests(point, 4096, 4096, seed=3)[0].prompt_ids
    clipped = point_requests(Point("long", (3000, 4000), (100, 100), 5, concurrency=1), 4096, 2048, seed=1)
    assert all(s.prompt_len + s.max_tokens < 2048 for s in clipped)


def test_poisson_points_run_at_a_share_of_the_simulated_capacity(profile: CalibrationProfile) -> None:
    deployment = deployment_from_profile(profile)
    sim = profile_sim_target(profile)
    point = Point("p", (64, 128), (16, 32), 200, load=0.5)
    plan = point_plan(point, deployment, sim, seed=2)
    specs = list(plan.requests)
    arrivals = [s.arrival_time for s in specs]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0 and plan.max_concurrency is None
    cap = capacity(sim, point_requests(point, 4096, 4096, seed=2))
    assert plan.description["request_rate"] == pytest.approx(0.5 * cap)
    assert len(specs) / arrivals[-1] == pytest.approx(0.5 * cap, rel=0.25)


def test_first_wave_of_a_closed_loop_is_not_counted() -> None:
    records = [RequestRecord(index=i, intended_time=0, send_time=0, finish_time=1) for i in range(6)]
    assert [r.index for r in counted(records, LoadPlan([], max_concurrency=4))] == [4, 5]
    assert len(counted(records, LoadPlan([]))) == 6


def test_best_repeat_is_paired_with_its_own_simulation() -> None:
    def repeat(tput: float, ttft: float) -> dict:
        m = {k: 100.0 for k in METRICS} | {"output_throughput": tput, "median_ttft_ms": ttft}
        return {"measured": m, "simulated": {k: v + 1 for k, v in m.items()}}

    measured, simulated = best_of([repeat(50, 9), repeat(70, 12), repeat(60, 10)])
    assert measured["output_throughput"] == 70 and simulated["output_throughput"] == 71
    assert measured["median_ttft_ms"] == 9 and simulated["median_ttft_ms"] == 10


def test_a_server_that_is_the_profile_validates_exactly(profile: CalibrationProfile, tmp_path: Path) -> None:
    server = profile_sim_target(profile)
    report = validate_on(server, profile, tmp_path, points=QUICK_POINTS[:3], repeats=2)
    assert report.within_bounds
    assert all(abs(e) < 1e-6 for p in report.points for e in p.error_pct.values() if e is not None)
    assert (tmp_path / "repeat-2" / QUICK_POINTS[0].name / "summary.json").is_file()


def test_engine_args_given_to_validate_override_the_profiles(profile: CalibrationProfile, tmp_path: Path) -> None:
    point = (Point("c24", (48, 96), (32, 64), 72, concurrency=24),)
    small = profile_sim_target(profile, "--max-num-seqs 4")
    right = validate_on(small, profile, tmp_path / "a", engine_args="--max-num-seqs 4", points=point, repeats=1)
    assert right.engine_config["max_num_seqs"] == 4
    assert abs(right.points[0].error_pct["median_ttft_ms"]) < 1e-6
    wrong = validate_on(small, profile, tmp_path / "b", points=point, repeats=1)  # simulated with 32 slots
    assert abs(wrong.points[0].error_pct["median_ttft_ms"]) > 50


def test_validate_cli_refuses_a_missing_profile_with_one_message(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["validate", "--calibration", str(tmp_path / "none.json"), "--base-url", "http://127.0.0.1:9"]
    )
    assert result.exit_code == 2
    assert "cannot read calibration profile" in result.output


def test_a_repeat_in_which_the_client_stalled_is_not_judged() -> None:
    def repeat(tput: float, bunched: float) -> dict:
        m = {k: 100.0 for k in METRICS} | {"output_throughput": tput, "median_tpot_ms": 0.0 if bunched else 2.0}
        return {"measured": m, "simulated": dict(m), "bunched": bunched}

    measured, _ = best_of([repeat(50, 0.0), repeat(90, 0.9)])  # the stalled one read everything at once: TPOT 0
    assert measured["output_throughput"] == 50 and measured["median_tpot_ms"] == 2.0
    nothing, _ = best_of([repeat(90, 0.9)])
    assert all(v is None for v in nothing.values())


def timed_profile(profile: CalibrationProfile, tmp_path: Path) -> CalibrationProfile:
    """The profile with a reference step time taken on its own simulator, as calibrate takes it on the server."""
    reference = time_reference(
        profile_sim_target(profile), 32, 4096, tmp_path / "calibration-reference", RunInfo.begun()
    )
    return profile.model_copy(update={"reference": reference})


def test_a_server_at_its_calibrated_speed_has_nothing_disturbed(profile: CalibrationProfile, tmp_path: Path) -> None:
    timed = timed_profile(profile, tmp_path)
    report = validate_on(profile_sim_target(timed), timed, tmp_path / "v", points=QUICK_POINTS[:2], repeats=2)
    assert [t["changed"] for t in report.reference["timings"]] == [False, False, False]  # before, after 1, after 2
    assert report.warnings == [] and report.within_bounds
    assert all(p.disturbed_repeats == 0 for p in report.points)
    assert (tmp_path / "v" / "reference" / "after-repeat-2" / "run-1" / "records.jsonl").is_file()


def test_a_server_slower_than_at_calibration_is_reported_as_disturbed_not_judged(
    profile: CalibrationProfile, tmp_path: Path
) -> None:
    timed = timed_profile(profile, tmp_path)
    slow = timed.model_copy(update={"coefficients": timed.coefficients.model_copy(update={"step_overhead_s": 3e-3})})
    report = validate_on(profile_sim_target(slow), timed, tmp_path / "v", points=QUICK_POINTS[:2], repeats=2)
    assert all(t["changed"] and t["change_pct"] > 10 for t in report.reference["timings"])
    assert report.warnings and "slower than when calibrated" in report.warnings[0]
    for point in report.points:
        assert point.disturbed_repeats == 2
        assert all(v is None for v in point.measured.values())  # not folded into an error figure
    assert not report.within_bounds


def test_a_profile_without_a_reference_says_the_speed_is_unchecked(profile: CalibrationProfile, tmp_path: Path) -> None:
    report = validate_on(profile_sim_target(profile), profile, tmp_path, points=QUICK_POINTS[:1], repeats=1)
    assert any("no reference step time" in w for w in report.warnings)
    assert report.points[0].disturbed_repeats == 0 and report.within_bounds


@pytest.mark.parametrize(
    "then, now, changed",
    [
        ([10.0, 10.2, 9.8], [10.3, 10.1, 10.2], False),  # within both spreads
        ([10.0, 10.1, 9.9], [11.0, 11.1, 10.9], True),  # 10% slower, spreads of 1%
        ([10.0, 10.0, 10.0], [10.2, 10.2, 10.2], False),  # under the 3% floor, however steady
        ([10.0, 10.0, 10.0], [9.0, 9.0, 9.0], True),  # faster counts too
    ],
)
def test_reference_speed_change_is_judged_against_both_spreads(then: list, now: list, changed: bool) -> None:
    change = ReferenceTiming(workload="w", runs_ms=then).speed_change(ReferenceTiming(workload="w", runs_ms=now))
    assert change is not None and change.changed is changed
    assert ReferenceTiming(workload="w", runs_ms=[]).speed_change(ReferenceTiming(workload="w", runs_ms=now)) is None


def test_a_speed_check_names_a_server_slower_than_its_calibration(profile: CalibrationProfile, tmp_path: Path) -> None:
    timed = timed_profile(profile, tmp_path)
    assert speed_check(timed.reference, profile_sim_target(timed), 32, 4096, tmp_path / "same") == []
    slow = timed.model_copy(update={"coefficients": timed.coefficients.model_copy(update={"step_overhead_s": 3e-3})})
    lines = speed_check(timed.reference, profile_sim_target(slow), 32, 4096, tmp_path / "slow")
    assert len(lines) == 1 and "slower than when calibrated" in lines[0]
    assert (tmp_path / "slow" / "warmup" / "records.jsonl").is_file()
    assert "unchecked" in speed_check(timed.reference, profile_sim_target(timed), 2, 4096, tmp_path / "other")[0]
    assert "schema 2" in speed_check(None, profile_sim_target(timed), 32, 4096, tmp_path / "none")[0]


def test_an_earlier_validation_is_replaced_only_with_overwrite(tmp_path: Path) -> None:
    """validate's report and its measured runs are data: a second validate into the same --out is refused, before
    any load, naming --overwrite; nothing of the earlier one is touched."""
    profile = tiny_profile(tmp_path)
    out = tmp_path / "validation.json"
    out.write_text("{}")
    (tmp_path / "validation.runs").mkdir()
    result = CliRunner().invoke(
        app, ["validate", "--calibration", str(profile), "--base-url", "http://127.0.0.1:9", "--out", str(out)]
    )
    assert result.exit_code == 2 and "--overwrite" in result.stderr and str(out) in result.stderr
    assert out.read_text() == "{}" and (tmp_path / "validation.runs").is_dir()


def test_the_server_is_written_as_validate_always_wrote_it() -> None:
    """validation.json's `server`: the URL first, then the model, unknown parts left out (a report validated against
    a target that is no live server has `{}`), whatever order the model declares its fields in."""
    from servelab.schemas.validation import ServerRef

    assert ServerRef(model="tiny-qwen", base_url="http://127.0.0.1:8000").model_dump() == {
        "base_url": "http://127.0.0.1:8000",
        "model": "tiny-qwen",
    }
    assert list(ServerRef(model="m", base_url="u").model_dump()) == ["base_url", "model"]
    assert ServerRef().model_dump() == {}
    assert ServerRef.model_validate({"base_url": "u", "model": "m", "version": "0.32"}).model_dump() == {
        "base_url": "u",
        "model": "m",
        "version": "0.32",
    }


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"points": "everything"}, "unknown point set"),
        ({"engine_args": "--max-num-seqs -3"}, "max-num-seqs"),
    ],
)
def test_the_verb_refuses_bad_input_before_any_request(tmp_path: Path, given: dict, message: str) -> None:
    """validate.run checks the profile, the point set and the flags first: the unreachable server is never asked."""
    from servelab.calibrate.validate import ValidateRequest, run

    request = ValidateRequest(tiny_profile(tmp_path), "http://127.0.0.1:9", tmp_path / "v.json", **given)
    with pytest.raises(InputError, match=message):
        run(request)
    assert not (tmp_path / "v.json").exists() and not (tmp_path / "v.runs").exists()
