"""A fake OpenAI-compatible streaming server that misbehaves on request (unit tests only).

Real behaviour is tested against a real vLLM; this server exists for the
faults a real server rarely shows on cue: HTTP errors (429/503 with a
Retry-After when `retry_after` is set), a connection reset mid-stream, a
stall, malformed SSE, a stream closed without `[DONE]`, an empty stream, a
stream without usage, a stream that says it came from another model.

The fault comes from the request body's `fault` field (sent through
HttpTarget's `extra_body`) or from `FaultServer.fault`; `delay` (seconds
between chunks) likewise. The server runs on its own thread and loop so a
test can drive the synchronous `HttpTarget.run` against it, and it logs the
arrival time of each request (time.perf_counter) and the peak number of
streams open at once.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from servelab.targets.preflight import CHAT, COMPLETIONS, probe_body

MODEL = "fake-model"
FAULTS = (
    "ok",
    "http_429",
    "http_500",
    "http_503",
    "reset",
    "stall",
    "malformed",
    "early_close",
    "stream_error",
    "empty_stream",
    "no_usage",
    "wrong_model",
)
OTHER_MODEL = "other-model"
"""What a `wrong_model` stream says it came from."""


@dataclass
class Received:
    t: float
    body: dict[str, Any]
    authorization: str | None
    session: str | None = None
    """The X-Session-ID header, as sent."""


@dataclass
class FaultServer:
    fault: str = "ok"
    delay: float = 0.0
    metrics_status: int = 200
    retry_after: str | None = None
    """Sent as Retry-After with the injected HTTP errors."""
    serve_chat: bool = True
    serve_cache_reset: bool = False
    """Offer vLLM's dev-mode `POST /reset_prefix_cache`; each call is counted in `cache_resets`."""
    cache_resets: int = 0
    received: list[Received] = field(default_factory=list)
    """The run's requests; pre-flight probes go to `probes`, so tests count only what the run sent."""
    probes: list[Received] = field(default_factory=list)
    active: int = 0
    peak_active: int = 0
    port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- handlers ---------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 4096}]})

    async def metrics(self, request: web.Request) -> web.Response:
        if self.metrics_status != 200:
            return web.Response(status=self.metrics_status, text="metrics disabled")
        text = (
            "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="{MODEL}"}} {self.active}\n'
            "# HELP vllm:generation_tokens_total Tokens.\n# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{model_name="{MODEL}"}} {len(self.received)}\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.cache_resets += 1
        return web.Response(status=200)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        body = await request.json()
        is_probe = body == probe_body(CHAT if chat else COMPLETIONS, body.get("model"))
        (self.probes if is_probe else self.received).append(
            Received(
                time.perf_counter(), body, request.headers.get("Authorization"), request.headers.get("X-Session-ID")
            )
        )
        fault = body.get("fault", self.fault)
        delay = float(body.get("delay", self.delay))
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 1)
        if fault in ("http_429", "http_500", "http_503"):
            status = int(fault[-3:])
            headers = {"Retry-After": self.retry_after} if self.retry_after else None
            return web.json_response(
                {"error": {"message": f"injected {status}", "code": status}}, status=status, headers=headers
            )
        if not body.get("stream"):
            key = "message" if chat else "text"
            return web.json_response({"choices": [{key: "x"}], "usage": {"completion_tokens": 1}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.active += 1
        self.peak_active = max(self.peak_active, self.active)
        try:
            if fault == "empty_stream":
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
                return resp
            if chat:
                await self._event(resp, {"choices": [{"delta": {"role": "assistant", "content": ""}}]})
            model = OTHER_MODEL if fault == "wrong_model" else body.get("model", MODEL)
            for i in range(n):
                if delay:
                    await asyncio.sleep(delay)
                if i == 1 and fault == "reset":
                    assert request.transport is not None
                    request.transport.abort()
                    raise asyncio.CancelledError  # the handler has nothing left to say on a dead socket
                if i == 1 and fault == "stall":
                    await self._closing.wait()
                    return resp
                if i == 1 and fault == "malformed":
                    await resp.write(b"data: {this is not json\n\n")
                if i == 1 and fault == "stream_error":
                    await self._event(resp, {"object": "error", "message": "injected stream error", "code": 500})
                choice = {"delta": {"content": f"t{i}"}} if chat else {"text": f"t{i}"}
                await self._event(resp, {"model": model, "choices": [choice]})
            if fault == "early_close":
                await resp.write_eof()
                return resp
            prompt = body.get("prompt", "")
            usage = {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}
            if fault != "no_usage":
                await self._event(resp, {"model": model, "choices": [], "usage": usage})
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            self.active -= 1

    @staticmethod
    async def _event(resp: web.StreamResponse, obj: dict[str, Any]) -> None:
        await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

    # -- lifecycle --------------------------------------------------------

    def __enter__(self) -> FaultServer:
        started = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def start() -> None:
            self._closing = asyncio.Event()
            app = web.Application()
            app.router.add_get("/v1/models", self.models)
            app.router.add_get("/metrics", self.metrics)
            app.router.add_post("/v1/completions", self.completions)
            if self.serve_chat:
                app.router.add_post("/v1/chat/completions", self.chat)
            if self.serve_cache_reset:
                app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
            self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            started.set()

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(start())
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._closing.set)
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
