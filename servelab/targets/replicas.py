"""Load spread over several servers of one model with no router in front (`bench --base-url A --base-url B`).

Each replica has its own keep-alive pool (StreamingClient); every request
goes to one of them by the policy, and its record names the URL that served
it, so the summary can be cut per replica. With `--workers N` each client
process routes its own share: least-outstanding then counts that process's
requests only, which is what a client-side balancer sees anyway.

The routes are the simulator's routers that need no server state (docs/fleets.md), from the same code
(servelab/workload/routing.py): round-robin, least-outstanding, prefix-hash (KubeAI's CHWBL on the prompt's first
tokens) and session (a conversation stays on the replica its first turn went to).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from servelab.schemas.vocabulary import Route, RouterPolicy
from servelab.targets.stream_client import StreamingClient
from servelab.workload.routing import HashRing, SessionAffinity, fewest, prefix_key
from servelab.workload.spec import RequestSpec

ROUND_ROBIN = RouterPolicy.ROUND_ROBIN
LEAST_OUTSTANDING = RouterPolicy.LEAST_OUTSTANDING
ROUTES = tuple(Route)


class Replicas:
    """One StreamingClient per base URL and the choice between them."""

    def __init__(self, base_urls: Sequence[str], route: str = ROUND_ROBIN) -> None:
        if route not in ROUTES:
            raise ValueError(f"route {route!r}: choose one of {', '.join(ROUTES)}")
        self.urls = list(base_urls)
        self.clients = [StreamingClient(url) for url in self.urls]
        self.route = RouterPolicy(route)
        self.outstanding = [0] * len(self.clients)
        self._turn = 0
        self._ring = HashRing(len(self.clients)) if self.route == RouterPolicy.PREFIX_HASH else None
        self._sessions = SessionAffinity()

    def pick(self, spec: RequestSpec) -> int:
        """The replica `spec` goes to (call `done` with it when the request ends)."""
        start = self._turn % len(self.clients)
        match self.route:
            case RouterPolicy.LEAST_OUTSTANDING:
                i = fewest(start, self.outstanding)
            case RouterPolicy.PREFIX_HASH:
                assert self._ring is not None
                i = self._ring.pick(prefix_key(spec.prompt_ids, spec.system_len), self.outstanding)
            case RouterPolicy.SESSION:
                conversation = self._sessions.conversation_of(spec.index, spec.conversation, spec.depends_on)
                i = self._sessions.pick(conversation, start, self.outstanding)
            case _:
                i = start
        self._turn = start + 1
        self.outstanding[i] += 1
        return i

    def done(self, i: int) -> None:
        self.outstanding[i] -= 1

    async def open(self, n: int) -> int:
        """Open `n` keep-alive connections ahead of use, spread evenly over the replicas; returns how many opened."""
        k = len(self.clients)
        shares = [n // k + (1 if i < n % k else 0) for i in range(k)]
        opened = await asyncio.gather(*(c.open(s) for c, s in zip(self.clients, shares) if s))
        return sum(opened)

    def close(self) -> None:
        for client in self.clients:
            client.close()
