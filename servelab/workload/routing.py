"""The routing choices that need no server state: one implementation for the simulator's routers and `bench`'s routes.

`servelab.sim.router` puts these in front of simulated replicas; `servelab.targets.replicas` puts them in front of
real ones (several `--base-url`, no router). Both see the same inputs: the router's own count of requests in flight
per replica, the prompt's token ids and the conversation a request belongs to. Living in the workload layer (the
bottom, beside RequestSpec), both can import it without reaching sideways or up. docs/fleets.md says where each
rule comes from.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

HASH_PREFIX_TOKENS = 25
"""prefix-hash key: KubeAI's default prefixCharLength of 100 characters, at about 4 characters a token."""
HASH_LOAD_FACTOR = 1.25
"""prefix-hash bound: KubeAI's default meanLoadFactor 125%: a replica takes a request while its in-flight count
plus one is at most 1.25 x the mean (counting the new request)."""
HASH_REPLICATION = 256
"""prefix-hash: points per replica on the ring (KubeAI's default replication)."""


def best(start: int, scores: Sequence[float]) -> int:
    """The highest score, ties to the first from `start` on (a rotating `start` spreads ties evenly)."""
    n = len(scores)
    chosen = start
    for k in range(1, n):
        i = (start + k) % n
        if scores[i] > scores[chosen]:
            chosen = i
    return chosen


def fewest(start: int, outstanding: Sequence[int]) -> int:
    """least-outstanding: the replica with the fewest requests in flight, ties rotating from `start`."""
    return best(start, [-x for x in outstanding])


def prefix_key(prompt_ids: Any, system_len: int = 0) -> bytes:
    """prefix-hash's key: the first HASH_PREFIX_TOKENS token ids after a chat's system prompt, as bytes.

    KubeAI keys a completions request on its prompt's head and a chat request on its first user message
    (`ChatCompletionRequest.Prefix` skips the system message), so chats that share a system prompt still spread
    by conversation; `system_len` is that system prompt's length (0 for a completions prompt)."""
    return np.asarray(prompt_ids[system_len : system_len + HASH_PREFIX_TOKENS], dtype=np.int64).tobytes()


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class HashRing:
    """KubeAI's CHWBL (consistent hashing with bounded loads) over `n` replicas.

    From the key's point on the ring, clockwise, the first replica whose
    in-flight count + 1 is at most HASH_LOAD_FACTOR x (total in flight + 1) / n;
    if none is, the key's own replica.
    """

    def __init__(self, n: int, replication: int = HASH_REPLICATION, load_factor: float = HASH_LOAD_FACTOR) -> None:
        if n < 1:
            raise ValueError(f"a ring needs at least one replica, got {n}")
        points = sorted((_hash64(f"replica-{r}-{k}".encode()), r) for r in range(n) for k in range(replication))
        self.hashes = np.array([p for p, _ in points], dtype=np.uint64)
        self.owners = np.array([r for _, r in points])
        self.n = n
        self.load_factor = load_factor

    def pick(self, key: bytes, outstanding: Sequence[int]) -> int:
        first = int(np.searchsorted(self.hashes, np.uint64(_hash64(key)))) % len(self.hashes)
        total = sum(outstanding)
        bound = (total + 1) / self.n * self.load_factor
        owners = self.owners
        for k in range(len(owners)):
            r = int(owners[(first + k) % len(owners)])
            if total == 0 or outstanding[r] + 1 <= bound:
                return r
        return int(owners[first])


class SessionAffinity:
    """session: a conversation's first request goes to the replica with the fewest in flight; its later ones follow.

    A request names its conversation either directly (`conversation`, what an `X-Session-ID` header carries) or
    through the earlier turn it follows (`depends_on`, as a trace links turns): `conversation_of` resolves both.
    """

    def __init__(self) -> None:
        self._conversation_of: dict[int, int] = {}
        self._home: dict[int, int] = {}

    def conversation_of(self, index: int, conversation: int | None, depends_on: int | None) -> int:
        if conversation is None:
            conversation = self._conversation_of.get(depends_on, index) if depends_on is not None else index
        self._conversation_of[index] = conversation
        return conversation

    def pick(self, conversation: int, start: int, outstanding: Sequence[int]) -> int:
        home = self._home.get(conversation)
        if home is None:
            home = self._home[conversation] = fewest(start, outstanding)
        return home
