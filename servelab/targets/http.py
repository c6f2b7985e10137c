"""`HttpTarget`: a load generator for OpenAI-compatible streaming servers (vLLM, SGLang, ...).

Two jobs, both measured: release requests exactly when the LoadPlan says
(arrival time, free concurrency slot, previous turn finished plus think
time, never after `plan.duration`), and time every streamed chunk without
the client's own delays leaking into the numbers. Every released request
yields exactly one RequestRecord, whatever goes wrong with it.

Timeouts: `request_timeout` bounds each request's whole life (connect,
queueing on the server, the full stream); `idle_timeout`, when set, also
bounds the silence between two reads, which catches a stalled stream long
before a generous total would. Either expiring gives error_kind "timeout".

A server that goes away mid-run (killed, crashed) resets the streams in
flight and refuses the next connection. The first refusal ends the run's
release of new requests: a closed loop would otherwise turn the rest of a
`--duration` into a storm of instant failures, each a record. The requests
already in flight end on their own (reset, or at `request_timeout`), so the
run ends by itself, with a record for every request sent.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import re
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import orjson
import uvloop

from servelab.errors import ServerFault
from servelab.metrics import engines
from servelab.metrics.engines import EngineMetrics
from servelab.metrics.gpu import GpuSampler, GpuTelemetry, gpu_sampler
from servelab.metrics.records import (
    CONNECTION_ERROR,
    CONNECTION_REFUSED,
    CONNECTION_RESET,
    ERROR,
    OK,
    RecordSink,
    RequestRecord,
)
from servelab.metrics.scrape import MetricsScraper, ReplicaScrapers
from servelab.targets.base import SampleSink, Slots, TargetRun
from servelab.targets.client_stats import WAVE_SPAN_S, DelayProbe
from servelab.targets.engine_identity import identify
from servelab.targets.errors import TargetError, unmet_dependency
from servelab.targets.preflight import (
    CHAT,
    COMPLETIONS,
    ENDPOINTS,
    error_message,
    ServerFound,
    preflight,
)
from servelab.schemas.vocabulary import SESSION_HEADER
from servelab.targets.replicas import ROUND_ROBIN, ROUTES, Replicas
from servelab.targets.sse import DONE, SSEDecoder
from servelab.targets.stop_signals import on_stop_signals
from servelab.targets.stream_client import (
    ConnectError,
    Phases,
    ProtocolError,
    RefusedError,
    StreamingClient,
)
from servelab.targets.tally import RunTally, aiter_specs
from servelab.targets.workers import SERVER_GONE, WorkerPool
from servelab.workload.spec import LoadPlan, RequestSpec

if TYPE_CHECKING:  # imported by the functions that send requests: a command that sends none starts without it
    import aiohttp

_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An HTTP header name (RFC 9110's token)."""
MAX_WAVE = 1024
"""At most this many first-wave requests are prepared (bodies built, connections opened) before the clock starts."""
RESET = "reset"
NOT_OFFERED = "not offered"
"""What `reset_prefix_cache` says when the server has no such endpoint (vLLM without dev mode)."""
CANCELLED = "cancelled"
ABANDONED = "abandoned"
"""A record's status when the client gave up on it on purpose (`abandon_after`): not an error."""
_GOLDEN = 2654435761
"""Knuth's multiplicative hash constant: spreads consecutive indices evenly over [0, 2**32)."""
EMPTY_STREAM = "empty_stream"
WRONG_MODEL = "wrong_model"


def first_wave(specs: Iterable[RequestSpec], limit: int) -> tuple[list[RequestSpec], Iterator[RequestSpec]]:
    """The requests due at the plan's first instant (at most `limit`, none that waits for another), and the rest.

    Reads the (possibly lazy) plan only as far as the wave: the rest is left for the release loop, in order.
    """
    it = iter(specs)
    wave: list[RequestSpec] = []
    for spec in it:
        if (
            spec.depends_on is not None
            or len(wave) >= limit
            or (wave and spec.arrival_time > wave[0].arrival_time + WAVE_SPAN_S)
        ):
            return wave, itertools.chain([spec], it)
        wave.append(spec)
    return wave, it


class MalformedStream(ServerFault):
    """A `data:` payload that is not JSON: the rest of that stream cannot be trusted."""


