"""What the SGLang and TensorRT-LLM schedulers share: the engine-facing side of a scheduler kept in Python lists.

vLLM's scheduler (scheduler.py) keeps its running requests in numpy rows
because it is the one run at scale and tuned for speed; the other engines'
schedulers keep each request's counters on the SimRequest itself, which is
slower per step but short to read. SimEngine talks to both the same way:
`schedule(now)` returns the step's tokens per scheduled request and the
tokens already in KV before them (and advances `num_computed_tokens`),
`update(step)` applies the sampled tokens. `steady_decode_steps` returns 0,
so the engine simulates every step.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from servelab.sim.request import FINISHED, SimRequest
from servelab.sim.scheduler import PrefixCacheCounters


class ListScheduler:
    """Base class: subclasses fill `_batch` in `schedule` and free a finished request's KV in `_release`."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        """Tokens one step may carry (the engine refuses, up front, a prompt over it when chunking is off)."""
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.prefix = PrefixCacheCounters()
        self.num_preemptions = 0
        self.preempted_this_step = False
        self._batch: list[tuple[SimRequest, int]] = []
        """This step's (request, tokens scheduled); computed tokens already advanced."""

    @property
    def num_running(self) -> int:
        return len(self.running)

    def add(self, req: SimRequest) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.running) or bool(self.waiting) or bool(self._batch)

    def steady_decode_steps(self, step: int, limit: int) -> int:
        return 0

    def _grant(self, req: SimRequest, tokens: int) -> None:
        req.num_computed_tokens += tokens
        self._batch.append((req, tokens))

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        granted = np.array([g for _, g in self._batch], dtype=np.int64)
        after = np.array([r.num_computed_tokens for r, _ in self._batch], dtype=np.int64)
        return granted, after - granted

    def _release(self, req: SimRequest) -> None:
        raise NotImplementedError

    def _after_step(self, batch: list[tuple[SimRequest, int]], sampled: set[int]) -> None:
        """Hook after a step's tokens are applied, before finished requests are released (prefix-cache inserts)."""

    def update(self, step: int) -> tuple[int, list[SimRequest], list[SimRequest]]:
        """Apply one step's sampled tokens: returns (tokens generated, requests with a first token, finished)."""
        first: list[SimRequest] = []
        finished: list[SimRequest] = []
        sampled: list[SimRequest] = []
        for req, _ in self._batch:
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk short of the prompt's end samples nothing
            req.num_tokens += 1
            sampled.append(req)
            if req.last_emit != step - 1:
                if req.run_start >= 0:
                    req.runs.append((req.run_start, req.last_emit))
                req.run_start = step
                if req.first_token_step is None:
                    req.first_token_step = step
                    first.append(req)
            req.last_emit = step
            if req.num_tokens >= req.prompt_len + req.max_tokens:
                finished.append(req)
        batch, self._batch = self._batch, []
        self._after_step(batch, {r.uid for r in sampled})
        for req in finished:
            self._release(req)
            if req in self.running:
                self.running.remove(req)
            req.blocks = []
            req.status = FINISHED
            req.finish_step = step
        return len(sampled), first, finished
