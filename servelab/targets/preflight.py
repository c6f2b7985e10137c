"""Checks that a server can take the run before any load is sent.

A wrong port, a typo in the endpoint or the model name should cost the user
one clear sentence, not a run of 1,000 failed requests. Each check names the
URL, endpoint or model that is wrong.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from servelab.targets.errors import TargetError

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ENDPOINTS = (COMPLETIONS, CHAT)
MODELS = "/v1/models"


def error_message(body: str, limit: int = 300) -> str:
    """The human part of an OpenAI-style error body (`{"error": {"message": ...}}`), else the body itself."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:limit]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"][:limit]
        if isinstance(err, str):
            return err[:limit]
        if isinstance(data.get("message"), str):
            return data["message"][:limit]
    return body.strip()[:limit]


def probe_body(endpoint: str, model: str) -> dict[str, Any]:
    """The cheapest valid request for an endpoint: one output token, not streamed."""
    if endpoint == CHAT:
        return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 1}
    return {"model": model, "prompt": "hi", "max_tokens": 1}


async def preflight(
    session: aiohttp.ClientSession,
    base_url: str,
    endpoint: str,
    model: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> dict[str, Any]:
    """Server info for run.json, with the model resolved (default: the first one listed).

    Raises TargetError when the server is unreachable, `/v1/models` fails,
    the model is not served, or the endpoint does not accept a one-token
    request. The API key is sent but never returned.
    """
    if endpoint not in ENDPOINTS:
        raise TargetError(f"endpoint {endpoint!r} is not supported; use one of {', '.join(ENDPOINTS)}")
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    models_url = base_url + MODELS
    try:
        async with session.get(models_url, headers=headers, timeout=client_timeout) as resp:
            body = await resp.text()
            status = resp.status
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise TargetError(f"cannot reach {base_url}: {type(exc).__name__}: {exc}".rstrip(": ")) from exc
    if status in (401, 403):
        raise TargetError(f"{models_url} rejected the API key (HTTP {status}); set OPENAI_API_KEY or --api-key")
    if status != 200:
        raise TargetError(f"GET {models_url} failed with HTTP {status}: {error_message(body)}")
    try:
        listed = json.loads(body)["data"]
        ids = [entry["id"] for entry in listed]
    except (ValueError, KeyError, TypeError) as exc:
        raise TargetError(f"GET {models_url} did not return an OpenAI model list: {body[:200]!r}") from exc
    if not ids:
        raise TargetError(f"{base_url} serves no models ({models_url} is empty)")
    if model is None:
        model = ids[0]
    elif model not in ids:
        raise TargetError(f"model {model!r} is not served by {base_url}; it serves: {', '.join(ids)}")

    url = base_url + endpoint
    try:
        async with session.post(url, json=probe_body(endpoint, model), headers=headers, timeout=client_timeout) as resp:
            body = await resp.text()
            status = resp.status
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise TargetError(f"POST {url} failed: {type(exc).__name__}: {exc}") from exc
    if status in (404, 405):
        raise TargetError(f"{url} does not exist on this server (HTTP {status}); check --endpoint")
    if status != 200:
        raise TargetError(f"POST {url} with model {model!r} failed with HTTP {status}: {error_message(body)}")
    return {
        "base_url": base_url,
        "endpoint": endpoint,
        "model": model,
        "models": listed,
    }
