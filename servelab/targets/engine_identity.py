"""Which engine serves a URL, and which version, as the server itself reports them.

A run's numbers mean little without the engine and release that produced
them, and the user's word for it may be stale; so run.json records what the
server says: the metric names of its `/metrics` (servelab/metrics/engines.py)
and the version from the engine's own endpoint (vLLM and trtllm-serve
`GET /version`, SGLang `GET /server_info`, llama.cpp `GET /props`). Every
probe is best effort: an endpoint a server lacks leaves that field null.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, TypedDict

from servelab.metrics import engines
from servelab.targets.errors import TargetError

if TYPE_CHECKING:  # imported by the functions that send requests: a command that sends none starts without it
    import aiohttp

PROBE_TIMEOUT_S = 5.0
VERSION_ENDPOINTS: dict[str, tuple[tuple[str, str], ...]] = {
    "vllm": (("/version", "version"),),
    "trtllm": (("/version", "version"),),
    "sglang": (("/server_info", "version"), ("/get_server_info", "version")),
    "llamacpp": (("/props", "build_info"),),
}
"""Per engine: (endpoint, JSON key of its version), tried in order."""
UNNAMED_PROBES = (("llamacpp", "/props", "build_info"), ("sglang", "/server_info", "version"))
"""A server whose /metrics name no engine: endpoints only one engine serves, which name it when they answer."""


async def _get(session: aiohttp.ClientSession, url: str, headers: dict[str, str] | None) -> str | None:
    import aiohttp

    try:
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        async with session.get(url, headers=headers, timeout=timeout) as resp:
            return await resp.text() if resp.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, UnicodeDecodeError):
        return None


async def _json_field(session: aiohttp.ClientSession, url: str, key: str, headers: dict[str, str] | None) -> str | None:
    body = await _get(session, url, headers)
    try:
        value = json.loads(body)[key] if body is not None else None
    except (ValueError, KeyError, TypeError):
        return None
    return str(value) if value is not None else None


class EngineFound(TypedDict):
    """The serving engine as pre-flight found it: its name, version, and where they came from (None: not found)."""

    name: str | None
    version: str | None
    reported_by: str | None


async def identify(
    session: aiohttp.ClientSession,
    base_url: str,
    engine: str = engines.AUTO,
    headers: dict[str, str] | None = None,
) -> EngineFound:
    """The engine for run.json's server_info.engine (schemas.results.EngineIdentity describes it there).

    `engine` is `--engine`: `auto` takes the name from the server's metric names; a named engine
    whose names the server's /metrics do not carry (it exports another engine's) raises TargetError
    before any load, since every timeline column would be empty.
    """
    if engine not in engines.ENGINE_CHOICES:
        raise TargetError(f"engine {engine!r} is not known; use one of {', '.join(engines.ENGINE_CHOICES)}")
    text = await _get(session, base_url + "/metrics", headers)
    detected = engines.detect(text) if text is not None else None
    if engine != engines.AUTO and detected is not None and detected.name != engine:
        raise TargetError(
            f"--engine {engine} but {base_url}/metrics exports {detected.name}'s metrics "
            f"({detected.prefix}*): use --engine {detected.name} or auto"
        )
    name = engine if engine != engines.AUTO else (detected.name if detected else None)
    if name is not None:
        for path, key in VERSION_ENDPOINTS[name]:
            version = await _json_field(session, base_url + path, key, headers)
            if version is not None:
                return {"name": name, "version": version, "reported_by": f"GET {path}"}
        return {"name": name, "version": None, "reported_by": "/metrics" if detected else "--engine"}
    for candidate, path, key in UNNAMED_PROBES:
        version = await _json_field(session, base_url + path, key, headers)
        if version is not None:
            return {"name": candidate, "version": version, "reported_by": f"GET {path}"}
    version = await _json_field(session, base_url + "/version", "version", headers)
    return {"name": None, "version": version, "reported_by": "GET /version" if version is not None else None}
