"""The server's own timings and GPU telemetry from a real `servelab bench` against the real vLLM CPU server.

One run of the default server (max_num_seqs 32) at concurrency 48, with a
stand-in DCGM exporter as `--gpu-metrics-url` (no GPU can exist here), then
`servelab diagnose` on it. Only facts that hold under any load are asserted:
the split's parts are non-negative and sum to the client's mean TTFT, the
histograms count exactly this run's requests, the engine's spans fit inside
its own TTFT, and every timeline row carries the GPU columns beside the
server's metrics.
"""

from __future__ import annotations

import json

import pytest
from support.dcgm_exporter import dcgm_exporter
from typer.testing import CliRunner

from servelab.cli import app
from servelab.metrics import gpu
from servelab.metrics import timeline as tl
from servelab.metrics.gpu import gpu_key
from servelab.metrics.results import load_run
from servelab.metrics.server_timings import ttft_split

pytestmark = pytest.mark.vllm
runner = CliRunner()
REQUESTS = 64

CLOCK_SLACK_S = 1e-3
"""The engine core and the API server stamp times in different processes; a millisecond covers their clocks."""


def test_bench_splits_ttft_from_the_servers_histograms_with_gpu_telemetry_beside(vllm_server, tiny_model, tmp_path):
    with dcgm_exporter() as exporter:
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
                "128",
                "--random-output-len",
                "32",
                "--num-prompts",
                str(REQUESTS),
                "--max-concurrency",
                "48",
                "--scrape-interval",
                "0.25",
                "--gpu-metrics-url",
                exporter + "/metrics",
                "--result-dir",
                str(tmp_path),
            ],
        )
    assert result.exit_code == 0, result.output
    run = load_run(tmp_path)
    assert run.summary["completed"] == REQUESTS

    server_rows = [s for s in run.timeline if tl.RUNNING in s.values]
    assert len(server_rows) >= 2
    assert all(gpu_key(0, gpu.UTIL) in s.values and gpu_key(1, gpu.SM_ACTIVE) in s.values for s in server_rows)
    assert run.run_info.server_info.model_extra["metrics_scrape"]["gpu"]["failures"] == 0

    split = ttft_split(run.records, run.timeline)
    assert split is not None and split.queue_measured
    assert split.requests == split.server_requests == REQUESTS and split.notes == ()
    assert min(split.parts.values()) >= 0 and split.queue_s > 0 and split.prefill_s > 0
    assert sum(split.parts.values()) == pytest.approx(split.client_ttft_s)
    assert split.client_ttft_s * 1e3 == pytest.approx(run.summary["mean_ttft_ms"])
    assert split.queue_s + split.prefill_s <= split.server_ttft_s + CLOCK_SLACK_S
    assert split.server_e2e_s is not None and split.decode_s is not None
    assert split.decode_s <= split.server_e2e_s + CLOCK_SLACK_S

    dx = runner.invoke(
        app,
        [
            "diagnose",
            str(tmp_path),
            "--gpu",
            "cpu",
            "--model",
            str(tiny_model),
            "--engine-args",
            "--max-num-seqs 32 --max-model-len 4096 --block-size 128",
            "--json",
        ],
    )
    assert dx.exit_code == 0, dx.output
    data = json.loads(dx.output)
    assert data["evidence"]["ttft_split"]["queue_s"] == pytest.approx(split.queue_s)
    split_notes = [n for n in data["notes"] if n.startswith("Where the first token's time went: TTFT mean ")]
    assert len(split_notes) == 1 and f"{1e3 * split.prefill_s:.0f} ms prefill" in split_notes[0]
