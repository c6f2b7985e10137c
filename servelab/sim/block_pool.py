"""Paged KV blocks with vLLM V1's free-block queue and prefix cache.

vLLM keeps one doubly linked free queue: blocks freed without a hash are
put at the front (reused first), blocks freed with a hash at the back, so
cached blocks are evicted least-recently-freed first; a prefix hit on a free
cached block takes it out of the queue. The queue is therefore always
[uncached blocks][cached blocks in free order], which is how we store it:
a Python stack for the uncached part and a numpy ring with lazy deletion for
the cached part, so that allocating, freeing and evicting many blocks costs
a few array operations rather than a Python loop per block.

Block 0 is vLLM's null block and is never handed out.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import cast

import numpy as np


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        if num_blocks < 2:
            raise ValueError(f"need at least 2 KV blocks (one is vLLM's null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref_cnt = np.zeros(num_blocks, dtype=np.int32)
        self.block_hash = np.zeros(num_blocks, dtype=np.int64)
        """0 = no hash (not full, or caching off)."""
        self._uncached: list[int] = list(range(num_blocks - 1, 0, -1))
        """Free blocks without a hash; the end of the list is the front of vLLM's queue."""
        self._ring = np.zeros(max(1024, 2 * num_blocks), dtype=np.int64)
        self._positions = np.arange(len(self._ring))
        """0, 1, 2, ... as long as the ring: slices of it stand for ring positions without a new arange."""
        self._head = 0
        self._tail = 0
        self._ring_pos = np.full(num_blocks, -1, dtype=np.int64)
        """Position in the ring of a free cached block, -1 otherwise (lazy deletion)."""
        self._num_cached_free = 0
        self._hash_to_block: dict[int, int] = {}
        """May hold stale entries; a lookup is valid only if block_hash[block] still equals the hash."""

    # -- counts -------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._uncached) + self._num_cached_free

    @property
    def usage(self) -> float:
        """Fraction of usable blocks not free, as vllm:kv_cache_usage_perc reports it."""
        return 1.0 - self.num_free / (self.num_blocks - 1)

    def num_evictable(self, blocks: Sequence[int]) -> int:
        """How many of these cached blocks sit in the free queue (a hit on them consumes free capacity)."""
        if not blocks:
            return 0
        return int(np.count_nonzero(self.ref_cnt[np.asarray(blocks)] == 0))

    # -- allocation -----------------------------------------------------------

    def allocate(self, n: int) -> list[int]:
        """Pop n blocks from the front of the free queue, evicting cached ones as vLLM does."""
        if n <= 0:
            return []
        if n > self.num_free:
            raise RuntimeError(f"cannot allocate {n} blocks, {self.num_free} free")
        uncached = self._uncached
        take = min(n, len(uncached))
        out = uncached[len(uncached) - take :]
        out.reverse()
        del uncached[len(uncached) - take :]
        if out:
            self.ref_cnt[out] = 1
        if n > take:
            evicted = self._pop_cached(n - take)
            self.block_hash[evicted] = 0
            self.ref_cnt[evicted] = 1
            out.extend(evicted.tolist())
        return out

    def _pop_cached(self, n: int) -> np.ndarray:
        ring, ring_pos, positions = self._ring, self._ring_pos, self._positions
        head, end = self._head, self._head + n
        if end <= self._tail:  # the usual case: the next n entries are all live (no prefix hit took one out)
            window = ring[head:end]
            if not np.count_nonzero(ring_pos[window] != positions[head:end]):
                ring_pos[window] = -1
                self._head = end
                self._num_cached_free -= n
                return window
        taken: list[np.ndarray] = []
        while n:
            head = self._head
            end = min(self._tail, head + max(2 * n, 256))
            window = ring[head:end]
            live = (ring_pos[window] == positions[head:end]).nonzero()[0]
            if len(live) >= n:
                live = live[:n]
                self._head = head + int(live[-1]) + 1
            else:
                self._head = end
            got = window[live]
            ring_pos[got] = -1
            taken.append(got)
            n -= len(got)
        blocks = np.concatenate(taken) if len(taken) > 1 else taken[0]
        self._num_cached_free -= len(blocks)
        return blocks

    def free(self, blocks: Sequence[int]) -> None:
        """Release one reference to each block, given in eviction order (vLLM frees a request tail first)."""
        if not blocks:
            return
        ids = np.asarray(blocks, dtype=np.int64)
        left = self.ref_cnt[ids]
        left -= 1
        self.ref_cnt[ids] = left
        freed = ids[left == 0]
        if not len(freed):
            return
        if self.enable_caching:
            hashed = self.block_hash[freed] != 0
            self._append_cached(freed[hashed])
            freed = freed[~hashed]
        # vLLM prepends these in order: the first freed ends up at the very front.
        self._uncached.extend(reversed(freed.tolist()))

    def _append_cached(self, blocks: np.ndarray) -> None:
        k = len(blocks)
        if not k:
            return
        if self._tail + k > len(self._ring):
            self._compact_ring(k)
        self._ring[self._tail : self._tail + k] = blocks
        self._ring_pos[blocks] = self._positions[self._tail : self._tail + k]
        self._tail += k
        self._num_cached_free += k

    def _compact_ring(self, extra: int) -> None:
        live = self._ring[self._head : self._tail]
        live = live[self._ring_pos[live] == np.arange(self._head, self._tail)]
        size = len(self._ring)
        while len(live) + extra > size // 2:
            size *= 2
        ring = np.zeros(size, dtype=np.int64)
        ring[: len(live)] = live
        self._ring = ring
        if size != len(self._positions):
            self._positions = np.arange(size)
        self._ring_pos[live] = self._positions[: len(live)]
        self._head, self._tail = 0, len(live)

    # -- prefix cache -----------------------------------------------------

    def lookup(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Longest run of cached blocks from the start of `hashes` (a miss ends it: hashes are chained)."""
        wanted = hashes[:max_blocks]
        if not len(wanted):
            return []
        get = self._hash_to_block.get
        first = get(wanted[0])
        if first is None or self.block_hash[first] != wanted[0]:
            return []  # the usual miss, decided by the first block alone
        # A hit: every block's candidate at once (-1: not in the index), kept up to the first that is not cached.
        blocks = np.fromiter(map(get, wanted, repeat(-1)), dtype=np.int64, count=len(wanted))
        ok = (blocks >= 0) & (self.block_hash[blocks] == np.asarray(wanted, dtype=np.int64))
        hit = len(ok) if ok.all() else int(ok.argmin())
        return cast(list[int], blocks[:hit].tolist())

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on prefix-hit blocks, removing free ones from the free queue."""
        if not blocks:
            return
        ids = np.asarray(blocks, dtype=np.int64)
        idle = ids[self.ref_cnt[ids] == 0]
        if len(idle):
            self._ring_pos[idle] = -1
            self._num_cached_free -= len(idle)
        self.ref_cnt[ids] += 1

    def cache(self, blocks: Sequence[int], hashes: Sequence[int] | np.ndarray, findable: bool = True) -> None:
        """Mark newly full blocks as cached under their hashes (duplicates of a cached hash are kept, as in vLLM).

        `findable=False` skips the hash index: for blocks only their owner could
        ever hit (generated tokens), which `index` adds if the owner is preempted.
        They still count as cached for the free queue's eviction order.
        """
        if not blocks:
            return
        self.block_hash[np.asarray(blocks, dtype=np.int64)] = hashes
        if findable:  # the index keys are Python ints: findable hashes come as a list (prompt_block_hashes)
            self.index(blocks, cast(Sequence[int], hashes))

    def index(self, blocks: Sequence[int], hashes: Sequence[int]) -> None:
        self._hash_to_block.update(zip(hashes, blocks))
        if len(self._hash_to_block) > 4 * self.num_blocks + 4096:
            live = np.flatnonzero(self.block_hash)
            self._hash_to_block = dict(zip(self.block_hash[live].tolist(), live.tolist()))

    # -- invariants (tests) -----------------------------------------------

    def check(self) -> None:
        """Raise if the free queue and the reference counts disagree."""
        if (self.ref_cnt < 0).any():
            raise AssertionError("negative reference count")
        in_ring = self._ring[self._head : self._tail]
        live = in_ring[self._ring_pos[in_ring] == np.arange(self._head, self._tail)]
        free = np.concatenate([np.asarray(self._uncached, dtype=np.int64), live])
        if len(np.unique(free)) != len(free):
            raise AssertionError("a block is in the free queue twice")
        if len(live) != self._num_cached_free:
            raise AssertionError("cached-free count is off")
        if (self.ref_cnt[free] != 0).any():
            raise AssertionError("a referenced block is in the free queue")
        if len(free) + int(np.count_nonzero(self.ref_cnt[1:])) != self.num_blocks - 1:
            raise AssertionError("blocks leaked: neither free nor referenced")
