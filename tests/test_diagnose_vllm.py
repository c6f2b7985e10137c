"""Planted faults on the real vLLM CPU server, diagnosed from a real measured run.

The run is measured with the HTTP client into a results directory exactly
as `bench` writes one, then `diagnose` reads that directory back.
"""

import numpy as np
import pytest

from servelab.diagnose import findings as fk
from servelab.diagnose.analysis import diagnose_run
from servelab.metrics.results import ResultWriter, load_run
from servelab.targets.deployment import build_deployment
from servelab.targets.http import HttpTarget
from servelab.workload.spec import LoadPlan, RequestSpec

pytestmark = pytest.mark.vllm

CPU_BLOCK = "--block-size 128"  # the CPU backend's block size


def measure(server, directory, *, requests, input_len, output_len, concurrency):
    rng = np.random.default_rng(0)
    specs = [RequestSpec(index=i, prompt_ids=rng.integers(10, 4000, input_len, dtype=np.int32).tolist(),
                         max_tokens=output_len) for i in range(requests)]
    plan = LoadPlan(requests=specs, max_concurrency=concurrency)
    writer = ResultWriter(directory, {"source": "http", "arrival": {"request_rate": None, "max_concurrency": concurrency}})
    target = HttpTarget(server.base_url, model=server.model_name, ignore_eos=True, scrape_interval=0.25)
    outcome = target.run(plan, writer.records, writer.write_sample)
    writer.update_run_info(client_stats=outcome.client_stats)
    writer.close()
    return load_run(directory)


def test_max_num_seqs_2_at_concurrency_16_is_max_num_seqs_bound(launch_vllm, tiny_model, tmp_path):
    with launch_vllm(["--max-num-seqs", "2"]) as server:
        run = measure(server, tmp_path, requests=48, input_len=128, output_len=64, concurrency=16)
    assert len(run.records) == 48 and all(r.ok for r in run.records)
    deployment = build_deployment("cpu", tiny_model, f"--max-num-seqs 2 --max-model-len 4096 {CPU_BLOCK}")
    dx = diagnose_run(run, deployment, with_recommendations=False)
    assert dx.bottleneck == fk.MAX_NUM_SEQS_BOUND, [(f.kind, round(f.score, 2)) for f in dx.findings]
    assert dx.evidence.max_running == 2 and dx.evidence.max_waiting >= 8


def test_kv_cache_too_small_is_kv_capacity_bound_with_preemptions(launch_vllm, tiny_model, tmp_path):
    # 8 blocks of 128 tokens hold four 250-token sequences; eight at once must preempt.
    flags = ["--num-gpu-blocks-override", "8", "--max-model-len", "512"]
    with launch_vllm(flags) as server:
        run = measure(server, tmp_path, requests=32, input_len=100, output_len=150, concurrency=8)
    assert all(r.ok for r in run.records)
    deployment = build_deployment("cpu", tiny_model, " ".join(flags) + f" {CPU_BLOCK}")
    dx = diagnose_run(run, deployment, with_recommendations=False)
    assert dx.bottleneck == fk.KV_CAPACITY_BOUND, [(f.kind, round(f.score, 2)) for f in dx.findings]
    assert dx.evidence.preemptions > 0
    assert f"{dx.evidence.preemptions:.0f} preemptions" in dx.findings[0].evidence[0]
