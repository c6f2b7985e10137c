"""TensorRT-LLM's batch manager: capacity scheduler, then micro-batch scheduler, every iteration.

In-flight batching: one iteration carries the generation requests (one token
each) and the context requests (their prompt, or with chunked context a
multiple of the KV block size) together, up to max_batch_size requests and
max_num_tokens tokens; without chunked context a prompt that does not fit
the tokens left waits for a later iteration, and one longer than
max_num_tokens is refused.

The capacity scheduler decides which requests may hold KV:
- GUARANTEED_NO_EVICT (default) admits a waiting request, first come first
  served, only if the KV blocks for its whole length (prompt + max_tokens),
  added to what every running request still needs to reach its own full
  length, are free: nothing is ever paused, at the price of admitting fewer.
- MAX_UTILIZATION admits a request when its prompt's blocks are free and,
  when the generation requests' next blocks do not fit, pauses the most
  recently started requests (their KV freed, to be recomputed), as vLLM's
  preemption does.
KV-cache block reuse (on by default) looks up the prompt's full blocks by
hash (vLLM's BlockPool stands in for TensorRT-LLM's radix of blocks: both
reuse whole blocks of an identical prefix and evict least recently freed).
The overlap scheduler is the engine's async scheduling.
"""

from __future__ import annotations

import numpy as np

from servelab.perf.engine_config import EngineConfig
from servelab.perf.trtllm_args import GUARANTEED_NO_EVICT, TRTLLMSettings
from servelab.sim.block_pool import BlockPool
from servelab.sim.list_scheduler import ListScheduler
from servelab.sim.request import PREEMPTED, RUNNING, SimRequest


class TRTLLMScheduler(ListScheduler):
    def __init__(self, config: EngineConfig, settings: TRTLLMSettings, pool: BlockPool) -> None:
        super().__init__(settings.max_num_tokens)
        self.max_batch = settings.max_batch_size
        self.bs = settings.tokens_per_block
        self.chunked = settings.enable_chunked_prefill
        self.reuse = settings.enable_block_reuse
        self.no_evict = settings.capacity_scheduler_policy == GUARANTEED_NO_EVICT
        self.pool = pool
        self._in_context: set[int] = set()
        self._cached_blocks: dict[int, int] = {}
        """Per request: how many of its leading blocks are registered for reuse."""

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.bs)

    def schedule(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        self.preempted_this_step = False
        if not self.no_evict:
            self._make_room()  # sets preempted_this_step; what it paused is not re-admitted in the same iteration
        self._admit(now)
        self._micro_batch()
        return self._arrays()

    # -- capacity scheduler ---------------------------------------------------

    def _admit(self, now: float) -> None:
        pool = self.pool
        reserved = 0
        if self.no_evict:
            reserved = sum(self._blocks(r.prompt_len + r.max_tokens) - len(r.blocks) for r in self.running)
        while self.waiting and len(self.running) < self.max_batch:
            req = self.waiting[0]
            if self.preempted_this_step and req.status == PREEMPTED:
                break
            hits: list[int] = []
            if self.reuse:
                most = (req.num_tokens - 1) // self.bs
                hits = pool.lookup(req.hashes(self.bs, most), most)
            if self.no_evict:
                need = self._blocks(req.prompt_len + req.max_tokens) - len(hits)
            else:
                need = self._blocks(req.num_tokens) - len(hits)
            if reserved + need + pool.num_evictable(hits) > pool.num_free:
                break
            if self.no_evict:
                reserved += need
            pool.touch(hits)
            self.waiting.popleft()
            req.blocks = list(hits)
            req.num_computed_tokens = len(hits) * self.bs
            self._cached_blocks[req.uid] = len(hits)
            if req.preemptions == 0:
                self.prefix.queries += req.num_tokens
                self.prefix.hits += req.num_computed_tokens
            if req.schedule_time is None:
                req.schedule_time = now
            req.status = RUNNING
            self._in_context.add(req.uid)
            self.running.append(req)

    def _make_room(self) -> None:
        """MAX_UTILIZATION: pause the latest-started requests until every generation request's next block fits."""
        while self.running:
            need = sum(
                1
                for r in self.running
                if r.uid not in self._in_context and r.num_computed_tokens + 1 > len(r.blocks) * self.bs
            )
            if need <= self.pool.num_free:
                return
            self._pause(self.running.pop())

    def _pause(self, req: SimRequest) -> None:
        self.pool.free(req.blocks[::-1])
        req.blocks = []
        req.restart()
        self.num_preemptions += 1
        self._in_context.discard(req.uid)
        self._cached_blocks.pop(req.uid, None)
        self.waiting.appendleft(req)
        self.preempted_this_step = True

    # -- micro-batch scheduler ------------------------------------------------

    def _take(self, req: SimRequest, tokens: int) -> bool:
        need = self._blocks(req.num_computed_tokens + tokens) - len(req.blocks)
        if need > self.pool.num_free:
            return False
        req.blocks.extend(self.pool.allocate(need))
        self._grant(req, tokens)
        return True

    def _micro_batch(self) -> None:
        budget = self.budget
        count = 0
        for req in self.running:
            if req.uid in self._in_context:
                continue
            if budget < 1 or count >= self.max_batch or not self._take(req, 1):
                break
            budget -= 1
            count += 1
        for req in self.running:
            if req.uid not in self._in_context:
                continue
            left = req.num_tokens - req.num_computed_tokens
            take = left if left <= budget else (budget // self.bs * self.bs if self.chunked else 0)
            if take <= 0 or count >= self.max_batch or not self._take(req, take):
                break
            budget -= take
            count += 1

    # -- after the step -------------------------------------------------------

    def _register(self, req: SimRequest) -> None:
        """Make the request's newly full prompt blocks reusable (block reuse covers prompt blocks here)."""
        have = self._cached_blocks.get(req.uid, 0)
        full = min(req.num_computed_tokens // self.bs, req.findable_blocks(self.bs))
        if self.reuse and full > have:
            self.pool.cache(req.blocks[have:full], req.hashes(self.bs, full)[have:full])
            self._cached_blocks[req.uid] = full

    def _after_step(self, batch: list[tuple[SimRequest, int]], sampled: set[int]) -> None:
        for req, _ in batch:
            if req.uid in self._in_context:
                self._register(req)
                if req.uid in sampled:  # its context is done: it generates from the next iteration
                    self._in_context.discard(req.uid)

    def _release(self, req: SimRequest) -> None:
        self.pool.free(req.blocks[::-1])
        self._in_context.discard(req.uid)
        self._cached_blocks.pop(req.uid, None)
