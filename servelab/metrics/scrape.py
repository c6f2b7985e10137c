"""The server's timeline, scraped from its Prometheus `/metrics` endpoint during a run, with the GPUs' telemetry.

Scraping is evidence, not load: a missing metric, a server without
`/metrics`, or a scrape that fails or is slow must never fail or slow the
run, so every error here degrades to "no sample" and the scraper keeps going.
GPU telemetry (servelab/metrics/gpu.py), when the run has it, is read at the
same instants and merged into the same samples: one row per instant, whichever
of the two answered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import asyncio
import urllib.request
from collections.abc import Callable, Sequence

from prometheus_client.parser import text_string_to_metric_families

from servelab.metrics import engines
from servelab.metrics import timeline as tl
from servelab.metrics.engines import EngineMetrics
from servelab.metrics.gpu import GpuSampler
from servelab.metrics.timeline import TimelineSample

if TYPE_CHECKING:  # imported by the functions that send requests: a command that sends none starts without it
    import aiohttp

SCRAPE_TIMEOUT_S = 2.0


def parse_metrics(text: str, engine: EngineMetrics | None = None) -> dict[str, float]:
    """An engine's metric values from an exposition text: its own names and the timeline's common ones.

    `engine` None: whichever engine the text's names show (servelab/metrics/engines.py); a text with
    no known engine's names gives no values. Every gauge and counter of the engine is kept and so are
    histograms' `_sum` and `_count` (enough for means over any window; buckets are too bulky to keep
    every second). Values of one name with several label sets (models, engines, DP ranks) are
    combined: fractions averaged, the rest summed. Raises ValueError on text that is not Prometheus
    exposition format.
    """
    if engine is None:
        engine = engines.detect(text)
        if engine is None:
            return {}
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(_engine_lines(text, engine.prefix)):
        if not family.name.startswith(engine.prefix):
            continue
        for sample in family.samples:
            name = sample.name
            if family.type in ("histogram", "gauge_histogram", "summary"):
                if not (name.endswith("_sum") or name.endswith("_count")):
                    continue
            elif name.endswith("_created"):
                continue
            for key in (name, *engines.common_names(engine, name)):
                sums[key] = sums.get(key, 0.0) + float(sample.value)
                counts[key] = counts.get(key, 0) + 1
    return {name: (value / counts[name] if name in engine.fractions else value) for name, value in sums.items()}


def _engine_lines(text: str, prefix: str) -> str:
    """Only the engine's lines, without histogram buckets.

    Buckets are most of an engine's exposition and parsing them would stall
    the event loop that is timing the requests; dropping them first keeps a
    scrape well under a millisecond of client CPU.
    """
    comments = (f"# HELP {prefix}", f"# TYPE {prefix}")
    keep = []
    for line in text.splitlines():
        if line.startswith(prefix):
            if "_bucket{" not in line:
                keep.append(line)
        elif line.startswith(comments):
            keep.append(line)
    keep.append("")
    return "\n".join(keep)


CACHE_CONFIG = "server_cache_config"
"""run.json's key for the labels of the server's vllm:cache_config_info (what server_cache_config reads)."""


def server_cache_config(base_url: str, timeout: float = 5.0) -> dict[str, str]:
    """Labels of vLLM's `cache_config_info` metric (block size, KV bytes); empty when the server has no such metric."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return {}
    lines = [line for line in text.splitlines() if "cache_config_info" in line]
    try:
        for family in text_string_to_metric_families("\n".join(lines) + "\n"):
            for sample in family.samples:
                return dict(sample.labels)
    except ValueError:
        return {}
    return {}


