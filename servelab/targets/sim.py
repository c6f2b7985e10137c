"""`SimTarget`: serves a LoadPlan with simulated vLLM engines instead of a server.

A discrete-event loop over simulated time: engine step ends, client-side
events (a request reaching the engine, a response reaching the client) and
step starts. Requests are released by exactly the HttpTarget rules: at
max(arrival time, a free concurrency slot, the previous turn finished plus
think time), waiting for slots first-come first-served, never at or after
`plan.duration`. The result is the same RequestRecords and timeline samples a
real run produces, deterministically.

Event order at equal times: step ends, then client events (an API server's
output round among them), then the API server taking in its next request,
then slot releases, then step starts, so a request released the moment
another finishes (with zero latency) joins the very next step; an API
server shares its core between intake and output rounds (SimTarget).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np

from servelab.metrics import timeline as tl
from servelab.metrics.intervals import Tier
from servelab.metrics.records import ERROR, OK, RecordSink, RequestRecord
from servelab.metrics.scrape import replica_load
from servelab.metrics.timeline import TimelineSample
from servelab.perf.cost_model import CostCoefficients, CostModel
from servelab.perf.engine_config import EngineConfig
from servelab.perf.vllm_cpu_costs import OUTPUT_SLICE, ApiServerCosts
from servelab.sim.engine import RequestRejected, SimEngine
from servelab.sim.engines import SchedulerFactory
from servelab.sim.request import SimRequest
from servelab.sim.router import ROUND_ROBIN, Router, ScorerWeights
from servelab.targets.base import SampleSink, TargetRun
from servelab.targets.errors import TargetError, unmet_dependency
from servelab.workload.spec import LoadPlan, RequestSpec

_STEP_END, _CLIENT, _INTAKE, _RELEASE, _STEP_BEGIN = 0, 1, 2, 3, 4
_REJECTED = "http_400"


class SimTarget:
    """Simulated deployment: `config.data_parallel_size` engines, each with `num_gpu_blocks` KV blocks.

    `network_latency` is a one-way client<->server delay in seconds added to
    every request and token; 0 by default.

    `api` (ApiServerCosts) models vLLM's API-server process, whose event loop
    tokenizes prompts and detokenizes and streams outputs on one CPU core: a
    server in front of the engines. A request reaches an engine only after
    the loop has spent per_request + per_prompt_token x prompt_len on it, and
    then `latency` (+ per prompt token) on no serial core (thread hand-offs,
    ZMQ hops). The loop takes requests in one at a time, in arrival order,
    and shares itself with the output rounds as asyncio shares a loop among
    its ready tasks (the requests being taken in, the output handler, the
    streams it woke): after a round, about (requests waiting) / (streams the
    round woke + 1) requests are taken in before the next round, and a round
    due during an intake goes after that one. So a burst's intake delays
    outputs by a share of the backlog, not all of it, and a busy output
    handler does not shut new requests out. Outputs leave it in rounds, as vLLM's AsyncLLM hands them on:
    its output handler receives every engine step that arrived since its last
    turn (`per_output_step` each, `per_output_token` per token: detokenization
    and bookkeeping), and then each request with new tokens sends one SSE
    chunk (`per_chunk`), which carries all of them, because
    RequestOutputCollector merges the outputs a request's stream has not taken
    yet. A frontend that keeps up sends a chunk per step; a saturated one
    sends fewer, fuller chunks, so its cost per token falls as its load rises,
    as on a real server, while its steps have at most `OUTPUT_SLICE` (128)
    outputs each. vLLM's handler processes a wider step in slices of 128 and
    yields the loop after each but the last, so the streams of each slice send
    their chunk before the next: such a step is a round of its own and every
    request gets one chunk per step, however far behind the server is (not for
    SGLang's or TensorRT-LLM's servers, whose handlers differ). Requests
    queue before the engine (the engine's own
    TTFT, measured from its arrival, stays low while the client's grows) and
    tokens queue after it. All 0 (default): no frontend. A decode run that
    the engine fast-forwards hands its steps to the rounds as the step-by-step
    loop would (`_run_rounds`).

    `config.api_server_count` N > 1 (vLLM's default: one per data-parallel
    engine) runs N such servers, one core each, as `--api-server-count` does (the processes share the listening
    socket): requests go to them in turn, each serves its requests' tokens,
    and a step's tokens are split evenly over them. Replicas behind a router in front of them (every router but
    `least-loaded`, vLLM's own data-parallel balancer, which runs inside the API servers it shares) are separate
    servers: the router picks a replica first, the request then queues at that replica's own API servers
    (`api_server_count`, 1 by default, each), and each replica's steps stream through its own servers only.
    `config.stream_interval`
    k > 1 sends the first token at once and then one chunk per k tokens (and
    the rest at the end), as vLLM's output processor does.
    """

    def __init__(
        self,
        config: EngineConfig,
        num_gpu_blocks: int,
        cost_model: CostModel,
        *,
        router: str = ROUND_ROBIN,
        router_weights: ScorerWeights | None = None,
        scrape_interval: float = 1.0,
        network_latency: float = 0.0,
        max_model_len: int | None = None,
        api: ApiServerCosts | None = None,
        cpu_costs: CostCoefficients | None = None,
        fast_forward: bool = True,
        scheduler_factory: SchedulerFactory | None = None,
        tier: Tier = Tier.SPECS_ONLY,
    ) -> None:
        if scrape_interval <= 0:
            raise TargetError("scrape_interval must be positive")
        if network_latency < 0:
            raise TargetError("network_latency cannot be negative")
        self.api = api if api is not None else ApiServerCosts()
        if min(asdict(self.api).values()) < 0:
            raise TargetError("API server costs cannot be negative")
        if config.api_servers < 1 or config.stream_interval < 1:
            raise TargetError("api_server_count and stream_interval must be at least 1")
        if config.data_parallel_size < 1:
            raise TargetError("data_parallel_size must be at least 1")
        self.servers_per_replica = config.replica_api_servers(router)
        """API servers each replica runs when the replicas are separate servers behind a router in front; None: the
        engines share `config.api_servers` (one server, or vLLM's data-parallel balancer inside its API servers)."""
        self.api_servers = config.api_servers_behind(router)
        """API-server processes in all, one core each."""
        self.config = config
        self.num_gpu_blocks = num_gpu_blocks
        self.cost_model = cost_model
        self.router = router
        self.router_weights = router_weights
        """llm-d's scorer weights for the routers that weigh them (sim/router.py); None: the router's own."""
        self.scrape_interval = scrape_interval
        self.network_latency = network_latency
        self.max_model_len = max_model_len
        self.fast_forward = fast_forward
        """Simulate runs of identical decode steps at once (SimEngine); False steps one by one, to the same results."""
        self.cpu_costs = cpu_costs if cpu_costs is not None else getattr(cost_model, "coefficients", None)
        """The engine core's CPU share of each step, which async scheduling overlaps with the GPU."""
        self.scheduler_factory = scheduler_factory
        """Another engine's scheduler (SGLang, TensorRT-LLM: servelab.sim.engines); None: vLLM's."""
        self.output_slice = OUTPUT_SLICE if scheduler_factory is None else None
        """Outputs per slice of vLLM's output handler (OUTPUT_SLICE); None: another engine's server, which merges."""
        self.tier = tier
        """What the costs are grounded in, which decides the width of the summary's intervals."""
        self.last_engines: list[SimEngine] = []
        """Engines of the latest run, for inspection (tests, diagnose)."""
        try:  # every setting is checked here, before any load
            Router(router, weights=router_weights)
            self.make_engine()
        except ValueError as exc:
            raise TargetError(str(exc)) from exc

    @property
    def has_frontend(self) -> bool:
        return self.api.any

    def make_engine(self) -> SimEngine:
        return SimEngine(
            self.config,
            self.num_gpu_blocks,
            self.cost_model,
            self.max_model_len,
            fast_forward=self.fast_forward,
            cpu_costs=self.cpu_costs,
            scheduler_factory=self.scheduler_factory,
        )

    def run(self, plan: LoadPlan, sink: RecordSink, on_sample: SampleSink | None = None) -> TargetRun:
        if plan.max_concurrency is not None and plan.max_concurrency < 1:
            raise TargetError(f"max_concurrency must be at least 1, got {plan.max_concurrency}")
        engines = [self.make_engine() for _ in range(self.config.data_parallel_size)]
        self.last_engines = engines
        wall0 = time.perf_counter()
        sim = _Simulation(self, engines, plan, sink, on_sample)
        sim.execute()
        wall = time.perf_counter() - wall0
        steps = sum(e.num_steps for e in engines)
        duration = max(0.0, sim.last_finish - sim.first_send) if sim.released else 0.0
        info = {
            "simulated": True,
            "engine_config": {k: getattr(self.config, k) for k in self.config.__dataclass_fields__},
            "num_gpu_blocks": self.num_gpu_blocks,
            "cost_model": type(self.cost_model).__name__,
            "cost_source": getattr(self.cost_model, "cost_source", type(self.cost_model).__name__),
            "router": self.router,
            "network_latency": self.network_latency,
            "api_server": asdict(self.api),
            "api_server_count": self.api_servers,
            "async_scheduling": bool(self.config.async_scheduling),
            "prediction_tier": str(self.tier),
            # Wall-clock facts live here, in run.json, so that summary.json is the same on every run of a seed.
            "sim_wall_s": wall,
            "steps_per_s": steps / wall if wall > 0 else 0.0,
        }
        if sim.replica_samples is not None:
            info["replicas"] = sim.replica_loads()
        if sim.router.cost.fixed_s or sim.router.cost.per_tokenized_token_s:
            info["router_time"] = sim.router.time_spent().model_dump()
        stats = {
            "engine_steps": steps,
            "engine_busy_s": [e.busy_time for e in engines],
            "frontend_busy_s": sim.frontend_busy,
            # What the interval's limit is decided from (servelab.metrics.intervals.classify_limit).
            "api_server_busy_share": sim.frontend_busy / (self.api_servers * duration) if duration > 0 else 0.0,
        }
        return TargetRun(duration=duration, server_info=info, client_stats=stats)


REPLICA_NAME = "replica-{}"
"""A simulated fleet's replica i, where a real fleet's records and loads name its URL."""


@dataclass(order=True, slots=True)
class _Waiter:
    wait_start: float
    seq: int
    spec: RequestSpec = field(compare=False)
    main: bool = field(compare=False, default=False)


class _Simulation:
    def __init__(
        self,
        target: SimTarget,
        engines: list[SimEngine],
        plan: LoadPlan,
        sink: RecordSink,
        on_sample: SampleSink | None,
    ) -> None:
        self.t = target
        self.engines = engines
        self.router = Router(target.router, weights=target.router_weights)
        self.plan = plan
        self.sink = sink
        self.on_sample = on_sample
        self._init_frontend(target, len(engines))
        self.stream_interval = target.config.stream_interval
        self.duration = plan.duration if plan.duration is not None else float("inf")
        self.free_slots = plan.max_concurrency if plan.max_concurrency is not None else None
        self.events: list[tuple[float, int, int, Callable[[float], None]]] = []
        self.deliveries: list[tuple[float, int, int, Callable[[float], None]]] = []
        """Responses reaching the client that can change nothing but the records (no slot, no parked turn waits on
        them): kept out of `events`, so they do not cut decode runs (the horizon), and popped in the same order."""
        self.inert_deliveries = self.free_slots is None
        """Whether a response's delivery can go in `deliveries`; off for good once a turn is parked on a response."""
        self.seq = itertools.count()
        self.waiters: list[_Waiter] = []
        self.specs: Iterator[RequestSpec] = iter(plan.requests)
        self.main_exhausted = False
        self.seen: set[int] = set()
        self.finished: dict[int, float] = {}
        self.parked: dict[int, list[RequestSpec]] = {}
        self.in_engine: dict[int, SimRequest] = {}
        """Requests an engine holds, by plan index, so a chat's next turn can tell its reply's tokens (_quote_reply)."""
        self.send_times: dict[int, float] = {}
        self.begin_pending = [False] * len(engines)
        self.next_scrape = 0.0
        self.release_at = float("inf")
        self.released = 0
        self.first_send = float("inf")
        self.last_finish = float("-inf")
        self.now = 0.0
        self._init_fleet(len(engines))

    def _init_frontend(self, target: SimTarget, engines: int) -> None:
        """The API servers' state: their CPU costs, intake queues, output rounds and what each has delivered."""
        self.latency = target.network_latency
        self.frontend = target.has_frontend
        api = target.api
        self.fe_request, self.fe_token = api.per_request_s, api.per_prompt_token_s
        self.fe_latency, self.fe_latency_token = api.latency_s, api.latency_per_prompt_token_s
        self.fe_output, self.fe_chunk, self.fe_step = api.per_output_token_s, api.per_chunk_s, api.per_output_step_s
        self.output_slice = target.output_slice
        self.servers = servers = target.api_servers
        self.frontend_free_at = [0.0] * servers
        self.frontend_busy = 0.0
        self.intake: list[deque[RequestSpec]] = [deque() for _ in range(servers)]
        """Per API server: requests that reached it and wait for its event loop to take them in."""
        self.intake_armed = [False] * servers
        self.intake_owed = [0] * servers
        """Per API server: how many waiting requests' intakes go before the next output round (see _serve_round)."""
        self.round_deferred = [False] * servers
        self.next_server = 0
        self.per_replica = target.servers_per_replica
        self.next_in_replica = [0] * engines
        self.server_of: dict[int, int] = {}
        self.delivered: list[list[list[float]]] = [[[] for _ in range(servers)] for _ in range(engines)]
        """With a frontend: per engine and API server, when the tokens of each step left that server (nan: not yet)."""
        self.pending: list[list[tuple[int, int, float]]] = [[] for _ in range(servers)]
        """Per API server: (engine, step, tokens) its output handler has not taken yet (a step's tokens are split
        evenly over the servers)."""
        self.round_armed = [False] * servers
        self.awaiting: list[list[tuple[int, int, SimRequest]]] = [[] for _ in range(servers)]
        """Per API server: finished requests (engine, last step, request) whose last tokens it has not sent yet."""

    def _init_fleet(self, engines: int) -> None:
        """A fleet's bookkeeping: its replicas' names, per-replica samples and counts (none for one engine)."""
        fleet = engines > 1
        self.replica_names = [REPLICA_NAME.format(i) for i in range(engines)] if fleet else None
        """A fleet's replicas as its records and loads name them (a record's base_url, as bench's several URLs)."""
        self.replica_samples: list[list[TimelineSample]] | None = [[] for _ in range(engines)] if fleet else None
        """A fleet's per-replica metrics at each sample: what bench scrapes from each replica's /metrics."""
        self.served = [0] * engines

    # -- the loop ---------------------------------------------------------

    def execute(self) -> None:
        self._pull_main(0.0)
        self._arm_release()
        events, deliveries = self.events, self.deliveries
        while events or deliveries:
            if deliveries and (not events or deliveries[0] < events[0]):
                t, _, _, action = heapq.heappop(deliveries)
            else:
                t, _, _, action = heapq.heappop(events)
            self._scrape_until(t)
            self.now = t
            action(t)
        self._scrape_until(self.now)
        self._sample(self.now)

    def _push(self, t: float, kind: int, action: Callable[[float], None]) -> None:
        heapq.heappush(self.events, (t, kind, next(self.seq), action))

    def _scrape_until(self, t: float) -> None:
        interval = self.t.scrape_interval
        if self.next_scrape < t and self._idle():
            # Every sample of an idle gap reads the same: keep its first and last, so a slow open loop
            # (--request-rate 1e-9) writes a few samples per request, not one per simulated second.
            skipped = math.ceil((t - self.next_scrape) / interval) - 1
            if skipped > 1:
                self._sample(self.next_scrape)
                self.next_scrape += skipped * interval
        while self.next_scrape < t:
            self._sample(self.next_scrape)
            self.next_scrape += interval

    def _idle(self) -> bool:
        return not any(engine.has_work() or engine.decode_run is not None for engine in self.engines)

    def _sample(self, t: float) -> None:
        if self.on_sample is None:
            return
        values: dict[str, float] = {}
        for i, engine in enumerate(self.engines):
            own = engine.metrics(t)
            if self.replica_samples is not None:
                self.replica_samples[i].append(TimelineSample(t=t, values=own))
            for name, v in own.items():
                values[name] = values.get(name, 0) + v
        values[tl.KV_USAGE] /= len(self.engines)
        self.on_sample(TimelineSample(t=t, values=values))

    def replica_loads(self) -> list[dict[str, object]]:
        """Each replica's load over the run, in the shape bench records for a real fleet (metrics.scrape)."""
        assert self.replica_names is not None and self.replica_samples is not None
        loads = []
        for name, samples, served in zip(self.replica_names, self.replica_samples, self.served):
            load = replica_load(name, samples)
            load["requests_served"] = served  # the simulated engine exports no e2e histogram to count them from
            loads.append(load)
        return loads

    # -- release (the HttpTarget rules) -----------------------------------

    def _pull_main(self, released_at: float) -> None:
        """Find the next request the main releaser sends, parking follow-up turns on their dependency."""
        for spec in self.specs:
            if spec.depends_on is not None:
                if spec.depends_on not in self.seen:
                    raise unmet_dependency(spec)
                self.seen.add(spec.index)
                done = self.finished.get(spec.depends_on)
                if done is None:
                    self.parked.setdefault(spec.depends_on, []).append(spec)
                    self._deliveries_matter()
                    running = self.in_engine.get(spec.depends_on)
                    if running is not None:
                        _quote_reply(running, spec)
                else:
                    self._wait(max(spec.arrival_time, done + spec.think_time), spec)
                continue
            self.seen.add(spec.index)
            if spec.arrival_time >= self.duration:
                break
            self._wait(max(spec.arrival_time, released_at), spec, main=True)
            return
        self.main_exhausted = True

    def _deliveries_matter(self) -> None:
        """A response's delivery may now release a turn: every pending one goes back among the events (in order)."""
        self.inert_deliveries = False
        for event in self.deliveries:
            heapq.heappush(self.events, event)
        self.deliveries.clear()

    def _wait(self, wait_start: float, spec: RequestSpec, main: bool = False) -> None:
        heapq.heappush(self.waiters, _Waiter(wait_start, next(self.seq), spec, main))

    def _arm_release(self) -> None:
        """Keep one release event pending at the earliest time the head waiter can go."""
        if self.waiters and (self.free_slots is None or self.free_slots > 0):
            t = max(self.waiters[0].wait_start, self.now)
            if t < self.release_at:
                self.release_at = t
                self._push(t, _RELEASE, self._release)

    def _release(self, now: float) -> None:
        if now >= self.release_at:
            self.release_at = float("inf")
        while self.waiters and self.waiters[0].wait_start <= now and (self.free_slots is None or self.free_slots > 0):
            w = heapq.heappop(self.waiters)
            if now >= self.duration:
                if w.main:
                    self.main_exhausted = True
                continue
            if self.free_slots is not None:
                self.free_slots -= 1
            self._send(w.spec, now)
            if w.main:
                self._pull_main(now)
        self._arm_release()

    def _send(self, spec: RequestSpec, now: float) -> None:
        self.released += 1
        self.first_send = min(self.first_send, now)
        self.send_times[spec.index] = now
        if self.latency:
            self._push(now + self.latency, _CLIENT, lambda t, s=spec: self._arrive(s, t))
        else:
            self._arrive(spec, now)

    def _frontend(self, arrival: float, work: float, server: int = 0) -> float:
        """Queue `work` seconds on one API server's core; returns when it is done (FIFO, items come in time order)."""
        done = max(arrival, self.frontend_free_at[server]) + work
        self.frontend_free_at[server] = done
        self.frontend_busy += work
        return done

    def _arrive(self, spec: RequestSpec, now: float) -> None:
        if self.frontend and self.per_replica is None:  # shared API servers take requests in turn
            server = self.next_server
            self.next_server = (server + 1) % self.servers
            self._queue_intake(spec, server, now)
        else:  # no frontend, or a router in front picks the replica, whose own API server takes it in (_route)
            self._admit(spec, now)

    def _queue_intake(self, spec: RequestSpec, server: int, now: float) -> None:
        self.server_of[spec.index] = server
        self.intake[server].append(spec)
        if not self.intake_armed[server]:
            self.intake_armed[server] = True
            self._take_in(server, now)

    def _servers_of(self, i: int) -> range:
        """The API servers engine `i`'s steps stream through: its replica's own, or all the shared ones."""
        if self.per_replica is None:
            return range(self.servers)
        return range(i * self.per_replica, (i + 1) * self.per_replica)

    def _take_in(self, server: int, now: float) -> None:
        """The API server's loop takes in its next waiting request, once its core is free (an output round due by
        then has gone first: it is a _CLIENT event, and this one an _INTAKE event at the same time)."""
        free = self.frontend_free_at[server]
        if free > now:
            self._push(free, _INTAKE, lambda t, s=server: self._take_in(s, t))
            return
        if not self.intake[server]:
            self.intake_armed[server] = False
            return
        spec = self.intake[server].popleft()
        done = self._frontend(now, self.fe_request + self.fe_token * spec.prompt_len, server)
        admitted = done + self.fe_latency + self.fe_latency_token * spec.prompt_len
        if self.per_replica is None:
            self._push(admitted, _CLIENT, lambda t, s=spec: self._admit(s, t))
        else:
            picked = server // self.per_replica  # the replica whose own API server this is
            self._push(admitted, _CLIENT, lambda t, i=picked, s=spec: self._enter(i, s, t))
        self.intake_owed[server] = max(0, self.intake_owed[server] - 1)
        if self.round_deferred[server] and not (self.intake_owed[server] and self.intake[server]):  # its turn now
            self.round_deferred[server] = False
            self._push(done, _CLIENT, lambda t, s=server: self._round(s, t))
        self._push(done, _INTAKE, lambda t, s=server: self._take_in(s, t))

    def _admit(self, spec: RequestSpec, now: float) -> None:
        """The request reaches the router (after the frontend, if any), which routes it after its own time."""
        own = self.router.own_time(spec)  # the router's own time (sim/router.py ROUTER_COSTS)
        if own:
            self._push(now + own, _CLIENT, lambda t, s=spec: self._route(s, t))
        else:
            self._route(spec, now)

    def _route(self, spec: RequestSpec, now: float) -> None:
        """The router picks an engine and the request reaches it (through that replica's own API server when the
        router is in front of separate servers)."""
        i = self.router.pick(self.engines, spec, now)  # routing (sim/router.py)
        if self.frontend and self.per_replica is not None:
            server = i * self.per_replica + self.next_in_replica[i]
            self.next_in_replica[i] = (self.next_in_replica[i] + 1) % self.per_replica
            self._queue_intake(spec, server, now)
        else:
            self._enter(i, spec, now)

    def _enter(self, i: int, spec: RequestSpec, now: float) -> None:
        """The request reaches engine `i`: the engine's clock for it starts here."""
        engine = self.engines[i]
        try:
            req = engine.add_request(spec.prompt_ids, spec.max_tokens, now, spec.priority, spec)
        except RequestRejected as exc:
            send = self.send_times.pop(spec.index)
            self.server_of.pop(spec.index, None)
            rec = self._record(spec, send, now + self.latency)
            rec.status, rec.error_kind, rec.error = ERROR, _REJECTED, str(exc)
            if self.replica_names is not None:
                rec.base_url = self.replica_names[i]
            self._push_delivery(rec)
            return
        self.in_engine[spec.index] = req
        for follow_up in self.parked.get(spec.index, ()):
            _quote_reply(req, follow_up)
        self._wake(i, now)

    def _wake(self, i: int, now: float) -> None:
        engine = self.engines[i]
        if not engine.in_step and not self.begin_pending[i] and engine.has_work():
            self.begin_pending[i] = True
            self._push(now, _STEP_BEGIN, lambda t, i=i: self._begin(i, t))

    # -- engines ----------------------------------------------------------

    def _begin(self, i: int, now: float) -> None:
        self.begin_pending[i] = False
        horizon = self.events[0][0] if self.events else float("inf")
        engine = self.engines[i]
        end = engine.begin_step(now, horizon)
        run = engine.decode_run
        if self.frontend and run is not None:
            self._run_rounds(i, *run)
        self._push(end, _STEP_END, lambda t, i=i: self._end(i, t))

    def _end(self, i: int, now: float) -> None:
        engine = self.engines[i]
        run = engine.decode_run
        generated = engine.counters.generation_tokens
        finished = engine.finish_step()
        if self.frontend:
            # A decode run's earlier steps went to the API servers in _run_rounds; this is its last.
            tokens = run[2] if run is not None else engine.counters.generation_tokens - generated
            step = engine.num_steps - 1
            servers = self._servers_of(i)
            for server in servers:
                delivered = self.delivered[i][server]
                if tokens:
                    delivered.append(math.nan)
                    self.pending[server].append((i, step, tokens / len(servers)))
                    self._arm_round(server, now)
                else:
                    delivered.append(now)
            for req in finished:
                self.awaiting[self.server_of[req.tag.index]].append((i, step, req))
        else:
            for req in finished:
                self._emit(i, req, now)
        self._wake(i, now)

    # -- the API server's output rounds -------------------------------------

    def _arm_round(self, server: int, now: float) -> None:
        if not self.round_armed[server]:
            self.round_armed[server] = True
            at = max(now, self.frontend_free_at[server])
            self._push(at, _CLIENT, lambda t, s=server: self._round(s, t))

    def _run_rounds(self, i: int, first: int, steps: int, tokens: int) -> None:
        """The output rounds of a decode run's steps but its last (which `_end` takes, as any step's).

        Those steps all end before the run's horizon, the next event of any
        kind, so nothing but their own rounds uses the API servers until then:
        a round due before the next of them ends is served here, exactly as
        the event loop would serve it, and the last one due is left to it
        (armed), as is everything when a round was already armed before the run.
        """
        ends = self.engines[i].step_ends
        servers = self._servers_of(i)
        share = tokens / len(servers)
        for server in servers:
            delivered = self.delivered[i][server]
            if self.round_armed[server]:  # the round armed before the run takes these steps too: they only queue
                delivered.extend([math.nan] * (steps - 1))
                self.pending[server].extend([(i, step, share) for step in range(first, first + steps - 1)])
                continue
            due: float | None = None
            for step in range(first, first + steps - 1):
                end = ends[step]
                while due is not None and due < end:  # at a tie the step's end comes first (_STEP_END < _CLIENT)
                    due = self.frontend_free_at[server] if self._serve_round(server, due) else None
                delivered.append(math.nan)
                self.pending[server].append((i, step, share))  # a served round replaced the list
                if due is None:
                    due = max(end, self.frontend_free_at[server])
            if due is not None:
                self.round_armed[server] = True
                self._push(due, _CLIENT, lambda t, s=server: self._round(s, t))

    def _round(self, server: int, now: float) -> None:
        free = self.frontend_free_at[server]
        if free > now:  # a request's admission took the core since this round was armed
            self._push(free, _CLIENT, lambda t, s=server: self._round(s, t))
            return
        if self.intake_owed[server] and self.intake[server]:  # waiting requests' intakes (one due now) go first
            self.round_deferred[server] = True
            return
        if self._serve_round(server, now):
            self._arm_round(server, now)

    def _serve_round(self, server: int, now: float) -> bool:
        """One turn of the output handler: the steps not taken yet, then one chunk per request with new tokens.

        A running request emits at most one token per step, so the requests
        with new tokens are about as many as the widest step's tokens; their
        chunks go out one after another, and each token is taken as sent at
        the mean position of that sequence. The handler takes queued steps
        back to back while each has at most `output_slice` outputs (their
        tokens merge); a wider step is a round of its own (_sliced_step).
        Returns whether steps are left for the next round.
        """
        self.round_armed[server] = False
        pending, limit = self.pending[server], self.output_slice
        if limit is not None and pending[0][2] > limit:
            take = 1
            i, step, width = pending[0]
            done, sent = self._sliced_step(now, width, limit)
        else:
            take = len(pending)
            if limit is not None:
                take = next((k for k, (_, _, n) in enumerate(pending) if n > limit), take)
            if take == 1:  # the usual round, one step's tokens: the same sums without the generators
                i, step, width = pending[0]
                handled = now + self.fe_step + self.fe_output * width
            else:
                batch = pending[:take]
                handled = now + self.fe_step * take + self.fe_output * sum(n for _, _, n in batch)
                width = max(n for _, _, n in batch)
            done = handled + self.fe_chunk * width
            sent = min(done, handled + self.fe_chunk * (width + 1) / 2)
        for i, step, _ in pending[:take]:
            self.delivered[i][server][step] = sent
        self.pending[server] = pending[take:]
        self.frontend_free_at[server] = done
        self.frontend_busy += done - now
        # asyncio gives every ready task a turn: the requests in intake against the output handler and the streams
        # it has just woken, so about (in intake) / (streams + 1) requests are taken in before the next round.
        self.intake_owed[server] = -(-len(self.intake[server]) // (int(width) + 1))
        waiting, self.awaiting[server] = self.awaiting[server], []
        for i, step, req in waiting:
            if math.isnan(self.delivered[i][server][step]):  # its last step waits for a later round
                self.awaiting[server].append((i, step, req))
            else:
                self._emit(i, req, now)
        return bool(self.pending[server])

    def _sliced_step(self, now: float, width: float, limit: int) -> tuple[float, float]:
        """A step of more than `limit` outputs: when the handler is done with it, and its chunks' mean send time.

        vLLM's handler processes the outputs in slices of `limit` and awaits
        asyncio.sleep(0) after each but the last, which lets the streams the
        slice woke send their chunks first; the last slice's streams send
        theirs at the handler's next wait (taken here as right after it).
        """
        full, rest = divmod(width, limit)
        sizes = np.append(np.full(int(full), float(limit)), [rest] if rest > 0 else [])
        per_output = self.fe_output + self.fe_chunk
        starts = now + self.fe_step + per_output * np.concatenate(([0.0], np.cumsum(sizes)[:-1]))
        sends = starts + self.fe_output * sizes + self.fe_chunk * (sizes + 1) / 2
        done = now + self.fe_step + per_output * width
        return done, min(done, float(np.dot(sizes, sends) / width))

    def _emit(self, i: int, req: SimRequest, now: float) -> None:
        """`req`'s last token has left the server: its record reaches the client after its last chunk."""
        rec = self._finished_record(i, req)
        if rec.finish_time > now:
            self._push_delivery(rec)
        else:
            self._deliver(rec)

    # -- records ----------------------------------------------------------

    def _record(self, spec: RequestSpec, send: float, finish: float) -> RequestRecord:
        return RequestRecord(
            index=spec.index,
            intended_time=send,
            send_time=send,
            finish_time=finish,
            prompt_tokens=spec.prompt_len,
            prefix_group=spec.prefix_group,
            priority=spec.priority,
        )

    def _finished_record(self, i: int, req: SimRequest) -> RequestRecord:
        spec: RequestSpec = req.tag
        self.in_engine.pop(spec.index, None)
        lat = self.latency
        if self.frontend:
            delivered = self.delivered[i][self.server_of.pop(spec.index)]
            times = []
            for first, last in req.emitted_steps():
                times.extend(delivered[first : last + 1])
        else:
            times = self.engines[i].token_times(req)
        if self.stream_interval > 1:
            times = _chunked(times, self.stream_interval)
        if self.frontend:
            # Tokens of one output round went out in one chunk: the client sees one arrival (ITL counts chunks).
            # Delivery times never decrease, so equal times are adjacent: keep each that differs from the one before.
            times = [x for x, before in zip(times, [None, *times]) if x != before]
        if lat:
            times = [x + lat for x in times]
        rec = self._record(spec, self.send_times.pop(spec.index), times[-1])
        rec.first_token_time = times[0]
        rec.chunk_times = times
        rec.output_tokens = req.num_output_tokens
        rec.schedule_time = req.schedule_time
        rec.preemptions = req.preemptions
        rec.status = OK
        if self.replica_names is not None:
            rec.base_url = self.replica_names[i]
            self.served[i] += 1
        return rec

    def _push_delivery(self, rec: RequestRecord) -> None:
        event = (rec.finish_time, _CLIENT, next(self.seq), lambda t, r=rec: self._deliver(r))
        heapq.heappush(self.deliveries if self.inert_deliveries else self.events, event)

    def _deliver(self, rec: RequestRecord) -> None:
        """The response reached the client: record it, free its slot, release what waited on it."""
        self.sink.write(rec)
        self.router.finished(rec.index)  # routing (sim/router.py): its own in-flight count
        self.last_finish = max(self.last_finish, rec.finish_time)
        self.finished[rec.index] = rec.finish_time
        for spec in self.parked.pop(rec.index, ()):
            self._wait(max(spec.arrival_time, rec.finish_time + spec.think_time), spec)
        if self.free_slots is not None:
            self.free_slots += 1
        self._arm_release()


def _quote_reply(req: SimRequest, follow_up: RequestSpec) -> None:
    """Give `req` the output tokens that `follow_up` (the chat's next turn) quotes as its reply, if it quotes one.

    vLLM caches the full blocks of generated tokens under their token ids, so
    the next turn, whose prompt is the history plus this reply, hits them. The
    simulator knows no output ids, but the workload's next turn carries the
    reply it stands for right after this prompt: those are the ids. Hashes are
    recomputed on next use; blocks already cached under private hashes stay so.
    """
    n, m = req.prompt_len, req.max_tokens
    if req.output_ids is not None or follow_up.prompt_len < n + m:
        return
    head = np.asarray(follow_up.prompt_ids[:n])
    if np.array_equal(head, np.asarray(req.prompt_ids)):
        req.output_ids = np.asarray(follow_up.prompt_ids[n : n + m])
        req.block_hashes = None


def _chunked(times: list[float], interval: int) -> list[float]:
    """Arrival times of the streamed chunks when the API server sends the first token, then every `interval` tokens.

    vLLM's RequestState.make_request_output: a chunk goes out on the first
    token, once `interval` tokens are unsent, and when the request finishes.
    """
    last = len(times) - 1
    return [times[0], *(times[min(j, last)] for j in range(interval, last + interval, interval))]
