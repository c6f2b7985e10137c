"""Data-parallel replicas behind a router, as vLLM's DP load balancer picks engines."""

from __future__ import annotations

from collections.abc import Sequence

from servelab.sim.engine import SimEngine
from servelab.sim.vocabulary import LEAST_LOADED as LEAST_LOADED, POLICIES as POLICIES, ROUND_ROBIN as ROUND_ROBIN  # named here for their importers


class Router:
    """round-robin, or least-loaded with vLLM's score.

    vLLM's DPLBAsyncMPClient scores an engine by waiting + running, adds
    waiting * 6 * max(0, kv_usage - 0.5) so queues on KV-bound engines
    repel traffic, and rotates the scan start so ties spread evenly.
    """

    def __init__(self, policy: str = ROUND_ROBIN) -> None:
        if policy not in POLICIES:
            raise ValueError(f"router policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy = policy
        self._next = 0

    def pick(self, engines: Sequence[SimEngine]) -> int:
        n = len(engines)
        start = self._next
        self._next = (self._next + 1) % n
        if self.policy == ROUND_ROBIN or n == 1:
            return start
        best, best_score = start, float("inf")
        for k in range(n):
            i = (start + k) % n
            waiting, running, usage = engines[i].load
            score = waiting + running + waiting * 6.0 * max(0.0, usage - 0.5)
            if score < best_score:
                best, best_score = i, score
        return best
