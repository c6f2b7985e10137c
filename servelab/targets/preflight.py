"""Checks that a server can take the run before any load is sent.

A wrong port, a typo in the endpoint or the model name should cost the user
one clear sentence, not a run of 1,000 failed requests. Each check names the
URL, endpoint or model that is wrong.

The probe is a one-token request streamed the way the run will stream, so
what would spoil every record is known before any load: a stream with no
event (fatal), a stream from another model than the one asked for (fatal),
a 429/503 with its Retry-After (fatal: the server refuses load right now),
a stream without usage (a warning: token counts will be estimated).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

from servelab.targets.engine_identity import EngineFound
from servelab.targets.errors import TargetError
from servelab.targets.sse import DONE, SSEDecoder

if TYPE_CHECKING:  # imported by the functions that send requests: a command that sends none starts without it
    import aiohttp

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


class ProbeBody(TypedDict, total=False):
    """The probe's request: a chat (`messages`, `max_completion_tokens`) or a completion (`prompt`, `max_tokens`)."""

    model: str
    messages: list[dict[str, str]]
    max_completion_tokens: int
    prompt: str
    max_tokens: int
    stream: bool
    stream_options: dict[str, bool]


def probe_body(endpoint: str, model: str) -> ProbeBody:
    """The cheapest valid request for an endpoint: one output token, streamed with usage as the run asks."""
    stream: ProbeBody = {"stream": True, "stream_options": {"include_usage": True}}
    if endpoint == CHAT:
        return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 1, **stream}
    return {"model": model, "prompt": "hi", "max_tokens": 1, **stream}


def model_names(model: str, listed: Sequence[ListedModel]) -> frozenset[str]:
    """The names a stream for `model` may carry: itself and the names listed with the same root
    (vLLM lists every --served-model-name and answers with the first)."""
    root = next((m.get("root") for m in listed if m.get("id") == model), None)
    return frozenset({model} | {m["id"] for m in listed if root is not None and m.get("root") == root})


def _probe_stream(url: str, model: str, names: frozenset[str], body: str) -> list[str]:
    """Checks the probe's streamed answer; raises TargetError on what would spoil every record, returns warnings."""
    decoder = SSEDecoder()
    events = []
    for payload in decoder.feed(body.encode()) + decoder.close():
        if payload == DONE:
            continue
        try:
            events.append(json.loads(payload))
        except ValueError:
            raise TargetError(f"POST {url} streamed an event that is not JSON: {payload[:120]!r}") from None
    if not events:
        raise TargetError(f"POST {url} answered HTTP 200 with an empty stream (no event): every request would fail")
    answered = events[0].get("model") if isinstance(events[0], dict) else None
    if isinstance(answered, str) and answered not in names:
        raise TargetError(
            f"POST {url} asked for model {model!r} and the stream came from {answered!r}: "
            f"the server (or a proxy before it) serves another model"
        )
    if not any(isinstance(e, dict) and e.get("usage") for e in events):
        return [
            f"{url} streams no usage (stream_options.include_usage is ignored): token counts are estimated, "
            "prompt tokens from the plan and output tokens as chunks with output"
        ]
    return []


class ListedModel(TypedDict, total=False):
    """One entry of an OpenAI `/v1/models` list, as far as pre-flight reads it (the server's JSON: kept whole)."""

    id: str
    root: str


class PreflightInfo(TypedDict):
    """What pre-flight found, for run.json's server_info (HttpTarget adds the engine and, with replicas, them)."""

    base_url: str
    endpoint: str
    model: str
    models: list[ListedModel]
    model_names: list[str]
    warnings: list[str]


class ServerFound(PreflightInfo, total=False):
    """Pre-flight's findings as HttpTarget keeps them: the engine, and the replicas when there are several."""

    engine: EngineFound
    base_urls: list[str]
    route: str


async def preflight(
    session: aiohttp.ClientSession,
    base_url: str,
    endpoint: str,
    model: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> PreflightInfo:
    """Server info for run.json, with the model resolved (default: the first one listed).

    Raises TargetError when the server is unreachable, `/v1/models` fails,
    the model is not served, or the endpoint does not accept a one-token
    request. The API key is sent but never returned.
    """
    import aiohttp

    if endpoint not in ENDPOINTS:
        raise TargetError(f"endpoint {endpoint!r} is not supported; use one of {', '.join(ENDPOINTS)}")
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    listed, ids = await _listed_models(session, base_url, headers, client_timeout)
    if model is None:
        model = ids[0]
    elif model not in ids:
        raise TargetError(f"model {model!r} is not served by {base_url}; it serves: {', '.join(ids)}")

    url = base_url + endpoint
    try:
        async with session.post(url, json=probe_body(endpoint, model), headers=headers, timeout=client_timeout) as resp:
            body = await resp.text()
            status = resp.status
            retry_after = resp.headers.get("Retry-After")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise TargetError(f"POST {url} failed: {type(exc).__name__}: {exc}") from exc
    if status in (404, 405):
        raise TargetError(f"{url} does not exist on this server (HTTP {status}); check --endpoint")
    if retry_after is not None and status in (429, 503):
        raise TargetError(
            f"POST {url} was refused with HTTP {status}, Retry-After: {retry_after} "
            f"({error_message(body)}): the server is not taking load now; try again later"
        )
    if status != 200:
        raise TargetError(f"POST {url} with model {model!r} failed with HTTP {status}: {error_message(body)}")
    names = model_names(model, listed)
    return {
        "base_url": base_url,
        "endpoint": endpoint,
        "model": model,
        "models": listed,
        "model_names": sorted(names),
        "warnings": _probe_stream(url, model, names, body),
    }


async def _listed_models(
    session: aiohttp.ClientSession, base_url: str, headers: dict[str, str] | None, timeout: aiohttp.ClientTimeout
) -> tuple[list[ListedModel], list[str]]:
    """`GET /v1/models`'s list and its ids; TargetError naming the URL when the server cannot be
    reached, refuses the key, fails, answers something else or lists nothing."""
    import aiohttp

    models_url = base_url + MODELS
    try:
        async with session.get(models_url, headers=headers, timeout=timeout) as resp:
            body = await resp.text()
            status = resp.status
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise TargetError(f"cannot reach {base_url}: {type(exc).__name__}: {exc}".rstrip(": ")) from exc
    if status in (401, 403):
        raise TargetError(f"{models_url} rejected the API key (HTTP {status}); set OPENAI_API_KEY or --api-key")
    if status != 200:
        raise TargetError(f"GET {models_url} failed with HTTP {status}: {error_message(body)}")
    try:
        listed: list[ListedModel] = json.loads(body)["data"]
        ids = [entry["id"] for entry in listed]
    except (ValueError, KeyError, TypeError) as exc:
        raise TargetError(f"GET {models_url} did not return an OpenAI model list: {body[:200]!r}") from exc
    if not ids:
        raise TargetError(f"{base_url} serves no models ({models_url} is empty)")
    return listed, ids
