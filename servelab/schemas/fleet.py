"""A fleet's replica as `bench` records it in run.json's `server_info.replicas` (servelab.metrics.scrape)."""

from __future__ import annotations

from pydantic import Field

from servelab.schemas.base import OpenModel


class ReplicaLoad(OpenModel):
    """One replica's share of a run, from its own /metrics: counters as their increase over the run, gauges as mean
    and peak; None where the replica did not export the quantity or no scrape answered."""

    url: str = Field(description="The replica's /metrics URL.")
    samples: int = Field(description="Scrapes that answered.")
    failures: int = Field(description="Scrapes that failed.")
    requests_served: int | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    prefix_cache_hit_rate: float | None = None
    server_ttft_sum_s: float | None = Field(None, description="The replica's own TTFT histogram: its sum's increase.")
    server_ttft_count: int | None = Field(None, description="...and its count's: the first tokens it timed.")
    mean_waiting: float | None = None
    max_waiting: float | None = None
    mean_running: float | None = None
    max_running: float | None = None
    mean_kv_usage: float | None = None
    max_kv_usage: float | None = None

    @property
    def name(self) -> str:
        """The replica's base URL, as the user gave it."""
        return self.url.removesuffix("/metrics")


class RouterTime(OpenModel):
    """A simulated router's own time over a run (servelab.sim.router's ROUTER_COSTS): what it spent on each request
    before the request reached a replica, which the first token waits for too."""

    requests: int = Field(description="Requests the router routed.")
    mean_s: float = Field(description="Its own time per request, on average (seconds).")
    tokenized_share: float = Field(description="Share of the requests whose prompt it tokenized in full.")
    fixed_s: float = Field(description="The price of every request (seconds).")
    per_tokenized_token_s: float = Field(description="The price of each prompt token it tokenizes (seconds).")
