"""`servelab bench`: measure a real OpenAI-compatible server with the flags of `vllm bench serve`."""

from __future__ import annotations

import sys
from typing import Annotated, Any, Optional

import typer

from servelab.cli import app
from servelab.cli.options import (
    SERVER_PANEL,
    ApiKeyFlag,
    LoadFlags,
    load_options,
)
from servelab.cli.checks import real
from servelab.cli.cluster import Clients, RayAddress, check_clients, ray_clients
from servelab.cli.report import ReportFlag
from servelab.errors import InputError
from servelab.metrics.engines import AUTO, ENGINE_CHOICES
from servelab.report.console import make_console
from servelab.targets.preflight import ENDPOINTS
from servelab.schemas.vocabulary import CLIENT_ROUTES as ROUTES, ROUND_ROBIN, SESSION_HEADER

DEFAULT_BASE_URL = "http://127.0.0.1:8000"


@app.command()
@load_options
def bench(
    base_url: Annotated[Optional[list[str]], typer.Option(
        help="Server root, e.g. http://127.0.0.1:8000. Repeat it for replicas of one model with no router in front: "
             "the load is spread over them (--route) and each record names the URL that served it.",
        rich_help_panel=SERVER_PANEL)] = None,
    route: Annotated[str, typer.Option(help=f"How requests are spread over several --base-url: {', '.join(ROUTES)}.", rich_help_panel=SERVER_PANEL)] = ROUND_ROBIN,
    endpoint: Annotated[str, typer.Option(help=f"One of {', '.join(ENDPOINTS)}.", rich_help_panel=SERVER_PANEL)] = "/v1/completions",
    model: Annotated[Optional[str], typer.Option(help="Served model name (default: the first of /v1/models).", rich_help_panel=SERVER_PANEL)] = None,
    api_key: ApiKeyFlag = None,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="vLLM: generate exactly max_tokens.", rich_help_panel=SERVER_PANEL)] = False,
    request_timeout: Annotated[float, typer.Option(callback=real(gt=0), help="Seconds a request may take in all.", rich_help_panel=SERVER_PANEL)] = 600.0,
    scrape_interval: Annotated[float, typer.Option(callback=real(gt=0), help="Seconds between /metrics scrapes.", rich_help_panel=SERVER_PANEL)] = 1.0,
    gpu_metrics_url: Annotated[Optional[str], typer.Option(
        help="A DCGM exporter's /metrics (e.g. http://gpu-host:9400/metrics): the server's GPUs, sampled with /metrics "
             "into timeline.jsonl. Default: this host's GPUs through NVML, if any.",
        rich_help_panel=SERVER_PANEL)] = None,
    engine: Annotated[str, typer.Option(
        help=f"Whose /metrics names to read: {', '.join(ENGINE_CHOICES)} (auto: the names the server exports). "
             "The engine and its version, as the server reports them, go into run.json.",
        rich_help_panel=SERVER_PANEL)] = AUTO,
    abandon_after: Annotated[Optional[float], typer.Option(
        callback=real(gt=0),
        help="Seconds after which a request still streaming is abandoned (connection closed, as a user closing the "
             "tab): recorded as abandoned, not an error; the summary counts them apart.", rich_help_panel=SERVER_PANEL)] = None,
    abandon_share: Annotated[float, typer.Option(
        callback=real(gt=0, le=1),
        help="The share of requests that abandon after --abandon-after (the same ones in every run).",
        rich_help_panel=SERVER_PANEL)] = 1.0,
    # -- fleets (docs/fleets.md): per-replica /metrics through a router, and the session header --
    replica_metrics_url: Annotated[Optional[list[str]], typer.Option(
        help="A replica's /metrics behind the router at --base-url (repeat it for each): scraped alongside the run, so "
             "run.json's server_info.replicas says what each served, its queue, KV usage and prefix-cache hits. "
             "Several --base-url are scraped without it.", rich_help_panel=SERVER_PANEL)] = None,
    session_header: Annotated[str, typer.Option(
        help="The header carrying a request's conversation id (multiturn) for routers with session affinity; "
             "'' sends none.", rich_help_panel=SERVER_PANEL)] = SESSION_HEADER,
    report: ReportFlag = False,
    workers: Annotated[int, typer.Option(
        min=1, max=1024, help="Client processes, one event loop each: raise it when the summary warns that the client is the bottleneck.", rich_help_panel=SERVER_PANEL)] = 1,
    ray_address: RayAddress = None,
    clients: Clients = 1,
    *,
    load: LoadFlags,
) -> None:
    """Measure a running server: latency, throughput and goodput under the load you describe.

    Exit codes: 0 measured; 2 bad input, or a server that fails the pre-flight check (nothing is sent), or a server that refused every request (its first error message is printed); 3 disturbed: the run ended, but requests failed because the server refused or dropped connections (killed, crashed) or a client worker died, so the numbers do not describe the server; 130 interrupted (Ctrl-C, SIGTERM); 1 a bug in servelab (reported with its traceback). Records, summary and timeline are written in every case but 1 and a refusal before the run.
    """  # noqa: E501  (one paragraph: the help keeps the docstring's line breaks)
    from servelab.cli.run_and_show import run_and_show  # the client, the runner and the tables: not for --help
    from servelab.diagnose.server_config import CACHE_CONFIG
    from servelab.experiment.calibrate import server_cache_config
    from servelab.metrics.gpu import GpuTelemetry
    from servelab.targets.http import HttpTarget

    out = make_console(stderr=load.json)
    load.check()
    first_plan = load.make_plan()  # dataset files are read and checked before the server is touched
    if endpoint == "/v1/chat/completions" and not (load.tokenizer or first_plan.description["text_prompts"]):
        raise InputError(f"--endpoint {endpoint} sends text: give --tokenizer (or a sharegpt/jsonl dataset) with --dataset-name {load.dataset_name}")
    if engine not in ENGINE_CHOICES:
        raise InputError(f"--engine must be one of {', '.join(ENGINE_CHOICES)}, got {engine!r}")
    if abandon_share != 1.0 and abandon_after is None:
        raise InputError("--abandon-share picks the requests that abandon: it needs --abandon-after")
    if gpu_metrics_url is not None and not gpu_metrics_url.startswith(("http://", "https://")):
        raise InputError(f"--gpu-metrics-url must be an http(s) URL, got {gpu_metrics_url!r}")
    urls = base_url or [DEFAULT_BASE_URL]
    if route not in ROUTES:
        raise InputError(f"--route {route!r}: choose one of {', '.join(ROUTES)}")
    if len(set(urls)) != len(urls):
        raise InputError(f"--base-url: a URL is given twice ({', '.join(urls)})")
    check_clients(clients, ray_address, load.sweep)
    options: dict[str, Any] = dict(
        base_url=urls, endpoint=endpoint, model=model, api_key=api_key, ignore_eos=ignore_eos,
        request_timeout=request_timeout, scrape_interval=scrape_interval,
        send_text=bool(first_plan.description["text_prompts"]), workers=workers, engine=engine,
        abandon_after=abandon_after, abandon_share=abandon_share, route=route,
        session_header=session_header or None, replica_metrics_urls=replica_metrics_url or (),
    )
    if replica_metrics_url and len(urls) > 1:
        raise InputError("--replica-metrics-url is for replicas behind one router URL; several --base-url are scraped themselves")
    target = HttpTarget(**options, gpu_telemetry=GpuTelemetry(dcgm_url=gpu_metrics_url))
    server = target.preflight()
    result_dir = load.output_dir("bench")
    flags = {"base_url": urls[0], "base_urls": urls, "route": route, "endpoint": endpoint, "model": server["model"], "ignore_eos": ignore_eos,
             "request_timeout": request_timeout, "scrape_interval": scrape_interval, "workers": workers,
             "gpu_metrics_url": gpu_metrics_url, "engine": engine, "abandon_after": abandon_after,
             "abandon_share": abandon_share, "session_header": session_header or None,
             "replica_metrics_urls": replica_metrics_url or [], **load.as_dict()}
    run_info: dict[str, Any] = {"verb": "bench", "source": "http", "argv": _argv_without_secrets(api_key), "flags": flags,
                                # the server's own KV blocks and prefix-cache switch, which diagnose reads back
                                CACHE_CONFIG: server_cache_config(urls[0])}
    out.print(f"bench: {server['model']} at {' + '.join(urls)}{endpoint} -> {result_dir}", highlight=False)
    for warning in server["warnings"]:
        out.print(f"[yellow]warning[/]: {warning}", highlight=False, soft_wrap=True)
    if ray_address is not None:
        flags.update(ray_address=ray_address, clients=clients)
        run_and_show(ray_clients(ray_address, clients, options, load.make_plan), load, first_plan, result_dir, run_info,
                     out, report=report)
        return
    run_and_show(target, load, first_plan, result_dir, run_info, out, report=report)


def _argv_without_secrets(api_key: str | None) -> list[str]:
    """The command line as typed, with the API key's value masked wherever it appears."""
    args = list(sys.argv)
    masked = []
    skip = False
    for arg in args:
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
    return masked
