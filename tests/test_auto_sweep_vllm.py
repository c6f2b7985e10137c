"""`bench --sweep auto` against the real vLLM CPU server: the saturation it finds is the one a manual sweep shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from support.schemas import assert_files_match_schemas

pytestmark = pytest.mark.vllm
runner = CliRunner()


def bench(server, result_dir: Path, *args: str) -> dict:
    result = runner.invoke(
        app,
        ["bench", "--base-url", server.base_url, "--model", server.model_name, "--ignore-eos",
         "--random-input-len", "64", "--random-output-len", "16", "--result-dir", str(result_dir), *args],
    )
    assert result.exit_code == 0, result.output
    return json.loads((result_dir / "sweep.json").read_text())


def test_auto_sweep_finds_the_saturation_that_a_manual_sweep_confirms(vllm_server, tmp_path):
    auto = bench(vllm_server, tmp_path / "auto", "--num-prompts", "16", "--sweep", "auto=2", "--goodput", "e2el:60000")
    found = auto["auto"]
    assert [p["profile"] for p in auto["points"]] == ["synchronous", "constant", "constant", "throughput"]
    assert all(p["failed"] == 0 for p in auto["points"])
    sync, peak = found["synchronous_rate"], found["throughput_rate"]
    assert 0 < sync < peak  # vLLM batches: all at once serves more per second than one at a time
    assert found["knee_rate"] is not None and sync <= found["knee_rate"] < peak
    assert found["max_goodput_rate"] is not None  # a minute per request: every rate that kept up meets it
    assert assert_files_match_schemas(tmp_path / "auto")["run"] == 4

    # By hand: half the one-at-a-time rate keeps up; three times the peak does not, whatever else the machine runs.
    low, high = sync / 2, 3 * peak
    manual = bench(vllm_server, tmp_path / "manual", "--duration", "4", "--sweep", f"request-rate={low:.4g},{high:.4g}")
    under, over = manual["points"]
    assert under["over_saturated"] is None, under
    assert over["over_saturated"] is not None and "over-saturated" in over["over_saturated"], over
    assert over["request_throughput"] < 0.8 * high
