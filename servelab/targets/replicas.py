"""Load spread over several servers of one model with no router in front (`bench --base-url A --base-url B`).

Each replica has its own keep-alive pool (StreamingClient); every request
goes to one of them by the policy, and its record names the URL that served
it, so the summary can be cut per replica. With `--workers N` each client
process routes its own share: least-outstanding then counts that process's
requests only, which is what a client-side balancer sees anyway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from servelab.targets.stream_client import StreamingClient

ROUND_ROBIN = "round-robin"
LEAST_OUTSTANDING = "least-outstanding"
ROUTES = (ROUND_ROBIN, LEAST_OUTSTANDING)


class Replicas:
    """One StreamingClient per base URL and the choice between them."""

    def __init__(self, base_urls: Sequence[str], route: str = ROUND_ROBIN) -> None:
        if route not in ROUTES:
            raise ValueError(f"route {route!r}: choose one of {', '.join(ROUTES)}")
        self.urls = list(base_urls)
        self.clients = [StreamingClient(url) for url in self.urls]
        self.route = route
        self.outstanding = [0] * len(self.clients)
        self._turn = 0

    def pick(self) -> int:
        """The replica the next request goes to (call `done` with it when the request ends)."""
        if self.route == LEAST_OUTSTANDING:
            i = min(range(len(self.clients)), key=lambda k: (self.outstanding[k], (k - self._turn) % len(self.clients)))
        else:
            i = self._turn % len(self.clients)
        self._turn = i + 1
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
