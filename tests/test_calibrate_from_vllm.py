"""`calibrate --from` on runs measured on the real vLLM CPU server: two `servelab bench` runs and one JSON written by
the vLLM venv's own `vllm bench serve --save-result`. Calibrate from one, predict the others with `simulate
--calibration`; the profile is written, the fit reported, predictions finite, refusals fire.

How accurate the predictions are is a benchmark (benchmarks/calibrate_from_accuracy.py, docs/validation.md),
not asserted here: the host is shared and noisy.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.metrics.imports import ResultFormat, read_measured_runs
from servelab.perf.calibration import load_profile
from servelab.schemas.profile import CalibrationOrigin

pytestmark = pytest.mark.vllm
runner = CliRunner()
ENGINE_ARGS = "--max-model-len 4096 --max-num-seqs 32 --block-size 128 --kv-cache-memory-bytes 1073741824"
"""The test server's flags (tests/conftest.py) as the simulator reads them: the CPU backend's blocks and 1 GiB KV."""
VLLM_BENCH_SERVE = (
    "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "from vllm.benchmarks.serve import add_cli_args, main; parser = FlexibleArgumentParser(); "
    "add_cli_args(parser); main(parser.parse_args(sys.argv[1:]))"
)
"""What `vllm bench serve` runs (vllm/entrypoints/cli/benchmark/serve.py), called as the vLLM venv's python: that
venv's `vllm` script stops at its version lookup, as the CPU build is installed without package metadata."""
VLLM_BENCH_LOAD = (
    "--random-input-len",
    "192",
    "--random-output-len",
    "48",
    "--num-prompts",
    "16",
    "--max-concurrency",
    "8",
)


def _cli(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "250"})


def _bench(server, directory: Path, *args: str) -> None:
    result = _cli(
        "bench",
        "--base-url",
        server.base_url,
        "--model",
        server.model_name,
        "--ignore-eos",
        "--result-dir",
        str(directory),
        *args,
    )
    assert result.exit_code == 0, result.output


def _vllm_bench_serve(server, vllm_python: Path, directory: Path) -> Path:
    """The vLLM venv's own benchmark client against the server, bounded; the JSON it saved (no --save-detailed)."""
    command = [
        str(vllm_python),
        "-c",
        VLLM_BENCH_SERVE,
        "--backend",
        "openai",
        "--base-url",
        server.base_url,
        "--model",
        server.model_name,
        "--tokenizer",
        str(server.model_dir),
        "--dataset-name",
        "random",
        *VLLM_BENCH_LOAD,
        "--ignore-eos",
        "--save-result",
        "--result-dir",
        str(directory),
        "--result-filename",
        "vllm-bench.json",
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return directory / "vllm-bench.json"


@pytest.fixture(scope="module")
def measured(vllm_server, vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("calibrate-from")
    _bench(
        vllm_server,
        root / "closed-c4",
        "--max-concurrency",
        "4",
        "--num-prompts",
        "24",
        "--random-input-len",
        "128",
        "--random-output-len",
        "48",
    )
    _bench(vllm_server, root / "burst", "--num-prompts", "24", "--random-input-len", "256", "--random-output-len", "24")
    return {
        "closed-c4": root / "closed-c4",
        "burst": root / "burst",
        "vllm": _vllm_bench_serve(vllm_server, vllm_python, root),
    }


def _simulate(profile: Path, out: Path, *load: str) -> dict:
    result = _cli("simulate", "--calibration", str(profile), *load, "--json", "--result-dir", str(out))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{") :])


def test_calibrate_from_one_bench_run_predicts_the_other_and_the_vllm_bench_json(
    vllm_server, measured, tmp_path
) -> None:
    profile_path = tmp_path / "profile.json"
    result = _cli(
        "calibrate",
        "--from",
        str(measured["closed-c4"]),
        "--gpu",
        "cpu",
        "--model",
        str(vllm_server.model_dir),
        "--engine-args",
        ENGINE_ARGS,
        "-o",
        str(profile_path),
    )
    assert result.exit_code == 0, result.output
    assert "measured / fitted / specs-only" in result.output and "CPU-side costs" in result.output
    profile = load_profile(profile_path)
    env = profile.environment
    assert profile.origin == CalibrationOrigin.RUNS and env is not None
    assert profile.server["from_runs"] == [str(measured["closed-c4"])]
    (fit,) = env.runs
    assert all(m.fitted is not None and math.isfinite(m.fitted) for m in fit.metrics.values())
    burst = _simulate(
        profile_path,
        tmp_path / "burst",
        "--num-prompts",
        "24",
        "--random-input-len",
        "256",
        "--random-output-len",
        "24",
    )
    vllm = _simulate(profile_path, tmp_path / "vllm", *VLLM_BENCH_LOAD)
    for predicted in (burst, vllm):
        assert predicted["completed"] > 0
        assert all(
            math.isfinite(predicted[k]) and predicted[k] > 0
            for k in ("request_throughput", "mean_ttft_ms", "mean_tpot_ms")
        )


def test_calibrate_from_the_vllm_bench_json_and_from_several_runs(vllm_server, measured, tmp_path) -> None:
    (run,) = read_measured_runs(measured["vllm"])
    assert run.format == ResultFormat.VLLM_BENCH and run.lengths_from == "file totals" and len(run.requests) == 16
    out = tmp_path / "p.json"
    result = _cli(
        "calibrate",
        "--from",
        str(measured["vllm"]),
        "--from",
        str(measured["burst"]),
        "--gpu",
        "cpu",
        "--model",
        str(vllm_server.model_dir),
        "--engine-args",
        ENGINE_ARGS,
        "-o",
        str(out),
    )
    assert result.exit_code == 0, result.output
    env = load_profile(out).environment
    assert env is not None and [r.format for r in env.runs] == ["vllm-bench", "servelab"]


def test_refusals_on_real_results_come_before_any_fitting(vllm_server, measured, tmp_path) -> None:
    out = tmp_path / "p.json"
    base = (
        "calibrate",
        "--gpu",
        "cpu",
        "--model",
        str(vllm_server.model_dir),
        "--engine-args",
        ENGINE_ARGS,
        "-o",
        str(out),
    )
    contradicts = _cli(*base, "--from", str(measured["vllm"]), "--num-prompts", "99")
    assert (
        contradicts.exit_code == 2
        and "--num-prompts 99" in contradicts.output
        and "vllm-bench.json" in contradicts.output
    )
    twice = _cli(*base, "--from", str(measured["burst"]), "--random-input-len", "256")
    assert twice.exit_code == 2 and "twice" in twice.output
    too_short = _cli(
        "calibrate",
        "--gpu",
        "cpu",
        "--model",
        str(vllm_server.model_dir),
        "--engine-args",
        "--max-model-len 128",
        "-o",
        str(out),
        "--from",
        str(measured["burst"]),
    )
    assert too_short.exit_code == 2 and "max_model_len 128" in too_short.output
    assert not out.exists()
