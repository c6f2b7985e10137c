"""`bench --sweep auto` and `--abandon-after` against the real vLLM CPU server: the saturation it finds is the one
a manual sweep shows; abandoned streams stop the server's work."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from servelab.cli import app
from servelab.metrics import timeline
from servelab.metrics.results import load_run
from support.schemas import assert_files_match_schemas

pytestmark = pytest.mark.vllm
runner = CliRunner()


def bench(server, result_dir: Path, *args: str) -> dict:
    result = runner.invoke(
        app,
        [
            "bench",
            "--base-url",
            server.base_url,
            "--model",
            server.model_name,
            "--ignore-eos",
            "--random-input-len",
            "64",
            "--random-output-len",
            "16",
            "--result-dir",
            str(result_dir),
            *args,
        ],
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

    # By hand: a quarter of the one-at-a-time rate keeps up; three times the peak does not, whatever else runs.
    low, high = sync / 4, 3 * peak
    manual = bench(vllm_server, tmp_path / "manual", "--duration", "4", "--sweep", f"request-rate={low:.4g},{high:.4g}")
    under, over = manual["points"]
    assert under["over_saturated"] is None, under
    assert over["over_saturated"] is not None and "over-saturated" in over["over_saturated"], over
    assert over["request_throughput"] < 0.8 * high


def test_abandoned_requests_stop_the_servers_work_and_are_not_errors(vllm_server, tmp_path):
    full = 1024
    result = runner.invoke(
        app,
        [
            "bench",
            "--base-url",
            vllm_server.base_url,
            "--model",
            vllm_server.model_name,
            "--ignore-eos",
            "--random-input-len",
            "32",
            "--random-output-len",
            str(full),
            "--num-prompts",
            "4",
            "--max-concurrency",
            "4",
            "--abandon-after",
            "0.2",
            "--scrape-interval",
            "0.25",
            "--result-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    run = load_run(tmp_path)
    abandoned = [r for r in run.records if r.abandoned]
    assert abandoned and run.summary["abandoned"] == len(abandoned) and run.summary["failed"] == 0
    # Once idle, the server had generated far fewer tokens than the 4 x 1024 asked for: it stopped the streams
    # that went away. (A server that kept generating would reach 4 x 1024 before going idle.)
    before = next(s.values[timeline.GENERATION_TOKENS] for s in run.timeline if timeline.GENERATION_TOKENS in s.values)
    deadline = time.monotonic() + 120
    while (now := server_metrics(vllm_server.base_url))[timeline.RUNNING] > 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert now[timeline.RUNNING] == 0
    generated = now[timeline.GENERATION_TOKENS] - before
    done = sum(r.output_tokens for r in run.records if r.ok)
    assert generated < done + len(abandoned) * full / 2, (generated, done)


def server_metrics(base_url: str) -> dict[str, float]:
    """vLLM's /metrics now, summed over label sets, by metric name."""
    text = urllib.request.urlopen(base_url + "/metrics", timeout=30).read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values
