"""calibrate + validate against the real vLLM CPU server: the fit must predict runs it never saw.

About five minutes: a 75 s calibration, the quick point set three times on
the calibrated server, then again on a server restarted with another
--max-num-seqs (the profile describes hardware and model, not one config).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.experiment.validate import BOUNDS_PCT
from servelab.perf.calibration import load_profile

pytestmark = pytest.mark.vllm
BUDGET_S = "75"


@pytest.fixture(scope="session")
def profile_path(vllm_server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("calibration") / "tiny-cpu.json"
    result = CliRunner().invoke(app, [
        "calibrate", "--base-url", vllm_server.base_url, "--gpu", "cpu", "--model", str(vllm_server.model_dir),
        "--engine-args", " ".join(vllm_server.extra_args), "--out", str(out), "--budget", BUDGET_S,
    ])
    assert result.exit_code == 0, result.output
    return out


def run_validate(base_url: str, profile: Path, out: Path, *extra: str) -> dict:
    result = CliRunner().invoke(app, [
        "validate", "--calibration", str(profile), "--base-url", base_url, "--points", "quick",
        "--out", str(out), *extra,
    ])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def assert_within_bounds(report: dict) -> None:
    table = "\n".join(f"{p['point']}: {json.dumps({k: None if v is None else round(v, 1) for k, v in p['error_pct'].items()})}" for p in report["points"])
    judged = [p for p in report["points"] if all(p["error_pct"][m] is not None for m in BOUNDS_PCT)]
    assert len(judged) >= 6, f"only {len(judged)} points measured without a client stall:\n{table}"
    for metric, bound in BOUNDS_PCT.items():
        assert report["median_abs_error_pct"][metric] <= bound, f"{metric} median |error| over {bound}%:\n{table}"


def test_calibration_fits_the_probes_and_keeps_them(profile_path: Path) -> None:
    profile = load_profile(profile_path)
    assert profile.fit["converged"]
    assert profile.fit["rms_rel_error"] < 0.15
    assert profile.hardware.vendor == "cpu" and not profile.hardware.placeholder
    assert "--block-size 128" in profile.engine_args  # mirrored from the server's cache_config_info
    assert profile.elapsed_s <= float(BUDGET_S) + 30  # warm-up pass plus at most one probe past the budget
    for probe in profile.probes:
        assert probe["passes"] >= 2 and all(Path(d, "records.jsonl").is_file() for d in probe["directories"])
    # The fit re-served through the simulator: single-request TTFT and batch TPOT as measured.
    errors = [abs(row["error_pct"][m]) for row in profile.simulated_probes for m in ("ttft_p50_ms", "tpot_p50_ms")
              if row["kind"] in ("prefill", "decode") and row["error_pct"][m] is not None
              and not (row["kind"] == "decode" and m == "ttft_p50_ms")]
    assert sorted(errors)[len(errors) // 2] < 10


def test_validate_on_held_out_points(profile_path: Path, vllm_server, tmp_path: Path) -> None:
    assert_within_bounds(run_validate(vllm_server.base_url, profile_path, tmp_path / "validation.json"))


def test_validate_after_a_restart_with_other_max_num_seqs(profile_path: Path, launch_vllm, tmp_path: Path) -> None:
    with launch_vllm(extra_args=["--max-num-seqs", "8"]) as server:
        report = run_validate(server.base_url, profile_path, tmp_path / "validation.json", "--engine-args", "--max-num-seqs 8")
    assert report["engine_config"]["max_num_seqs"] == 8
    assert_within_bounds(report)
