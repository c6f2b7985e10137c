"""The lazily built prefix-cache index gives the very same run as indexing every block at once."""

from __future__ import annotations

import numpy as np

from servelab.metrics import timeline as tl
from servelab.metrics.records import MemorySink
from servelab.perf.engine_config import EngineConfig
from servelab.sim.block_pool import BlockPool
from servelab.sim.engine import SimEngine
from servelab.sim.linear_cost import LinearCostModel
from servelab.targets.sim import SimTarget
from servelab.workload.spec import LoadPlan, RequestSpec

COST = LinearCostModel(overhead=0.002, per_token=50e-6, per_context_token=2e-9)
CONFIG = EngineConfig(max_num_seqs=24, max_num_batched_tokens=512)


def mixed_prefix_specs(n: int, seed: int) -> list[RequestSpec]:
    """Shared system prompts of several lengths, exact repeats (duplicate blocks) and unique prompts."""
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 5000, k, dtype=np.int32) for k in (64, 200, 333)]
    repeats = [rng.integers(0, 5000, 160, dtype=np.int32) for _ in range(3)]
    t = np.cumsum(rng.exponential(1 / 40, n))
    out = []
    for i in range(n):
        kind = rng.integers(0, 3)
        if kind == 0:
            ids = np.concatenate([prefixes[rng.integers(0, 3)], rng.integers(0, 5000, rng.integers(1, 150), dtype=np.int32)])
        elif kind == 1:
            ids = repeats[rng.integers(0, 3)]
        else:
            ids = rng.integers(0, 5000, rng.integers(20, 400), dtype=np.int32)
        out.append(RequestSpec(i, ids, int(rng.integers(1, 120)), float(t[i])))
    return out


class EagerIndex(SimTarget):
    def make_engine(self) -> SimEngine:
        engine = super().make_engine()
        engine.pool.defer_index = False
        return engine


def run(target: SimTarget, plan: LoadPlan):
    sink = MemorySink()
    samples = []
    target.run(plan, sink, samples.append)
    return [r.to_json() for r in sorted(sink.records, key=lambda r: r.index)], samples


def test_deferred_index_changes_no_record_and_no_counter(monkeypatch):
    purges = []
    purge = BlockPool._purge
    monkeypatch.setattr(BlockPool, "_purge", lambda self: (purges.append(self.defer_index), purge(self)))
    # 200 blocks for 24 sequences: evictions, preemptions and index purges all happen.
    plan = LoadPlan(mixed_prefix_specs(900, seed=5))
    lazy, lazy_samples = run(SimTarget(CONFIG, 200, COST), plan)
    eager, eager_samples = run(EagerIndex(CONFIG, 200, COST), plan)
    assert lazy == eager
    assert True in purges and False in purges
    last = lazy_samples[-1].values
    assert last[tl.PREFIX_HITS] > 0 and last[tl.PREEMPTIONS] > 0
    assert [s.values for s in lazy_samples] == [s.values for s in eager_samples]


def test_a_purge_keeps_what_a_lookup_would_find():
    pool = BlockPool(6, enable_caching=True)
    a = pool.allocate(2)
    pool.cache(a, [11, 12], chains=[(11, 2)])
    pool.free(a[::-1])
    pool.allocate(5)  # evicts both: their pending registrations are dead
    pool._purge()
    assert pool._num_pending == 0 and pool.lookup([11, 12], 2) == []
    pool.check()
