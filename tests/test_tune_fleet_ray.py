"""tune's stage 2 for a fleet on Ray (`--ray-address`): each replica placed on the cluster holding its GPU, the
driver benching them once all are ready; a replica that will not start stops the fleet and is the row's error.

A local cluster of two worker nodes, each with one `trial_gpu` (the custom resource standing in for a GPU), so a
fleet of two single-GPU replicas lands one replica on each node. Skipped without Ray unless SERVELAB_REQUIRE_RAY=1.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.processes import wait_gone
from support.profiles import TINY_CONFIG

from servelab.metrics.slo import SLO
from servelab.targets.deployment import build_deployment
from servelab.tune.confirm import ServerCommand, Stage2Config, confirm
from servelab.tune.objectives import Objective
from servelab.tune.space import apply
from servelab.tune.workload import TuneWorkload
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount

pytestmark = pytest.mark.ray
TRIAL_GPU = "trial_gpu"
LINE = "--max-model-len 4096 --max-num-seqs 32"
SIM_ARGS = "--block-size 128 --kv-cache-memory-bytes 1G"
OBJECTIVE = Objective("goodput", SLO.parse("ttft:2000"))
CHATS = TuneWorkload(
    WorkloadConfig(dataset_name="multiturn", turns=2, prefix_len=128, num_prefixes=4, input_len=64, output_len=8),
    ArrivalConfig(max_concurrency=4),
    Amount(num_prompts=16),
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A head that runs nothing and two worker nodes of one trial GPU each; its address."""
    if os.environ.get("SERVELAB_REQUIRE_RAY") != "1":
        pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    import ray

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for _ in range(2):
            nodes.add_node(num_cpus=1, resources={TRIAL_GPU: 1})
        nodes.wait_for_nodes()
        yield nodes.address
    finally:
        ray.shutdown()
        nodes.shutdown()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _fleet(model: Path) -> Stage2Config:
    params = {"data_parallel_size": 2, "router": "session"}
    deployment = apply(build_deployment("cpu", model, f"{LINE} {SIM_ARGS}"), params)
    return Stage2Config(
        "trial-1", params, apply(build_deployment("cpu", model, LINE), params).engine_args(), deployment
    )


def test_a_replica_that_will_not_start_on_the_cluster_is_the_rows_error(tmp_path: Path, cluster: str) -> None:
    from servelab.cluster.ray_pool import RayPool

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(TINY_CONFIG))
    crash = ServerCommand(f"{sys.executable} -c 'import sys; sys.exit(3)' {{engine_args}}", startup_timeout=60)
    pool = RayPool(cluster)
    [row] = confirm(
        [_fleet(tmp_path / "model")], crash, CHATS, OBJECTIVE, tmp_path / "tune", pool=pool, gpu_resource=TRIAL_GPU
    )
    assert row.measured is None and row.predicted_score is not None
    assert row.error is not None and "would not start: server exited with code 3" in row.error, row.error


@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_a_fleet_on_two_nodes_is_measured_from_the_driver_and_leaves_no_server(
    tmp_path: Path, tiny_model: Path, vllm_python: Path, _vllm_pool: Any, cluster: str
) -> None:
    from servelab.cluster.ray_pool import RayPool

    _vllm_pool.stop_default()  # the host has two cores
    pids = tmp_path / "pids"
    server = (
        f"{vllm_python} -m vllm.entrypoints.openai.api_server --model {tiny_model} "
        "--served-model-name tiny-qwen {engine_args} --host {host} --port {port}"
    )
    command = ServerCommand(
        f"sh -c 'echo $$ >> {pids}; exec {server}'", env={"VLLM_CPU_KVCACHE_SPACE": "1"}, startup_timeout=900
    )
    pool = RayPool(cluster)
    [row] = confirm(
        [_fleet(tiny_model)], command, CHATS, OBJECTIVE, tmp_path / "tune", pool=pool, gpu_resource=TRIAL_GPU
    )

    assert row.ok, row.error
    assert row.route == "session" and len({s.base_url for s in row.fleet}) == 2
    assert row.measured is not None and row.measured.completed == 16
    served = [load.requests_served or 0 for load in row.replicas]
    assert all(n > 0 for n in served) and sum(served) == 16, served
    out = tmp_path / "tune" / "stage2" / "trial-1"
    for i in range(2):  # each replica's log came back from its node
        assert "tiny-qwen" in (out / f"replica-{i}" / "server.log").read_text()
    started = [int(line) for line in pids.read_text().split()]
    assert len(started) == 2 and not wait_gone(started, within=60.0)


def test_a_fleet_the_cluster_cannot_place_is_reported_not_waited_for_forever(tmp_path: Path, cluster: str) -> None:
    """Replicas that hold a resource no node has are never placed: the fleet is the row's error once twice
    --startup-timeout has passed, and the pending replicas are let go."""
    from servelab.cluster.ray_pool import RayPool

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(TINY_CONFIG))
    never_run = ServerCommand(f"{sys.executable} -c 'import sys; sys.exit(3)' {{engine_args}}", startup_timeout=5)
    pool = RayPool(cluster)
    [row] = confirm(
        [_fleet(tmp_path / "model")],
        never_run,
        CHATS,
        OBJECTIVE,
        tmp_path / "tune",
        pool=pool,
        gpu_resource="no_such_gpu",
    )
    assert row.measured is None and row.predicted_score is not None
    assert row.error is not None and row.error.count("not placed and ready within 10 s") == 2, row.error