class _Slots:
    """Concurrency slots that remember when they became free.

    The time a slot frees is the intended send time of the closed-loop request
    that takes it, so send lag measures the client, not the server.
    """

    def __init__(self, n: int) -> None:
        self._free: asyncio.Queue[float] = asyncio.Queue()
        for _ in range(n):
            self._free.put_nowait(0.0)

    async def acquire(self) -> float:
        return await self._free.get()

    def release(self, t: float) -> None:
        self._free.put_nowait(t)


def _classify(exc: BaseException) -> str:
    if isinstance(exc, MalformedStream):
        return "malformed_sse"
    if isinstance(exc, asyncio.TimeoutError):
        return "timeout"
    if isinstance(exc, RefusedError):
        return CONNECTION_REFUSED
    if isinstance(exc, ConnectError):
        return CONNECTION_ERROR
    if isinstance(exc, ProtocolError):
        return "protocol_error"
    if isinstance(exc, OSError):
        return CONNECTION_RESET
    return "client_error"


def _check_settings(
    endpoint: str,
    request_timeout: float,
    idle_timeout: float | None,
    workers: int,
    engine: str,
    abandon_after: float | None,
    abandon_share: float,
) -> None:
    """TargetError naming the first setting HttpTarget cannot run with, before anything is sent."""
    if endpoint not in ENDPOINTS:
        raise TargetError(f"endpoint {endpoint!r} is not supported; use one of {', '.join(ENDPOINTS)}")
    if request_timeout <= 0 or (idle_timeout is not None and idle_timeout <= 0):
        raise TargetError("request_timeout and idle_timeout must be positive")
    if workers < 1:
        raise TargetError(f"workers must be at least 1, got {workers}")
    if engine not in engines.ENGINE_CHOICES:
        raise TargetError(f"engine {engine!r} is not known; use one of {', '.join(engines.ENGINE_CHOICES)}")
    if abandon_after is not None and not abandon_after > 0:
        raise TargetError(f"--abandon-after must be > 0 seconds, got {abandon_after}")
    if not 0 < abandon_share <= 1:
        raise TargetError(f"--abandon-share must be in (0, 1], got {abandon_share}")


def _replica_urls(
    base_url: str | Sequence[str], route: str, session_header: str | None, replica_metrics_urls: Sequence[str]
) -> tuple[list[str], list[str]]:
    """The replicas' base URLs without a trailing `/` or `/v1`, and the /metrics to scrape for each (as given, else
    every replica's own when there are several); TargetError for no URL, a repeat, or a route, session header or
    replica /metrics URL that cannot be used with them."""
    urls = [base_url] if isinstance(base_url, str) else list(base_url)
    if not urls:
        raise TargetError("give at least one base URL")
    if route not in ROUTES:
        raise TargetError(f"route {route!r}: choose one of {', '.join(ROUTES)}")
    base_urls = [url.rstrip("/").removesuffix("/v1") for url in urls]
    if len(set(base_urls)) != len(base_urls):
        raise TargetError(f"a base URL is given twice: {', '.join(base_urls)}")
    if session_header is not None and not _HEADER_NAME.fullmatch(session_header):
        raise TargetError(f"--session-header {session_header!r} is not an HTTP header name")
    bad = [u for u in replica_metrics_urls if not u.startswith(("http://", "https://"))]
    if bad:
        raise TargetError(f"--replica-metrics-url must be an http(s) URL, got {', '.join(map(repr, bad))}")
    own_metrics = [url + "/metrics" for url in base_urls] if len(base_urls) > 1 else []
    return base_urls, list(replica_metrics_urls) or own_metrics


class Usage(TypedDict, total=False):
    """A stream's `usage` event as far as the client reads it: the server's own token counts."""

    prompt_tokens: int | None
    completion_tokens: int | None


class _RunClock:
    """Run time for the scrapers: seconds since the run's zero, which is set when the clock starts."""

    def __init__(self) -> None:
        self.zero = 0.0

    def __call__(self) -> float:
        return time.perf_counter() - self.zero


