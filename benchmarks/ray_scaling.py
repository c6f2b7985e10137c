"""How much faster a big simulated search runs on Ray: a 1,000-configuration grid, one process vs. the cluster.

Qwen2.5-7B on one A100-80GB, 512-token prompts, 64 output tokens, 40
requests per simulated run, objective: throughput (one simulation per
configuration). The grid is max_num_seqs x max_num_batched_tokens x
long_prefill_token_threshold = 10 x 10 x 10 = 1,000 configurations, searched
by `tune`'s own stage 1 (`run_search`, optuna study in SQLite) twice: without
a pool (one process, as `servelab tune` runs without --ray-address) and with
the Ray pool `--ray-address` uses. Both must score every configuration alike
(the script checks it); the table gives the wall times and their ratio.

What bounds the ratio: the cores. Simulations are CPU-bound Python, one per
Ray worker, so the speed-up is at most min(workers, cores) -- 2 on the
2-core development machine -- less what stays serial on the driver (each
trial's optuna ask/tell and SQLite write, and Ray's per-task overhead of a
few ms, which is why each task should be a whole simulation, not less), and
less whatever else the machine runs meanwhile.

Without --ray-address the script starts a one-node Ray on this machine with
every core (`ray.init(num_cpus=os.cpu_count())`); with it, it joins that cluster.

    flock /tmp/servelab-heavy.lock .venv/bin/python benchmarks/ray_scaling.py [--configs 1000] [--sim-prompts 40] \\
        [--ray-address ADDR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from servelab.pool import TaskPool
from servelab.targets.deployment import build_deployment
from servelab.tune.objectives import Objective
from servelab.tune.space import SearchSpace, candidate_key
from servelab.tune.study import SearchSettings, run_search
from servelab.tune.trial import SimJudge
from servelab.tune.workload import TuneWorkload
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount

AXES = {
    "max_num_seqs": [4, 8, 12, 16, 24, 32, 48, 64, 96, 128],
    "max_num_batched_tokens": [256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192],
    "long_prefill_token_threshold": [0, 32, 64, 96, 128, 192, 256, 384, 512, 1024],
}


def space(configs: int) -> SearchSpace:
    """The first `configs` of the 1,000-point grid's axes (10 x 10 x 10 by default; fewer for a quick look)."""
    per_axis = max(1, round(configs ** (1 / 3)))
    return SearchSpace.from_items([f"{k}={','.join(map(str, v[:per_axis]))}" for k, v in AXES.items()])


def search(judge: SimJudge, grid: SearchSpace, pool: TaskPool | None) -> tuple[float, dict[str, Any]]:
    with tempfile.TemporaryDirectory() as scratch:
        began = time.perf_counter()
        trials = run_search(
            grid,
            judge.judge,
            Path(scratch),
            direction="maximize",
            settings=SearchSettings(n_trials=grid.size, sampler="grid"),
            pool=pool,
        )
        wall = time.perf_counter() - began
    return wall, {candidate_key(t.params): t.score for t in trials}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", type=int, default=1000)
    ap.add_argument("--sim-prompts", type=int, default=40)
    ap.add_argument("--ray-address", default=None)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import ray

    from servelab.cluster.ray_pool import RayPool

    workload = TuneWorkload(
        WorkloadConfig(input_len=512, output_len=64), ArrivalConfig(), Amount(num_prompts=args.sim_prompts)
    )
    deployment = build_deployment("a100-80gb", "qwen2.5-7b", "")
    judge = SimJudge(deployment, deployment, workload, Objective("throughput", None))
    grid = space(args.configs)

    one_wall, one = search(judge, grid, None)
    if args.ray_address is None:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    pool = RayPool(args.ray_address or "auto")
    began = time.perf_counter()
    ray.get([ray.remote(lambda: None).remote() for _ in range(pool.slots)])  # workers started before the clock
    warm = time.perf_counter() - began
    ray_wall, spread = search(judge, grid, pool)
    assert spread == one, "the cluster scored some configuration differently from one process"

    cpus = int(ray.cluster_resources().get("CPU", 0))
    result = {
        "configurations": grid.size,
        "sim_prompts": args.sim_prompts,
        "host_cores": os.cpu_count(),
        "ray_cpus": cpus,
        "one_process_s": round(one_wall, 1),
        "ray_s": round(ray_wall, 1),
        "speedup": round(one_wall / ray_wall, 2),
        "per_config_ms_one_process": round(1000 * one_wall / grid.size, 1),
        "ray_worker_warmup_s": round(warm, 1),
        "load_average_1m": round(os.getloadavg()[0], 1),
    }
    print(
        f"| configurations | one process | Ray ({cpus} CPUs) | speed-up | bound | load avg |\n"
        f"|---:|---:|---:|---:|---:|---:|\n"
        f"| {grid.size:,} | {one_wall:.1f} s | {ray_wall:.1f} s | {one_wall / ray_wall:.2f}x "
        f"| {min(cpus, os.cpu_count() or 1)}x | {result['load_average_1m']} |"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
