"""`simulate` as a library function: the load a SimulateRequest describes, served by a simulated deployment."""

from __future__ import annotations

from typing import Any

from servelab.runs.load import Observe, Say, run_load, silent, unobserved
from servelab.runs.request import SimulateRequest
from servelab.runs.results import Results, SweepResults
from servelab.runs.run_info import simulate_run_info


def run(request: SimulateRequest, *, say: Say = silent, observe: Observe = unobserved) -> Results | SweepResults:
    """Serve the load on the simulated deployment; the results directory of the run, or the sweep's index."""
    request.check()
    deployment = request.deployment.deployment()
    target = deployment.sim_target(request.deployment.scrape_interval)
    load = request.load
    first_plan = load.make_plan()
    for warning in deployment.warnings:
        say(f"[yellow]warning:[/] {warning}")
    result_dir = load.output_dir("simulate")
    run_info = simulate_run_info(request, deployment.describe(), deployment.router)
    say(f"simulate: {describe_line(deployment)} -> {result_dir}")
    pool = None
    if request.deployment.ray_address is not None:
        from servelab.cluster.ray_pool import RayPool

        pool = RayPool(request.deployment.ray_address)
    return run_load(target, load, first_plan, result_dir, run_info, observe, pool)


def describe_line(deployment: Any) -> str:
    """One line naming the simulated deployment: model, GPU, parallelism, batch limits and KV cache."""
    c = deployment.config
    replicas = f" x {c.data_parallel_size} replicas ({deployment.router})" if c.data_parallel_size > 1 else ""
    return (
        f"{deployment.model.name} on {deployment.hardware.name}, TP={c.tensor_parallel_size}{replicas}: "
        f"max_num_seqs {c.max_num_seqs}, max_num_batched_tokens {c.max_num_batched_tokens}, "
        f"{deployment.memory.num_blocks:,} KV blocks of {c.block_size} ({deployment.memory.kv_cache_bytes / 2**30:.1f} "
        f"GiB)"
    )
