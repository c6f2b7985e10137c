"""A real `bench` sweep on the vLLM CPU server and a `simulate` sweep of the same workload, overlaid in one report."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.cli.report import REPORT_HTML
from servelab.metrics.results import load_run
from servelab.report import figures
from servelab.report.inputs import load_inputs
from support import browser

pytestmark = pytest.mark.vllm
runner = CliRunner()

WORKLOAD = (
    "--random-input-len",
    "64",
    "--random-output-len",
    "64",
    "--num-prompts",
    "16",
    "--seed",
    "3",
    "--sweep",
    "max-concurrency=1,4",
    "--scrape-interval",
    "0.1",
)
"""Small, but each point runs long enough (about a second or more) for a server timeline worth drawing."""
SIM_ENGINE_ARGS = "--max-model-len 4096 --max-num-seqs 32 --block-size 128 --kv-cache-memory-bytes 1G"
"""The fixture server's flags (conftest.DEFAULT_ENGINE_ARGS) plus what the CPU backend fixes: its 128-token
blocks and the 1 GiB of KV cache the fixture gives it (VLLM_CPU_KVCACHE_SPACE)."""


def _invoke(*args: str) -> None:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output


@pytest.mark.timeout(900)
def test_measured_and_simulated_sweeps_overlay_on_the_same_curves(vllm_server, tmp_path: Path) -> None:
    measured, simulated, page = tmp_path / "bench", tmp_path / "simulate", tmp_path / "both.html"
    _invoke(
        "bench",
        "--base-url",
        vllm_server.base_url,
        "--model",
        vllm_server.model_name,
        "--ignore-eos",
        *WORKLOAD,
        "--result-dir",
        str(measured),
        "--report",
    )
    _invoke(
        "simulate",
        "--gpu",
        "cpu",
        "--model",
        str(vllm_server.model_dir),
        "--engine-args",
        SIM_ENGINE_ARGS,
        *WORKLOAD,
        "--result-dir",
        str(simulated),
        "--report",
    )
    assert (measured / REPORT_HTML).is_file() and (simulated / REPORT_HTML).is_file()
    _invoke("report", str(measured), str(simulated), "-o", str(page))

    inputs = load_inputs([measured, simulated])
    assert [s.label for s in inputs.sweeps] == ["bench (measured)", "simulate (simulated)"]
    for sweep in inputs.sweeps:
        assert [p.sweep_value for p in sweep.points] == [1, 4]
        assert all(p.summary.completed == 16 and p.summary.failed == 0 for p in sweep.points)
    first_prompts = [
        [r.prompt_tokens for r in load_run(d / "max-concurrency=1").records] for d in (measured, simulated)
    ]
    assert first_prompts[0] == first_prompts[1]  # the same requests, measured and simulated

    curves = figures.sweep_curves_figure(inputs.sweeps)
    for axis in ("x", "x2"):  # TTFT and TPOT panels: both sources, p50 and p99 each, every point drawn
        traces = [t for t in curves.data if t.xaxis == axis]
        assert sorted(t.name for t in traces) == [
            "bench (measured) — p50",
            "bench (measured) — p99",
            "simulate (simulated) — p50",
            "simulate (simulated) — p99",
        ]
        assert all(len(t.x) == 2 and None not in t.x and None not in t.y for t in traces)
    measured_x = next(t.x for t in curves.data if t.name == "bench (measured) — p50")
    assert list(measured_x) == [p.summary.output_throughput for p in inputs.sweeps[0].points]
    html = page.read_text()
    assert html.count("bench (measured) — p50") >= 1 and html.count("simulate (simulated) — p50") >= 1

    if browser.available():
        artifacts = Path(os.environ.get("SERVELAB_ARTIFACTS", tmp_path))
        check = browser.open_page(page, artifacts / "report-vllm-overlay.png")
        assert check.errors == []
        assert check.plots and all(p.rendered and p.traces > 0 for p in check.plots)
        assert "Sweeps" in check.headings
