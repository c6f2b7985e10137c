"""tune's stage 2 on the real vLLM CPU server: --max-num-seqs 2 / 8 / 32 at concurrency 32, 2 as the baseline.

Stage 2 measures the baseline and the simulator's best (top_k 1): two server starts, the suite's costliest part.

At concurrency 32 a batch of 2 queues 30 requests behind it (TTFT in
seconds), so under `ttft:500` its goodput collapses; the tuner must measure
that, recommend another setting, and leave no server behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.metrics.slo import SLO
from servelab.targets.deployment import build_deployment
from servelab.targets.server_process import group_alive
from servelab.tune.confirm import ServerCommand
from servelab.tune.objectives import Objective
from servelab.tune.space import SearchSpace
from servelab.tune.study import SearchSettings
from servelab.tune import TuneRequest, run
from servelab.tune.workload import TuneWorkload
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount
from support.schemas import assert_files_match_schemas

PORT = 18401


def _group_gone(pgid: int) -> bool:
    """No process of the group runs (zombies aside: PID 1 here never reaps a server's orphans)."""
    return not group_alive(pgid)


def _processes_on(model_dir: Path, port: int) -> list[int]:
    """Any process whose command line names this model and port (a server that outlived tune)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if str(model_dir).encode() in cmdline and str(port).encode() in cmdline:
                found.append(int(entry.name))
    return found


@pytest.mark.vllm
def test_stage2_picks_a_bigger_batch_than_the_bad_baseline_and_leaves_no_server(
    tmp_path: Path, tiny_model: Path, vllm_python: Path, _vllm_pool, launch_vllm
) -> None:
    _vllm_pool.stop_default()  # one vLLM at a time: tune starts its own
    workload = WorkloadConfig(input_len=256, output_len=64)
    arrival = ArrivalConfig(max_concurrency=32)
    line, sim_args = "--max-model-len 4096 --max-num-seqs 2", "--block-size 128 --kv-cache-memory-bytes 1G"
    request = TuneRequest(
        simulated=build_deployment("cpu", tiny_model, f"{line} {sim_args}"),
        launch=build_deployment("cpu", tiny_model, line),
        sim_args=sim_args,
        space=SearchSpace.from_items(["max_num_seqs=2,8,32"]),
        objective=Objective("goodput", SLO.parse("ttft:500")),
        sim_workload=TuneWorkload(workload, arrival, Amount(num_prompts=200)),
        bench_workload=TuneWorkload(workload, arrival, Amount(num_prompts=160)),
        search=SearchSettings(n_trials=10),
        output=tmp_path / "tune",
        top_k=1,
        server=ServerCommand(
            f"{vllm_python} -m vllm.entrypoints.openai.api_server --model {tiny_model} --served-model-name tiny-qwen "
            "{engine_args}",
            env={"VLLM_CPU_KVCACHE_SPACE": "1"},
            port=PORT,
            startup_timeout=600,
        ),
        server_check=lambda url, config, directory: [f"{config.label} checked at {url}"],
    )
    doc = run(request).model_dump(mode="json")  # the file's content

    results = {r["label"]: r for r in doc["stage2"]["results"]}
    assert len(results) == 2 and all(r["error"] is None for r in results.values()), results
    baseline = results["baseline"]
    rec = doc["recommendation"]
    assert rec["source"] == "stage2" and rec["label"] != "baseline"
    assert rec["params"]["max_num_seqs"] != 2
    assert rec["score"] > baseline["measured_score"]
    assert rec["gain_over_baseline"] > 1
    for r in results.values():
        assert r["measured"]["failed"] == 0
        assert r["warnings"] == [f"{r['label']} checked at http://127.0.0.1:{PORT}"]  # each server checked when up
        assert r["server_pid"] is not None and _group_gone(r["server_pid"])
    assert _processes_on(tiny_model, PORT) == []
    assert not (tmp_path / "tune" / "stage2" / "live-server.json").exists()
    # Every file the study wrote, stage 2's bench directories included, is what its published schema says.
    seen = assert_files_match_schemas(tmp_path / "tune")
    assert seen == {"tune": 1, "trial": 3, "stage2": 2, "run": 2, "record": 2, "summary": 2, "timeline": 2}, seen
    print(
        {
            label: (
                r["engine_args"],
                r["predicted_score"],
                r["measured_score"],
                r["measured"]["median_ttft_ms"],
                r["startup_s"],
                r["bench_s"],
            )
            for label, r in results.items()
        }
    )
