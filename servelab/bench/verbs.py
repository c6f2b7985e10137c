"""`bench` and `simulate` as library functions: a request in, its results directory written, its results out.

The two differ only in what serves the requests (a real server or the simulator); from the plan on, the run (one
point, a `--sweep`, or `--sweep auto`) is one code path, so a measured and a simulated run always read the same.
`say` receives the lines a person watching wants (what runs where, the deployment's warnings); `observe` gives a
live observer (a progress bar) for each run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from servelab.bench.request import BenchRequest, SimulateRequest
from servelab.bench.results import Results, SweepResults, load_results
from servelab.bench.run_info import bench_run_info, simulate_run_info
from servelab.cli.options import LoadFlags
from servelab.experiment.auto_sweep import AutoSweep, run_auto_sweep
from servelab.experiment.runner import run_point
from servelab.experiment.sweep import run_sweep
from servelab.metrics.records import RecordSink
from servelab.pool import TaskPool
from servelab.schemas.results import SweepIndex
from servelab.targets.base import Target
from servelab.workload.spec import LoadPlan

Say = Callable[[str], None]
Observe = Callable[[str, LoadPlan], AbstractContextManager[RecordSink | None]]
"""A run's live observer from its label and plan (experiment.sweep.Observe)."""


def _silent(line: str) -> None:
    """The default `say`: the Python API prints nothing."""


@contextmanager
def _unobserved(label: str, plan: LoadPlan) -> Iterator[RecordSink | None]:
    yield None


def run(request: BenchRequest, *, say: Say = _silent, observe: Observe = _unobserved) -> Results | SweepResults:
    """Measure the server: pre-flight (nothing is sent to a server that fails it), then the load; the results
    directory of the run, or the sweep's index."""
    from servelab.experiment.calibrate import server_cache_config
    from servelab.metrics.gpu import GpuTelemetry
    from servelab.targets.http import HttpTarget

    request.check()
    load, server = request.load, request.server
    first_plan = load.make_plan()  # dataset files are read and checked before the server is touched
    text = bool(first_plan.description["text_prompts"])
    request.check_text(text)
    target: Target = HttpTarget(**server.target_options(text), gpu_telemetry=GpuTelemetry(dcgm_url=server.gpu_metrics_url))
    found = target.preflight()  # type: ignore[attr-defined]
    result_dir = load.output_dir("bench")
    run_info = bench_run_info(request, found["model"], server_cache_config(server.urls[0]))
    say(f"bench: {found['model']} at {' + '.join(server.urls)}{server.endpoint} -> {result_dir}")
    for warning in found["warnings"]:
        say(f"[yellow]warning[/]: {warning}")
    if server.ray_address is not None:
        from servelab.cluster.clients import RayClients

        target = RayClients(server.ray_address, server.clients, server.target_options(text), load.make_plan)
    return run_load(target, load, first_plan, result_dir, run_info, observe)


def simulate(request: SimulateRequest, *, say: Say = _silent, observe: Observe = _unobserved) -> Results | SweepResults:
    """Serve the load on the simulated deployment; the results directory of the run, or the sweep's index."""
    request.check()
    deployment = request.deployment.deployment()
    target = deployment.sim_target(request.deployment.scrape_interval)
    load = request.load
    first_plan = load.make_plan()
    for warning in deployment.warnings:
        say(f"[yellow]warning:[/] {warning}")
    result_dir = load.output_dir("simulate")
    run_info = simulate_run_info(request, deployment.describe())
    say(f"simulate: {describe_line(deployment)} -> {result_dir}")
    pool = None
    if request.deployment.ray_address is not None:
        from servelab.cluster.ray_pool import RayPool

        pool = RayPool(request.deployment.ray_address)
    return run_load(target, load, first_plan, result_dir, run_info, observe, pool)


def run_load(target: Target, load: LoadFlags, first_plan: LoadPlan, result_dir: Path, run_info: dict[str, Any],
             observe: Observe = _unobserved, pool: TaskPool | None = None) -> Results | SweepResults:
    """One point, a sweep or an auto sweep, as --sweep says; an interrupted run returns what it wrote."""
    slo, percentiles, sweep = load.slo(), load.percentiles(), load.parsed_sweep()
    if sweep is None:
        with observe(run_info["verb"], first_plan) as observer:
            run_point(target, first_plan, result_dir, run_info, slo, percentiles, [observer] if observer is not None else [])
        return load_results(result_dir)
    args = (load.arrival(), load.make_plan, result_dir, run_info, slo, percentiles, observe)
    raw = (run_auto_sweep(target, sweep, *args) if isinstance(sweep, AutoSweep)
           else run_sweep(target, sweep, *args, pool=pool))
    return SweepResults(result_dir, SweepIndex.model_validate(raw))


def describe_line(deployment: Any) -> str:
    """One line naming the simulated deployment: model, GPU, parallelism, batch limits and KV cache."""
    c = deployment.config
    replicas = f" x {c.data_parallel_size} replicas ({deployment.router})" if c.data_parallel_size > 1 else ""
    return (
        f"{deployment.model.name} on {deployment.hardware.name}, TP={c.tensor_parallel_size}{replicas}: "
        f"max_num_seqs {c.max_num_seqs}, max_num_batched_tokens {c.max_num_batched_tokens}, "
        f"{deployment.memory.num_blocks:,} KV blocks of {c.block_size} ({deployment.memory.kv_cache_bytes / 2**30:.1f} GiB)"
    )


def masked_argv(api_key: str | None, argv: list[str] | None = None) -> tuple[str, ...]:
    """The command line as typed, with the API key's value masked wherever it appears."""
    masked: list[str] = []
    skip = False
    for arg in sys.argv if argv is None else argv:
        if skip:
            masked.append("***")
            skip = False
        elif arg == "--api-key":
            masked.append(arg)
            skip = True
        elif arg.startswith("--api-key="):
            masked.append("--api-key=***")
        else:
            masked.append("***" if api_key and arg == api_key else arg)
    return tuple(masked)
