"""SGLang's scheduler against schedules worked out by hand from its source (see sim/sglang_scheduler.py)."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.perf.engine_config import EngineConfig
from servelab.perf.sglang_args import SGLangSettings
from servelab.sim.radix_cache import RadixCache
from servelab.sim.request import SimRequest
from servelab.sim.sglang_scheduler import INIT_NEW_TOKEN_RATIO, SGLangScheduler


def make(
    capacity: int,
    *,
    chunk: int = 16,
    max_running: int = 8,
    radix: bool = True,
    policy: str = "fcfs",
    conservativeness: float = 1.0,
) -> SGLangScheduler:
    settings = SGLangSettings(
        chunked_prefill_size=chunk,
        context_length=1024,
        schedule_policy=policy,
        schedule_conservativeness=conservativeness,
    )
    config = EngineConfig(
        max_num_seqs=max_running, max_num_batched_tokens=chunk, block_size=1, enable_prefix_caching=radix
    )
    return SGLangScheduler(config, settings, RadixCache(capacity, radix))


def req(uid: int, ids: list[int], max_tokens: int) -> SimRequest:
    return SimRequest(uid, np.array(ids), len(ids), max_tokens, 0.0)


def step(s: SGLangScheduler, n: int) -> tuple[list[int], list[int]]:
    granted, before = s.schedule(0.0)
    s.update(n)
    return granted.tolist(), before.tolist()


def test_a_prefill_batch_is_chunked_and_never_mixed_with_decodes():
    s = make(64, chunk=8)
    a, b = req(0, list(range(1, 7)), 3), req(1, list(range(11, 17)), 3)
    s.add(a)
    s.add(b)
    assert step(s, 0) == ([6, 2], [0, 0])  # A whole (6 of the 8-token chunk), B cut to the 2 left
    assert a.first_token_step == 0 and b.first_token_step is None and s.chunked is b
    assert step(s, 1) == ([4], [2])  # the chunked request first; A, already running, does not decode in a prefill batch
    assert step(s, 2) == ([1, 1], [6, 6])  # nothing waiting: one decode batch of both
    assert b.first_token_step == 1 and s.num_running == 2


def test_radix_prefix_hit_recomputes_the_last_token_and_counts():
    s = make(64)
    a = req(0, [1, 2, 3, 4, 5, 6, 7, 8], 1)
    s.add(a)
    step(s, 0)  # A's prompt, one token: done, its prompt stays in the tree (unlocked)
    assert a.finish_step == 0 and s.cache.evictable == 8 and s.cache.free == 56
    b = req(1, [1, 2, 3, 4, 5, 6, 9, 9, 9, 9], 1)
    s.add(b)
    assert step(s, 1) == ([4], [6])
    assert (s.prefix.queries, s.prefix.hits) == (18, 6)
    c = req(2, [1, 2, 3, 4, 5, 6, 7, 8], 1)  # all of it cached: the last token is still computed, for its logits
    s.add(c)
    assert step(s, 2) == ([1], [7])


def test_lpm_admits_the_longest_cached_prefix_first_and_fcfs_does_not():
    for policy, first in (("lpm", 2), ("fcfs", 1)):
        s = make(64, max_running=1, policy=policy)
        s.add(req(0, [1, 2, 3, 4, 5, 6, 7, 8], 1))
        step(s, 0)
        s.add(req(1, [20, 21, 22, 23, 24, 25, 26, 27, 28, 29], 2))
        s.add(req(2, [1, 2, 3, 4, 5, 6, 7, 8, 30, 31], 2))
        s.schedule(0.0)
        assert [r.uid for r, _ in s._batch] == [first], policy


def test_new_token_ratio_gates_admission_then_retraction_resets_it():
    # 20 token slots, no radix cache. A is admitted alone: B's 4 + 10 tokens do not fit the 20 - 14 left.
    s = make(20, radix=False, conservativeness=0.01)
    a, b = req(0, [1, 2, 3, 4], 10), req(1, [5, 6, 7, 8], 10)
    s.add(a)
    s.add(b)
    assert step(s, 0) == ([4], [0])
    # Next batch: A's remaining 9 tokens count only x 0.007, so 16 - 0.063 leaves room for B's 14.
    assert step(s, 1) == ([4], [0])
    for n in range(2, 8):  # six decode steps of both: 12 free slots -> 0, the ratio decaying each step
        assert step(s, n) == ([1, 1], [n + 2, n + 2])
    assert s.cache.free == 0 and s.new_token_ratio < 0.007
    # Step 8 needs 2 slots: B (same output count as A, same prompt, later in the batch) is retracted, its 10 slots
    # freed; A alone decodes. The ratio becomes (A's 7 decoded + 20 x 1) / 10, capped at 1.
    assert step(s, 8) == ([1], [10])
    assert s.num_preemptions == 1 and list(s.waiting) == [b] and b.num_computed_tokens == 0 and b.num_tokens == 11
    assert s.new_token_ratio == 1.0
    assert s.cache.free == 9
    # With the ratio at 1, B (11 + 10 tokens) waits until A is done; then the idle engine resets the ratio.
    n = 9
    while s.has_work() and n < 200:
        step(s, n)
        n += 1
    assert a.finish_step is not None and b.finish_step is not None and b.finish_step > a.finish_step
    assert s.new_token_ratio == pytest.approx(min(INIT_NEW_TOKEN_RATIO * 0.01, 1.0))
    assert s.cache.free == 20


def test_a_retracted_request_matches_only_its_known_tokens_when_readmitted():
    s = make(64)
    s.add(req(0, [5, 6, 7, 8], 1))
    step(s, 0)  # [5, 6, 7, 8] now cached
    b = req(1, [5, 6, 7, 8], 10)
    b.num_tokens, b.preemptions = 11, 1  # retracted after 7 generated tokens, whose ids are unknown
    s.add(b)
    # All 4 known tokens match (a fresh request would stop at 3: its last token is recomputed); the 7 others are new.
    assert step(s, 1) == ([7], [4])


def test_sglang_cuda_graph_flags_reach_the_common_config():
    """--disable-cuda-graph turns every step eager; otherwise decode batches up to cuda_graph_max_bs replay graphs
    and extend batches are eager (SGLang's model runner)."""
    from servelab.perf.hardware import get_gpu
    from servelab.perf.models import get_model
    from servelab.perf.sglang_args import parse_sglang_args, resolve_sglang

    hw, spec = get_gpu("a100-40gb"), get_model("qwen2.5-7b")
    default = resolve_sglang(parse_sglang_args("").settings, hw, spec).config
    assert (default.enforce_eager, default.cuda_graph_max_batch, default.eager_prefill) == (False, 32, True)
    parsed = parse_sglang_args("--disable-cuda-graph --cuda-graph-max-bs 16")
    flagged = resolve_sglang(parsed.settings, hw, spec).config
    assert parsed.warnings == [] and flagged.enforce_eager is True and flagged.cuda_graph_max_batch == 16
