"""`bench` as a library function: measure a running OpenAI-compatible server under the load a BenchRequest describes."""

from __future__ import annotations

import sys

from servelab.runs.load import Observe, Say, run_load, silent, unobserved
from servelab.runs.request import BenchRequest
from servelab.runs.results import Results, SweepResults
from servelab.runs.run_info import bench_run_info
from servelab.targets.base import Target


def run(request: BenchRequest, *, say: Say = silent, observe: Observe = unobserved) -> Results | SweepResults:
    """Measure the server: pre-flight (nothing is sent to a server that fails it), then the load; the results
    directory of the run, or the sweep's index."""
    from servelab.metrics.scrape import server_cache_config
    from servelab.metrics.gpu import GpuTelemetry
    from servelab.targets.http import HttpTarget

    request.check()
    load, server = request.load, request.server
    first_plan = load.make_plan()  # dataset files are read and checked before the server is touched
    text = bool(first_plan.description["text_prompts"])
    request.check_text(text)
    http = HttpTarget(**server.target_options(text), gpu_telemetry=GpuTelemetry(dcgm_url=server.gpu_metrics_url))
    found = http.preflight()
    result_dir = load.output_dir("bench")
    run_info = bench_run_info(request, found["model"], server_cache_config(server.urls[0]))
    say(f"bench: {found['model']} at {' + '.join(server.urls)}{server.endpoint} -> {result_dir}")
    for warning in found["warnings"]:
        say(f"[yellow]warning[/]: {warning}")
    target: Target = http
    if server.ray_address is not None:
        from servelab.cluster.clients import RayClients

        options = dict(server.target_options(text))  # RayClients takes a plain dict
        target = RayClients(server.ray_address, server.clients, options, load.make_plan)
    return run_load(target, load, first_plan, result_dir, run_info, observe)


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
