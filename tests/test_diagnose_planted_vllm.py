"""Issue 13's must-show on the real vLLM CPU server: an API-server-bound and a prefill-bound deployment, each
diagnosed from a real `servelab bench` run with the server's own TTFT split as the evidence.

How the faults are planted so that they show on two shared cores (docs/examples.md has both diagnoses):

- API-server-bound: one API server (`--api-server-count 1`, vLLM's default) and a burst of 400 requests of 16
  prompt tokens and 2 output tokens all sent at once (`--request-rate inf`). The tiny model's engine work per
  request is a fraction of a millisecond; HTTP, tokenization, the event loop and streaming are not, so requests
  wait in the API process before the engine core sees them. `--max-num-seqs 512` (more than the burst) keeps a
  sequence slot from being what they wait for.
- Prefill-bound: prompts of 3,800 tokens near `--max-model-len 4096`, 2 output tokens, two users, and a
  512-token budget (`--max-num-batched-tokens 512`): every prompt is ~8 full steps of prefill, and a waiting
  prompt is scheduled only in the last chunk of the one before it.

Only what holds under any load is asserted: the split's largest part and the finding that names it first,
with the split (and, for the API server, the HTTP breakdown) among its evidence; no time is bounded.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.diagnose import findings as fk

pytestmark = pytest.mark.vllm
runner = CliRunner()


def bench(server, directory, *flags: str) -> dict:
    result = runner.invoke(
        app,
        [
            "bench",
            "--base-url",
            server.base_url,
            "--model",
            server.model_name,
            "--dataset-name",
            "random",
            "--ignore-eos",
            "--scrape-interval",
            "0.25",
            "--result-dir",
            str(directory),
            *flags,
        ],
    )
    assert result.exit_code == 0, result.output
    return json.loads((directory / "summary.json").read_text())


def diagnose(directory, model_dir, engine_args: str) -> dict:
    result = runner.invoke(
        app,
        ["diagnose", str(directory), "--gpu", "cpu", "--model", str(model_dir), "--engine-args", engine_args, "--json"],
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def largest_part(dx: dict) -> str:
    split = dx["evidence"]["ttft_split"]
    parts = {"api_server": split["api_server_s"], "queue": split["queue_s"], "prefill": split["prefill_s"]}
    return max(parts, key=parts.__getitem__)


def test_a_burst_of_short_requests_on_one_api_server_is_frontend_bound_by_the_servers_split(
    launch_vllm, tiny_model, tmp_path
):
    flags = ["--max-num-seqs", "512", "--api-server-count", "1"]
    with launch_vllm(flags) as server:
        summary = bench(
            server,
            tmp_path,
            "--random-input-len",
            "16",
            "--random-output-len",
            "2",
            "--num-prompts",
            "400",
            "--request-rate",
            "inf",
        )
    assert summary["completed"] == 400
    dx = diagnose(tmp_path, tiny_model, "--max-model-len 4096 " + " ".join(flags))
    assert largest_part(dx) == "api_server", dx["evidence"]["ttft_split"]
    first = dx["findings"][0]
    assert first["kind"] == fk.FRONTEND_CPU_BOUND, [(f["kind"], f["score"]) for f in dx["findings"]]
    assert fk.UNDERLOADED not in [f["kind"] for f in dx["findings"]]  # 400 requests outstanding is no light load
    split_lines = [line for line in first["evidence"] if line.startswith("TTFT mean ")]
    assert len(split_lines) == 1 and "ms API server & network" in split_lines[0]
    breakdown = next(line for line in first["evidence"] if "outside the engine core" in line)
    outside = dx["evidence"]["outside_engine"]
    assert outside["network_s"] + outside["api_server_s"] == pytest.approx(outside["outside_s"])
    assert outside["api_server_s"] > outside["network_s"]  # loopback: the network is not where requests waited
    assert f"{1e3 * outside['outside_s']:.0f} ms outside the engine core" in breakdown


def test_long_prompts_under_a_small_token_budget_are_prefill_bound_by_the_servers_split(
    launch_vllm, tiny_model, tmp_path
):
    flags = ["--max-model-len", "4096", "--max-num-batched-tokens", "512"]
    with launch_vllm(flags) as server:
        summary = bench(
            server,
            tmp_path,
            "--random-input-len",
            "3800",
            "--random-output-len",
            "2",
            "--num-prompts",
            "16",
            "--max-concurrency",
            "2",
        )
    assert summary["completed"] == 16
    dx = diagnose(tmp_path, tiny_model, " ".join(flags))
    assert largest_part(dx) in ("prefill", "queue"), dx["evidence"]["ttft_split"]
    first = dx["findings"][0]
    assert first["kind"] == fk.PREFILL_COMPUTE_BOUND, [(f["kind"], f["score"]) for f in dx["findings"]]
    assert (
        "3800 computed prompt tokens" in first["evidence"][0] and "steps of at most 512 tokens" in first["evidence"][0]
    )
    assert any(line.startswith("TTFT mean ") and "ms prefill" in line for line in first["evidence"])
    assert first["recommendations"], "a finding without a priced change"