class HttpTarget:
    """Serves a LoadPlan by streaming requests to an OpenAI-compatible server.

    `send_text=True` sends `spec.prompt_text` to /v1/completions when the spec
    has one (token ids otherwise: exact lengths, no tokenizer mismatch).
    The API key only ever goes into the Authorization header.
    """

    def __init__(
        self,
        base_url: str | Sequence[str],
        endpoint: str = COMPLETIONS,
        model: str | None = None,
        api_key: str | None = None,
        ignore_eos: bool = False,
        request_timeout: float = 600.0,
        idle_timeout: float | None = None,
        scrape_interval: float = 1.0,
        extra_body: dict[str, Any] | None = None,
        send_text: bool = False,
        run_preflight: bool = True,
        workers: int = 1,
        gpu_telemetry: GpuTelemetry | None = None,
        engine: str = engines.AUTO,
        abandon_after: float | None = None,
        abandon_share: float = 1.0,
        route: str = ROUND_ROBIN,
        session_header: str | None = SESSION_HEADER,
        replica_metrics_urls: Sequence[str] = (),
    ) -> None:
        _check_settings(endpoint, request_timeout, idle_timeout, workers, engine, abandon_after, abandon_share)
        self.base_urls, self.replica_metrics_urls = _replica_urls(base_url, route, session_header, replica_metrics_urls)
        """Replicas of one model, no router in front: requests are spread over them by `route` (replicas.py); and
        each replica's /metrics, scraped alongside the run: given (a router in front), or every --base-url's."""
        self.base_url = self.base_urls[0]
        """The first replica: /metrics, /reset_prefix_cache and the server info come from it."""
        self.route = route
        self.session_header = session_header
        """The header that carries a request's conversation id (when it has one), for routers with session
        affinity; None: not sent."""
        self.endpoint = endpoint
        self.model = model
        self.ignore_eos = ignore_eos
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout
        self.scrape_interval = scrape_interval
        self.extra_body = dict(extra_body or {})
        self.send_text = send_text
        self.run_preflight = run_preflight
        self.workers = workers
        """Client processes: one event loop each (servelab/targets/workers.py)."""
        self.gpu_telemetry = gpu_telemetry
        """GPUs sampled beside /metrics (servelab/metrics/gpu.py); None: none."""
        self.engine = engine
        """Whose /metrics names to read (servelab/metrics/engines.py), or `auto`: the server's."""
        self.abandon_after, self.abandon_share = abandon_after, abandon_share
        """Seconds after its send at which a request still streaming is abandoned (the connection closed, like a
        user closing the tab; None: never), and the share of requests that do (chosen by their index, the same ones
        in every run of a plan)."""
        auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._headers = {"Content-Type": "application/json", **auth}
        self.server_info: ServerFound | None = None
        self.model_names: frozenset[str] = frozenset({model} if model else ())
        """Names a stream may say it came from: the model asked for and, after pre-flight, its aliases
        (vLLM lists every --served-model-name and answers with the first)."""
        self.clock_zero: float | None = None
        """time.perf_counter() at run time 0 (CLOCK_MONOTONIC: shared by processes on one host)."""

    # -- request building -------------------------------------------------

    def body(self, spec: RequestSpec) -> bytes:
        payload: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True}}
        if self.model is not None:
            payload["model"] = self.model
        if self.endpoint == CHAT:
            if spec.messages is not None:
                payload["messages"] = spec.messages
            elif spec.prompt_text is not None:
                payload["messages"] = [{"role": "user", "content": spec.prompt_text}]
            else:
                raise TargetError(f"request {spec.index} has neither messages nor prompt_text; {CHAT} needs text")
            payload["max_completion_tokens"] = spec.max_tokens
        else:
            use_text = self.send_text and spec.prompt_text is not None
            ids = spec.prompt_ids
            payload["prompt"] = (
                spec.prompt_text if use_text else (ids.tolist() if hasattr(ids, "tolist") else list(ids))
            )
            payload["max_tokens"] = spec.max_tokens
        if self.ignore_eos:
            payload["ignore_eos"] = True
        payload.update(self.extra_body)
        return json.dumps(payload, separators=(",", ":")).encode()

    # -- preflight --------------------------------------------------------

    async def apreflight(self, session: aiohttp.ClientSession | None = None) -> ServerFound:
        import aiohttp

        if session is None:
            async with aiohttp.ClientSession() as own:
                return await self.apreflight(own)
        auth = self._auth_headers()
        info: ServerFound = {**await preflight(session, self.base_url, self.endpoint, self.model, headers=auth)}
        info["engine"] = await identify(session, self.base_url, self.engine, auth or None)
        for other in self.base_urls[1:]:  # every replica must serve the same model, under the name the first gave
            await preflight(session, other, self.endpoint, info["model"], headers=auth)
        if len(self.base_urls) > 1:
            info = {**info, "base_urls": self.base_urls, "route": self.route}
        self.model = info["model"]
        self.server_info = info
        self.model_names = frozenset(info["model_names"])
        return info

    def _engine_metrics(self) -> EngineMetrics | None:
        """The metric names to scrape: the engine pre-flight identified, else the one named; None: found on the
        first scrape."""
        identified = self.server_info.get("engine") if self.server_info is not None else None
        name = (identified["name"] if identified else None) or (self.engine if self.engine != engines.AUTO else None)
        return engines.ENGINES.get(name) if name else None

    def abandons(self, index: int) -> bool:
        """Whether request `index` is one that gives up after `abandon_after` (a fixed hash of the index, so the
        share holds over any run and the same requests abandon in every point of a sweep)."""
        if self.abandon_after is None:
            return False
        return self.abandon_share >= 1 or (index * _GOLDEN % 2**32) / 2**32 < self.abandon_share

    def _auth_headers(self) -> dict[str, str]:
        """The Authorization header alone, for requests that are not the stream (pre-flight, /metrics)."""
        return {k: v for k, v in self._headers.items() if k == "Authorization"}

    def preflight(self) -> ServerFound:
        """Check URL, `/v1/models`, model and endpoint; raises TargetError naming what is wrong."""
        return asyncio.run(self.apreflight())

    def reset_prefix_cache(self) -> str:
        """Empty the server's prefix cache (every replica's), where it offers an endpoint for it; says what happened.

        vLLM serves `POST /reset_prefix_cache` only with VLLM_SERVER_DEV_MODE=1; elsewhere the answer is
        "not offered" and the run goes on: a sweep point then may inherit the previous point's cache.
        """
        return asyncio.run(self._areset_prefix_cache())

    async def _areset_prefix_cache(self) -> str:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            said = [await self._reset_one(session, url) for url in self.base_urls]
        if len(set(said)) == 1:
            return said[0]
        return "; ".join(f"{url}: {what}" for url, what in zip(self.base_urls, said))

    async def _reset_one(self, session: aiohttp.ClientSession, base_url: str) -> str:
        import aiohttp

        try:
            async with session.post(
                base_url + "/reset_prefix_cache",
                headers=self._auth_headers(),
                timeout=aiohttp.ClientTimeout(total=30),
            ) as resp:
                if resp.status == 200:
                    return RESET
                if resp.status in (404, 405):
                    return NOT_OFFERED
                return f"refused: HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"failed: {type(exc).__name__}: {exc}"

    # -- running ----------------------------------------------------------

    def run(self, plan: LoadPlan, sink: RecordSink, on_sample: SampleSink | None = None) -> TargetRun:
        """Run the plan on a fresh event loop; SIGINT/SIGTERM end it early with interrupted=True.

        Objects that exist before the run are frozen out of the garbage collector: in a
        large process (a test session, a notebook) a full collection scans them all and
        stalls the loop for up to a second, which would be charged to the server.
        """
        gc.freeze()
        try:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(self.arun(plan, sink, on_sample, handle_signals=True))
        finally:
            gc.unfreeze()

    async def arun(
        self,
        plan: LoadPlan,
        sink: RecordSink,
        on_sample: SampleSink | None = None,
        handle_signals: bool = False,
        slots: Slots | None = None,
    ) -> TargetRun:
        """The run on the running event loop; `slots`, when given, is the plan's cap shared with other clients
        (one event loop then: a shared cap is not split between --workers processes)."""
        import aiohttp

        if self.run_preflight and self.server_info is None:
            await self.apreflight()
        cap = plan.max_concurrency
        if cap is not None and cap < 1:
            raise TargetError(f"max_concurrency must be at least 1, got {cap}")
        workers = min(self.workers, cap) if cap is not None else self.workers
        if slots is not None and workers > 1:
            raise TargetError("a concurrency cap shared with other clients runs on one event loop: --workers 1")
        clock = _RunClock()
        async with aiohttp.ClientSession() as scrape_session, gpu_sampler(self.gpu_telemetry, scrape_session) as gpu:
            scraper = self._scraper(scrape_session, self.base_url + "/metrics", clock, on_sample, gpu)
            replicas = ReplicaScrapers(
                [self._scraper(scrape_session, url, clock, None, None) for url in self.replica_metrics_urls]
            )
            first, _ = await asyncio.gather(scraper.fetch(), replicas.fetch_first())
            tally = await self._release(plan, sink, workers, clock, (scraper, replicas, first), handle_signals, slots)
            await scraper.sample_once()
            scrape_stats = scraper.stats()
        if tally.plan_error is not None:
            raise TargetError(tally.plan_error)
        duration = max(0.0, tally.last_finish - tally.first_send) if tally.schedule_lags else 0.0
        stats = tally.client_stats()
        stats["clock_zero_perf_counter"] = clock.zero
        stats.update(tally.notes)
        info: dict[str, Any] = {**(self.server_info or {"base_url": self.base_url, "endpoint": self.endpoint})}
        info["metrics_scrape"] = scrape_stats
        if replicas.scrapers:
            info["replicas"] = replicas.loads()
        return TargetRun(duration=duration, interrupted=tally.interrupted, server_info=info, client_stats=stats)

    def _scraper(
        self,
        session: aiohttp.ClientSession,
        url: str,
        clock: _RunClock,
        on_sample: SampleSink | None,
        gpu: GpuSampler | None,
    ) -> MetricsScraper:
        """A /metrics scraper stamping run time, reading the names of the engine pre-flight identified."""
        auth = self._auth_headers() or None
        return MetricsScraper(session, url, clock, on_sample, self.scrape_interval, auth, gpu, self._engine_metrics())

    async def _release(
        self,
        plan: LoadPlan,
        sink: RecordSink,
        workers: int,
        clock: _RunClock,
        scrapers: tuple[MetricsScraper, ReplicaScrapers, dict[str, float] | None],
        handle_signals: bool,
        slots: Slots | None,
    ) -> RunTally:
        """Prepare the first wave (connections and bodies, or the --workers processes) before the clock starts, so
        the first requests leave on time; then start the clock and serve the plan with the scrapers beside it
        (`scrapers`: the server's, the replicas', and the server's values read before the run, its sample at 0)."""
        scraper, replicas, first = scrapers
        cap = plan.max_concurrency
        wave, rest = first_wave(plan.requests, cap or MAX_WAVE)
        pool = WorkerPool(self, plan, sink, workers) if workers > 1 else None
        client: Replicas | None = None
        bodies: dict[int, bytes] = {}
        if pool is not None:
            await pool.start(wave, rest)
        else:
            client = Replicas(self.base_urls, self.route)
            bodies = await self.prepare(client, wave, cap or len(wave))
        clock.zero = self.clock_zero = time.perf_counter()
        if first is not None:
            scraper.record(0.0, first)
        stop_scraping = asyncio.Event()
        scraping = asyncio.gather(scraper.run(stop_scraping), replicas.run(stop_scraping))
        try:
            if pool is not None:
                return await pool.run(clock.zero, handle_signals)
            assert client is not None
            specs = aiter_specs(itertools.chain(wave, rest))
            return await self.serve(specs, cap, plan.duration, sink, clock.zero, handle_signals, client, bodies, slots)
        finally:
            stop_scraping.set()
            await scraping

    async def serve(
        self,
        specs: AsyncIterator[RequestSpec],
        max_concurrency: int | None,
        duration: float | None,
        sink: RecordSink,
        zero: float,
        handle_signals: bool,
        client: Replicas,
        bodies: dict[int, bytes],
        slots: Slots | None = None,
    ) -> RunTally:
        """Release and stream requests on this event loop; the body of a run, in one process or in each worker.

        `client` and `bodies` come from `prepare`, before the clock started; the client is closed here. The cap is
        `slots` when given (shared with other clients), else this loop's own `max_concurrency` slots.
        """
        if slots is None and max_concurrency:
            slots = _Slots(max_concurrency)
        try:
            return await _Run(self, specs, slots, duration, sink, client, zero, bodies).execute(handle_signals)
        finally:
            client.close()

    async def prepare(self, client: Replicas, wave: Sequence[RequestSpec], connections: int) -> dict[int, bytes]:
        """What must not happen on the clock: the first wave's request bodies, and the connections they will use.

        A body that cannot be built (a chat request without text) fails here, before any load.
        """
        bodies = {spec.index: self.body(spec) for spec in wave}
        await client.open(connections)
        return bodies

    # -- one request ------------------------------------------------------

    async def stream(
        self, client: StreamingClient, spec: RequestSpec, rec: RequestRecord, zero: float, body: bytes | None = None
    ) -> None:
        """Send one request (its `body` when built ahead) and fill `rec` from the stream; raises on transport faults."""
        if body is None:
            body = self.body(spec)
        headers = self._headers
        if self.session_header is not None and spec.conversation is not None:
            headers = {**headers, self.session_header: str(spec.conversation)}
        head = client.request_head(self.endpoint, len(body), headers)
        state = _StreamState(rec, self.endpoint == CHAT, zero, self.model_names)
        start = time.perf_counter()
        rec.send_time = start - zero
        response = await client.post(head, body, state.on_body, self.request_timeout, self.idle_timeout)
        rec.finish_time = response.last_read - zero
        _record_phases(rec, response.phases, start)
        state.on_body(b"", response.last_read)  # flush: an event may lack its final blank line
        if response.status != 200:
            rec.status, rec.error_kind = ERROR, f"http_{response.status}"
            rec.error = error_message(response.error_body.decode("utf-8", "replace")) or f"HTTP {response.status}"
            if response.retry_after is not None:  # a 429/503 that says when to come back: the server is refusing load
                rec.error = f"{rec.error} (Retry-After: {response.retry_after})"
            return
        if rec.chunk_times:
            rec.first_token_time = rec.chunk_times[0]
        usage = state.usage
        rec.tokens_estimated = usage is None
        rec.prompt_tokens = int(usage.get("prompt_tokens") or 0) if usage else spec.prompt_len
        rec.output_tokens = int(usage.get("completion_tokens") or 0) if usage else len(rec.chunk_times)
        if rec.status != OK:
            return
        if not state.events:
            rec.status, rec.error_kind = ERROR, EMPTY_STREAM
            rec.error = "HTTP 200 with no event in the stream" + (" before data: [DONE]" if state.done else "")
        elif not state.done:
            rec.status, rec.error_kind = ERROR, "incomplete_stream"
            rec.error = "stream ended without data: [DONE]"


