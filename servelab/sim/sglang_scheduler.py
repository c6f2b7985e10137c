"""SGLang's scheduler (srt/managers/scheduler.py, schedule_policy.py, schedule_batch.py), step by step.

Each iteration runs either a prefill ("extend") batch or a decode batch, never
both (mixed chunks are off by default): a prefill batch whenever a waiting
request can be admitted, otherwise one decode token for every running request.

Admission (PrefillAdder): waiting requests in policy order — fcfs, or lpm
(longest radix-cache prefix first) while the queue holds at most 128
requests, fcfs beyond that — each after a radix-cache match (the last token
is always recomputed). A request is admitted while
- running + admitted < max_running_requests,
- its new tokens + min(its remaining max_new_tokens, 4096) < the remaining total, which
  starts at free + evictable KV minus, for every running request,
  min(its remaining max_new_tokens, 4096) x new_token_ratio,
- its new tokens < the remaining max_prefill_tokens (unless it is the first),
and the batch's new tokens stop at chunked_prefill_size, where the last
request is cut (a chunked request, continued first in the next prefill batch).

new_token_ratio starts at 0.7 x schedule_conservativeness, falls by
(0.7 - 0.7 x 0.14) / 600 per decode step down to 0.7 x 0.14, is reset to its
start when the engine goes idle, and after a retraction is set to
(decoded tokens + 20 x running) / (their max_new_tokens), capped at 1.

Retraction: when a decode step cannot get one token per running request,
even after evicting cache, requests are retracted — fewest output tokens
first, longest prompt among equals — until 20 decode steps' worth of tokens
per remaining request are free (one request is never retracted). A retracted
request keeps its generated tokens (it re-prefills prompt + output later) and
keeps in the radix tree whatever of it was cached there; its other KV is
freed. It goes to the back of the waiting queue. (Its admission counts the output tokens it has left, not
max_new_tokens again, so a retracted request never asks for more than the pool.)

Overlap scheduling (on by default) is the engine's async scheduling.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from servelab.perf.engine_config import EngineConfig
from servelab.perf.sglang_args import SGLangSettings
from servelab.sim.list_scheduler import ListScheduler
from servelab.sim.radix_cache import RadixCache, RadixNode
from servelab.sim.request import RUNNING, SimRequest

CLIP_MAX_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
LPM_QUEUE_LIMIT = 128
"""lpm falls back to fcfs above this many waiting requests (matching them all would cost too much)."""


@dataclass(slots=True)
class _Slot:
    """A running request's KV: the locked radix node over its first `cached` tokens, plus `private` slots."""

    ids: tuple[int, ...]
    node: RadixNode
    cached: int
    private: int = 0


@dataclass(slots=True)
class _Budget:
    """What one prefill batch may still take: KV tokens (`total`, running requests' future tokens reserved),
    prompt tokens (`input`, max_prefill_tokens) and the chunk (`chunk`, None: prompts go whole)."""

    total: float
    input: int
    chunk: int | None

    def spend_chunk(self, tokens: int) -> None:
        if self.chunk is not None:
            self.chunk -= tokens

    def exhausted(self) -> bool:
        return self.input <= 0 or (self.chunk is not None and self.chunk <= 0)


