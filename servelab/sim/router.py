"""Replicas behind a router: the policies real fleets run, each seeing only what its real counterpart sees.

One replica is an engine with its own queue, KV cache and prefix cache. The
router picks one per request, as the request reaches the fleet, from its own
view of the replicas:

- round-robin: nothing (a rotating counter).
- random: nothing (a uniform draw per request, seeded): a Kubernetes Service
  in front of the pods (kube-proxy picks an endpoint at random) or llm-d's
  random picker.
- least-loaded: vLLM's data-parallel balancer (DPLBAsyncMPClient), which
  reads each engine's waiting, running and KV usage as the engines report them,
  and counts the requests it sent each engine that have not finished.
- least-outstanding: the router's own count of requests it sent and has not
  seen finish (KubeAI's LeastLoad, Envoy's LEAST_REQUEST); no server state.
- prefix-hash: KubeAI's PrefixHash, consistent hashing with bounded loads
  (CHWBL) on the prompt's first tokens, over its own in-flight counts.
- prefix-aware: llm-d's precise prefix-cache scheduling: each replica's
  longest cached prefix of the request, from the engines' KV-cache events
  (live), weighed against the waiting queue and KV usage, which the endpoint
  picker scrapes from `/metrics` every `scrape_interval` seconds, and against
  its own in-flight counts (the active-request scorer). With a prefix weight
  of 0 it is llm-d's scheduler without a prefix scorer (its "load" profiles).
- prefix-estimate: llm-d's estimated prefix-cache scheduling: the prompt's
  blocks it sent each replica before (its own LRU per replica, never the
  engines' caches), weighed against the same scorers (sim/prefix_index.py).
- session: a conversation (a request and the turns that follow it) stays on
  the replica its first turn went to, as an `X-Session-ID` affinity does; a
  first turn goes to the replica with the fewest of the router's requests.

Both llm-d policies add the same weighted scorers (ScorerWeights), so any of
llm-d's scheduling profiles built from them is one policy and its weights.

Before it picks, a router spends its own time on the request (`Router.own_time`): the request reaches
a replica that much later. That time is priced per router kind from published measurements of its
counterpart (ROUTER_COSTS); a router whose counterpart publishes none costs nothing here.

docs/fleets.md says where each algorithm comes from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any, Protocol

import numpy as np

from servelab.perf.errors import PerfConfigError
from servelab.sim.block_pool import BlockPool
from servelab.sim.engine import SimEngine
from servelab.sim.hashing import prompt_block_hashes
from servelab.sim.prefix_index import PrefixEstimate, estimate_block_hashes
from servelab.sim.radix_cache import RadixCache
from servelab.schemas.fleet import RouterTime
from servelab.schemas.vocabulary import (
    LEAST_LOADED as LEAST_LOADED,
    POLICIES as POLICIES,
    ROUND_ROBIN as ROUND_ROBIN,
)  # named here for their importers
from servelab.schemas.vocabulary import RouterPolicy as RouterPolicy
from servelab.workload.routing import HashRing, SessionAffinity, best as _best, fewest, prefix_key
from servelab.workload.routing import (
    HASH_LOAD_FACTOR as HASH_LOAD_FACTOR,
    HASH_PREFIX_TOKENS as HASH_PREFIX_TOKENS,
)  # named here for their importers

EPP_SCRAPE_INTERVAL = 0.05
"""prefix-aware: how often llm-d's endpoint picker refreshes the replicas' metrics (its default 50 ms)."""


EPP_SCHEDULER_S = 0.2e-3
"""prefix-aware: the endpoint picker's own time to schedule a request without a prefix scorer, as its scheduler
end-to-end latency histogram measured it (gateway-api-inference-extension PR #768, Llama-3-8B on 6 H100s, 2,048-token
system prompts and 256-token questions). The gateway's ext-proc hop to the picker has no published unloaded figure,
so it is not priced."""
EPP_SCHEDULING_S = EPP_SCHEDULER_S + 0.3e-3
"""prefix-aware: the same with its prefix-cache plugin, which the same histogram put at 0.3 ms more."""
TOKENIZE_PER_TOKEN_S = 43.7e-3 / 38_000
"""prefix-aware: the precise scorer tokenizes the prompt itself to find its cached blocks (with the HuggingFace
tokenizers library, called from Go), and waits for it from llm-d-kv-cache-manager v0.3.0 on (`Pool.Tokenize`, PR
#95; v0.2.1 queued the prompt and scored with the tokens its store already held, docs/fleets.md). Tokenizing costs
about 1.15 us a token: a HuggingFace tokenizer took 43.7 ms a request on ~38,000-token prompts in a serving frontend,
timed with nsys (TensorRT-LLM PR #18389)."""
TOKEN_STORE_BLOCK = 64
"""prefix-aware: the tokens a block of the scorer's tokenization cache holds. llm-d-kv-cache-manager's prefix store
keys 256-byte chunks of the prompt's text, about 64 tokens."""
TOKEN_STORE_OVERLAP = 0.8
"""prefix-aware: the share of a prompt the tokenization cache must already hold for the scorer to reuse its tokens
instead of tokenizing the prompt again (llm-d-kv-cache-manager's `minPrefixOverlapRatio`)."""


@dataclass(frozen=True, slots=True)
class RouterCost:
    """A router's own time per request: `fixed_s` for every request, `per_tokenized_token_s` for each prompt token
    it tokenizes."""

    fixed_s: float = 0.0
    per_tokenized_token_s: float = 0.0


ROUTER_COSTS: dict[RouterPolicy, RouterCost] = {
    RouterPolicy.PREFIX_AWARE: RouterCost(EPP_SCHEDULING_S, TOKENIZE_PER_TOKEN_S),
}
"""The routers whose counterparts publish what they cost. The rest cost nothing here, because no measurement of
them was found: round-robin and least-outstanding (a plain proxy), random (kube-proxy forwards at L4, no proxy in
the path), prefix-hash (KubeAI's proxy: it parses the body and hashes 100 characters), session, and least-loaded
(vLLM's balancer runs inside its API server process: no hop of its own, and no published price)."""


SCORERS = ("prefix", "queue", "kv", "active")
"""ScorerWeights' scorers, in their flag's order (its other field, active_until, is not a weight)."""


class ActiveRelease(StrEnum):
    """When llm-d's active-request scorer stops counting a request against the replica it went to."""

    END = "end"
    """When its response ends: the router's own in-flight count (llm-d-inference-scheduler from PR #378, which moved
    the scorer to GIE's ResponseComplete hook, GIE PR #1661)."""
    HEADERS = "headers"
    """When its response's headers come back: GIE v0.5.1 runs its PostResponse plugins from HandleResponseHeaders
    (pkg/epp/handlers/response.go), and the scorer of llm-d-inference-scheduler b9c56d36 forgets the request there
    (GIE issue #1483; llm-d-inference-scheduler issues #317, #376). vLLM sends a streamed response's headers before
    the engine sees the request, so the scorer sees none in flight and scores every replica 1. Here the request
    counts for nothing from the moment it is routed."""


@dataclass(frozen=True, slots=True)
class ScorerWeights:
    """The weights of llm-d's scorers, as an EndpointPickerConfig gives them (a scorer weighted 0 is not run).

    The default, prefix-aware's: prefix, queue and kv are those of llm-d's precise prefix-cache guide (3, 2, 2).
    `active` is the active-request scorer that llm-d PR #669 and KServe's samples add to that guide because without
    it a prompt shared by every request (a system prompt) sends all of them to the one replica that cached it until
    queues form; its weight of 2 is ours (the queue scorer's). active=0 gives the guide's set. prefix-estimate's
    default is LLMD_LOAD_PROFILE's with the prefix scorer weighted 2 (sim/prefix_index.py)."""

    prefix: float = 3.0
    queue: float = 2.0
    kv: float = 2.0
    active: float = 2.0
    active_until: ActiveRelease = ActiveRelease.END

    @classmethod
    def parse(cls, text: str) -> ScorerWeights:
        """`prefix=2,queue=0,kv=1,active=1[,active_until=headers]`: a scorer left out weighs 0 (as in llm-d's
        config, where a scorer not listed is not run). ValueError naming the bad part."""
        names = [f.name for f in fields(cls)]
        given: dict[str, str] = {}
        for part in text.split(","):
            name, sep, value = (s.strip() for s in part.partition("="))
            if not sep or name not in names or not value:
                raise ValueError(f"{part.strip()!r} is not NAME=VALUE with NAME one of {', '.join(names)}")
            if name in given:
                raise ValueError(f"{name} is given twice")
            given[name] = value
        until = given.pop("active_until", ActiveRelease.END)
        if until not in list(ActiveRelease):
            raise ValueError(f"active_until={until!r}: choose {' or '.join(ActiveRelease)}")
        weights = {name: _weight(name, value) for name, value in given.items()}
        if not any(weights.values()):
            raise ValueError("every weight is 0: give at least one scorer a positive weight")
        zero = dict.fromkeys(SCORERS, 0.0)
        return cls(**(zero | weights), active_until=ActiveRelease(until))

    def flag(self) -> str:
        """The weights as `--router-weights` takes them (`parse` reads them back)."""
        weights = ",".join(f"{name}={getattr(self, name):g}" for name in SCORERS)
        return f"{weights},active_until={self.active_until}"


def _weight(name: str, value: str) -> float:
    try:
        weight = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number") from None
    if not np.isfinite(weight) or weight < 0:
        raise ValueError(f"{name}={value!r}: a weight is a finite number >= 0")
    return weight


LLMD_LOAD_PROFILE = ScorerWeights(prefix=0.0, queue=0.0, kv=1.0, active=1.0, active_until=ActiveRelease.HEADERS)
"""llm-d's "load" scheduling profile as its 37-capacity benchmark configured it (active-request 1, kv-cache 1; llm-d-
kv-cache-manager benchmarking/37-capacity/README.md at edb766fdb1c0) and as the image it ran scored: the
active-request scorer released at the response's headers (ActiveRelease.HEADERS)."""
LLMD_PREFIX_LOAD_PROFILE = replace(LLMD_LOAD_PROFILE, prefix=2.0)
"""The same benchmark's "precise-prefix-cache_load" and "estimate-prefix-cache_load" profiles: "load" plus a prefix
scorer weighted 2 (precise: KV events, prefix-aware; estimate: its own routing history, prefix-estimate)."""
DEFAULT_WEIGHTS: dict[RouterPolicy, ScorerWeights] = {
    RouterPolicy.PREFIX_AWARE: ScorerWeights(),
    RouterPolicy.PREFIX_ESTIMATE: LLMD_PREFIX_LOAD_PROFILE,
}
"""The policies that weigh llm-d's scorers, and their weights when none are given."""


def weights_for(text: str | None, router: str | None) -> ScorerWeights | None:
    """`--router-weights` read and checked against `--router`, before anything is built (None: none given)."""
    if text is None:
        return None
    if router not in DEFAULT_WEIGHTS:
        raise PerfConfigError(
            f"--router-weights weighs llm-d's scorers: give it with --router {' or --router '.join(DEFAULT_WEIGHTS)}"
            f"{'' if router is None else f', not --router {router}'}"
        )
    try:
        return ScorerWeights.parse(text)
    except ValueError as exc:
        raise PerfConfigError(f"--router-weights {text!r}: {exc}") from None


class RoutedRequest(Protocol):
    """What a router may read off a request: its id, its prompt's tokens (and how many open with a chat's system
    prompt), the turn it follows and the conversation it belongs to, if any."""

    @property
    def index(self) -> int: ...
    @property
    def prompt_ids(self) -> Any: ...
    @property
    def depends_on(self) -> int | None: ...
    @property
    def conversation(self) -> int | None: ...
    @property
    def system_len(self) -> int: ...


class Router:
    """Picks a replica for each request (`pick`) and hears when each one finishes (`finished`)."""

    def __init__(
        self,
        policy: str = ROUND_ROBIN,
        *,
        scrape_interval: float = EPP_SCRAPE_INTERVAL,
        weights: ScorerWeights | None = None,
        seed: int = 0,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"router policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy = RouterPolicy(policy)
        if weights is not None and self.policy not in DEFAULT_WEIGHTS:
            raise ValueError(f"scorer weights are for the {' and '.join(DEFAULT_WEIGHTS)} routers, not {policy}")
        self.scrape_interval = scrape_interval
        self.weights = weights if weights is not None else DEFAULT_WEIGHTS.get(self.policy, ScorerWeights())
        self._next = 0
        self._draws = np.random.default_rng(seed)
        """random, and the ties of llm-d's scorers: the router's own draws, so a run is reproducible and independent
        of the workload's seed."""
        self.outstanding: list[int] = []
        """Per replica: requests this router sent there that have not finished (its own count)."""
        self._replica_of: dict[int, int] = {}
        self._sessions = SessionAffinity()
        self._ring: HashRing | None = None
        self._estimate: PrefixEstimate | None = None
        self._scraped: list[tuple[int, int, float]] = []
        self._next_scrape = -np.inf
        self.cost = ROUTER_COSTS.get(self.policy, RouterCost())
        if self.policy is RouterPolicy.PREFIX_AWARE and not self.weights.prefix:
            self.cost = RouterCost(EPP_SCHEDULER_S)  # no prefix scorer: no prefix plugin, nothing tokenized
        self._token_store: set[int] = set()
        """prefix-aware: the blocks of every prompt the scorer tokenized (its tokenization cache; the real one keeps
        500,000 blocks, more than any replayed run sends)."""
        self._timed = self._tokenized = 0
        self._own_seconds = 0.0

    def own_time(self, request: RoutedRequest) -> float:
        """Seconds this router spends on `request` before it picks a replica (ROUTER_COSTS); counted for
        `time_spent`."""
        tokenized = self._tokenizes(request.prompt_ids)
        seconds = self.cost.fixed_s + self.cost.per_tokenized_token_s * tokenized
        self._timed += 1
        self._tokenized += tokenized > 0
        self._own_seconds += seconds
        return seconds

    def _tokenizes(self, prompt_ids: Any) -> int:
        """The prompt tokens the router tokenizes: all of them, unless its tokenization cache already holds
        TOKEN_STORE_OVERLAP of the prompt, block by block from its start; a tokenized prompt's blocks join the cache.
        Only a router that pays per token keeps that cache."""
        if not self.cost.per_tokenized_token_s:
            return 0
        blocks = prompt_block_hashes(prompt_ids, TOKEN_STORE_BLOCK)
        held = next((k for k, block in enumerate(blocks) if block not in self._token_store), len(blocks))
        if held * TOKEN_STORE_BLOCK >= TOKEN_STORE_OVERLAP * len(prompt_ids):
            return 0
        self._token_store.update(blocks)
        return len(prompt_ids)

    def time_spent(self) -> RouterTime:
        """What the router's own time came to over the requests it was asked about (`own_time`)."""
        n = self._timed
        return RouterTime(
            requests=n,
            mean_s=self._own_seconds / n if n else 0.0,
            tokenized_share=self._tokenized / n if n else 0.0,
            fixed_s=self.cost.fixed_s,
            per_tokenized_token_s=self.cost.per_tokenized_token_s,
        )

    def pick(self, engines: Sequence[SimEngine], request: RoutedRequest, now: float) -> int:
        n = len(engines)
        if len(self.outstanding) != n:
            self.outstanding = [0] * n
        start = self._next
        self._next = (self._next + 1) % n
        i = start if n == 1 else self._choose(engines, request, now, start)
        self._replica_of[request.index] = i
        self.outstanding[i] += 1
        return i

    def finished(self, index: int) -> None:
        """The response to request `index` ended (or failed): it no longer counts against its replica."""
        i = self._replica_of.pop(index, None)
        if i is not None:
            self.outstanding[i] -= 1

    def _choose(self, engines: Sequence[SimEngine], request: RoutedRequest, now: float, start: int) -> int:
        match self.policy:
            case RouterPolicy.ROUND_ROBIN:
                return start
            case RouterPolicy.RANDOM:
                return int(self._draws.integers(len(engines)))
            case RouterPolicy.LEAST_LOADED:
                return _best(start, [-_vllm_dp_score(*e.load, n) for e, n in zip(engines, self.outstanding)])
            case RouterPolicy.LEAST_OUTSTANDING:
                return fewest(start, self.outstanding)
            case RouterPolicy.PREFIX_HASH:
                if self._ring is None:
                    self._ring = HashRing(len(engines))
                return self._ring.pick(prefix_key(request.prompt_ids, request.system_len), self.outstanding)
            case RouterPolicy.PREFIX_AWARE:
                return self._weighted(engines, now, self._precise_prefix(engines, request))
            case RouterPolicy.PREFIX_ESTIMATE:
                if self._estimate is None:
                    self._estimate = PrefixEstimate(len(engines))
                hashes = estimate_block_hashes(request.prompt_ids)
                chosen = self._weighted(engines, now, self._estimate.scores(hashes))
                self._estimate.index.add(hashes, chosen)
                return chosen
            case RouterPolicy.SESSION:
                return self._session(request, start)

    def _session(self, request: RoutedRequest, start: int) -> int:
        conversation = self._sessions.conversation_of(request.index, request.conversation, request.depends_on)
        return self._sessions.pick(conversation, start, self.outstanding)

    def _weighted(self, engines: Sequence[SimEngine], now: float, prefix: Sequence[float]) -> int:
        """llm-d's weighted scorers (ScorerWeights) over the replicas' `prefix` scores, the highest total wins, ties
        drawn at random (GIE v0.5.1's max-score-picker shuffles the pods before its stable sort by score).

        queue: (most waiting - its waiting) / (most - fewest), 1 when all are
        equal; kv: 1 - KV usage; both as last scraped; active: active_scores.
        """
        self._scrape(engines, now)
        waiting = [w for w, _, _ in self._scraped]
        most, fewest = max(waiting), min(waiting)
        queue = [1.0 if most == fewest else (most - w) / (most - fewest) for w in waiting]
        kv = [1.0 - usage for _, _, usage in self._scraped]
        w = self.weights
        scores = [
            w.prefix * p + w.queue * q + w.kv * f + w.active * a
            for p, q, f, a in zip(prefix, queue, kv, self.active_scores())
        ]
        top = max(scores)
        tied = [i for i, score in enumerate(scores) if score == top]
        return tied[0] if len(tied) == 1 else tied[int(self._draws.integers(len(tied)))]

    def _precise_prefix(self, engines: Sequence[SimEngine], request: RoutedRequest) -> list[float]:
        """prefix-aware's prefix scorer: each replica's cached leading blocks of the prompt (_holders_scaled); with a
        prefix weight of 0 there is no such scorer and no cache is read."""
        if not self.weights.prefix:
            return [0.0] * len(engines)
        return _holders_scaled([_cached_prefix(e, request.prompt_ids) for e in engines])

    def active_scores(self) -> list[float]:
        """llm-d's active-request scorer: (most in flight - its in flight) / most, 1 when it has none, over the
        requests it still counts (ScorerWeights.active_until): all it sent that have not ended, or none."""
        if self.weights.active_until is ActiveRelease.HEADERS:
            return [1.0] * len(self.outstanding)
        busiest = max(self.outstanding)
        return [1.0 if busiest == 0 else (busiest - x) / busiest for x in self.outstanding]

    def _scrape(self, engines: Sequence[SimEngine], now: float) -> list[tuple[int, int, float]]:
        """The replicas' (waiting, running, KV usage) as the endpoint picker last scraped them."""
        if now >= self._next_scrape:
            self._scraped = [e.load for e in engines]
            self._next_scrape = now + self.scrape_interval
        return self._scraped


def _vllm_dp_score(waiting: int, running: int, kv_usage: float, in_flight: int) -> float:
    """vLLM's DPLBAsyncMPClient (core_client.py `get_core_engine_for_request`): the larger of the engine's waiting +
    running and the requests the balancer sent it that have not finished (`engine_inflight`, which counts a request
    from the moment it is chosen, so requests still in the API server's intake are not all sent to the engine that
    looked emptiest), plus waiting x 6 x max(0, KV usage - 0.5), so queues on KV-bound engines repel traffic."""
    return max(in_flight, waiting + running) + waiting * 6.0 * max(0.0, kv_usage - 0.5)


def _holders_scaled(held: Sequence[int]) -> list[float]:
    """llm-d's precise prefix score from each replica's cached leading tokens of the prompt: 0 for a replica that
    holds none, and over the replicas that hold some, min-max scaled among themselves, 1 for all when they hold
    alike (one holder alone scores 1).

    llm-d-kv-cache-manager v0.2.1's LongestPrefixScorer (pkg/kvcache/kvblock_scorer.go) scores only the pods that
    hold the prompt's first block, counting each one's consecutive blocks from there; llm-d-inference-scheduler
    b9c56d36 (pkg/plugins/scorer/utils.go, indexedScoresToNormalizedScoredPods) takes min and max over those scores
    alone and gives every pod missing from them 0. So where two replicas hold a prompt, the one holding less of it
    scores as if it held none."""
    holding = [h for h in held if h > 0]
    if not holding:
        return [0.0] * len(held)
    low, high = min(holding), max(holding)
    return [0.0 if h <= 0 else 1.0 if high == low else (h - low) / (high - low) for h in held]


def _cached_prefix(engine: SimEngine, prompt_ids: Any) -> int:
    """Tokens at the start of the prompt that the replica holds in its prefix cache, as its KV events tell."""
    pool = engine.pool
    if isinstance(pool, RadixCache):
        return _radix_prefix(pool, prompt_ids) if pool.enabled else 0
    if isinstance(pool, BlockPool):
        hashes = prompt_block_hashes(prompt_ids, engine.block_size)
        return len(pool.lookup(hashes, len(hashes))) * engine.block_size
    raise TypeError(f"no prefix-cache view of a {type(pool).__name__}")


def _radix_prefix(cache: RadixCache, ids: Any) -> int:
    """SGLang's tree: the matched length, read without touching its LRU clock or splitting an edge."""
    node, pos, limit = cache.root, 0, len(ids)
    while pos < limit:
        child = node.children.get(int(ids[pos]))
        if child is None:
            return pos
        key = child.key
        k = min(len(key), limit - pos)
        same = next((j for j in range(k) if int(ids[pos + j]) != key[j]), k)
        pos += same
        if same < len(key):
            return pos
        node = child
    return pos
