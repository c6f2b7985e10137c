"""calibrate + validate against the real vLLM CPU server: they complete, and everything they report is accounted for.

How accurate the fit is on held-out points is a benchmark, not a test
(`benchmarks/calibration_accuracy.py`, tables in docs/validation.md): on a
shared 2-core host it depends on what else runs. What holds under any load,
and is asserted here: calibrate converges and keeps every probe run; the
profile's simulator reproduces the fit's own step model on its probes; the
reference step time is recorded; validate measures every held-out point or
says why not (client stalled, server at another speed than at calibration).
The benchmark also validates on a server restarted with another
--max-num-seqs; here the simulator's tests cover that override. About three
minutes, one of them the server's start.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.calibrate.validate import METRICS
from servelab.perf.calibration import load_profile
from support.schemas import assert_files_match_schemas

pytestmark = pytest.mark.vllm
BUDGET_S = "45"
REPEATS = 2


@pytest.fixture(scope="session")
def profile_path(vllm_server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("calibration") / "tiny-cpu.json"
    result = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--base-url",
            vllm_server.base_url,
            "--gpu",
            "cpu",
            "--model",
            str(vllm_server.model_dir),
            "--engine-args",
            " ".join(vllm_server.extra_args),
            "--out",
            str(out),
            "--budget",
            BUDGET_S,
        ],
    )
    # 3: written, but the host was too busy to time its reference step steadily (marked unreliable, said so)
    assert result.exit_code == 0 or (result.exit_code == 3 and "unreliable" in result.output), result.output
    assert "reference step" in result.output
    return out


def run_validate(base_url: str, profile: Path, out: Path, *extra: str) -> dict:
    result = CliRunner().invoke(
        app,
        [
            "validate",
            "--calibration",
            str(profile),
            "--base-url",
            base_url,
            "--points",
            "quick",
            "--repeats",
            str(REPEATS),
            "--out",
            str(out),
            *extra,
        ],
    )
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def assert_every_point_accounted_for(report: dict) -> None:
    """Each point has all its figures, or every one of its repeats is reported as stalled or disturbed."""
    assert len(report["points"]) == 6
    for point in report["points"]:
        set_aside = point["stalled_repeats"] + point["disturbed_repeats"]
        assert len(point["repeats"]) == REPEATS and 0 <= set_aside <= REPEATS
        judged = [r for r in point["repeats"] if not r["disturbed"] and r["bunched"] <= 0.2]
        if judged:
            assert all(point["measured"][m] is not None and point["error_pct"][m] is not None for m in METRICS), point
        else:
            assert all(v is None for v in point["measured"].values()), point
        for repeat in point["repeats"]:
            assert Path(repeat["directory"], "records.jsonl").is_file()
    timings = report["reference"]["timings"]
    assert [t["when"] for t in timings] == ["before repeat 1"] + [f"after repeat {r + 1}" for r in range(REPEATS)]
    for timing in timings:  # every timing compared with the profile's, or unjudged because its runs stalled
        assert timing["changed"] is not None or not timing["runs_ms"]
    disturbed = any(t["changed"] for t in timings)
    assert disturbed == any("slower" in w or "faster" in w for w in report["warnings"])
    assert "cpu_count" in report["host"]


def test_calibration_converges_keeps_its_probes_and_its_simulator_matches_its_fit(profile_path: Path) -> None:
    profile = load_profile(profile_path)
    assert profile.fit["converged"]
    assert profile.hardware.vendor == "cpu" and not profile.hardware.placeholder
    assert "--block-size 128" in profile.engine_args  # mirrored from the server's cache_config_info
    for probe in profile.probes:
        assert probe["passes"] >= 1 and all(Path(d, "records.jsonl").is_file() for d in probe["directories"])
    assert profile.reference is not None and len(profile.reference.runs_ms) + profile.reference.stalled_runs == 6
    assert profile.host["cpu_count"] >= 1 and "load_avg_1m" in profile.host
    seen = assert_files_match_schemas(profile_path.with_name(profile_path.stem + ".probes"), {profile_path: "profile"})
    assert seen["profile"] == 1 and seen["run"] >= 8 and seen["run"] == seen["summary"] == seen["record"], seen

    # The profile re-served through the simulator gives what its own step model predicted for each prefill and
    # decode probe: the simulator runs exactly the fitted costs, whatever the noise in what they were fitted to.
    predicted = {o["label"]: o["predicted_ms"] for o in profile.fit["observations"]}
    errors = []
    for row in profile.simulated_probes:
        metric = {"prefill": "median_ttft_ms", "decode": "median_tpot_ms"}.get(row["kind"])
        if metric and row["probe"] in predicted:
            errors.append(abs(row["simulated"][metric] / predicted[row["probe"]] - 1))
    assert len(errors) >= 8
    assert sorted(errors)[len(errors) // 2] < 0.1, errors


def test_validate_on_held_out_points(profile_path: Path, vllm_server, tmp_path: Path) -> None:
    assert_every_point_accounted_for(run_validate(vllm_server.base_url, profile_path, tmp_path / "validation.json"))
    seen = assert_files_match_schemas(tmp_path / "validation.runs", {tmp_path / "validation.json": "validation"})
    assert seen["validation"] == 1 and seen["run"] >= 6 * REPEATS and seen["run"] == seen["summary"], seen
