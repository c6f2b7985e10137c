"""Which router a deployment runs when none is named: a vLLM line with `--data-parallel-size N` is one server whose own
balancer spreads the requests (least-loaded); `--replicas N` are servers behind a plain proxy (round-robin)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from servelab.cli import app
from servelab.targets.deployment import build_deployment

runner = CliRunner()


def test_data_parallel_in_the_launch_line_is_vllm_s_own_balancer():
    assert build_deployment("a100-80gb", "qwen2.5-7b", "--data-parallel-size 2").router == "least-loaded"
    assert build_deployment("a100-80gb", "qwen2.5-7b", "-dp 2").router == "least-loaded"


def test_replicas_alone_sit_behind_round_robin_and_a_named_router_wins():
    assert build_deployment("a100-80gb", "qwen2.5-7b", replicas=2).router == "round-robin"
    assert build_deployment("a100-80gb", "qwen2.5-7b", "--data-parallel-size 1").router == "round-robin"
    named = build_deployment("a100-80gb", "qwen2.5-7b", "--data-parallel-size 2", router="session")
    assert named.router == "session"


def test_simulate_records_the_router_it_ran_not_a_blank_default(tmp_path):
    out = tmp_path / "dp"
    args = ["simulate", "--gpu", "a100-80gb", "--model", "qwen2.5-7b", "--engine-args", "--data-parallel-size 2"]
    load = ["--num-prompts", "8", "--random-input-len", "64", "--random-output-len", "8", "--result-dir", str(out)]
    result = runner.invoke(app, [*args, *load])
    assert result.exit_code == 0, result.output
    assert "(least-loaded)" in result.output
    assert json.loads((out / "run.json").read_text())["flags"]["router"] == "least-loaded"


def test_a_tune_candidate_given_data_parallel_ranks_runs_vllm_s_balancer_as_stage_2_starts_it():
    from servelab.tune.space import apply

    base = build_deployment("h100", "qwen2.5-7b")
    assert apply(base, {"data_parallel_size": 2}).router == "least-loaded"
    assert apply(base, {"data_parallel_size": 2, "router": "session"}).router == "session"
    assert apply(base, {"max_num_seqs": 128}).router == "round-robin"
    fleet = build_deployment("h100", "qwen2.5-7b", replicas=2, router="prefix-hash")
    assert apply(fleet, {"data_parallel_size": 4}).router == "prefix-hash"