def _record_phases(rec: RequestRecord, phases: Phases, start: float) -> None:
    """The request's HTTP phases (stream_client.Phases) as the record's durations."""
    connect = phases.connect_s
    rec.connection_reused = connect is None
    rec.http_connect_s = connect
    rec.http_send_s = max(0.0, phases.sent - start - (connect or 0.0))
    if phases.first_byte is not None:
        rec.http_wait_s = phases.first_byte - phases.sent
        rec.http_receive_s = phases.last_byte - phases.first_byte


class _StreamState:
    """Turns one response's body bytes into the record's timings, inside the read callback.

    Every event of one network read gets that read's arrival time: they did
    arrive together, and it keeps the per-chunk cost to the JSON decode.
    """

    __slots__ = (
        "rec",
        "chunk_times",
        "is_chat",
        "zero",
        "decoder",
        "usage",
        "done",
        "last_read",
        "events",
        "model_names",
    )

    def __init__(self, rec: RequestRecord, is_chat: bool, zero: float, model_names: frozenset[str]) -> None:
        self.rec = rec
        self.chunk_times = rec.chunk_times
        self.is_chat = is_chat
        self.zero = zero
        self.decoder = SSEDecoder()
        self.usage: Usage | None = None
        self.done = False
        self.last_read = time.perf_counter()
        self.events = 0
        """JSON events seen: none at all is an empty stream, whatever the status line said."""
        self.model_names: frozenset[str] | None = model_names or None
        """What the first event's `model` may say (then None: checked once); None when no model was named."""

    def on_body(self, data: bytes, t: float) -> None:
        self.last_read = t
        now = t - self.zero
        for payload in self.decoder.feed(data) if data else self.decoder.close():
            if payload == DONE:
                self.done = True
                continue
            try:
                obj = orjson.loads(payload)  # strict (trailing data is an error); 2.5x faster than json on a chunk
            except orjson.JSONDecodeError:
                self.rec.finish_time = now
                raise MalformedStream(f"not JSON: {payload[:120]!r}") from None
            self.events += 1
            if self.model_names is not None:
                self._check_model(obj.get("model"), self.model_names)
            choices = obj.get("choices")
            if choices:
                choice = choices[0]
                if self.is_chat:
                    delta = choice.get("delta") or {}
                    out = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                else:
                    out = choice.get("text")
                if out or choice.get("token_ids"):
                    self.chunk_times.append(now)
            if obj.get("usage"):
                self.usage = obj["usage"]
            if "error" in obj or obj.get("object") == "error":
                rec = self.rec
                rec.status, rec.error_kind = ERROR, "stream_error"
                rec.error = error_message(payload.decode("utf-8", "replace"))

    def _check_model(self, answered: Any, names: frozenset[str]) -> None:
        """A stream from another model than the one asked for (a proxy's fallback, a mislabelled server)
        measures that model: the record keeps its timings but is not counted as a success."""
        if isinstance(answered, str) and answered not in names:
            rec = self.rec
            rec.status, rec.error_kind = ERROR, WRONG_MODEL
            rec.error = f"asked for model {' or '.join(sorted(names))!r}, the stream came from {answered!r}"
        self.model_names = None


