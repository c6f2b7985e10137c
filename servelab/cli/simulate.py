"""`servelab simulate`: the load `bench` would send, served by simulated vLLM engines on a GPU cost model.

The load flags are bench's own (`@load_options`), and the results directory
is bench's format with `"source": "sim"` and the deployment in run.json, so
every later verb reads a simulated run exactly like a measured one.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from servelab.cli import app
from servelab.cli.options import (
    DEPLOYMENT_PANEL,
    CalibrationFlag,
    EngineArgsFlag,
    EngineFlag,
    GpuFileFlag,
    GpuFlag,
    LoadFlags,
    ModelFlag,
    ReplicasFlag,
    RouterFlag,
    TpFlag,
    VllmVersionFlag,
    deployment_from_flags,
    load_options,
)
from servelab.cli.checks import real
from servelab.cli.cluster import RayAddress, ray_pool
from servelab.cli.report import ReportFlag
from servelab.errors import InputError
from servelab.report.console import make_console
from servelab.schemas.vocabulary import ROUND_ROBIN, VLLM

if TYPE_CHECKING:
    from servelab.targets.deployment import Deployment


def _describe_line(deployment: Deployment) -> str:
    c = deployment.config
    replicas = f" x {c.data_parallel_size} replicas ({deployment.router})" if c.data_parallel_size > 1 else ""
    return (
        f"{deployment.model.name} on {deployment.hardware.name}, TP={c.tensor_parallel_size}{replicas}: "
        f"max_num_seqs {c.max_num_seqs}, max_num_batched_tokens {c.max_num_batched_tokens}, "
        f"{deployment.memory.num_blocks:,} KV blocks of {c.block_size} ({deployment.memory.kv_cache_bytes / 2**30:.1f} GiB)"
    )


@app.command()
@load_options
def simulate(
    gpu: GpuFlag = None,
    model: ModelFlag = None,
    engine_args: EngineArgsFlag = "",
    engine: EngineFlag = VLLM,
    tp: TpFlag = None,
    replicas: ReplicasFlag = None,
    router: RouterFlag = ROUND_ROBIN,
    gpu_file: GpuFileFlag = None,
    calibration: CalibrationFlag = None,
    vllm_version: VllmVersionFlag = None,
    scrape_interval: Annotated[float, typer.Option(callback=real(gt=0), help="Simulated seconds between timeline samples.", rich_help_panel=DEPLOYMENT_PANEL)] = 1.0,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="As `bench --ignore-eos`: generate exactly max_tokens. "
                                             "The simulator always does (where EOS falls is the text's, not the engine's: "
                                             "vary --random-output-len with --random-range-ratio instead); taken so a bench "
                                             "line pastes as is.", rich_help_panel=DEPLOYMENT_PANEL)] = False,
    report: ReportFlag = False,
    ray_address: RayAddress = None,
    *,
    load: LoadFlags,
) -> None:
    """Predict latency, throughput and goodput of a vLLM deployment under the load you describe, without a GPU."""
    from servelab.cli.run_and_show import run_and_show  # the runner and the tables: not for --help

    out = make_console(stderr=load.json)
    load.check()
    if ray_address is not None and load.sweep is None:
        raise InputError("--ray-address spreads the points of a --sweep over the cluster; a single run has nothing to spread")
    deployment = deployment_from_flags(gpu, model, engine_args, calibration=calibration, tp=tp, replicas=replicas,
                                       router=router, gpu_file=gpu_file, vllm_version=vllm_version, engine=engine)
    target = deployment.sim_target(scrape_interval)
    first_plan = load.make_plan()
    for warning in deployment.warnings:
        out.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    result_dir = load.output_dir("simulate")
    flags = {"gpu": gpu, "model": model, "engine": engine, "engine_args": engine_args, "tp": tp, "replicas": replicas, "router": router,
             "gpu_file": str(gpu_file) if gpu_file else None, "calibration": str(calibration) if calibration else None,
             "vllm_version": vllm_version, "scrape_interval": scrape_interval, "ignore_eos": ignore_eos, **load.as_dict()}
    run_info: dict[str, Any] = {"verb": "simulate", "source": "sim", "argv": list(sys.argv), "flags": flags,
                                "deployment": deployment.describe()}
    out.print(f"simulate: {_describe_line(deployment)} -> {result_dir}", highlight=False)
    run_and_show(target, load, first_plan, result_dir, run_info, out, report=report, title="Simulated serving result",
                 pool=ray_pool(ray_address))
