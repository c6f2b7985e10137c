"""The inference-bench L4 long-prompt runs replayed as the source ran and scored them (docs/accuracy.md, "Long
shared prompts on one L4").

benchmarks/gpu_accuracy.py replays these runs with the published prompt-length estimate, no client warm-up and
throughput as output / elapsed time. The source differs on all three (servelab/perf/data/published.yaml, the
comment above the inference-bench entries):

- prompt lengths: the 10 distinct long prompts of prompts/workload.jsonl counted with Qwen2.5's tokenizer
  inside its chat template (COUNTED_LONG_PROMPT), not 30 + characters / 4;
- warm-up: bench_lib.run_benchmark_impl first runs the regime's first 2C prompts to completion on the same
  server, then the 100 measured ones, so their prompts are in the prefix cache;
- throughput: scripts/reaggregate.py divides the output by (sum of per-request wall times) / C.

Each long run is replayed specs only (the deployment gpu_accuracy builds) with each difference added in turn,
and the simulated scheduler's KV block pool is followed through the measured requests (fewest free blocks,
most requests running, preemptions); the short runs at C >= 16 are replayed as gpu_accuracy.py replays them,
for their throughput by the source's formula. Run it from the repository root:

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
from servelab.workload.spec import LoadPlan, RequestSpec  # noqa: E402

RUNS = tuple(f"inference-bench-l4-qwen25-7b-long-c{c}" for c in (1, 16, 64))
SHORT_RUNS = tuple(f"inference-bench-l4-qwen25-7b-short-c{c}" for c in (16, 32, 64))
"""Replayed as gpu_accuracy.py does only, for their throughput by the source's formula (their prompts are short
enough that neither the estimate nor the warm-up moves them)."""
COUNTED_LONG_PROMPT = {0: 1471, 1: 1450, 2: 1444, 4: 1440, 5: 1473, 6: 1470, 7: 1437, 8: 1497, 20: 1447, 30: 1469}
"""Tokens of each distinct long prompt, keyed by its first request (published_lengths.yaml same_prompt_as):
prompts/workload.jsonl at ree2raz/inference-bench 6219100, each prompt in Qwen2.5-7B-Instruct's chat template
("<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n
<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n"), encoded with the Qwen2 BPE's tokenizer.json
(`tokenizers`; "Hello world" -> [9707, 1879])."""
MEASURED_AFTER = 1000.0
"""Send time of the measured requests when a warm-up precedes them: after the warm-up has drained."""
METRICS = ("output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms")


@dataclass(frozen=True)
class Variant:
    name: str
    counted_lengths: bool
    warm_up: bool


VARIANTS = (
    Variant("estimated lengths, no warm-up (gpu_accuracy.py)", False, False),
    Variant("estimated lengths, 2C warm-up", False, True),
    Variant("counted lengths, no warm-up", True, False),
    Variant("counted lengths, 2C warm-up", True, True),
)


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


def lengths(published: dict[str, Any], run: str, counted: bool) -> dict[str, Any]:
    """The run's published lengths, with every request's prompt length counted where `counted`."""
    lens = dict(published[run])
    if counted:
        lens["input_lens"] = [COUNTED_LONG_PROMPT[s] for s in lens["same_prompt_as"]]
    return lens


def load(entry: dict[str, Any], lens: dict[str, Any], vocab: int, warm_up: bool) -> LoadPlan:
    """The replay's requests (gpu_accuracy._plan), after the source's warm-up of its first 2C where `warm_up`."""
    plan = gpu_accuracy._plan(entry, {entry["lengths"]: lens}, vocab, None)
    measured = list(plan.requests)
    if not warm_up:
        return plan
    warm = measured[: 2 * (plan.max_concurrency or 1)]
    requests = [RequestSpec(i, r.prompt_ids, r.max_tokens, 0.0) for i, r in enumerate(warm)]
    requests += [RequestSpec(len(warm) + i, r.prompt_ids, r.max_tokens, MEASURED_AFTER) for i, r in enumerate(measured)]
    return LoadPlan(requests, max_concurrency=plan.max_concurrency)


def replay(entry: dict[str, Any], published: dict[str, Any], variant: Variant) -> tuple[dict[str, Any], PoolTrace]:
    deployment = gpu_accuracy.specs_deployment(entry)
    lens = lengths(published, entry["lengths"], variant.counted_lengths)
    plan = load(entry, lens, deployment.model.vocab_size, variant.warm_up)
    since = MEASURED_AFTER if variant.warm_up else 0.0
    trace, sink = PoolTrace(since), MemorySink()
    with traced(trace):
        deployment.sim_target().run(plan, sink)
    summary = summarize(sink.records, warmup=since).model_dump(exclude_unset=True)
    # scripts/reaggregate.py: throughput = output / (sum of wall times / C)
    concurrency = entry["workload"]["max_concurrency"]
    out = sum(lens["output_lens"])
    summary["source_throughput"] = out / (summary["mean_e2el_ms"] / 1000 * summary["completed"] / concurrency)
    return summary, trace


def _error(predicted: float, measured: float | None) -> str:
    return f"{predicted:,.1f} ({predicted / measured - 1:+.0%})" if measured else f"{predicted:,.1f}"


def table(entries: dict[str, dict[str, Any]], published: dict[str, Any]) -> str:
    head = ["run", "replay", "out tok/s", "out tok/s, source's formula", *METRICS[1:], "fewest free blocks"]
    head += ["most running", "preemptions"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in RUNS + SHORT_RUNS:
        entry = entries[run]
        measured = entry["measured"]
        rows.append(
            f"| {run} | measured | {measured['output_throughput']} | {measured['output_throughput']} | "
            + " | ".join(str(measured.get(m)) for m in METRICS[1:])
            + " | | | |"
        )
        for variant in VARIANTS if run in RUNS else VARIANTS[:1]:
            got, trace = replay(entry, published, variant)
            cells = [_error(got["output_throughput"], measured["output_throughput"])]
            cells.append(_error(got["source_throughput"], measured["output_throughput"]))
            cells += [_error(got[m], measured.get(m)) for m in METRICS[1:]]
            cells += [str(trace.fewest_free), str(trace.most_running), str(trace.preemptions)]
            rows.append(f"| {run} | {variant.name} | " + " | ".join(cells) + " |")
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
