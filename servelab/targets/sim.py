"""`SimTarget`: serves a LoadPlan with simulated vLLM engines instead of a server.

A discrete-event loop over simulated time: engine step ends, client-side
events (a request reaching the engine, a response reaching the client) and
step starts. Requests are released by exactly the HttpTarget rules: at
max(arrival time, a free concurrency slot, the previous turn finished plus
think time), waiting for slots first-come first-served, never at or after
`plan.duration`. The result is the same RequestRecords and timeline samples a
real run produces, deterministically.

Event order at equal times: step ends, then client events, then slot
releases, then step starts, so a request released the moment another
finishes (with zero latency) joins the very next step.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from servelab.metrics import timeline as tl
from servelab.metrics.records import ERROR, OK, RecordSink, RequestRecord
from servelab.metrics.timeline import TimelineSample
from servelab.perf.cost_model import CostModel
from servelab.perf.engine_config import EngineConfig
from servelab.sim.engine import RequestRejected, SimEngine
from servelab.sim.request import SimRequest
from servelab.sim.router import ROUND_ROBIN, Router
from servelab.targets.base import SampleSink, TargetRun
from servelab.targets.errors import TargetError, unmet_dependency
from servelab.workload.spec import LoadPlan, RequestSpec

_STEP_END, _CLIENT, _RELEASE, _STEP_BEGIN = 0, 1, 2, 3
_REJECTED = "http_400"


class SimTarget:
    """Simulated deployment: `config.data_parallel_size` engines, each with `num_gpu_blocks` KV blocks.

    `network_latency` is a one-way client<->server delay in seconds added to
    every request and token; 0 by default.

    `frontend_s_per_request` / `frontend_s_per_token` model vLLM's API-server
    process, which tokenizes prompts and detokenizes and streams outputs on one
    CPU core: a single FIFO server in front of the engines. A request reaches
    an engine only after the frontend has spent per_request + per_token x
    prompt_len on it; the tokens of each engine step are delivered after
    per_token each, as one batch, on the same server. When that work exceeds
    one core the frontend is the bottleneck: requests queue before the engine
    (the engine's own TTFT, measured from its arrival, stays low while the
    client's grows) and tokens queue after it. Both 0 (default): no frontend.
    The decode fast-forward is off while the frontend is modelled, so that its
    queue sees every step's tokens in time order.
    """

    def __init__(
        self,
        config: EngineConfig,
        num_gpu_blocks: int,
        cost_model: CostModel,
        *,
        router: str = ROUND_ROBIN,
        scrape_interval: float = 1.0,
        network_latency: float = 0.0,
        max_model_len: int | None = None,
        frontend_s_per_request: float = 0.0,
        frontend_s_per_token: float = 0.0,
    ) -> None:
        if scrape_interval <= 0:
            raise TargetError("scrape_interval must be positive")
        if network_latency < 0:
            raise TargetError("network_latency cannot be negative")
        if frontend_s_per_request < 0 or frontend_s_per_token < 0:
            raise TargetError("frontend coefficients cannot be negative")
        if config.data_parallel_size < 1:
            raise TargetError("data_parallel_size must be at least 1")
        self.config = config
        self.num_gpu_blocks = num_gpu_blocks
        self.cost_model = cost_model
        self.router = router
        self.scrape_interval = scrape_interval
        self.network_latency = network_latency
        self.max_model_len = max_model_len
        self.frontend_s_per_request = frontend_s_per_request
        self.frontend_s_per_token = frontend_s_per_token
        self.last_engines: list[SimEngine] = []
        """Engines of the latest run, for inspection (tests, diagnose)."""
        try:  # every setting is checked here, before any load
            Router(router)
            self.make_engine()
        except ValueError as exc:
            raise TargetError(str(exc)) from exc

    @property
    def has_frontend(self) -> bool:
        return self.frontend_s_per_request > 0 or self.frontend_s_per_token > 0

    def make_engine(self) -> SimEngine:
        return SimEngine(
            self.config, self.num_gpu_blocks, self.cost_model, self.max_model_len, fast_forward=not self.has_frontend
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
            "frontend_s_per_request": self.frontend_s_per_request,
            "frontend_s_per_token": self.frontend_s_per_token,
            # Wall-clock facts live here, in run.json, so that summary.json is the same on every run of a seed.
            "sim_wall_s": wall,
            "steps_per_s": steps / wall if wall > 0 else 0.0,
        }
        stats = {
            "engine_steps": steps,
            "engine_busy_s": [e.busy_time for e in engines],
            "frontend_busy_s": sim.frontend_busy,
        }
        return TargetRun(duration=duration, server_info=info, client_stats=stats)


@dataclass(order=True, slots=True)
class _Waiter:
    wait_start: float
    seq: int
    spec: RequestSpec = field(compare=False)
    main: bool = field(compare=False, default=False)


class _Simulation:
    def __init__(
        self, target: SimTarget, engines: list[SimEngine], plan: LoadPlan, sink: RecordSink, on_sample: SampleSink | None
    ) -> None:
        self.t = target
        self.engines = engines
        self.router = Router(target.router)
        self.plan = plan
        self.sink = sink
        self.on_sample = on_sample
        self.latency = target.network_latency
        self.frontend = target.has_frontend
        self.fe_request, self.fe_token = target.frontend_s_per_request, target.frontend_s_per_token
        self.frontend_free_at = 0.0
        self.frontend_busy = 0.0
        self.delivered: list[list[float]] = [[] for _ in engines]
        """With a frontend: per engine, when the tokens of each step left the frontend."""
        self.duration = plan.duration if plan.duration is not None else float("inf")
        self.free_slots = plan.max_concurrency if plan.max_concurrency is not None else None
        self.events: list[tuple[float, int, int, Callable[[float], None]]] = []
        self.seq = itertools.count()
        self.waiters: list[_Waiter] = []
        self.specs: Iterator[RequestSpec] = iter(plan.requests)
        self.main_exhausted = False
        self.seen: set[int] = set()
        self.finished: dict[int, float] = {}
        self.parked: dict[int, list[RequestSpec]] = {}
        self.send_times: dict[int, float] = {}
        self.begin_pending = [False] * len(engines)
        self.next_scrape = 0.0
        self.release_at = float("inf")
        self.released = 0
        self.first_send = float("inf")
        self.last_finish = float("-inf")
        self.now = 0.0

    # -- the loop ---------------------------------------------------------

    def execute(self) -> None:
        self._pull_main(0.0)
        self._arm_release()
        while self.events:
            t, _, _, action = heapq.heappop(self.events)
            self._scrape_until(t)
            self.now = t
            action(t)
        self._scrape_until(self.now)
        self._sample(self.now)

    def _push(self, t: float, kind: int, action: Callable[[float], None]) -> None:
        heapq.heappush(self.events, (t, kind, next(self.seq), action))

    def _scrape_until(self, t: float) -> None:
        while self.next_scrape < t:
            self._sample(self.next_scrape)
            self.next_scrape += self.t.scrape_interval

    def _sample(self, t: float) -> None:
        if self.on_sample is None:
            return
        values: dict[str, float] = {}
        for engine in self.engines:
            for name, v in engine.metrics(t).items():
                values[name] = values.get(name, 0) + v
        values[tl.KV_USAGE] /= len(self.engines)
        self.on_sample(TimelineSample(t=t, values=values))

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
                else:
                    self._wait(max(spec.arrival_time, done + spec.think_time), spec)
                continue
            self.seen.add(spec.index)
            if spec.arrival_time >= self.duration:
                break
            self._wait(max(spec.arrival_time, released_at), spec, main=True)
            return
        self.main_exhausted = True

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

    def _frontend(self, arrival: float, work: float) -> float:
        """Queue `work` seconds on the frontend's one core; returns when it is done (FIFO, items come in time order)."""
        done = max(arrival, self.frontend_free_at) + work
        self.frontend_free_at = done
        self.frontend_busy += work
        return done

    def _arrive(self, spec: RequestSpec, now: float) -> None:
        if self.frontend:
            done = self._frontend(now, self.fe_request + self.fe_token * spec.prompt_len)
            self._push(done, _CLIENT, lambda t, s=spec: self._admit(s, t))
        else:
            self._admit(spec, now)

    def _admit(self, spec: RequestSpec, now: float) -> None:
        """The request reaches an engine (after the frontend, if any): the engine's clock for it starts here."""
        i = self.router.pick(self.engines)
        engine = self.engines[i]
        try:
            engine.add_request(spec.prompt_ids, spec.max_tokens, now, spec.priority, spec)
        except RequestRejected as exc:
            send = self.send_times.pop(spec.index)
            rec = self._record(spec, send, now + self.latency)
            rec.status, rec.error_kind, rec.error = ERROR, _REJECTED, str(exc)
            self._push(now + self.latency, _CLIENT, lambda t, r=rec: self._deliver(r))
            return
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
        end = self.engines[i].begin_step(now, min(horizon, self.next_scrape))
        self._push(end, _STEP_END, lambda t, i=i: self._end(i, t))

    def _end(self, i: int, now: float) -> None:
        engine = self.engines[i]
        generated = engine.counters.generation_tokens
        finished = engine.finish_step()
        if self.frontend:
            tokens = engine.counters.generation_tokens - generated
            self.delivered[i].append(self._frontend(now, self.fe_token * tokens) if tokens else now)
        for req in finished:
            rec = self._finished_record(i, req)
            if rec.finish_time > now:
                self._push(rec.finish_time, _CLIENT, lambda t, r=rec: self._deliver(r))
            else:
                self._deliver(rec)
        self._wake(i, now)

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
        lat = self.latency
        if self.frontend:
            delivered = self.delivered[i]
            times = [delivered[s] for first, last in req.emitted_steps() for s in range(first, last + 1)]
        else:
            times = self.engines[i].token_times(req)
        if lat:
            times = [x + lat for x in times]
        rec = self._record(spec, self.send_times.pop(spec.index), times[-1])
        rec.first_token_time = times[0]
        rec.chunk_times = times
        rec.output_tokens = req.num_output_tokens
        rec.schedule_time = req.schedule_time
        rec.preemptions = req.preemptions
        rec.status = OK
        return rec

    def _deliver(self, rec: RequestRecord) -> None:
        """The response reached the client: record it, free its slot, release what waited on it."""
        self.sink.write(rec)
        self.last_finish = max(self.last_finish, rec.finish_time)
        self.finished[rec.index] = rec.finish_time
        for spec in self.parked.pop(rec.index, ()):
            self._wait(max(spec.arrival_time, rec.finish_time + spec.think_time), spec)
        if self.free_slots is not None:
            self.free_slots += 1
        self._arm_release()
