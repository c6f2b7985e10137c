"""A bench run in which the real vLLM CPU server refused every request: exit 2 and the server's own reason.

The prompts are longer than the server's --max-model-len (4096, tests/conftest.py), so vLLM answers each with
HTTP 400 and says why; before, such a run exited 0 and printed only "errors: http_400 N".
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.errors import EXIT_BAD_INPUT
from servelab.metrics.results import load_run

pytestmark = pytest.mark.vllm


def test_a_run_whose_every_request_the_server_refused_exits_2_with_the_servers_reason(vllm_server, tmp_path: Path):
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--base-url",
            vllm_server.base_url,
            "--model",
            vllm_server.model_name,
            "--num-prompts",
            "4",
            "--random-input-len",
            "5000",
            "--random-output-len",
            "4",
            "--result-dir",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    last = result.output.strip().splitlines()[-1]
    print(last)  # shown with -s: docs/bad-input.md quotes it
    assert last.startswith("error: every request failed (http_400 4)")
    assert "maximum context length" in last or "max_model_len" in last or "4096" in last, last  # vLLM's own words
    run = load_run(tmp_path / "run")  # the records are kept: they are what says why
    assert len(run.records) == 4 and not any(r.ok for r in run.records)
