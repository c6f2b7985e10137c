"""Fleet findings (servelab/diagnose/fleet.py) from replicas' loads as bench records them in server_info.replicas."""

from __future__ import annotations

import json

from servelab.diagnose.fleet import FLEET_IMBALANCE, OUTSIDE_REPLICAS, ROUTING_CACHE_MISSES, fleet_findings
from servelab.metrics import timeline as tl
from servelab.metrics.scrape import replica_load
from servelab.metrics.timeline import TimelineSample
from servelab.schemas.fleet import ReplicaLoad


def load(url: str, served: int, waiting: float, hits: float, queries: float) -> ReplicaLoad:
    return ReplicaLoad(
        url=url + "/metrics",
        samples=20,
        failures=0,
        requests_served=served,
        mean_waiting=waiting,
        max_waiting=3 * waiting,
        mean_kv_usage=0.4,
        prefix_cache_hits=hits,
        prefix_cache_queries=queries,
        prefix_cache_hit_rate=hits / queries,
    )


def test_a_replica_that_queues_beside_an_idle_one_is_an_imbalance():
    found = fleet_findings([load("http://a", 70, 4.0, 50, 100), load("http://b", 30, 0.0, 50, 100)], 0.5)
    assert [f.kind for f in found] == [FLEET_IMBALANCE]
    assert "http://a queued while http://b had nothing waiting" in found[0].evidence[-1]


def test_hits_far_below_what_the_workload_repeats_are_lost_to_routing():
    replicas = [load("http://a", 50, 0.2, 30, 100), load("http://b", 50, 0.3, 26, 100)]
    found = fleet_findings(replicas, repeated_share=0.68)
    assert [f.kind for f in found] == [ROUTING_CACHE_MISSES]
    assert "the fleet hit 28% of prompt tokens; the workload repeats 68%" in found[0].evidence[2]
    assert fleet_findings(replicas, repeated_share=0.33) == []  # within 10 points of what one cache could hit
    assert fleet_findings(replicas, repeated_share=None) == []


def test_one_replica_or_a_balanced_well_routed_fleet_has_no_finding():
    assert fleet_findings([load("http://a", 100, 5.0, 0, 100)], 0.9) == []
    assert fleet_findings([load("http://a", 50, 0.5, 60, 100), load("http://b", 50, 0.5, 62, 100)], 0.65) == []


def timed(url: str, served: int, server_ttft_ms: float) -> ReplicaLoad:
    return load(url, served, 0.2, 50, 100).model_copy(
        update={"server_ttft_sum_s": served * server_ttft_ms / 1e3, "server_ttft_count": served}
    )


def test_first_tokens_that_wait_behind_the_router_are_time_outside_the_replicas():
    replicas = [timed("http://a", 60, 80.0), timed("http://b", 40, 130.0)]
    found = fleet_findings(replicas, None, router_ttft_ms=250.0)
    assert [f.kind for f in found] == [OUTSIDE_REPLICAS]
    # the replicas' own mean is weighted by what each served: (60 x 80 + 40 x 130) / 100 = 100 ms
    assert "the client's mean TTFT 250 ms against the replicas' own 100 ms: 150 ms" in found[0].evidence[2]
    assert "http://a: first token 80 ms after the request reached it, over 60 requests" in found[0].evidence[0]


def test_a_few_milliseconds_outside_or_no_router_is_no_finding():
    replicas = [timed("http://a", 50, 100.0), timed("http://b", 50, 100.0)]
    assert fleet_findings(replicas, None, router_ttft_ms=115.0) == []  # 15 ms: under the 20 ms floor
    assert fleet_findings(replicas, None, router_ttft_ms=None) == []  # servelab routed, or a simulated fleet
    untimed = [load("http://a", 50, 0.2, 50, 100), load("http://b", 50, 0.2, 50, 100)]
    assert fleet_findings(untimed, None, router_ttft_ms=900.0) == []  # no replica exported its TTFT histogram


def test_a_replicas_load_as_bench_records_it_reads_as_a_replica_load():
    """The producer's dict (run.json's server_info.replicas) is what fleet_findings reads: no key drifts apart."""
    samples = [
        TimelineSample(0.0, {tl.E2E_COUNT: 10, tl.PREFIX_HITS: 0, tl.PREFIX_QUERIES: 0, tl.WAITING: 0, tl.TTFT_SUM: 1}),
        TimelineSample(1.0, {tl.E2E_COUNT: 40, tl.PREFIX_HITS: 30, tl.PREFIX_QUERIES: 120, tl.WAITING: 4}),
    ]
    samples[0].values.update({tl.TTFT_COUNT: 10, tl.KV_USAGE: 0.1})
    samples[1].values.update({tl.TTFT_SUM: 4, tl.TTFT_COUNT: 40})
    recorded = json.loads(json.dumps(replica_load("http://a/metrics", samples, failures=1)))  # as run.json holds it
    load = ReplicaLoad.model_validate(recorded)
    assert (load.name, load.samples, load.failures, load.requests_served) == ("http://a", 2, 1, 30)
    assert (load.prefix_cache_hit_rate, load.mean_waiting, load.max_waiting) == (0.25, 2.0, 4)
    assert (load.server_ttft_sum_s, load.server_ttft_count) == (3, 30)
    assert load.model_extra == {}  # every key the producer writes is a field
