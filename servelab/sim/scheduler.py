"""vLLM V1's `Scheduler.schedule()` on arrays.

The algorithm is vLLM's (vllm/v1/core/sched/scheduler.py): one token
budget per step; RUNNING requests first, in queue order, each asking for
`num_tokens - num_computed_tokens` (capped by `long_prefill_token_threshold`
when more than one request is eligible) and getting what is left of the
budget; a request that cannot get KV slots preempts, by recompute, the last
running request (FCFS) or the lowest-priority one (priority), repeatedly,
until it fits or is itself the victim; then, only if nothing was preempted,
WAITING requests in FCFS or priority order while budget and
`max_num_seqs` last, each after a prefix-cache lookup, chunked if chunked
prefill is on and otherwise only if the whole remainder fits, and only if
the KV blocks of the whole prompt are free (`scheduler_reserve_full_isl`,
on by default in 0.32) plus the watermark once something runs.

The running queue is held as parallel numpy arrays so that a step's
budget split (a cumulative sum), block needs and token updates are a few
vector operations; Python only touches the requests that cross a block
boundary, finish, or start/stop emitting.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

import numpy as np

from servelab.perf.engine_config import EngineConfig
from servelab.sim.block_pool import BlockPool
from servelab.sim.hashing import output_block_hash_array, output_block_hashes
from servelab.sim.request import FINISHED, RUNNING, SimRequest, hash_ahead

FCFS = "fcfs"
PRIORITY = "priority"
_HASH_AHEAD = 64
"""Waiting requests whose prompt hashes are computed together (one numpy pass costs about what two prompts
alone would)."""


@dataclass(slots=True)
class PrefixCacheCounters:
    """Counted in tokens over new (never preempted) requests, like vllm:prefix_cache_*_total."""

    queries: int = 0
    hits: int = 0


class _WaitingQueue:
    """FCFS deque (preempted requests go back to the front) or a (priority, arrival, uid) heap."""

    def __init__(self, policy: str) -> None:
        self.priority = policy == PRIORITY
        self._fifo: deque[SimRequest] = deque()
        self._heap: list[tuple[int, float, int, SimRequest]] = []

    def __len__(self) -> int:
        return len(self._heap) if self.priority else len(self._fifo)

    def add(self, req: SimRequest) -> None:
        if self.priority:
            heapq.heappush(self._heap, (req.priority, req.arrival_time, req.uid, req))
        else:
            self._fifo.append(req)

    def prepend(self, req: SimRequest) -> None:
        if self.priority:
            self.add(req)
        else:
            self._fifo.appendleft(req)

    def peek(self) -> SimRequest:
        return self._heap[0][3] if self.priority else self._fifo[0]

    def first(self, k: int) -> Iterator[SimRequest]:
        """Up to k waiting requests, the next to go first (FCFS); some k of them under priority (the heap's order)."""
        if self.priority:
            return (entry[3] for entry in self._heap[:k])
        return islice(self._fifo, k)

    def pop(self) -> SimRequest:
        return heapq.heappop(self._heap)[3] if self.priority else self._fifo.popleft()


class Scheduler:
    def __init__(self, config: EngineConfig, pool: BlockPool) -> None:
        if config.max_num_seqs is None or config.max_num_batched_tokens is None:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be resolved before simulating")
        if config.scheduling_policy not in (FCFS, PRIORITY):
            raise ValueError(f"scheduling_policy must be fcfs or priority, got {config.scheduling_policy!r}")
        self.max_num_seqs = config.max_num_seqs
        self.budget = config.max_num_batched_tokens
        self.chunked_prefill = config.enable_chunked_prefill
        self.caching = config.enable_prefix_caching
        self.long_prefill_threshold = config.long_prefill_token_threshold
        self.policy = config.scheduling_policy
        self.block_size = config.block_size
        self.reserve_full_prompt = config.scheduler_reserve_full_isl
        self.watermark_blocks = int(config.watermark * pool.num_blocks)
        self.pool = pool
        self.waiting = _WaitingQueue(self.policy)
        self.prefix = PrefixCacheCounters()
        self.num_preemptions = 0
        self.preempted_this_step = False
        cap = self.max_num_seqs
        # Running queue, in vLLM's order: one row per running request. The per-request counters are the rows of
        # one matrix, so that removing finished or preempted requests moves all of them in one copy.
        self.reqs: list[SimRequest] = []
        self._rows = np.zeros((8, cap), dtype=np.int64)
        (
            self.computed,
            self.tokens,
            self.held,
            self.cached,
            self.limit,
            self.run_start,
            self.last_emit,
            self.scheduled,
        ) = self._rows
        """limit: prompt_len + max_tokens, the request finishes when num_tokens reaches it (ignore_eos);
        scheduled: tokens scheduled for each running request in the current step."""
        self._pending_blocks: list[int] = []
        self._pending_hashes: list[int] = []
        self._pending_private_blocks: list[int] = []
        self._pending_private_owners: list[int] = []
        self._pending_private_positions: list[int] = []
        self._steady_until = 0
        """The step that ends the steady stretch `steady_decode_steps` found last, while nothing but decode runs has
        touched the queues since (0: unknown): a run cut short by an outside event resumes without re-checking."""
        self._run_base: tuple[np.ndarray, np.ndarray, int] = (np.zeros(0, np.int64), np.zeros(0, np.int64), 0)
        """(computed tokens, held blocks, free blocks) before the latest decode run, for its mid-run KV usage."""
        """Generated-token blocks to cache, with their request's uid and their index in it: the hashes
        (`output_block_hash_array`) are computed for all of them at once when they are flushed."""

    @property
    def num_running(self) -> int:
        return len(self.reqs)

    def add(self, req: SimRequest) -> None:
        self.waiting.add(req)
        self._steady_until = 0

    def has_work(self) -> bool:
        return bool(self.reqs) or len(self.waiting) > 0

    # -- schedule ---------------------------------------------------------

    def schedule(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        """Decide this step's tokens; allocates KV and advances num_computed_tokens like vLLM's schedule().

        Returns, per running request, the tokens scheduled and the tokens already in KV before them.
        """
        budget = self.budget
        n = len(self.reqs)
        self._steady_until = 0
        self.scheduled[:n] = 0
        threshold = self.long_prefill_threshold if n + len(self.waiting) > 1 else 0
        preempted = False
        start = 0
        bs = self.block_size
        while start < len(self.reqs) and budget > 0:
            end = len(self.reqs)
            computed = self.computed[start:end]
            want = self.tokens[start:end] - computed
            if threshold > 0:
                np.minimum(want, threshold, out=want)
            total_want = int(np.add.reduce(want))
            if total_want <= budget:  # everyone gets what it asks (the usual step)
                granted, used = want, total_want
            else:
                granted = np.minimum(np.cumsum(want), budget)
                granted[1:] -= granted[:-1].copy()
                used = budget
            # Blocks held always equal ceil(computed / block_size), so this is >= 0, and 0 where nothing is granted.
            need = computed + granted
            need += bs - 1
            need //= bs
            need -= self.held[start:end]
            total_need = int(np.add.reduce(need))
            free = self.pool.num_free
            if total_need <= free:
                self._commit(start, end, granted, need, total_need)
                budget -= used
                break
            cum_need = np.cumsum(need)
            fits = int(np.searchsorted(cum_need, free, side="right"))
            if fits:
                self._commit(start, start + fits, granted[:fits], need[:fits], int(cum_need[fits - 1]))
                budget -= int(np.add.reduce(granted[:fits]))
            current = start + fits
            victim = self._victim()
            restored = int(self.scheduled[victim])
            self._preempt(victim)
            preempted = True
            if victim == current:
                break  # nothing left to preempt for it: vLLM stops scheduling running requests here
            budget += restored
            start = current - 1 if victim < current else current
        if not preempted:
            budget = self._admit_waiting(budget, threshold, now)
        self.preempted_this_step = preempted
        self._flush_cache()
        n = len(self.reqs)
        granted = self.scheduled[:n]
        return granted, self.computed[:n] - granted

    def _victim(self) -> int:
        if self.policy == PRIORITY:
            # vLLM: max by (priority, arrival_time); real arrival times never tie, so uid stands in for their order.
            reqs = self.reqs
            return max(range(len(reqs)), key=lambda i: (reqs[i].priority, reqs[i].arrival_time, reqs[i].uid))
        return len(self.reqs) - 1

    def _commit(self, start: int, end: int, granted: np.ndarray, need: np.ndarray, total_need: int) -> None:
        """Apply the grant of rows start..end: advance computed tokens, hand out `need` new blocks, cache full ones."""
        self.scheduled[start:end] = granted
        computed = self.computed[start:end]
        computed += granted
        self._grow(start, end, computed, need, total_need)

    def _grow(self, start: int, end: int, computed: np.ndarray, need: np.ndarray, total_need: int) -> None:
        """Give rows start..end (`computed`: their KV tokens, advanced) `need` new blocks each; cache the full ones."""
        reqs = self.reqs
        if total_need:
            new = self.pool.allocate(total_need)
            rows = need.nonzero()[0].tolist()
            if len(rows) == total_need:  # one block each: decodes crossing a block boundary
                for i, block in zip(rows, new):
                    reqs[start + i].blocks.append(block)
            else:
                offset = 0
                for i, k in zip(rows, need[rows].tolist()):
                    reqs[start + i].blocks.extend(new[offset : offset + k])
                    offset += k
            self.held[start:end] += need
        if self.caching:
            full = computed // self.block_size
            cached = self.cached[start:end]
            crossing = (full > cached).nonzero()[0]
            if len(crossing):
                self._cache_rows(start, crossing.tolist(), cached[crossing].tolist(), full[crossing].tolist())
                cached[:] = full  # the others already have every full block cached

    def _cache_rows(self, start: int, rows: list[int], have: list[int], full: list[int]) -> None:
        """`_cache_blocks` for several running rows; the usual case, one generated-token block, inline."""
        bs = self.block_size
        reqs = self.reqs
        blocks, owners, positions = (
            self._pending_private_blocks,
            self._pending_private_owners,
            self._pending_private_positions,
        )
        for i, h, f in zip(rows, have, full):
            req = reqs[start + i]
            if f - h != 1:
                self._cache_blocks(req, h, f)
            elif h >= req.findable_blocks(bs):
                blocks.append(req.blocks[h])
                owners.append(req.uid)
                positions.append(h)
            elif req.block_hashes is not None and h < len(req.block_hashes):  # a known reply's block, hashed already
                self._pending_blocks.append(req.blocks[h])
                self._pending_hashes.append(req.block_hashes[h])
            else:
                self._cache_blocks(req, h, f)

    def _cache_blocks(self, req: SimRequest, have: int, full: int) -> None:
        """Queue newly full blocks for the prefix cache; `_flush_cache` registers them before any lookup.

        Blocks past the prompt's full blocks hold generated tokens: unless their
        ids are known (`SimRequest.output_ids`), only this request could hit them
        (after a preemption), so they skip the hash index.
        """
        prompt_blocks = req.findable_blocks(self.block_size)
        if have < prompt_blocks:
            upto = min(full, prompt_blocks)
            self._pending_blocks.extend(req.blocks[have:upto])
            self._pending_hashes.extend(req.hashes(self.block_size, upto)[have:upto])
            have = upto
        if full > have:
            self._pending_private_blocks.extend(req.blocks[have:full])
            self._pending_private_owners.extend([req.uid] * (full - have))
            self._pending_private_positions.extend(range(have, full))

    def _flush_cache(self) -> None:
        if self._pending_blocks:
            self.pool.cache(self._pending_blocks, self._pending_hashes)
            self._pending_blocks, self._pending_hashes = [], []
        if self._pending_private_blocks:
            hashes = output_block_hash_array(
                np.array(self._pending_private_owners, dtype=np.int64),
                np.array(self._pending_private_positions, dtype=np.int64),
            )
            self.pool.cache(self._pending_private_blocks, hashes, findable=False)
            self._pending_private_blocks, self._pending_private_owners, self._pending_private_positions = [], [], []

    def _admit_waiting(self, budget: int, threshold: int, now: float) -> int:
        bs = self.block_size
        pool = self.pool
        while budget > 0 and len(self.waiting) and len(self.reqs) < self.max_num_seqs:
            req = self.waiting.peek()
            hits: list[int] = []
            if self.caching:
                self._flush_cache()
                max_hit_blocks = (req.num_tokens - 1) // bs  # the last token is always recomputed for its logits
                if req.block_hashes is None:  # hash the queue's head in one go: they all need it soon
                    hash_ahead(self.waiting.first(_HASH_AHEAD), bs)
                hits = pool.lookup(req.hashes(bs, max_hit_blocks), max_hit_blocks)
            hit_tokens = len(hits) * bs
            new_tokens = req.num_tokens - hit_tokens
            if 0 < threshold < new_tokens:
                new_tokens = threshold
            if not self.chunked_prefill and new_tokens > budget:
                break
            new_tokens = min(new_tokens, budget)
            need = -((hit_tokens + new_tokens) // -bs) - len(hits)
            # allocate_slots: with full_sequence_must_fit the whole prompt's blocks must be free, not the chunk's
            # (they include `need`); the watermark is kept free for waiting requests once anything is running.
            gate = -(req.num_tokens // -bs) - len(hits) if self.reserve_full_prompt else need
            reserve = self.watermark_blocks if self.reqs else 0
            if gate + pool.num_evictable(hits) + reserve > pool.num_free:
                break
            pool.touch(hits)
            req.blocks = hits + pool.allocate(need)
            computed = hit_tokens + new_tokens
            full = computed // bs
            if self.caching:
                if req.preemptions == 0:
                    self.prefix.queries += req.num_tokens
                    self.prefix.hits += hit_tokens
                if full > len(hits):
                    self._cache_blocks(req, len(hits), full)
            self.waiting.pop()
            if req.schedule_time is None:
                req.schedule_time = now
            req.status = RUNNING
            self._append_running(req, computed, new_tokens, full if self.caching else 0)
            budget -= new_tokens
        return budget

    def _append_running(self, req: SimRequest, computed: int, scheduled: int, cached: int) -> None:
        i = len(self.reqs)
        self.reqs.append(req)
        self.computed[i] = computed
        self.tokens[i] = req.num_tokens
        self.held[i] = len(req.blocks)
        self.cached[i] = cached
        self.limit[i] = req.prompt_len + req.max_tokens
        self.run_start[i] = req.run_start
        self.last_emit[i] = req.last_emit
        self.scheduled[i] = scheduled

    def _save(self, i: int) -> SimRequest:
        """Copy a running row back into its request before it leaves the running queue."""
        req = self.reqs[i]
        req.num_tokens = int(self.tokens[i])
        req.num_computed_tokens = int(self.computed[i])
        req.run_start = int(self.run_start[i])
        req.last_emit = int(self.last_emit[i])
        return req

    def _preempt(self, i: int) -> None:
        req = self._save(i)
        if self.caching:
            self._flush_cache()
            prompt_blocks = req.findable_blocks(self.block_size)
            cached = int(self.cached[i])
            if cached > prompt_blocks:  # its generated-token blocks become findable for its own recompute
                self.pool.index(req.blocks[prompt_blocks:cached], output_block_hashes(req.uid, prompt_blocks, cached))
        self.pool.free(req.blocks[::-1])
        req.blocks = []
        req.restart()
        self.num_preemptions += 1
        n = len(self.reqs)
        self._rows[:, i : n - 1] = self._rows[:, i + 1 : n]
        del self.reqs[i]
        self.waiting.prepend(req)

    # -- steady decoding, many steps at once -------------------------------

    def steady_decode_steps(self, step: int, limit: int) -> int:
        """How many coming steps are pure decodes of an unchanging batch (0 if the next one is not).

        Such steps are all alike: every running request decodes one token and
        emits it, nobody finishes before the last of them (`finish_decode_run`
        takes those that finish in it), nobody can be admitted, and the KV
        blocks they need are free, so no preemption. Checking that costs a few
        array operations; replaying the steps one by one would cost a
        Python-level schedule() each.
        """
        if step < self._steady_until:  # the rest of a stretch an outside event cut: its checks still hold
            return min(limit, self._steady_until - step)
        n = len(self.reqs)
        if n == 0 or n > self.budget or limit < 1:
            return 0
        if len(self.waiting) and n < self.max_num_seqs:
            return 0
        tokens, computed = self.tokens[:n], self.computed[:n]
        if (tokens - computed != 1).any() or (self.last_emit[:n] != step - 1).any():
            return 0
        k = min(limit, int((self.limit[:n] - tokens).min()))
        bs, held, free = self.block_size, self.held[:n], self.pool.num_free
        if int((-((computed + k) // -bs) - held).sum()) > free:
            lo, hi = 0, k  # the largest k whose new blocks fit
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if int((-((computed + mid) // -bs) - held).sum()) <= free:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
        self._steady_until = step + k if k < limit else 0  # (a stretch cut by `limit` may be longer)
        return k

    def decode_contexts(self) -> np.ndarray:
        """Context length of each running request before its next decode step."""
        return self.computed[: len(self.reqs)].copy()

    def apply_decode_steps(self, first_step: int, k: int) -> int:
        """Advance every running request by k decode steps (as k schedule()+update() calls would); returns tokens."""
        n = len(self.reqs)
        computed, held = self.computed[:n], self.held[:n]
        self._run_base = (computed.copy(), held.copy(), self.pool.num_free)
        computed += k
        need = -(computed // -self.block_size)
        need -= held
        self._grow(0, n, computed, need, int(np.add.reduce(need)))
        self.scheduled[:n] = 0
        self.tokens[:n] += k
        self.last_emit[:n] = first_step + k - 1
        if self.caching:
            self._flush_cache()
        return n * k

    def finish_decode_run(self, step: int) -> list[SimRequest]:
        """After the last step (`step`) of a decode run: the requests it finished, removed as `update` removes them."""
        if step + 1 < self._steady_until:
            return []  # every request is at least one token short of its limit until the stretch's last step
        self._steady_until = 0
        return self._finish_done(step)

    def decode_run_usage(self, steps: int) -> float:
        """KV usage after the first `steps` steps of the latest `apply_decode_steps`, as step-by-step would show it."""
        computed, held, free = self._run_base
        need = int(np.add.reduce(-((computed + steps) // -self.block_size) - held))
        return 1.0 - (free - need) / (self.pool.num_blocks - 1)

    # -- after the step ---------------------------------------------------

    def update(self, step: int) -> tuple[int, list[SimRequest], list[SimRequest]]:
        """Apply one step's sampled tokens: returns (tokens generated, requests with a first token, finished)."""
        self._steady_until = 0
        n = len(self.reqs)
        if n == 0:
            return 0, [], []
        tokens, last_emit = self.tokens[:n], self.last_emit[:n]
        # A row whose tokens are all computed was scheduled this step (after sampling it is one token behind).
        sampled = self.computed[:n] >= tokens
        tokens += sampled
        restarted = (sampled & (last_emit != step - 1)).nonzero()[0]
        first: list[SimRequest] = []
        for i in restarted.tolist():
            req = self.reqs[i]
            if self.run_start[i] >= 0:
                req.runs.append((int(self.run_start[i]), int(last_emit[i])))
            self.run_start[i] = step
            if req.first_token_step is None:
                req.first_token_step = step
                first.append(req)
        np.copyto(last_emit, step, where=sampled)
        # Only a request that just sampled can reach its limit: the others were removed when they did.
        return int(np.count_nonzero(sampled)), first, self._finish_done(step)

    def _finish_done(self, step: int) -> list[SimRequest]:
        """Remove the running requests that reached their limit at `step`, freeing their blocks; returns them."""
        n = len(self.reqs)
        done = (self.tokens[:n] >= self.limit[:n]).nonzero()[0].tolist()
        finished: list[SimRequest] = []
        if done:
            for i in done:
                req = self._save(i)
                self.pool.free(req.blocks[::-1])
                req.blocks = []
                req.status = FINISHED
                req.finish_step = step
                finished.append(req)
            # Close the gaps: each stretch between finished rows moves left by the number finished before it
            # (a few slice copies are cheaper than one boolean gather over the matrix).
            rows = self._rows
            for j, i in enumerate(done):
                stop = done[j + 1] if j + 1 < len(done) else n
                rows[:, i - j : stop - j - 1] = rows[:, i + 1 : stop]
            for i in reversed(done):
                del self.reqs[i]
        return finished
