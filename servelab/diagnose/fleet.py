"""Findings about a fleet: replicas behind a router, as `bench` recorded them (run.json's `server_info.replicas`).

Two things only a fleet can get wrong, read off each replica's own `/metrics` over the run (docs/fleets.md):

- imbalance: one replica queues while another has nothing waiting, so the fleet's latency is its busiest
  replica's while capacity sits idle;
- prefix-cache hits lost to routing: each replica caches only what was sent to it, so a route that scatters a
  conversation (or the users of one system prompt) prefills again what another replica holds. The fleet's hit
  rate is set against the share of prompt tokens the workload itself repeats: what one cache shared by every
  replica could have hit at most.

- time outside the replicas, behind a router: the client's mean TTFT against the replicas' own (their TTFT
  histograms time a request from when it reached them), so what is left is the router's queueing, scoring and
  proxying, the network and the client. Which of those it is needs a run straight to one replica beside it.
  A simulated fleet knows its router's own time exactly (run.json's `server_info.router_time`), and that is the
  finding's evidence there.
"""

from __future__ import annotations

from collections.abc import Sequence

from servelab.diagnose.findings import make_finding
from servelab.schemas.diagnosis import Finding
from servelab.schemas.fleet import ReplicaLoad, RouterTime
from servelab.schemas.vocabulary import FindingKind

FLEET_IMBALANCE = FindingKind.FLEET_IMBALANCE
ROUTING_CACHE_MISSES = FindingKind.ROUTING_CACHE_MISSES
QUEUED = 1.0
"""Mean waiting requests from which a replica counts as queueing."""
IDLE = 0.1
"""Mean waiting requests under which a replica counts as having nothing queued."""
LOST_HITS = 0.10
"""Share of prompt tokens a route must lose to the replicas' separate caches before it is a finding."""
CACHE_AWARE_ROUTES = "session (chats), prefix-hash or prefix-aware"
OUTSIDE_REPLICAS = FindingKind.OUTSIDE_REPLICAS
OUTSIDE_MS = 20.0
"""Milliseconds of every first token outside the replicas from which a router's path is a finding..."""
OUTSIDE_SHARE = 0.25
"""...and the share of the client's mean TTFT it must also reach (a few ms of loopback never matter)."""


def fleet_findings(
    replicas: Sequence[ReplicaLoad],
    repeated_share: float | None,
    router_ttft_ms: float | None = None,
    router_time: tuple[RouterTime, float] | None = None,
) -> list[Finding]:
    """The fleet's findings from its replicas' loads (metrics.scrape.replica_load); `repeated_share`: the share
    of prompt tokens a request shares with an earlier one (None: unknown); `router_ttft_ms`: the client's mean
    TTFT when it went through a router (None: no router, servelab spread the load itself, or a simulated fleet);
    `router_time`: a simulated router's own time and the run's mean TTFT in ms. Nothing for fewer than two
    replicas."""
    if len(replicas) < 2:
        return []
    found = [
        imbalance(replicas),
        routing_cache_misses(replicas, repeated_share),
        outside_replicas(replicas, router_ttft_ms),
        router_own_time(*router_time) if router_time is not None else None,
    ]
    return [f for f in found if f is not None]


def imbalance(replicas: Sequence[ReplicaLoad]) -> Finding | None:
    known = [(load.mean_waiting, load) for load in replicas if load.mean_waiting is not None]
    if len(known) < 2:
        return None
    busiest_w, busiest = max(known, key=lambda item: item[0])
    idlest_w, idlest = min(known, key=lambda item: item[0])
    if busiest_w < QUEUED or idlest_w > IDLE:
        return None
    evidence = [
        f"{load.name}: {load.requests_served} requests served, {w:.1f} waiting on average "
        f"(peak {load.max_waiting or 0:.0f}), KV cache {100 * (load.mean_kv_usage or 0):.0f}% used"
        for w, load in known
    ]
    evidence.append(
        f"{busiest.name} queued while {idlest.name} had nothing waiting: the router sends more than "
        "its share to one replica (a cache-aware route keeping too much on the replica that cached a "
        "shared prompt, or a hash with no load bound); a route that weighs load (least-outstanding, "
        "prefix-aware's queue and active-request scores, prefix-hash's bound) spreads it"
    )
    return make_finding(
        FLEET_IMBALANCE, "One replica queues while another idles", min(1.0, busiest_w / (busiest_w + 1)), evidence
    )