class SGLangScheduler(ListScheduler):
    def __init__(self, config: EngineConfig, settings: SGLangSettings, cache: RadixCache) -> None:
        if config.max_num_seqs is None or settings.chunked_prefill_size is None or settings.context_length is None:
            raise ValueError("resolve the SGLang settings (resolve_sglang) before simulating")
        chunk = settings.chunked_prefill_size
        super().__init__(chunk if chunk > 0 else settings.context_length)
        self.chunk: int | None = chunk if chunk > 0 else None
        self.max_running = config.max_num_seqs
        self.max_prefill_tokens = settings.max_prefill_tokens
        self.policy = "lpm" if settings.schedule_policy == "lpm" else "fcfs"
        self.init_ratio = min(INIT_NEW_TOKEN_RATIO * settings.schedule_conservativeness, 1.0)
        self.min_ratio = min(self.init_ratio * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.ratio_decay = (self.init_ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_ratio
        self.cache = cache
        self.chunked: SimRequest | None = None
        self._slots: dict[int, _Slot] = {}
        self._joining: list[SimRequest] = []
        self._prefilled = False
        """Whether the current step is a prefill batch (whose computed prompt tokens then go into the radix tree)."""

    def has_work(self) -> bool:
        return super().has_work() or self.chunked is not None

    # -- one iteration ------------------------------------------------------

    def schedule(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        self.preempted_this_step = False
        self._prefilled = self._prefill(now)
        if not self._prefilled:
            self._decode()
        return self._arrays()

    def _remaining_new(self, req: SimRequest) -> int:
        return min(req.max_tokens - req.num_output_tokens, CLIP_MAX_NEW_TOKENS)

    def _prefill(self, now: float) -> bool:
        """One prefill batch: the chunked request's next piece first, then waiting requests in policy order while
        the KV, prompt-token and chunk budgets last (SGLang's PrefillAdder)."""
        if self.chunked is None and (not self.waiting or len(self.running) >= self.max_running):
            return False
        cache = self.cache
        budget = _Budget(
            total=cache.free
            + cache.evictable
            - sum(self._remaining_new(r) * self.new_token_ratio for r in self.running),
            input=self.max_prefill_tokens,
            chunk=self.chunk,
        )
        added = 0
        if self.chunked is not None:
            ended = self._continue_chunk(budget)
            if ended is not None:
                return ended
            added = 1
        admitted: set[int] = set()
        for req in self._ordered():
            if len(self.running) + added >= self.max_running:
                break
            ids = self._ids(req)
            hit, node = cache.match(ids, self._match_limit(req, ids))
            extend = req.num_tokens - hit
            if extend + self._remaining_new(req) >= budget.total:
                break
            if extend >= budget.input and added:
                break
            cut = budget.chunk is not None and extend > budget.chunk
            take = budget.chunk if cut and budget.chunk is not None else extend
            if take <= 0 or not self._start(req, ids, node, hit, take, now):
                break
            admitted.add(req.uid)
            added += 1
            budget.input -= take
            if cut:
                self.chunked = req
                break
            self._joining.append(req)
            budget.total -= take + self._remaining_new(req)
            budget.spend_chunk(take)
            if budget.total <= 0 or budget.exhausted():
                break
        if admitted:
            self.waiting = deque(r for r in self.waiting if r.uid not in admitted)
        return added > 0

    def _continue_chunk(self, budget: _Budget) -> bool | None:
        """The chunked request's next piece, first in the batch. True or False is what the batch returns (a piece
        that is not its last, no budget left, or no KV for it); None lets waiting requests follow."""
        req = self.chunked
        assert req is not None
        left = req.num_tokens - req.num_computed_tokens
        take = left if budget.chunk is None else min(left, budget.chunk)
        if not self.cache.allocate(take):
            return False
        self._slots[req.uid].private += take
        self._grant(req, take)
        if take < left:
            return True
        self.chunked = None
        self._joining.append(req)
        budget.total -= take + self._remaining_new(req)
        budget.input -= take
        budget.spend_chunk(take)
        return True if budget.exhausted() else None

    def _start(self, req: SimRequest, ids: tuple[int, ...], node: RadixNode, hit: int, take: int, now: float) -> bool:
        """Admit a waiting request with its cached prefix (`hit` tokens at `node`) and `take` new tokens; False
        when the cache cannot hold them."""
        cache = self.cache
        cache.lock(node)
        if not cache.allocate(take):
            cache.unlock(node)
            return False
        self._slots[req.uid] = _Slot(ids, node, hit, take)
        if req.preemptions == 0:
            self.prefix.queries += req.num_tokens
            self.prefix.hits += hit
        if req.schedule_time is None:
            req.schedule_time = now
        req.status = RUNNING
        req.num_computed_tokens = hit
        self._grant(req, take)
        return True

    def _ordered(self) -> list[SimRequest]:
        reqs = list(self.waiting)
        if self.policy == "lpm" and self.cache.enabled and len(reqs) <= LPM_QUEUE_LIMIT:
            hits = {r.uid: self.cache.match(ids, self._match_limit(r, ids))[0] for r in reqs for ids in (self._ids(r),)}
            reqs.sort(key=lambda r: -hits[r.uid])
        return reqs

    @staticmethod
    def _match_limit(req: SimRequest, ids: tuple[int, ...]) -> int:
        """Tokens a match may cover: all but the last (recomputed for its logits), and only those whose ids are known
        (a retracted request's generated tokens are not, unless the caller gave them)."""
        return min(req.num_tokens - 1, len(ids))

    def _ids(self, req: SimRequest) -> tuple[int, ...]:
        slot = self._slots.get(req.uid)
        return slot.ids if slot is not None else tuple(np.asarray(req.hashed_ids()).tolist())

    def _decode(self) -> None:
        if not self.running:
            return
        if self.cache.allocate(len(self.running)):
            self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.min_ratio)
        else:
            self._retract()
            if not self.cache.allocate(len(self.running)):
                raise RuntimeError("SGLang model: no KV for one decode token even after retracting all but one request")
        for req in self.running:
            self._slots[req.uid].private += 1
            self._grant(req, 1)

    def _retract(self) -> None:
        order = sorted(self.running, key=lambda r: (r.num_output_tokens, -r.prompt_len), reverse=True)
        retracted: list[SimRequest] = []
        while not retracted or self.cache.free < len(order) * RETRACT_DECODE_STEPS:
            if len(order) == 1:
                break
            req = order.pop()
            self._free_slot(req)
            req.restart()
            self.num_preemptions += 1
            retracted.append(req)
            residual = len(order) * RETRACT_DECODE_STEPS - self.cache.free
            if residual > 0:
                self.cache.evict(residual)
        gone = {r.uid for r in retracted}
        self.running = [r for r in self.running if r.uid not in gone]
        self.waiting.extend(retracted)
        decoded = sum(r.num_output_tokens for r in order)
        budget = sum(r.max_tokens for r in order)
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(order)) / budget)
        self.preempted_this_step = True

    # -- after the step -------------------------------------------------------

    def _insert(self, req: SimRequest, upto: int) -> None:
        """Hand the request's first `upto` tokens to the radix tree (cache_unfinished_req / cache_finished_req)."""
        slot = self._slots[req.uid]
        upto = min(upto, len(slot.ids))
        if not self.cache.enabled or upto <= slot.cached:
            return
        already, node = self.cache.insert(slot.ids[:upto])
        self.cache.release(already - slot.cached)  # someone else cached these meanwhile: our copies are duplicates
        slot.private -= upto - slot.cached
        self.cache.lock(node)
        self.cache.unlock(slot.node)
        slot.node, slot.cached = node, upto

    def _free_slot(self, req: SimRequest) -> None:
        slot = self._slots.pop(req.uid)
        self.cache.release(slot.private)
        self.cache.unlock(slot.node)

    def _after_step(self, batch: list[tuple[SimRequest, int]], sampled: set[int]) -> None:
        if self._prefilled:
            for req, _ in batch:
                self._insert(req, req.num_computed_tokens)
        self.running.extend(self._joining)
        self._joining = []

    def _release(self, req: SimRequest) -> None:
        self._insert(req, req.num_tokens)
        self._free_slot(req)

    def update(self, step: int) -> tuple[int, list[SimRequest], list[SimRequest]]:
        result = super().update(step)
        if not self.has_work():
            self.new_token_ratio = self.init_ratio
        return result