class _Abandon:
    """One request's armed abandonment: the timer, and whether it fired (its cancel, not the run's)."""

    __slots__ = ("handle", "fired")

    def __init__(self) -> None:
        self.handle: asyncio.TimerHandle
        self.fired = False


class _Run:
    """The state of one event loop's share of a run: release schedule, in-flight requests, dependencies, stop."""

    def __init__(
        self,
        target: HttpTarget,
        specs: AsyncIterator[RequestSpec],
        slots: Slots | None,
        duration: float | None,
        sink: RecordSink,
        client: Replicas,
        zero: float,
        bodies: dict[int, bytes],
    ) -> None:
        self.target = target
        self.bodies = bodies
        """Request bodies built before the clock started (the first wave), used once each."""
        self.specs = specs
        self.duration = duration
        self.sink = sink
        self.client = client
        self.zero = zero
        self.slots = slots
        self.finished: dict[int, float] = {}
        """Finish time of every finished request, for `depends_on` (indices point backwards)."""
        self._seen: set[int] = set()
        self.finish_events: dict[int, asyncio.Event] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.requests: set[asyncio.Task[None]] = set()
        """The tasks of released requests (the rest of `tasks` release them)."""
        self.tally = RunTally()

    def now(self) -> float:
        return time.perf_counter() - self.zero

    # -- orchestration ----------------------------------------------------

    async def execute(self, handle_signals: bool) -> RunTally:
        cpu0 = time.process_time()
        probe = DelayProbe(lambda: len(self.requests))
        probe.start()
        self._spawn(self._release())
        restore = on_stop_signals(self._on_signal) if handle_signals else None
        try:
            while self.tasks:
                await asyncio.wait(set(self.tasks))
        finally:
            if restore is not None:
                restore()
            await probe.stop()
        tally = self.tally
        tally.wall_s = self.now()
        tally.cpu_s = time.process_time() - cpu0
        tally.loop_lags, tally.loop_weights = probe.lags, probe.weights
        tally.loop_at = [t - self.zero for t in probe.at]
        return tally

    def stop(self) -> None:
        """Stop releasing and cancel everything in flight; each request still writes its record."""
        for task in list(self.tasks):
            task.cancel()

    def _on_signal(self) -> None:
        self.tally.interrupted = True
        self.stop()

    def _server_gone(self, rec: RequestRecord) -> None:
        """The server refused a connection: release nothing more; requests in flight end on their own."""
        if SERVER_GONE in self.tally.notes:
            return
        self.tally.notes[SERVER_GONE] = f"connection refused at {rec.finish_time:.3f} s: no request released after it"
        for task in self.tasks - self.requests:
            task.cancel()

    # -- release ----------------------------------------------------------

    async def _release(self) -> None:
        duration = self.duration
        try:
            if duration is None:
                await self._release_all()
            else:
                async with asyncio.timeout_at(asyncio.get_running_loop().time() + duration - self.now()):
                    await self._release_all()
        except TimeoutError:
            pass
        except TargetError as exc:
            self._fail(exc)

    def _fail(self, exc: TargetError) -> None:
        """The plan (or a shared cap's broker) cannot go on: stop; the run raises it once every record is written."""
        self.tally.plan_error = str(exc)
        self.stop()

    async def _release_all(self) -> None:
        duration = self.duration
        async for spec in self.specs:
            if spec.depends_on is not None and spec.depends_on not in self._seen:
                raise unmet_dependency(spec)
            self._seen.add(spec.index)
            if duration is not None and spec.arrival_time >= duration:
                return
            if spec.depends_on is not None:
                self._spawn(self._release_after_dependency(spec))
                continue
            await self._sleep_until(spec.arrival_time)
            intended = spec.arrival_time
            if self.slots is not None:
                intended = max(intended, await self.slots.acquire())
            self._launch(spec, intended)

    async def _release_after_dependency(self, spec: RequestSpec) -> None:
        """Wait for the previous turn, the think time and a slot; give up at the run's end."""
        duration = self.duration
        deadline = None if duration is None else asyncio.get_running_loop().time() + duration - self.now()
        try:
            async with asyncio.timeout_at(deadline):
                dep = spec.depends_on
                assert dep is not None
                if dep not in self.finished:
                    await self.finish_events.setdefault(dep, asyncio.Event()).wait()
                intended = max(spec.arrival_time, self.finished[dep] + spec.think_time)
                await self._sleep_until(intended)
                if self.slots is not None:
                    intended = max(intended, await self.slots.acquire())
                self._launch(spec, intended)
        except TimeoutError:
            pass
        except TargetError as exc:  # a shared cap's broker was lost
            self._fail(exc)

    async def _sleep_until(self, t: float) -> None:
        """Never early: uvloop's timers have millisecond granularity and may fire just before `t`."""
        while (delay := t - self.now()) > 0:
            await asyncio.sleep(delay)

    def _spawn(self, coro) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def _launch(self, spec: RequestSpec, intended: float) -> None:
        task = self._spawn(self._request(spec, intended))
        self.requests.add(task)
        task.add_done_callback(self.requests.discard)

    async def _request(self, spec: RequestSpec, intended: float) -> None:
        rec = RequestRecord(
            index=spec.index,
            intended_time=intended,
            send_time=self.now(),
            finish_time=0.0,
            prefix_group=spec.prefix_group,
            priority=spec.priority,
        )
        abandon = self._abandon_later(spec)
        replica = self.client.pick(spec)
        if len(self.client.clients) > 1:
            rec.base_url = self.client.urls[replica]
        try:
            await self.target.stream(
                self.client.clients[replica], spec, rec, self.zero, self.bodies.pop(spec.index, None)
            )
        except asyncio.CancelledError:
            rec.finish_time = self.now()
            if abandon is not None and abandon.fired:
                rec.status, rec.abandoned = ABANDONED, True
                asyncio.current_task().uncancel()  # type: ignore[union-attr]  # our own cancel, handled here
            else:
                rec.status, rec.error_kind, rec.error = CANCELLED, CANCELLED, "run interrupted"
        except Exception as exc:  # every fault becomes a record, never a lost request
            rec.status, rec.error_kind = ERROR, _classify(exc)
            rec.error = f"{type(exc).__name__}: {exc}"[:500]
            if rec.error_kind == "timeout":
                rec.error = self._timeout_text()
            if not rec.finish_time:
                rec.finish_time = self.now()
            if rec.error_kind == CONNECTION_REFUSED:
                self._server_gone(rec)
        finally:
            self.client.done(replica)
            if abandon is not None:
                abandon.handle.cancel()
            if rec.chunk_times and rec.first_token_time is None:
                rec.first_token_time = rec.chunk_times[0]
            if not rec.prompt_tokens:
                rec.prompt_tokens = spec.prompt_len
            if not rec.output_tokens:
                rec.output_tokens = len(rec.chunk_times)
            self._finish(spec.index, rec)

    def _abandon_later(self, spec: RequestSpec) -> _Abandon | None:
        """Arm the cancel of this request's task at `abandon_after` seconds, if it is one that abandons."""
        after = self.target.abandon_after
        if after is None or not self.target.abandons(spec.index):
            return None
        task = asyncio.current_task()
        assert task is not None
        abandon = _Abandon()

        def fire() -> None:
            abandon.fired = True
            task.cancel()

        abandon.handle = asyncio.get_running_loop().call_later(after, fire)
        return abandon

    def _timeout_text(self) -> str:
        idle = self.target.idle_timeout
        limits = f"request_timeout={self.target.request_timeout:g}s" + (f", idle_timeout={idle:g}s" if idle else "")
        return f"no complete response within the limits ({limits})"

    def _finish(self, index: int, rec: RequestRecord) -> None:
        self.finished[index] = rec.finish_time
        event = self.finish_events.pop(index, None)
        if event is not None:
            event.set()
        if self.slots is not None:
            self.slots.release(rec.finish_time)
        self.tally.add(rec)
        self.sink.write(rec)
