"""`servelab simulate`: the load `bench` would send, served by simulated vLLM engines on a GPU cost model.

The load flags are bench's own (`@load_options`), and the results directory
is bench's format with `"source": "sim"` and the deployment in run.json, so
every later verb reads a simulated run exactly like a measured one.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from servelab.cli import app
from servelab.cli.options import (
    LoadFlags,
    deployment_from_flags,
    load_options,
)
from servelab.cli.cluster import RayAddress, ray_pool
from servelab.cli.report import ReportFlag
from servelab.cli.run_and_show import run_and_show
from servelab.errors import InputError
from servelab.sim.router import POLICIES, ROUND_ROBIN
from servelab.targets.deployment import Deployment

_DEPLOYMENT = "Deployment"


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
    gpu: Annotated[Optional[str], typer.Option(help="GPU from the catalogue, e.g. a100-80gb, h100-sxm.", rich_help_panel=_DEPLOYMENT)] = None,
    model: Annotated[Optional[str], typer.Option(help="Built-in model (qwen2.5-7b, llama-3.1-8b, ...) or a Hugging Face model dir with config.json.", rich_help_panel=_DEPLOYMENT)] = None,
    engine_args: Annotated[str, typer.Option(help="Your `vllm serve` flags, as you would paste them: \"--max-num-seqs 128 --no-enable-prefix-caching\".", rich_help_panel=_DEPLOYMENT)] = "",
    tp: Annotated[Optional[int], typer.Option("--tp", help="Tensor-parallel size (same as --tensor-parallel-size in --engine-args).", rich_help_panel=_DEPLOYMENT)] = None,
    replicas: Annotated[Optional[int], typer.Option(help="Data-parallel replicas behind one router.", rich_help_panel=_DEPLOYMENT)] = None,
    router: Annotated[str, typer.Option(help=f"How replicas are picked: {', '.join(POLICIES)}.", rich_help_panel=_DEPLOYMENT)] = ROUND_ROBIN,
    gpu_file: Annotated[Optional[Path], typer.Option(help="YAML with your own GPUs, added to the catalogue.", rich_help_panel=_DEPLOYMENT)] = None,
    calibration: Annotated[Optional[Path], typer.Option(help="A profile from `servelab calibrate`: its hardware, model and fitted coefficients.", rich_help_panel=_DEPLOYMENT)] = None,
    scrape_interval: Annotated[float, typer.Option(help="Simulated seconds between timeline samples.", rich_help_panel=_DEPLOYMENT)] = 1.0,
    report: ReportFlag = False,
    ray_address: RayAddress = None,
    *,
    load: LoadFlags,
) -> None:
    """Predict latency, throughput and goodput of a vLLM deployment under the load you describe, without a GPU."""
    out = Console(stderr=True) if load.json else Console()
    load.check()
    if scrape_interval <= 0:
        raise InputError(f"--scrape-interval must be > 0 seconds, got {scrape_interval}")
    if ray_address is not None and load.sweep is None:
        raise InputError("--ray-address spreads the points of a --sweep over the cluster; a single run has nothing to spread")
    deployment = deployment_from_flags(gpu, model, engine_args, calibration=calibration, tp=tp,
                                       replicas=replicas, router=router, gpu_file=gpu_file)
    target = deployment.sim_target(scrape_interval)
    first_plan = load.make_plan()
    for warning in deployment.warnings:
        out.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    result_dir = load.output_dir("simulate")
    flags = {"gpu": gpu, "model": model, "engine_args": engine_args, "tp": tp, "replicas": replicas, "router": router,
             "gpu_file": str(gpu_file) if gpu_file else None, "calibration": str(calibration) if calibration else None,
             "scrape_interval": scrape_interval, **load.as_dict()}
    run_info: dict[str, Any] = {"verb": "simulate", "source": "sim", "argv": list(sys.argv), "flags": flags,
                                "deployment": deployment.describe()}
    out.print(f"simulate: {_describe_line(deployment)} -> {result_dir}", highlight=False)
    run_and_show(target, load, first_plan, result_dir, run_info, out, report=report, title="Simulated serving result",
                 pool=ray_pool(ray_address))
