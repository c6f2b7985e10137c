"""Planted faults on the real vLLM CPU server: a real `servelab bench` run, then `servelab diagnose` on it."""

import json

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.diagnose import findings as fk

pytestmark = pytest.mark.vllm

CPU_BLOCK = "--block-size 128"  # the CPU backend's block size


def bench(server, directory, *, requests, input_len, output_len, concurrency):
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--base-url",
            server.base_url,
            "--model",
            server.model_name,
            "--dataset-name",
            "random",
            "--random-input-len",
            str(input_len),
            "--random-output-len",
            str(output_len),
            "--ignore-eos",
            "--max-concurrency",
            str(concurrency),
            "--num-prompts",
            str(requests),
            "--scrape-interval",
            "0.25",
            "--result-dir",
            str(directory),
        ],
    )
    assert result.exit_code == 0, result.output
    return json.loads((directory / "summary.json").read_text())


MEASUREMENT_CAVEATS = (fk.CLIENT_BOUND, fk.FRONTEND_CPU_BOUND)
"""On this 2-core host the vLLM CPU engine, its API server and the client share the cores, so the
run may also (truthfully) report a stalled client or a starved API server; the planted fault must
still be the first finding about the engine itself."""


def engine_bottleneck(dx):
    return next(f["kind"] for f in dx["findings"] if f["kind"] not in MEASUREMENT_CAVEATS)


def diagnose(directory, model_dir, engine_args):
    result = CliRunner().invoke(
        app,
        ["diagnose", str(directory), "--gpu", "cpu", "--model", str(model_dir), "--engine-args", engine_args, "--json"],
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_max_num_seqs_2_at_concurrency_16_is_max_num_seqs_bound(launch_vllm, tiny_model, tmp_path):
    with launch_vllm(["--max-num-seqs", "2"]) as server:
        summary = bench(server, tmp_path, requests=48, input_len=128, output_len=64, concurrency=16)
    assert summary["completed"] == 48
    dx = diagnose(tmp_path, tiny_model, f"--max-num-seqs 2 --max-model-len 4096 {CPU_BLOCK}")
    assert engine_bottleneck(dx) == fk.MAX_NUM_SEQS_BOUND, [(f["kind"], f["score"]) for f in dx["findings"]]
    assert dx["evidence"]["max_running"] == 2 and dx["evidence"]["max_waiting"] >= 8
    # The server's own split is the evidence: the mean request's TTFT went mostly to waiting for one of 2 slots.
    queue_bound = next(f for f in dx["findings"] if f["kind"] == fk.MAX_NUM_SEQS_BOUND)
    assert any(
        line.startswith("TTFT mean ") and "(waiting for a sequence slot: 2 running at max_num_seqs 2)" in line
        for line in queue_bound["evidence"]
    ), queue_bound["evidence"]
    assert (tmp_path / "diagnosis.json").is_file()


def test_kv_cache_too_small_is_kv_capacity_bound_with_preemptions(launch_vllm, tiny_model, tmp_path):
    # 8 blocks of 128 tokens hold four 250-token sequences; eight at once must preempt.
    flags = ["--num-gpu-blocks-override", "8", "--max-model-len", "512"]
    with launch_vllm(flags) as server:
        summary = bench(server, tmp_path, requests=32, input_len=100, output_len=150, concurrency=8)
    assert summary["completed"] == 32
    dx = diagnose(tmp_path, tiny_model, " ".join(flags) + f" {CPU_BLOCK}")
    assert engine_bottleneck(dx) == fk.KV_CAPACITY_BOUND, [(f["kind"], f["score"]) for f in dx["findings"]]
    preemptions = dx["evidence"]["preemptions"]
    assert preemptions > 0
    kv = next(f for f in dx["findings"] if f["kind"] == fk.KV_CAPACITY_BOUND)
    assert f"{preemptions:.0f} preemptions" in kv["evidence"][0]
