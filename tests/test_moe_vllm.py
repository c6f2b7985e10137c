"""A mixture-of-experts model on the real vLLM CPU server: `bench`, `diagnose RESULTS` and live `calibrate`.

The model is tests/support/make_tiny_moe_model.py's random Qwen3-MoE (8 experts, top-2), which vLLM's CPU build
serves through its fused-MoE CPU path (X86CPUUnquantizedExperts). A planted fault (--max-num-seqs 2 at
concurrency 8) must be what diagnose finds first about the engine, read with the MoE model's own config.json;
calibrate must fit the live server and keep its probes. About four minutes, two of them server starts.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.diagnose import findings as fk
from servelab.perf.calibration import load_profile
from servelab.perf.models import load_hf_config
from support.make_tiny_moe_model import EXPERTS_PER_TOKEN, NUM_EXPERTS, SERVED_NAME, is_built

pytestmark = pytest.mark.vllm

MAKE = Path(__file__).parent / "support" / "make_tiny_moe_model.py"
CPU_BLOCK = "--block-size 128"  # the CPU backend's block size
MEASUREMENT_CAVEATS = (fk.CLIENT_BOUND, fk.FRONTEND_CPU_BOUND)
"""The 2-core host's client and API server share the cores with the engine (see test_diagnose_vllm.py)."""


@pytest.fixture(scope="session")
def tiny_moe_model(vllm_python: Path, tiny_model: Path) -> Path:
    """Built beside the dense tiny model, with the vLLM venv's torch and transformers."""
    out = tiny_model.parent / "tiny-moe-model"
    if not is_built(out, seed=0):
        done = subprocess.run([str(vllm_python), str(MAKE), str(out)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(f"building the tiny MoE model failed:\n{done.stdout}\n{done.stderr}", pytrace=False)
    return out


def test_servelab_reads_the_tiny_moe_config_as_a_mixture_of_experts(tiny_moe_model: Path) -> None:
    model = load_hf_config(tiny_moe_model)
    assert model.moe is not None
    assert (model.moe.num_experts, model.moe.experts_per_token) == (NUM_EXPERTS, EXPERTS_PER_TOKEN)
    assert model.active_params < model.params


def test_bench_then_diagnose_finds_the_planted_max_num_seqs_on_the_moe_model(launch_vllm, tiny_moe_model, tmp_path):
    with launch_vllm(["--max-num-seqs", "2"], model_dir=tiny_moe_model, model_name=SERVED_NAME) as server:
        result = CliRunner().invoke(
            app,
            [
                "bench",
                "--base-url",
                server.base_url,
                "--model",
                SERVED_NAME,
                "--dataset-name",
                "random",
                "--random-input-len",
                "128",
                "--random-output-len",
                "48",
                "--ignore-eos",
                "--max-concurrency",
                "8",
                "--num-prompts",
                "32",
                "--scrape-interval",
                "0.25",
                "--result-dir",
                str(tmp_path),
            ],
        )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "summary.json").read_text())["completed"] == 32
    result = CliRunner().invoke(
        app,
        [
            "diagnose",
            str(tmp_path),
            "--gpu",
            "cpu",
            "--model",
            str(tiny_moe_model),
            "--engine-args",
            f"--max-num-seqs 2 --max-model-len 4096 {CPU_BLOCK}",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    dx = json.loads(result.output)
    first = next(f["kind"] for f in dx["findings"] if f["kind"] not in MEASUREMENT_CAVEATS)
    assert first == fk.MAX_NUM_SEQS_BOUND, [(f["kind"], f["score"]) for f in dx["findings"]]
    assert dx["evidence"]["max_running"] == 2


def test_live_calibrate_fits_the_moe_server_and_keeps_its_probes(launch_vllm, tiny_moe_model, tmp_path):
    out = tmp_path / "tiny-moe-cpu.json"
    with launch_vllm(model_dir=tiny_moe_model, model_name=SERVED_NAME) as server:
        result = CliRunner().invoke(
            app,
            [
                "calibrate",
                "--base-url",
                server.base_url,
                "--gpu",
                "cpu",
                "--model",
                str(tiny_moe_model),
                "--engine-args",
                " ".join(server.extra_args),
                "--out",
                str(out),
                "--budget",
                "45",
            ],
        )
    # 3: written, but the host was too busy to time its reference step steadily (marked unreliable, said so)
    assert result.exit_code == 0 or (result.exit_code == 3 and "unreliable" in result.output), result.output
    profile = load_profile(out)
    assert profile.fit["converged"]
    assert profile.probes and profile.fit["observations"], profile.fit
