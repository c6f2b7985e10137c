"""The inference-bench L4 runs, with and without the source's client warm-up, the simulated KV block pool followed
(docs/accuracy.md, "Long shared prompts on one L4").

benchmarks/gpu_accuracy.py replays these runs as the source ran and scored them (servelab/perf/data/published.yaml,
the comment above the inference-bench entries): counted prompt lengths, the client's warm-up of its first 2C
prompts (`client_warmup_requests`) and the throughput of scripts/reaggregate.py, C x output / sum(E2E)
(`throughput`). This script replays each run specs only, as gpu_accuracy.py does and without the warm-up, shows
the output throughput by the source's formula and over the elapsed time, and follows the simulated scheduler's KV
block pool through the measured requests (fewest free blocks, most requests running, preemptions). Run it from the
repository root:

    PYTHONPATH=. .venv/bin/python benchmarks/l4_long_prompts.py
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))

import gpu_accuracy  # noqa: E402  (the replay this varies)

from servelab.metrics.records import MemorySink  # noqa: E402
from servelab.metrics.summary import summarize  # noqa: E402
from servelab.sim.scheduler import Scheduler  # noqa: E402

RUNS = tuple(f"inference-bench-l4-qwen25-7b-long-c{c}" for c in (1, 16, 64))
SHORT_RUNS = tuple(f"inference-bench-l4-qwen25-7b-short-c{c}" for c in (16, 32, 64))
METRICS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms")
VARIANTS = {"as gpu_accuracy.py replays it": True, "no client warm-up": False}
"""Replay name -> whether the client's warm-up (the entry's client_warmup_requests) runs first."""


@dataclass
class PoolTrace:
    """The block pool and running queue after each schedule() from `since` on."""

    since: float = 0.0
    fewest_free: int | None = None
    most_running: int = 0
    preemptions_at_start: int | None = None
    preemptions: int = 0

    def seen(self, scheduler: Scheduler, now: float) -> None:
        if now < self.since:
            return
        if self.preemptions_at_start is None:
            self.preemptions_at_start = scheduler.num_preemptions
        free = scheduler.pool.num_free
        self.fewest_free = free if self.fewest_free is None else min(self.fewest_free, free)
        self.most_running = max(self.most_running, scheduler.num_running)
        self.preemptions = scheduler.num_preemptions - self.preemptions_at_start


@contextmanager
def traced(trace: PoolTrace) -> Iterator[None]:
    """Follow every Scheduler.schedule() of the replay into `trace`."""
    schedule = Scheduler.schedule

    def schedule_and_look(self: Scheduler, now: float) -> Any:
        out = schedule(self, now)
        trace.seen(self, now)
        return out

    Scheduler.schedule = schedule_and_look  # type: ignore[method-assign]
    try:
        yield
    finally:
        Scheduler.schedule = schedule  # type: ignore[method-assign]


def replay(entry: dict[str, Any], published: dict[str, Any], warm_up: bool) -> tuple[dict[str, Any], PoolTrace]:
    """The run replayed as gpu_accuracy.py does (with or without its warm-up), its output throughput over the elapsed
    time beside the source's, and the block pool seen through its measured requests."""
    entry = entry if warm_up else {**entry, "client_warmup_requests": 0}
    deployment = gpu_accuracy.specs_deployment(entry)
    plan, warmup = gpu_accuracy.warmed_plan(entry, published, deployment, None)
    trace, sink = PoolTrace(plan.warmup), MemorySink()
    with traced(trace):
        deployment.sim_target().run(plan, sink)
    records = [r for r in sink.records if r.index >= warmup]
    summary = summarize(records, duration=gpu_accuracy.scored_duration(entry, records)).model_dump()
    summary["elapsed_throughput"] = summarize(records).output_throughput
    return summary, trace


def _error(predicted: float, measured: float | None) -> str:
    return f"{predicted:,.1f} ({predicted / measured - 1:+.0%})" if measured else f"{predicted:,.1f}"


def table(entries: dict[str, dict[str, Any]], published: dict[str, Any]) -> str:
    head = ["run", "replay", "out tok/s, source's formula", "out tok/s over elapsed time", *METRICS]
    head += ["fewest free blocks", "most running", "preemptions"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in RUNS + SHORT_RUNS:
        measured = entries[run]["measured"]
        cells = [str(measured["output_throughput"]), "", *(str(measured.get(m)) for m in METRICS), "", "", ""]
        rows.append(f"| {run} | measured | " + " | ".join(cells) + " |")
        for name, warm_up in VARIANTS.items():
            got, trace = replay(entries[run], published, warm_up)
            cells = [_error(got[m], measured.get(m)) for m in ("output_throughput", "elapsed_throughput", *METRICS)]
            cells += [str(trace.fewest_free), str(trace.most_running), str(trace.preemptions)]
            rows.append(f"| {run} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    published = yaml.safe_load(gpu_accuracy.LENGTHS.read_text())
    entries = {e["id"]: e for e in gpu_accuracy.entries()}
    plan = gpu_accuracy.specs_deployment(entries[RUNS[0]]).memory
    print(
        f"KV cache of the replayed deployment: {plan.num_blocks} blocks of {plan.block_size} tokens "
        f"({plan.kv_token_capacity:,} tokens, {plan.kv_cache_bytes / 2**30:.2f} GiB)\n"
    )
    print(table(entries, published))


if __name__ == "__main__":
    main()
