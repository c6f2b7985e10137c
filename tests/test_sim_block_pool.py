"""The KV block pool: vLLM's free-queue order, prefix-cache hits, reference counts."""

import numpy as np
import pytest

from servelab.sim.block_pool import BlockPool
from servelab.sim.hashing import output_block_hashes, prompt_block_hashes


def test_allocation_skips_the_null_block_and_counts_free_blocks():
    pool = BlockPool(9, enable_caching=True)
    assert pool.num_free == 8
    blocks = pool.allocate(8)
    assert sorted(blocks) == list(range(1, 9))
    assert pool.num_free == 0 and pool.usage == 1.0
    with pytest.raises(RuntimeError):
        pool.allocate(1)
    pool.free(blocks[::-1])
    pool.check()
    assert pool.num_free == 8


def test_uncached_blocks_are_reused_first_and_cached_ones_evicted_least_recently_freed_first():
    pool = BlockPool(9, enable_caching=True)
    a = pool.allocate(2)
    b = pool.allocate(2)
    pool.cache(a, [101, 102])
    pool.cache(b, [201, 202])
    pool.free(a[::-1])  # freed first: evicted first
    pool.free(b[::-1])
    partial = pool.allocate(1)
    pool.free(partial)  # no hash: back to the front
    assert pool.allocate(1) == partial
    assert pool.lookup([101, 102], 2) == a
    # 3 never-used blocks remain uncached ahead of the cached ones; then a (freed first) goes, tail block first.
    pool.allocate(3)
    evicted = pool.allocate(1)
    assert evicted == [a[1]]
    assert pool.lookup([101, 102], 2) == [a[0]]
    assert pool.lookup([201, 202], 2) == b
    pool.check()


def test_a_hit_on_a_free_cached_block_takes_it_out_of_the_free_queue():
    pool = BlockPool(5, enable_caching=True)
    a = pool.allocate(2)
    pool.cache(a, [7, 8])
    pool.free(a[::-1])
    assert pool.num_free == 4
    hits = pool.lookup([7, 8, 9], 3)
    assert hits == a
    assert pool.num_evictable(hits) == 2
    pool.touch(hits)
    assert pool.num_free == 2
    assert pool.allocate(2) and pool.num_free == 0  # the hit blocks were not handed out again
    pool.check()
    pool.touch(hits)  # a second sharer
    assert list(pool.ref_cnt[hits]) == [2, 2]


def test_lookup_stops_at_the_first_miss_and_at_the_limit():
    pool = BlockPool(8, enable_caching=True)
    a = pool.allocate(3)
    pool.cache([a[0], a[2]], [1, 3])
    assert pool.lookup([1, 2, 3], 3) == [a[0]]
    pool.cache([a[1]], [2])
    assert pool.lookup([1, 2, 3], 2) == a[:2]


def test_without_caching_nothing_is_found_and_freed_blocks_stay_uncached():
    pool = BlockPool(6, enable_caching=False)
    a = pool.allocate(3)
    pool.free(a[::-1])
    assert pool.allocate(1) == [a[-1]]  # LIFO reuse, as vLLM does for unhashed blocks
    pool.check()


def test_prompt_hashes_are_a_prefix_chain():
    rng = np.random.default_rng(0)
    shared = rng.integers(0, 50_000, 64, dtype=np.int32)
    p1 = np.concatenate([shared, rng.integers(0, 50_000, 40, dtype=np.int32)])
    p2 = np.concatenate([shared, rng.integers(0, 50_000, 40, dtype=np.int32)])
    h1, h2 = prompt_block_hashes(p1, 16), prompt_block_hashes(p2, 16)
    assert len(h1) == 6  # 104 tokens: 6 full blocks
    assert h1[:4] == h2[:4] and h1[4] != h2[4]
    # Same block content at a different position is a different block.
    assert prompt_block_hashes(np.tile(shared[:16], 2), 16)[0] != prompt_block_hashes(np.tile(shared[:16], 2), 16)[1]
    assert prompt_block_hashes(list(p1), 16) == h1
    assert 0 not in h1
    assert set(output_block_hashes(1, 0, 5)).isdisjoint(output_block_hashes(2, 0, 5))
