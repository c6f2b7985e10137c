"""tune's stage 2 measures a fleet as it was predicted: two vLLM CPU servers (the tiny model) behind servelab's own
session route, not one server with --data-parallel-size 2.

The study searches `data_parallel_size=2` x `router=session` over a baseline of one server; stage 2 measures the
baseline (one server) and the fleet (two servers started side by side, each with the configuration's flags less
the replica count), and records each replica's load beside the prediction. Three server starts: the costliest
part. The workload is small (16 three-turn chats, 8 requests in flight); nothing timed is asserted.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from servelab.metrics.slo import SLO
from servelab.report.inputs import load_inputs
from servelab.report.replicas import fleets_of
from servelab.targets.deployment import build_deployment
from servelab.targets.server_process import group_alive
from servelab.tune import TuneRequest, run
from servelab.tune.confirm import ServerCommand
from servelab.tune.objectives import Objective
from servelab.tune.space import SearchSpace
from servelab.tune.study import SearchSettings
from servelab.tune.workload import TuneWorkload
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount
from support.schemas import assert_files_match_schemas

LINE = "--max-model-len 4096 --max-num-seqs 32"
SIM_ARGS = "--block-size 128 --kv-cache-memory-bytes 1G"
CHATS = WorkloadConfig(dataset_name="multiturn", turns=3, prefix_len=128, num_prefixes=4, input_len=128, output_len=16)


@pytest.mark.vllm
def test_stage2_starts_the_fleet_the_simulator_predicted_and_records_each_replicas_load(
    tmp_path: Path, tiny_model: Path, vllm_python: Path, _vllm_pool
) -> None:
    _vllm_pool.stop_default()  # tune starts its own servers, and the host has two cores
    chats = TuneWorkload(CHATS, ArrivalConfig(max_concurrency=8), Amount(num_prompts=48))
    request = TuneRequest(
        simulated=build_deployment("cpu", tiny_model, f"{LINE} {SIM_ARGS}"),
        launch=build_deployment("cpu", tiny_model, LINE),
        sim_args=SIM_ARGS,
        space=SearchSpace.from_items(["data_parallel_size=2", "router=session"]),
        objective=Objective("goodput", SLO.parse("ttft:2000")),
        sim_workload=chats,
        bench_workload=chats,
        search=SearchSettings(n_trials=10),
        output=tmp_path / "tune",
        top_k=1,
        server=ServerCommand(
            f"{vllm_python} -m vllm.entrypoints.openai.api_server --model {tiny_model} --served-model-name tiny-qwen "
            "{engine_args}",
            env={"VLLM_CPU_KVCACHE_SPACE": "1"},
            startup_timeout=600,
        ),
    )
    doc = run(request)

    assert doc.stage2 is not None
    baseline, fleet = doc.stage2.results
    assert baseline.ok and fleet.ok, (baseline.error, fleet.error)
    assert baseline.route is None and baseline.fleet == [] and baseline.server_pid is not None
    assert fleet.params == {"data_parallel_size": 2, "router": "session"} and fleet.route == "session"
    # Predicted and measured, side by side, for the fleet as a whole.
    assert fleet.predicted.completed == 48 and fleet.measured is not None and fleet.measured.completed == 48
    assert fleet.measured_score is not None and fleet.predicted_score is not None

    # Two servers, each started without the replica count, on ports of their own; none left running.
    urls = [server.base_url for server in fleet.fleet]
    assert len(set(urls)) == 2
    assert all(server.pid is not None and not group_alive(server.pid) for server in fleet.fleet)
    assert not group_alive(baseline.server_pid)
    out = Path(fleet.directory or "")
    assert all((out / f"replica-{i}" / "server.log").stat().st_size > 0 for i in range(2))
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["route"] == "session" and run_json["base_urls"] == urls
    assert "--data-parallel-size" in fleet.engine_args and "--data-parallel-size" not in run_json["replica_engine_args"]
    assert not (tmp_path / "tune" / "stage2" / "live-server.json").exists()

    # Each replica's load, from its own /metrics, in stage2.json as in run.json; between them they served it all.
    stored = json.loads((out / "stage2.json").read_text())
    assert [load["url"] for load in stored["replicas"]] == [f"{url}/metrics" for url in urls]
    assert stored["replicas"] == run_json["server_info"]["replicas"]
    served = [load.requests_served or 0 for load in fleet.replicas]
    assert all(n > 0 for n in served) and sum(served) == 48, served

    # The session route kept every chat on one replica.
    conversation = {spec.index: spec.conversation for spec in chats.plan().requests}
    replicas_of: dict[object, set[str]] = defaultdict(set)
    for line in (out / "records.jsonl").read_text().splitlines():
        record = json.loads(line)
        replicas_of[conversation[record["index"]]].add(record["base_url"])
    assert len(replicas_of) == 16 and all(len(used) == 1 for used in replicas_of.values())
    assert {url for used in replicas_of.values() for url in used} == set(urls)

    # The study's report shows the fleet's stage-2 run replica by replica, as it shows any measured fleet.
    [(report_run, rows)] = fleets_of(load_inputs([tmp_path / "tune"]))
    assert report_run.directory == out and [row.name for row in rows] == sorted(urls)
    assert sum(row.completed or 0 for row in rows) == 48 and all(row.load is not None for row in rows)

    seen = assert_files_match_schemas(tmp_path / "tune")
    assert seen == {"tune": 1, "trial": 1, "stage2": 2, "run": 2, "record": 2, "summary": 2, "timeline": 2}, seen
    print(
        {
            r.label: (r.engine_args, r.predicted.request_throughput, r.measured and r.measured.request_throughput)
            for r in doc.stage2.results
        },
        [(load.requests_served, load.prefix_cache_hit_rate, load.mean_running) for load in fleet.replicas],
    )
