"""SGLang's token pool and radix-tree prefix cache (mem_cache/radix_cache.py), with page size 1.

SGLang keeps the KV of finished and running requests' prefixes in a radix
tree whose edges are token sequences. A request locks the path to its last
matched node while it runs (`inc_lock_ref`), so those tokens cannot be
evicted; unlocked tokens stay cached but are *evictable*, and `evict(n)`
removes unlocked leaves least-recently-used first (a leaf's parent becomes a
candidate once its last child goes). The pool itself is counted, not
addressed: `free` slots, `evictable` and `protected` tree tokens; a running
request's tokens that are not in the tree yet are its private allocation,
which the scheduler tracks.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence


class RadixNode:
    __slots__ = ("children", "key", "last_access", "lock", "parent")

    def __init__(self, key: tuple[int, ...], parent: RadixNode | None) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[int, RadixNode] = {}
        self.lock = 0
        self.last_access = 0


class RadixCache:
    """`capacity` token slots; with `enabled` False (--disable-radix-cache) nothing is ever matched or kept."""

    def __init__(self, capacity: int, enabled: bool = True) -> None:
        if capacity < 2:
            raise ValueError(f"need at least 2 KV token slots, got {capacity}")
        self.num_blocks = capacity
        """Slots of one token each (the engine reads capacity as blocks x block size 1)."""
        self.enabled = enabled
        self.free = capacity
        self.evictable = 0
        self.protected = 0
        self.root = RadixNode((), None)
        self.root.lock = 1
        self._clock = itertools.count(1)

    @property
    def usage(self) -> float:
        """SGLang's token_usage: slots neither free nor evictable cache, over the pool."""
        return (self.num_blocks - self.free - self.evictable) / self.num_blocks

    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut node's edge after `at` tokens; returns the new upper node (which inherits the lock count)."""
        parent = node.parent
        assert parent is not None
        upper = RadixNode(node.key[:at], parent)
        upper.lock = node.lock
        upper.last_access = node.last_access
        parent.children[node.key[0]] = upper
        node.key = node.key[at:]
        node.parent = upper
        upper.children[node.key[0]] = node
        return upper

    def _walk(self, ids: Sequence[int], limit: int) -> tuple[int, RadixNode]:
        """Longest cached prefix of ids[:limit]: (its length, its last node), splitting an edge matched part-way."""
        node, pos, now = self.root, 0, next(self._clock)
        while pos < limit:
            child = node.children.get(ids[pos])
            if child is None:
                break
            key = child.key
            k = min(len(key), limit - pos)
            if tuple(ids[pos : pos + k]) != key[:k]:
                k = next(i for i in range(k) if ids[pos + i] != key[i])
            if k < len(key):
                if k == 0:
                    break
                child = self._split(child, k)
            child.last_access = now
            node, pos = child, pos + k
            if k < len(child.key):
                break
        return pos, node

    def match(self, ids: Sequence[int], limit: int) -> tuple[int, RadixNode]:
        """Cached tokens at the start of ids[:limit] and the node to lock (SGLang's match_prefix)."""
        if not self.enabled:
            return 0, self.root
        return self._walk(ids, limit)

    def insert(self, ids: Sequence[int]) -> tuple[int, RadixNode]:
        """Put ids in the tree; returns how many were cached already (their slots are duplicates) and the last node.

        The caller hands the slots of the rest from its private allocation to the tree, and frees the duplicates.
        """
        matched, node = self._walk(ids, len(ids))
        if matched < len(ids):
            leaf = RadixNode(tuple(ids[matched:]), node)
            leaf.last_access = next(self._clock)
            node.children[leaf.key[0]] = leaf
            self.evictable += len(leaf.key)
            node = leaf
        return matched, node

    def lock(self, node: RadixNode) -> None:
        n: RadixNode | None = node
        while n is not None and n is not self.root:
            if n.lock == 0:
                self.evictable -= len(n.key)
                self.protected += len(n.key)
            n.lock += 1
            n = n.parent

    def unlock(self, node: RadixNode) -> None:
        n: RadixNode | None = node
        while n is not None and n is not self.root:
            n.lock -= 1
            if n.lock == 0:
                self.evictable += len(n.key)
                self.protected -= len(n.key)
            n = n.parent

    def allocate(self, n: int) -> bool:
        """Take n slots, evicting cache if needed; False (nothing taken) if even that leaves too few."""
        if n > self.free:
            self.evict(n - self.free)
        if n > self.free:
            return False
        self.free -= n
        return True

    def release(self, n: int) -> None:
        self.free += n

    def evict(self, n: int) -> None:
        """Free at least n slots of unlocked cache if there are that many, least recently used leaves first."""
        leaves: list[tuple[int, int, RadixNode]] = []
        order = itertools.count()
        stack = [self.root]
        while stack:
            node = stack.pop()
            if not node.children and node.lock == 0:
                leaves.append((node.last_access, next(order), node))
            stack.extend(node.children.values())
        heapq.heapify(leaves)
        freed = 0
        while freed < n and leaves:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            freed += len(leaf.key)
            self.evictable -= len(leaf.key)
            if parent is not self.root and not parent.children and parent.lock == 0:
                heapq.heappush(leaves, (parent.last_access, next(order), parent))
        self.free += freed
