"""run.json's `run_info` for bench and simulate, built in one place for the CLI and the Python API alike.

What a verb records is what its request holds: every flag as given (paths as text), the server's or the deployment's
own description, and for bench the server's KV-cache configuration, which `diagnose` reads back to size the cache
from the server's figures rather than from flags.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from servelab.runs.request import BenchRequest, SimulateRequest
from servelab.schemas.results import Json, RunInfo
from servelab.schemas.vocabulary import Route


def flag_values(block: object, *, skip: tuple[str, ...] = ()) -> Json:
    """A flag block's fields as run.json's `flags` keeps them: paths as text, vocabularies as their words."""
    out: Json = {}
    for f in fields(block):  # type: ignore[arg-type]
        if f.name in skip:
            continue
        value = getattr(block, f.name)
        out[f.name] = str(value) if isinstance(value, (Path, Route)) else value
    return out


def bench_run_info(request: BenchRequest, served_model: str, cache_config: Json) -> RunInfo:
    """`served_model`: the model pre-flight found (what --model named, or the server's first); `cache_config`: the
    server's own KV blocks and prefix-cache switch (servelab.metrics.scrape.server_cache_config)."""
    from servelab.metrics.scrape import CACHE_CONFIG

    s = request.server
    flags = {
        "base_url": s.urls[0],
        "base_urls": s.urls,
        "route": str(s.route),
        "endpoint": s.endpoint,
        "model": served_model,
        **flag_values(
            s,
            skip=(
                "base_url",
                "route",
                "endpoint",
                "model",
                "api_key",
                "ray_address",
                "clients",
                "replica_metrics_url",
                "session_header",
            ),
        ),
        "session_header": s.session_header or None,
        "replica_metrics_urls": list(s.replica_metrics_url or ()),
        **flag_values(request.load),
    }
    if s.ray_address is not None:
        flags.update(ray_address=s.ray_address, clients=s.clients)
    keys = {"verb": "bench", "source": "http", "argv": list(request.argv), "flags": flags, CACHE_CONFIG: cache_config}
    return RunInfo.begun(**keys)


def simulate_run_info(request: SimulateRequest, deployment: Json, router: str) -> RunInfo:
    """`deployment`: the simulated deployment's description (Deployment.describe); `router`: the one it runs,
    recorded in place of a --router left to its default (a diagnosis of this run rebuilds the same fleet)."""
    unset = ("router_weights",) if request.deployment.router_weights is None else ()  # run.json as before the flag
    flags = {**flag_values(request.deployment, skip=("ray_address", *unset)), **flag_values(request.load)}
    flags["router"] = router
    return RunInfo.begun(verb="simulate", source="sim", argv=list(request.argv), flags=flags, deployment=deployment)
