"""prefix-estimate: llm-d's estimated prefix-cache scheduling, whose view of the caches is its own routing history.

llm-d's endpoint picker in its `estimate` mode (llm-d-inference-scheduler's `prefix-cache-scorer`, which in that
mode is the Gateway API Inference Extension's prefix plugin) never reads an engine's cache. After each pick it
records the request's prompt blocks against the pod it chose, in an LRU per pod, and scores the next request by
how many of its leading blocks that record holds per pod. So it sends a repeat of a prompt back to the pod it
chose before even when that pod's cache has since evicted it, and forgets a prompt its LRU dropped even when the
pod still holds it: the estimate's blind spots, which the precise mode (`prefix-aware`, KV events) has not.

What is modelled, from the code the llm-d 37-capacity benchmark ran (llm-d/llm-d-kv-cache-manager
benchmarking/37-capacity/README.md at edb766fdb1c0, config "estimate-prefix-cache_load"): its `prefix-cache-scorer`
with `mode` unset (llm-d-inference-scheduler b9c56d36, the last commit before PR #323 moved the precise mode to a
scorer type of its own; the README's configurations mean what they say only between PR #297, which added the
active-request scorer, and PR #323) hands its parameters to GIE v0.5.1's prefix plugin
(pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go and indexer.go at 978c23bb):

- hashing: the prompt's bytes in blocks of `hashBlockSize` (256), at most `maxPrefixBlocksToMatch` (256) of them,
  a trailing part block ignored, each block's hash chained on the one before; the chain opens with a hash of the
  model's name, which counts as a block; a prompt shorter than one block has no hashes (and scores 0 everywhere).
- record: after a pick, every hash of the request goes into the chosen pod's LRU (`lruCapacityPerServer` entries,
  2200), moving one already there to the front; the entry it evicts stops naming that pod.
- score: walking the request's hashes in order until one no pod holds, each pod gains one for every hash it holds;
  its score is that count over the request's hashes (not scaled over the pods).
- the picker adds the scorers' weighted scores and takes the highest, ties broken at random (GIE's
  max-score-picker shuffles the pods before it sorts them by score).

The other scorers of "_load" and their weights (prefix 2, kv-cache 1, active-request 1, the last released at the
response's headers as that image did) are the router's (sim/router.py ScorerWeights, DEFAULT_WEIGHTS). No scorer
bounds a pod's load beyond what these weigh.

Blocks in tokens: the plugin cuts characters, the simulator's prompts are token ids. A block is
HASH_BLOCK_CHARS / CHARS_PER_TOKEN = 64 tokens: 4 characters a token is GIE's own premise for its default block
(plugin.go: "a good guess of average characters per token is 4"), and the llm-d reports that set 256 say so
("hashBlockSize: 256 # vllm block-size (64) x4", benchmarking/load-with-headroom/standard-scale-64p-cache-load
at c9ac9eef). Prompts whose text runs to more characters a token (inference-perf's random token ids decoded) fill
more entries per request in the real LRU than here, so the real estimate forgets sooner than this one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from servelab.sim.hashing import prompt_block_hashes

HASH_BLOCK_CHARS = 256
"""`hashBlockSize` of the 37-capacity config (GIE's default is 64)."""
CHARS_PER_TOKEN = 4
"""GIE's premise for its block size: about 4 characters a token."""
BLOCK_TOKENS = HASH_BLOCK_CHARS // CHARS_PER_TOKEN
MAX_PREFIX_BLOCKS = 256
"""`maxPrefixBlocksToMatch` of the config (and GIE's default): prompt beyond 256 blocks is not hashed."""
LRU_CAPACITY_PER_SERVER = 2200
"""`lruCapacityPerServer` of the config (GIE's default is 31,250): block hashes remembered per pod."""
MODEL_BLOCK = -1
"""The chain's first entry, GIE's hash of the model's name (one model here, so one key no block hash can equal)."""


def estimate_block_hashes(
    prompt_ids: Any, block_tokens: int = BLOCK_TOKENS, max_blocks: int = MAX_PREFIX_BLOCKS
) -> list[int]:
    """The request's hashes as the plugin makes them: none for a prompt under one block; else the model's entry
    and the chained hashes of the prompt's first `max_blocks` full blocks."""
    if len(prompt_ids) < block_tokens:
        return []
    return [MODEL_BLOCK, *prompt_block_hashes(prompt_ids[: block_tokens * max_blocks], block_tokens)]


class PrefixIndex:
    """GIE's indexer: per pod an LRU of the block hashes routed there, and per hash the pods whose LRU holds it."""

    def __init__(self, servers: int, capacity: int = LRU_CAPACITY_PER_SERVER) -> None:
        if capacity < 1:
            raise ValueError(f"an LRU needs room for at least one entry, got {capacity}")
        self.capacity = capacity
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(servers)]
        self._holders: dict[int, set[int]] = {}

    def add(self, hashes: Sequence[int], server: int) -> None:
        """Record that `server` was sent these blocks: each to its LRU's front, the oldest out past its capacity."""
        lru = self.lru[server]
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                continue
            lru[h] = None
            self._holders.setdefault(h, set()).add(server)
            if len(lru) > self.capacity:
                evicted, _ = lru.popitem(last=False)
                holders = self._holders[evicted]
                holders.discard(server)
                if not holders:
                    del self._holders[evicted]

    def matched(self, hashes: Sequence[int]) -> list[int]:
        """Per pod, the request's hashes it holds, counted up to the first hash no pod holds (GIE's greedy walk:
        a pod missing one block but holding the next still counts the next, if another pod held the first)."""
        counts = [0] * len(self.lru)
        for h in hashes:
            holders = self._holders.get(h)
            if not holders:
                break
            for server in holders:
                counts[server] += 1
        return counts


class PrefixEstimate:
    """The estimated prefix-cache scorer: each pod's share of a request's hashes its index holds (`scores`); the
    router records its pick in `index`."""

    def __init__(self, servers: int, capacity: int = LRU_CAPACITY_PER_SERVER) -> None:
        self.index = PrefixIndex(servers, capacity)

    def scores(self, hashes: Sequence[int]) -> list[float]:
        """Per pod, the request's hashes (estimate_block_hashes) matched there over their number: 0 with none."""
        return [m / len(hashes) if hashes else 0.0 for m in self.index.matched(hashes)]