def routing_cache_misses(replicas: Sequence[ReplicaLoad], repeated_share: float | None) -> Finding | None:
    queries = sum(load.prefix_cache_queries or 0.0 for load in replicas)
    hits = sum(load.prefix_cache_hits or 0.0 for load in replicas)
    if not queries or repeated_share is None:
        return None
    fleet_rate = hits / queries
    lost = repeated_share - fleet_rate
    if lost < LOST_HITS:
        return None
    evidence = [
        f"{load.name}: {100 * (load.prefix_cache_hit_rate or 0):.0f}% of its prompt tokens hit its prefix cache"
        for load in replicas
    ]
    evidence.append(
        f"the fleet hit {100 * fleet_rate:.0f}% of prompt tokens; the workload repeats "
        f"{100 * repeated_share:.0f}% (a shared prefix, a resent chat history), which one cache shared "
        f"by every replica could hit: {100 * lost:.0f}% of prompt tokens were prefilled again because the "
        "route sent them where they were not cached"
    )
    evidence.append(
        f"a route that sends a request where its prefix is cached ({CACHE_AWARE_ROUTES}) keeps those "
        "hits: `servelab simulate --replicas N --router ROUTER` prices each on this workload"
    )
    return make_finding(
        ROUTING_CACHE_MISSES,
        "The router scatters prompts away from the replica that cached them",
        min(1.0, lost / repeated_share),
        evidence,
    )


def outside_replicas(replicas: Sequence[ReplicaLoad], client_ttft_ms: float | None) -> Finding | None:
    sums = [load.server_ttft_sum_s for load in replicas]
    counts = [load.server_ttft_count for load in replicas]
    if client_ttft_ms is None or any(s is None for s in sums) or any(c is None for c in counts):
        return None  # no router, or a replica that exported no TTFT histogram
    timed = [(load, s or 0.0, c or 0) for load, s, c in zip(replicas, sums, counts)]
    if not sum(c for _, _, c in timed):
        return None
    server_ms = 1e3 * sum(s for _, s, _ in timed) / sum(c for _, _, c in timed)
    outside = client_ttft_ms - server_ms
    if outside < max(OUTSIDE_MS, OUTSIDE_SHARE * client_ttft_ms):
        return None
    evidence = [
        f"{load.name}: first token {1e3 * s / c:.0f} ms after the request reached it, over {c} requests"
        for load, s, c in timed
        if c
    ]
    evidence.append(
        f"the client's mean TTFT {client_ttft_ms:.0f} ms against the replicas' own {server_ms:.0f} ms: "
        f"{outside:.0f} ms of every first token ({100 * outside / client_ttft_ms:.0f}%) passes outside the "
        "replicas, in the router (its queue, its scoring, its proxying), on the network or in the client"
    )
    evidence.append(
        "a run straight to one replica at its share of the load (`servelab bench --base-url REPLICA`) leaves "
        "the network and the client; what it does not show is the router's"
    )
    return make_finding(
        OUTSIDE_REPLICAS,
        "First tokens wait outside the replicas: the router, the network or the client",
        min(1.0, outside / client_ttft_ms),
        evidence,
    )


def router_own_time(spent: RouterTime, client_ttft_ms: float) -> Finding | None:
    """A simulated router's own time (its scheduling, and tokenizing the prompts it scores) as the part of every
    first token spent outside the replicas, when it is material by the same bounds as a measured fleet's."""
    own_ms = 1e3 * spent.mean_s
    if own_ms < max(OUTSIDE_MS, OUTSIDE_SHARE * client_ttft_ms):
        return None
    evidence = [
        f"the router spends {own_ms:.1f} ms on each request before a replica sees it, on average over "
        f"{spent.requests} requests ({100 * own_ms / client_ttft_ms:.0f}% of the mean TTFT, {client_ttft_ms:.0f} ms)",
        f"it takes {1e3 * spent.fixed_s:.2f} ms to schedule any request, and tokenizes "
        f"{100 * spent.tokenized_share:.0f}% of the prompts itself at {1e6 * spent.per_tokenized_token_s:.2f} us "
        'a token (docs/fleets.md, "The router\'s own time"): long prompts it has not seen cost the most',
    ]
    return make_finding(
        OUTSIDE_REPLICAS,
        "First tokens wait in the router: its own scheduling and tokenizing",
        min(1.0, own_ms / client_ttft_ms),
        evidence,
    )