class MetricsScraper:
    """Samples `/metrics` on an interval, stamping each sample with run time.

    `clock` returns seconds since the start of the run, so samples line up
    with the RequestRecords of the same run.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        clock: Callable[[], float],
        on_sample: Callable[[TimelineSample], None] | None,
        interval: float = 1.0,
        headers: dict[str, str] | None = None,
        gpu: GpuSampler | None = None,
        engine: EngineMetrics | None = None,
    ) -> None:
        self.session = session
        self.url = url
        self.clock = clock
        self.on_sample = on_sample
        self.interval = interval
        self.headers = headers
        self.gpu = gpu
        self.engine = engine
        """Whose names to read; None until a scrape shows them (then fixed for the run)."""
        self.samples: list[TimelineSample] = []
        self.failures = 0
        self.last_error: str | None = None

    async def fetch(self) -> dict[str, float] | None:
        """One instant's values: the server's and the GPUs', read concurrently; None when neither answered."""
        if self.gpu is None:
            return await self.fetch_server()
        server, gpu = await asyncio.gather(self.fetch_server(), self.gpu.sample())
        if server is None and not gpu:
            return None
        return {**(server or {}), **gpu}

    async def fetch_server(self) -> dict[str, float] | None:
        """One scrape's values; None (and a counted failure) when the endpoint fails or is not Prometheus text."""
        import aiohttp

        try:
            timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
            async with self.session.get(self.url, headers=self.headers, timeout=timeout) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                text = await resp.text()
            # Parsing takes milliseconds; in a worker thread the event loop that times requests
            # gets the interpreter back at every switch interval instead of waiting for the parse.
            if self.engine is None:
                self.engine = engines.detect(text)
            return await asyncio.to_thread(parse_metrics, text, self.engine) if self.engine is not None else {}
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, UnicodeDecodeError) as exc:
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            return None

    def record(self, t: float, values: dict[str, float]) -> TimelineSample:
        sample = TimelineSample(t=t, values=values)
        self.samples.append(sample)
        if self.on_sample is not None:
            self.on_sample(sample)
        return sample

    async def sample_once(self) -> TimelineSample | None:
        values = await self.fetch()
        return None if values is None else self.record(self.clock(), values)

    async def run(self, stop: asyncio.Event) -> None:
        """Scrape every `interval` seconds until `stop` is set; drift-free against run time."""
        next_t = self.clock() + self.interval
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, next_t - self.clock()))
                return
            except asyncio.TimeoutError:
                pass
            await self.sample_once()
            next_t = max(next_t + self.interval, self.clock())

    def stats(self) -> dict[str, object]:
        stats: dict[str, object] = {
            "url": self.url,
            "engine": None if self.engine is None else self.engine.name,
            "samples": len(self.samples),
            "failures": self.failures,
            "last_error": self.last_error,
        }
        if self.gpu is not None:
            stats["gpu"] = self.gpu.stats()
        return stats


class ReplicaScrapers:
    """Each replica's `/metrics`, scraped beside a run through a router (or over several `--base-url`), so the run
    says what each replica did: requests served, queue, KV usage and prefix-cache hits (`loads`)."""

    def __init__(self, scrapers: list[MetricsScraper]) -> None:
        self.scrapers = scrapers
        self._first: list[dict[str, float] | None] = []

    async def fetch_first(self) -> None:
        """Each replica's counters before the run (their values then are the run's zero)."""
        self._first = list(await asyncio.gather(*(s.fetch() for s in self.scrapers)))

    async def run(self, stop: asyncio.Event) -> None:
        for scraper, first in zip(self.scrapers, self._first):
            if first is not None:
                scraper.record(0.0, first)
        await asyncio.gather(*(s.run(stop) for s in self.scrapers))
        await asyncio.gather(*(s.sample_once() for s in self.scrapers))

    def loads(self) -> list[dict[str, object]]:
        return [replica_load(s.url, s.samples, s.failures) for s in self.scrapers]


def replica_load(url: str, samples: Sequence[TimelineSample], failures: int = 0) -> dict[str, object]:
    """One replica's share of the run from its samples (a real replica's scrapes, or a simulated replica's own
    metrics): counters as differences over the run (requests it finished, prefix-cache queries and hits, its own
    TTFT histogram's sum and count: the first tokens as the replica timed them), gauges as
    mean and peak (waiting, running, KV usage). None where the replica did not export the quantity or no scrape
    answered."""
    out: dict[str, object] = {"url": url, "samples": len(samples), "failures": failures}

    def delta(name: str) -> float | None:
        have = [s.values[name] for s in samples if name in s.values]
        return have[-1] - have[0] if have else None

    def gauge(name: str) -> tuple[float | None, float | None]:
        have = [s.values[name] for s in samples if name in s.values]
        return (sum(have) / len(have), max(have)) if have else (None, None)

    served = delta(tl.E2E_COUNT)
    hits, queries = delta(tl.PREFIX_HITS), delta(tl.PREFIX_QUERIES)
    ttft_count = delta(tl.TTFT_COUNT)
    out.update(
        requests_served=None if served is None else int(round(served)),
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        prefix_cache_hit_rate=hits / queries if hits is not None and queries else None,
        server_ttft_sum_s=delta(tl.TTFT_SUM),
        server_ttft_count=None if ttft_count is None else int(round(ttft_count)),
    )
    for key, name in (("waiting", tl.WAITING), ("running", tl.RUNNING), ("kv_usage", tl.KV_USAGE)):
        mean, peak = gauge(name)
        out.update({f"mean_{key}": mean, f"max_{key}": peak})
    return out
