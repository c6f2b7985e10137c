"""One simulated vLLM engine: scheduler + KV pool + a cost model for step time.

A step is split in two so that a discrete-event driver can interleave many
engines and the clients: `begin_step(now)` schedules (allocating KV and
advancing computed tokens, as vLLM's schedule() does) and returns when the
step ends; `finish_step()` applies the sampled tokens at that time: every
request whose prefill is complete after the step emits one token, the first
one at the end of the step that completes its prefill, and a request
finishes when it has max_tokens (ignore_eos semantics). Metrics are taken at
step ends, which is when vLLM's own stats refresh. A step that starts after
the engine sat idle also pays the cost model's `wake_time` for that idle spell.

With async scheduling (vLLM 0.32's default on GPUs: `EngineCore.step_with_batch_queue`
with two batches in flight and `AsyncScheduler`'s output placeholders), the
engine core schedules step N+1 and prepares its inputs while the GPU runs
step N. Two things follow, and both are modelled:
- a step's CPU work (the cost model's step, per-request and prefill-step
  overheads) overlaps the previous step's GPU work: the GPU starts step N+1 at
  max(its scheduling + CPU work, the end of step N), so back-to-back steps
  cost max(GPU, CPU) instead of their sum;
- step N+1 is scheduled when step N starts on the GPU, so a request that
  reaches the engine after that joins step N+2, one step later than the
  synchronous loop would take it (requests wait in an inbox, as in vLLM's
  input queue, until the scheduling that can see them). If nothing could be
  scheduled then, the engine core schedules again after step N's output, as
  the synchronous loop does.
The logical order (schedule N, apply N's tokens, schedule N+1) is kept: with
placeholders the decisions vLLM takes are the same, except that a finished
request's blocks return to the pool one step later in vLLM (not modelled).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from servelab.errors import ServerFault
from servelab.sim import vllm_metrics as tl
from servelab.perf.cost_model import CostCoefficients, CostModel, StepBatch
from servelab.perf.engine_config import EngineConfig
from servelab.sim.block_pool import BlockPool
from servelab.sim.engines import SchedulerFactory
from servelab.sim.request import SimRequest
from servelab.sim.scheduler import Scheduler


class RequestRejected(ServerFault, ValueError):
    """The engine refuses the request up front, as vLLM answers HTTP 400."""


@dataclass(slots=True)
class EngineCounters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    iteration_tokens_sum: int = 0
    iteration_tokens_count: int = 0
    ttft_sum: float = 0.0
    ttft_count: int = 0
    prefill_time_sum: float = 0.0
    """First scheduling to first token, summed over requests (vLLM's request_prefill_time_seconds)."""


class SimEngine:
    def __init__(
        self,
        config: EngineConfig,
        num_gpu_blocks: int,
        cost_model: CostModel,
        max_model_len: int | None = None,
        fast_forward: bool = True,
        cpu_costs: CostCoefficients | None = None,
        scheduler_factory: SchedulerFactory | None = None,
    ) -> None:
        self.config = config
        if scheduler_factory is None:
            self.pool = BlockPool(num_gpu_blocks, config.enable_prefix_caching)
            self.scheduler = Scheduler(config, self.pool)
        else:  # another engine's scheduler and KV pool (sim/engines.py)
            self.scheduler, self.pool = scheduler_factory(num_gpu_blocks)
        self.cost_model = cost_model
        self.max_model_len = max_model_len if max_model_len is not None else config.max_model_len
        self.block_size = config.block_size
        self.step_ends: list[float] = []
        """End time of every step; token k of a request is at step_ends[its k-th emitting step]."""
        self.counters = EngineCounters()
        self.busy_time = 0.0
        self._next_uid = 0
        self._in_step = False
        self._gauges = (0, 0, 0.0)
        self._aggregate = getattr(cost_model, "step_time_aggregate", None)
        """RooflineCostModel's totals-based entry point: a step costs a few array sums instead of list building."""
        self.fast_forward = fast_forward
        """Replay runs of identical decode steps in one go; results are the same either way."""
        self._pending_tokens: int | None = None
        self._pending_run: tuple[int, int, int] | None = None
        """(first step, steps, tokens per step) of a decode run in flight, for metrics read mid-run."""
        self._run_queues = (0, 0)
        """(running, waiting) when that run began: what every step of it but the last reports (the last may see a
        request that arrived during it)."""
        self.async_scheduling = bool(config.async_scheduling)
        self._cpu = cpu_costs
        """The CPU part of a step's time (it overlaps the GPU under async scheduling); None: all of it is GPU."""
        self._inbox: deque[SimRequest] = deque()
        """Async scheduling: requests that reached the engine but no scheduling has seen yet (arrival order)."""
        self._gpu_start = 0.0
        """Async scheduling: when the latest step started on the GPU, which is when the next one was scheduled."""
        self._step_cpu = 0.0
        self.fast_forwarded_steps = 0
        """Steps advanced by decode runs rather than one schedule() each (what the fast path saved)."""

    @property
    def num_steps(self) -> int:
        return len(self.step_ends)

    def add_request(
        self,
        prompt_ids: Any,
        max_tokens: int,
        arrival_time: float,
        priority: int = 0,
        tag: Any = None,
        output_ids: Any = None,
    ) -> SimRequest:
        """Queue a request; raises RequestRejected for one vLLM would refuse.

        `output_ids`, when known, are the tokens it will generate (see SimRequest.output_ids).
        """
        prompt_len = len(prompt_ids)
        total = prompt_len + max_tokens
        if prompt_len == 0 or max_tokens < 1:
            raise RequestRejected("the prompt must be non-empty and max_tokens at least 1")
        if self.max_model_len is not None and total > self.max_model_len:
            raise RequestRejected(
                f"{prompt_len} prompt + {max_tokens} output tokens exceed max_model_len {self.max_model_len}"
            )
        capacity = (self.pool.num_blocks - 1) * self.block_size
        if total > capacity:
            raise RequestRejected(f"{total} tokens exceed the whole KV cache ({capacity} tokens)")
        if not self.config.enable_chunked_prefill and prompt_len > self.scheduler.budget:
            raise RequestRejected(
                f"{prompt_len}-token prompt exceeds max_num_batched_tokens {self.scheduler.budget} with chunked "
                f"prefill off"
            )
        req = SimRequest(self._next_uid, prompt_ids, prompt_len, max_tokens, arrival_time, priority, tag, output_ids)
        self._next_uid += 1
        if self.async_scheduling:
            self._inbox.append(req)
        else:
            self.scheduler.add(req)
        return req

    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self._inbox)

    @property
    def decode_run(self) -> tuple[int, int, int] | None:
        """(first step, steps, tokens per step) of the decode run in flight; None while a single step is."""
        return self._pending_run

    @property
    def in_step(self) -> bool:
        return self._in_step

    def begin_step(self, now: float, horizon: float = float("inf")) -> float:
        """Start a step at `now`; returns when it ends.

        With fast-forward, a run of identical decode steps is simulated at
        once, as long as each starts before `horizon` (the next outside event
        that could change the batch); the returned time is then the end of
        the last of them.
        """
        # A step that starts later than the previous one ended follows an idle engine (the first: idle since start).
        idle = now - self.step_ends[-1] if self.step_ends else math.inf
        wake = self.cost_model.wake_time(idle) if idle > 0 else 0.0
        if self.async_scheduling:
            return self._begin_async(now, horizon, wake, idle)
        if self.fast_forward:
            k = self.scheduler.steady_decode_steps(len(self.step_ends), 1 << 30)
            if k:
                return self._decode_run(now, horizon, k, wake=wake)
        granted, before = self.scheduler.schedule(now)
        duration = self._step_time(granted, before)
        if duration < 0 or (duration == 0 and not self.scheduler.preempted_this_step):
            raise RuntimeError(f"cost model returned a non-positive step time {duration!r}")
        duration += wake
        end = now + duration
        self.busy_time += duration
        self.step_ends.append(end)
        self._in_step = True
        return end

    def _begin_async(self, now: float, horizon: float, wake: float, idle: float) -> float:
        """A step under async scheduling: scheduled when the previous one started on the GPU, if there was work then."""
        inbox = self._inbox
        scheduled_at = now
        if idle <= 0:  # back to back: this step was scheduled while the previous one ran, if anything could run
            early = self._gpu_start
            if self.scheduler.has_work() or (inbox and inbox[0].arrival_time <= early):
                scheduled_at = early
        while inbox and inbox[0].arrival_time <= scheduled_at:
            self.scheduler.add(inbox.popleft())
        if self.fast_forward:
            k = self.scheduler.steady_decode_steps(len(self.step_ends), 1 << 30)
            if k:  # requests still in the inbox join the first step scheduled at or after they came
                joins = inbox[0].arrival_time if inbox else math.inf
                return self._decode_run(now, horizon, k, scheduled_at=scheduled_at, wake=wake, joins=joins)
        granted, before = self.scheduler.schedule(scheduled_at)
        total = self._step_time(granted, before)
        if total < 0 or (total == 0 and not self.scheduler.preempted_this_step):
            raise RuntimeError(f"cost model returned a non-positive step time {total!r}")
        cpu = min(self._step_cpu, total)
        self._gpu_start = max(scheduled_at + cpu, now)
        end = self._gpu_start + total - cpu + wake
        self.busy_time += end - now
        self.step_ends.append(end)
        self._in_step = True
        return end

    def _step_time(self, granted: np.ndarray, before: np.ndarray) -> float:
        # A prefill chunk is a row granted more than one token; the chunks are few, so their sums are Python's.
        chunks = (granted > 1).nonzero()[0]
        num_chunks = len(chunks)
        num_scheduled = int(np.count_nonzero(granted))
        num_decodes = num_scheduled - num_chunks
        if num_scheduled == 0:
            if self.scheduler.preempted_this_step:
                self._step_cpu = 0.0
                return 0.0  # the only candidate preempted itself: vLLM runs an empty step and retries
            raise RuntimeError("simulator stalled: requests are queued but none could be scheduled")
        if self._cpu is not None:
            self._step_cpu = self._cpu.cpu_step_time(num_scheduled, num_chunks > 0)
        if self._aggregate is None:
            decode = granted == 1
            return self.cost_model.step_time(
                StepBatch(
                    prefill_chunks=list(zip(granted[chunks].tolist(), before[chunks].tolist())),
                    decode_contexts=before[decode].tolist(),
                )
            )
        new, cached = granted[chunks].tolist(), before[chunks].tolist()
        if num_scheduled == len(granted):  # every row decodes or prefills: the decodes' context is the rest
            decode_context = int(np.add.reduce(before)) - sum(cached)
        else:
            decode_context = int(np.add.reduce(before[granted == 1]))
        return self._aggregate(
            sum(new),
            sum([m * c + m * (m + 1) // 2 for m, c in zip(new, cached)]),
            num_decodes,
            decode_context,
            num_scheduled,
            sum(cached),
        )

    def _decode_step_time(self, contexts: np.ndarray, base_sum: int, k: int) -> float:
        """Time of the k-th step of a decode run from the running sums when the cost model offers them."""
        n = len(contexts)
        if self._aggregate is None:
            return self.cost_model.step_time(StepBatch(decode_contexts=(contexts + k).tolist()))
        return self._aggregate(0, 0, n, base_sum + n * k, n, 0)

    def _decode_run(
        self,
        now: float,
        horizon: float,
        k: int,
        scheduled_at: float | None = None,
        wake: float = 0.0,
        joins: float = math.inf,
    ) -> float:
        """Up to k identical decode steps from `now`, the first after `wake` seconds of wake-up time.

        Synchronous: each step follows the previous one. Async (`scheduled_at` given): each step's CPU work
        overlaps the previous step's GPU work, as in `_begin_async`, and the run stops before the first step
        scheduled at or after `joins` (a request waiting in the inbox joins that one). Every end time and the
        busy time are summed in the order `begin_step` sums them, so the floats are the same to the last bit.
        """
        base = self.scheduler.decode_contexts()
        base_sum = int(base.sum())
        first = len(self.step_ends)
        ends = self.step_ends
        t = now
        busy = self.busy_time
        done = 0
        if scheduled_at is None:
            while done < k and (done == 0 or t < horizon):
                duration = self._decode_step_time(base, base_sum, done)
                if done == 0:
                    duration += wake
                t += duration
                busy += duration
                ends.append(t)
                done += 1
        else:
            n = len(base)
            cpu = self._cpu.cpu_step_time(n, False) if self._cpu is not None else 0.0
            sched, gpu_start = scheduled_at, self._gpu_start
            while done < k and (done == 0 or (t < horizon and sched < joins)):
                total = self._decode_step_time(base, base_sum, done)
                c = min(cpu, total)
                gpu_start = max(sched + c, t)
                end = gpu_start + total - c + (wake if done == 0 else 0.0)
                busy += end - t
                t = end
                sched = gpu_start
                ends.append(t)
                done += 1
            self._gpu_start = gpu_start
        self.busy_time = busy
        self.fast_forwarded_steps += done
        self._pending_tokens = self.scheduler.apply_decode_steps(first, done)
        self._pending_run = (first, done, self._pending_tokens // done)
        self._run_queues = (self.scheduler.num_running, len(self.scheduler.waiting))
        self._in_step = True
        return t

    def finish_step(self) -> list[SimRequest]:
        step = len(self.step_ends) - 1
        end = self.step_ends[step]
        if self._pending_tokens is not None:
            assert self._pending_run is not None  # set with _pending_tokens, by the same step
            c = self.counters
            c.generation_tokens += self._pending_tokens
            c.iteration_tokens_sum += self._pending_tokens
            c.iteration_tokens_count += self._pending_run[1]
            self._pending_tokens = None
            self._pending_run = None
            self._in_step = False
            finished = self.scheduler.finish_decode_run(step)
            self._gauges = (self.scheduler.num_running, len(self.scheduler.waiting), self.pool.usage)
            return finished
        generated, first, finished = self.scheduler.update(step)
        c = self.counters
        prompt = 0
        for req in first:
            assert req.schedule_time is not None  # its first token came from a step that scheduled it
            prompt += req.prompt_len
            c.ttft_sum += end - req.arrival_time
            c.prefill_time_sum += end - req.schedule_time
        c.ttft_count += len(first)
        c.prompt_tokens += prompt
        c.generation_tokens += generated
        c.iteration_tokens_sum += prompt + generated
        c.iteration_tokens_count += 1
        self._in_step = False
        self._gauges = (self.scheduler.num_running, len(self.scheduler.waiting), self.pool.usage)
        return finished

    def token_times(self, req: SimRequest) -> list[float]:
        times: list[float] = []
        ends = self.step_ends
        for first, last in req.emitted_steps():
            times.extend(ends[first : last + 1])
        return times

    def metrics(self, t: float) -> dict[str, float]:
        """This engine's /metrics at time t (as of its last step end before t), under vLLM's names."""
        running, waiting, usage = self._gauges
        c = self.counters
        generated, iterations = c.generation_tokens, c.iteration_tokens_count
        if self._pending_run is not None:
            first, steps, per_step = self._pending_run
            ended = bisect.bisect_right(self.step_ends, t, first, first + steps) - first
            generated += ended * per_step
            iterations += ended
            if ended:  # the gauges as that step's end set them: the queues the run started with, its KV grown
                running, waiting = self._run_queues
                usage = self.scheduler.decode_run_usage(ended)
        prefix = self.scheduler.prefix
        return {
            tl.RUNNING: running,
            tl.WAITING: waiting,
            tl.KV_USAGE: usage,
            tl.PREEMPTIONS: self.scheduler.num_preemptions,
            tl.PREFIX_QUERIES: prefix.queries,
            tl.PREFIX_HITS: prefix.hits,
            tl.PROMPT_TOKENS: c.prompt_tokens,
            tl.GENERATION_TOKENS: generated,
            tl.ITERATION_TOKENS_SUM: c.iteration_tokens_sum + (generated - c.generation_tokens),
            tl.ITERATION_TOKENS_COUNT: iterations,
            tl.TTFT_SUM: c.ttft_sum,
            tl.TTFT_COUNT: c.ttft_count,
            tl.PREFILL_TIME_SUM: c.prefill_time_sum,
            tl.PREFILL_TIME_COUNT: c.ttft_count,
        }

    @property
    def load(self) -> tuple[int, int, float]:
        """(waiting, running, kv usage) right now, for the router."""
        return len(self.scheduler.waiting), self.scheduler.num_running, self.pool.usage
