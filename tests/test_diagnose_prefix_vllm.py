"""Issue 13's must-show on the real vLLM CPU server: prefix caching off under a shared system prompt.

A real `servelab bench` run with a 512-token system prompt against a server
started with --no-enable-prefix-caching, then `servelab diagnose` on it with
no engine flags at all: the server's own vllm:cache_config_info (recorded by
bench) says prefix caching is off and how many KV blocks it has, and the
finding names the recomputed prefix and prices turning the cache on.
"""

import json

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.diagnose import findings as fk
from servelab.metrics.scrape import CACHE_CONFIG

pytestmark = pytest.mark.vllm


def test_prefix_caching_off_under_a_shared_system_prompt_is_found_from_the_servers_own_config(
    launch_vllm, tiny_model, tmp_path
):
    with launch_vllm(["--no-enable-prefix-caching"]) as server:
        bench = CliRunner().invoke(
            app,
            [
                "bench",
                "--base-url",
                server.base_url,
                "--model",
                server.model_name,
                "--dataset-name",
                "prefix",
                "--prefix-len",
                "512",
                "--random-input-len",
                "32",
                "--random-output-len",
                "16",
                "--ignore-eos",
                "--max-concurrency",
                "4",
                "--num-prompts",
                "24",
                "--scrape-interval",
                "0.25",
                "--result-dir",
                str(tmp_path),
            ],
        )
    assert bench.exit_code == 0, bench.output
    labels = json.loads((tmp_path / "run.json").read_text())[CACHE_CONFIG]
    assert labels["enable_prefix_caching"] == "False" and int(labels["num_gpu_blocks"]) > 0

    result = CliRunner().invoke(app, ["diagnose", str(tmp_path), "--gpu", "cpu", "--model", str(tiny_model), "--json"])
    assert result.exit_code == 0, result.output
    dx = json.loads(result.stdout)
    assert dx["deployment"]["engine_config"]["enable_prefix_caching"] is False  # read from the server, not given
    assert dx["deployment"]["num_gpu_blocks"] == int(labels["num_gpu_blocks"])
    assert "vllm:cache_config_info" in dx["notes"][0]
    assert all(c["kind"] == fk.CLIENT_BOUND for c in dx["caveats"])  # a starved client is a caveat, not a finding
    assert fk.CLIENT_BOUND not in [f["kind"] for f in dx["findings"]]
    first = dx["findings"][0]
    assert first["kind"] == fk.PREFIX_CACHING_OFF, [(f["kind"], f["score"]) for f in dx["findings"]]
    assert "512 of each prompt's" in first["evidence"][0]
    fix = next(r for r in first["recommendations"] if "enable prefix caching" in r["change"])
    assert fix["gain"] != 0 and "servelab bench" in fix["confirm"]
