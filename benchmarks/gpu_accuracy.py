"""The simulator against published real-GPU vLLM runs (servelab/perf/data/published.yaml).

Each run is replayed the way a user would replay it with `servelab simulate`:
the same `--gpu/--model/--engine-args` (plus `--no-async-scheduling` for
engines older than 0.14, which ran the synchronous loop by default; vLLM's defaults for everything the
source leaves at default, the default cost model, no calibration) and the
same workload flags through the same library path (`build_plan` ->
`Deployment.sim_target().run` -> `summarize`):

- `random`: `--dataset-name random` with the published lengths (fixed, or
  uniform within `range_ratio`);
- `prefix`: `--dataset-name prefix --prefix-len P --num-prefixes G` with the
  rest of the published mean prompt as each request's own tokens;
- `sharegpt`: no ShareGPT file ships here, so lognormal lengths (coefficient of
  variation 1) kept only where the benchmark clients keep a conversation
  (`sharegpt_stand_in`: vLLM's is_valid_sequence, as sglang.bench_serving) and
  scaled to the published means, random tokens;
- `prompt_pool` (inference-perf's shared-prefix load): that many prompts made once, with the
  prefix groups above, resent whole in one fixed cycle;
- where the source published every request's lengths (published_lengths.yaml),
  those requests as they are (a JSONL dataset of token ids), a resent prompt
  with the same tokens;
- arrival: `--request-rate` (inf, or req/s with `--burstiness`) and
  `--max-concurrency`, `--num-prompts` as published;
- a client that warmed the server first (`client_warmup_requests`): its first
  requests sent at t=0 and run to completion, then the measured ones, which
  alone are summarized;
- throughput as the source computed it (`throughput`: over the elapsed time,
  or C x output / the sum of the requests' E2E).

Errors are predicted / measured - 1 per metric; the summary gives, per metric,
the number of runs, MAPE, median |error| and the signed mean (MPE), in the
form of inference-sim's sim-to-real study, for V1-era and V0-era runs
separately. Runs whose GPU the source does not name, and runs an entry marks
`in_summary: false` (a flag the simulator does not model), are shown but left
out of the summary. Prints Markdown (docs/accuracy.md); deterministic.

Scoring is held out. Every constant of the simulator read off a published run
is named in FITTED_CONSTANTS with the runs it was read from; those runs and every
other run of the same source (host and harness) leave the scored set and are
shown apart as "match by construction". An open loop the simulator serves at its
offered rate has that rate as its throughput by construction: its throughput is
shown apart, the headline covers the runs where it can be wrong. Scored runs are
tabled by regime (`servelab.metrics.intervals.classify_regime`, the same function
a user's prediction is classified by), by source and by tier (TIERS: a tier is a
function that turns an entry into a prediction). `--write-residuals` writes the
scored runs' log(measured / predicted) per tier, regime, limit (`classify_limit`:
the engine, or the API server's core) and metric to
servelab/perf/data/prediction_residuals.yaml, which every simulated summary's 80%
intervals are read from; their coverage is measured by leaving each source out in
turn, building the intervals from the others and counting its values inside.

    .venv/bin/python benchmarks/gpu_accuracy.py [--only ID ...] [--max-prompts N] [--write-residuals]
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import cache
from itertools import chain
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import yaml

from servelab.calibrate.calibrate_from import CalibrateFromError, fit_from_runs
from servelab.targets.profile import with_environment
from servelab.metrics.imports import MEASURED_KEYS, MeasuredRun, ResultFormat
from servelab.metrics.intervals import (
    API_SERVER_BOUND_SHARE,
    LEVEL,
    RESIDUALS,
    Limit,
    Regime,
    Residual,
    ResidualTable,
    Tier,
    classify_limit,
    classify_regime,
    metric_bounds,
)
from servelab.metrics.records import MemorySink, RequestRecord
from servelab.metrics.summary import summarize
from servelab.schemas.profile import EnvironmentFit
from servelab.perf.engine_args import parse_engine_args
from servelab.perf.errors import PerfConfigError
from servelab.perf.published import (
    LENGTHS,
    PUBLISHED,
    ThroughputFormula,
    client_warmup_requests,
    published_entries,
    throughput_formula,
)
from servelab.targets.deployment import Deployment, build_deployment
from servelab.workload.arrival import ArrivalConfig, schedule
from servelab.workload.datasets import SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL, SHAREGPT_MIN_LEN, WorkloadConfig
from servelab.workload.plan import Amount, build_plan
from servelab.workload.spec import LoadPlan, RequestSpec

REPLAYED_DATASETS = ("random", "prefix", "sharegpt")

METRICS = (
    "request_throughput",
    "output_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p90_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p90_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "median_e2el_ms",
    "p90_e2el_ms",
    "p99_e2el_ms",
)
SHORT = {
    m: m.replace("_ms", "")
    .replace("request_throughput", "req/s")
    .replace("output_throughput", "out tok/s")
    .replace("median_", "p50_")
    for m in METRICS
}
FLOORS = {"request_throughput": 0.15, "mean_ttft_ms": 0.25, "mean_tpot_ms": 0.10}
"""The floors on the held-out V1 table's median |error|, over every class and on the saturated class alone."""
HEADLINE = ("request_throughput", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms")
"""The metrics the tables by class, source and tier show."""
THROUGHPUTS = ("request_throughput", "output_throughput")


@dataclass(frozen=True)
class FittedConstant:
    """A constant of the simulator read off published runs: those runs, and their source's others, are not scored."""

    name: str
    where: str
    runs: tuple[str, ...]


FITTED_CONSTANTS = (
    FittedConstant(
        "CostCoefficients.eager_launch_s_per_layer = 0.64 ms (host time to launch a layer's kernels "
        "without CUDA graphs)",
        "servelab/schemas/profile.py",
        ("staru09-a100-80gb-llama31-8b-c20",),
    ),
)
"""Every constant read off a published run (grep 'read off' in servelab/ and docs/). Choices the published runs
informed without fixing a number (which measured vLLM release's CPU costs a release in between takes,
vllm_cpu_costs.measured) are not constants; they are named in docs/accuracy.md."""


PUBLISHED_FILE = [PUBLISHED]
"""The published-runs file replayed: published.yaml, or another one set by use_published (moe_accuracy.py)."""


def use_published(path: Path) -> None:
    """Replay the runs of `path` instead of published.yaml (the same scoring, another class of runs)."""
    PUBLISHED_FILE[0] = path
    entries.cache_clear()
    fitted_sources.cache_clear()


@cache
def entries() -> tuple[dict[str, Any], ...]:
    """The published-runs file's entries, read once (the tiers look up sibling runs for every entry)."""
    return tuple(published_entries(PUBLISHED_FILE[0]))


def constants_here() -> tuple[FittedConstant, ...]:
    """The fitted constants read off runs of the file being replayed (another file's runs are not here to hold out)."""
    ids = {e["id"] for e in entries()}
    return tuple(c for c in FITTED_CONSTANTS if set(c.runs) <= ids)


def source_of(entry: dict[str, Any]) -> str:
    """The publisher of a run (one host and harness): its repository, else its URL's site and first path segments, an
    issue's or pull request's number included (each is one reporter's host, not the repository's)."""
    src = entry["source"]
    if src.get("repo"):
        return str(src["repo"])
    url = urlparse(src["url"])
    parts = [p for p in url.path.split("/") if p]
    if url.netloc != "github.com":
        return url.netloc
    return "/".join([url.netloc, *parts[: 4 if parts[2:3] in (["issues"], ["pull"]) else 2]])


@cache
def fitted_sources() -> dict[str, FittedConstant]:
    """Source -> the constant read off one of its runs."""
    by_id = {e["id"]: e for e in entries()}
    return {source_of(by_id[run]): c for c in constants_here() for run in c.runs}


def not_replayable(entry: dict[str, Any]) -> str | None:
    """Why the entry cannot be replayed, or None."""
    w = entry["workload"]
    if entry.get("lengths"):
        return None
    if w["dataset"] not in REPLAYED_DATASETS or not (w.get("mean_input_len") and w.get("mean_output_len")):
        return "the source gives no request lengths"
    return None


def _plan(entry: dict[str, Any], published: dict[str, Any], vocab: int, max_prompts: int | None) -> LoadPlan:
    """The entry's load, built as `servelab simulate`'s flags would build it."""
    w = entry["workload"]
    n = min(w["num_prompts"], max_prompts or w["num_prompts"])
    rate = float(w.get("request_rate", "inf"))
    arrival = ArrivalConfig(
        request_rate=rate, burstiness=float(w.get("burstiness", 1.0)), max_concurrency=w.get("max_concurrency")
    )
    if entry.get("lengths"):
        # The source's own per-request lengths, all released at t=0 (its request rate is inf); a request
        # that resent an earlier prompt sends that prompt's tokens again, as a JSONL dataset of token ids would.
        lens = published[entry["lengths"]]
        same = lens.get("same_prompt_as") or range(len(lens["input_lens"]))
        rng = np.random.default_rng(0)
        prompts: dict[int, np.ndarray] = {}
        specs = [
            RequestSpec(i, prompts.setdefault(s, rng.integers(0, vocab, p, dtype=np.int32)), max(1, o), 0.0)
            for i, (p, o, s) in enumerate(zip(lens["input_lens"][:n], lens["output_lens"][:n], same))
        ]
        return LoadPlan(specs, max_concurrency=arrival.max_concurrency)
    inp, out = round(w["mean_input_len"]), round(w["mean_output_len"])
    if w.get("prompt_pool"):
        return LoadPlan(schedule(_pooled_prompts(w, inp, out, vocab, n), arrival, np.random.default_rng(1), count=n))
    if w["dataset"] == "sharegpt":
        requests = schedule(_sharegpt_prompts(w, vocab, n), arrival, np.random.default_rng(1), count=n)
        return LoadPlan(requests, max_concurrency=arrival.max_concurrency)
    if w["dataset"] == "prefix":
        workload = WorkloadConfig(
            "prefix",
            input_len=inp - w["prefix_len"],
            output_len=out,
            length_distribution="fixed",
            prefix_len=w["prefix_len"],
            num_prefixes=w["num_prefixes"],
        )
    else:
        workload = WorkloadConfig("random", input_len=inp, output_len=out, range_ratio=float(w.get("range_ratio", 0.0)))
    return build_plan(workload, arrival, Amount(num_prompts=n))


def sharegpt_stand_in(mean_input: float, mean_output: float, n: int) -> dict[str, list[int]]:
    """`n` (prompt, reply) lengths standing in for a published ShareGPT sample, whose per-request lengths the sources
    do not publish: lognormal lengths (coefficient of variation 1), kept only where the benchmark clients keep a
    conversation (vLLM's benchmarks/datasets.py is_valid_sequence, as sglang.bench_serving: both at least 4 tokens,
    the prompt at most 1,024, prompt and reply at most 2,048), the first `n` kept scaled to the published means.
    Unfiltered, the stand-in would send replies no published sample holds (5,636 tokens among 1,000), and a burst
    lasts as long as its longest reply."""
    published = np.array([[mean_input], [mean_output]])
    sigma = np.sqrt(np.log(2.0))  # a lognormal whose standard deviation is its mean
    shapes = np.exp(sigma * np.random.default_rng(0).standard_normal((2, 20_000)) - sigma**2 / 2)
    scale = published
    for _ in range(30):  # the filter trims the tails, so rescale until the kept means are the published ones
        prompt, reply = np.rint(scale * shapes)
        kept = (np.minimum(prompt, reply) >= SHAREGPT_MIN_LEN) & (prompt <= SHAREGPT_MAX_PROMPT)
        kept &= prompt + reply <= SHAREGPT_MAX_TOTAL
        prompt, reply = prompt[kept][:n], reply[kept][:n]
        if len(reply) < n:
            raise ValueError(f"the ShareGPT stand-in keeps {len(reply)} of 20,000 draws, fewer than the {n} asked for")
        scale = scale * published / np.array([[prompt.mean()], [reply.mean()]])
    return {"input_lens": prompt.astype(int).tolist(), "output_lens": reply.astype(int).tolist()}


def _sharegpt_prompts(w: dict[str, Any], vocab: int, n: int) -> Iterator[RequestSpec]:
    """A ShareGPT run's requests: random tokens at the stand-in's kept lengths (sharegpt_stand_in)."""
    lens = sharegpt_stand_in(w["mean_input_len"], w["mean_output_len"], n)
    rng = np.random.default_rng(0)
    for i, (prompt, reply) in enumerate(zip(lens["input_lens"], lens["output_lens"])):
        yield RequestSpec(i, rng.integers(0, vocab, prompt, dtype=np.int32), reply)


def _pooled_prompts(w: dict[str, Any], inp: int, out: int, vocab: int, n: int) -> Iterator[RequestSpec]:
    """inference-perf's shared-prefix load: `prompt_pool` prompts made once (num_prefixes groups, each prompt its
    group's prefix_len tokens then its own), sent in one fixed shuffled cycle, so later requests resend earlier
    prompts whole and vLLM's prefix cache holds them (SharedPrefixDataGenerator, see published.yaml)."""
    rng = np.random.default_rng(0)
    groups, pool, prefix_len = w["num_prefixes"], w["prompt_pool"], w["prefix_len"]
    prefixes = [rng.integers(0, vocab, prefix_len, dtype=np.int32) for _ in range(groups)]
    prompts = [
        np.concatenate([prefixes[g % groups], rng.integers(0, vocab, inp - prefix_len, dtype=np.int32)])
        for g in range(pool)
    ]
    order = rng.permutation(pool)
    for i in range(n):
        k = int(order[i % pool])
        yield RequestSpec(i, prompts[k], out, prefix_group=k % groups, prefix_len=prefix_len)


@dataclass(frozen=True)
class Replay:
    entry: dict[str, Any]
    predicted: dict[str, Any]
    prompts: int
    """Requests replayed (the source's num_prompts unless --max-prompts cut it)."""
    seconds: float
    """Wall time of the replay, for the benchmark's own cost."""
    regime: Regime = Regime.UNDER_CAPACITY
    """As `classify_regime` files the prediction (what a user's prediction of this run would be filed under)."""
    tier: Tier = Tier.SPECS_ONLY
    limit: Limit = Limit.ENGINE
    """As `classify_limit` files the prediction, from the simulated run's API-server busy share."""
    calibrated_on: str | None = None
    """The calibrated tier's reference run (never the run itself)."""

    @property
    def in_summary(self) -> bool:
        """False for a run whose GPU the source leaves out, or one the entry keeps out (`in_summary: false`)."""
        return bool(self.entry.get("gpu_stated", True) and self.entry.get("in_summary", True))

    @property
    def source(self) -> str:
        return source_of(self.entry)

    @property
    def by_construction(self) -> bool:
        """A constant was read off this run or a sibling of it (same source): it matches by construction."""
        return self.source in fitted_sources()

    @property
    def scored(self) -> bool:
        """In the held-out tables and the residuals: a V1 run in the summary whose source no constant was read off."""
        return self.in_summary and self.entry["era"] == "v1" and not self.by_construction

    @property
    def served_at_offered_rate(self) -> bool:
        """An open loop the simulator served under capacity: its throughput is the offered rate by construction."""
        w = self.entry["workload"]
        return (
            str(w.get("request_rate", "inf")) != "inf"
            and not w.get("max_concurrency")
            and self.regime != Regime.SATURATED
        )

    def error(self, metric: str) -> float | None:
        measured = self.entry["measured"].get(metric)
        predicted = self.predicted.get(metric)
        if not measured or predicted is None:
            return None
        return float(predicted) / measured - 1

    def scored_error(self, metric: str) -> float | None:
        """The error where it can be wrong: None off the scored set, and for a throughput served at the offered rate."""
        if not self.scored or (metric in THROUGHPUTS and self.served_at_offered_rate):
            return None
        return self.error(metric)

    def residual(self, metric: str) -> float | None:
        """log(measured / predicted), the unit intervals are built in; None where scored_error is."""
        err = self.scored_error(metric)
        return None if err is None or err <= -1 else -math.log1p(err)


def stated_version(text: str) -> str | None:
    """The vLLM release a source states ("0.15.1"; "main, May 2025 (~0.9)" is 0.9); None: not stated.

    The replay runs that release's defaults and CPU costs (perf/vllm_versions.py,
    perf/vllm_cpu_costs.py); a run whose version is not stated keeps the modelled release's.
    A V0-era run (before 0.8, its own table) is replayed as the earliest V1 release, 0.8.
    """
    found = re.search(r"(\d+)\.(\d+)", text)
    if not found:
        return None
    return f"{found[1]}.{found[2]}" if (int(found[1]), int(found[2])) >= (0, 8) else "0.8"


def specs_deployment(entry: dict[str, Any]) -> Deployment:
    """The deployment as `simulate --gpu --model --engine-args --vllm-version` builds it from what the source states."""
    version = stated_version(str(entry.get("vllm_version", "")))
    return build_deployment(entry["gpu"], entry["model"], entry.get("engine_args") or "", vllm_version=version)


def replay(
    entry: dict[str, Any],
    published: dict[str, Any],
    max_prompts: int | None = None,
    deployment: Deployment | None = None,
    tier: Tier = Tier.SPECS_ONLY,
) -> Replay:
    """The entry's load on `deployment` (None: specs only), summarized and filed under its regime and limit."""
    deployment = deployment or specs_deployment(entry)
    start = time.perf_counter()
    plan, warmup = warmed_plan(entry, published, deployment, max_prompts)
    sink = MemorySink()
    run = deployment.sim_target().run(plan, sink)
    records = [r for r in sink.records if r.index >= warmup]
    regime = classify_regime(records, plan.max_concurrency, summarize(records).model_dump(exclude_unset=True))
    summary = summarize(records, duration=scored_duration(entry, records)).model_dump(exclude_unset=True)
    seconds = time.perf_counter() - start
    return Replay(
        entry, summary, int(summary["completed"]), seconds, regime, tier, limit=classify_limit(run.client_stats)
    )


def warmed_plan(
    entry: dict[str, Any], published: dict[str, Any], deployment: Deployment, max_prompts: int | None
) -> tuple[LoadPlan, int]:
    """The entry's load after its client's warm-up (`client_warmup_requests`), and how many requests lead it.

    The warm-up is the run's first requests (of the whole run, whatever --max-prompts keeps) sent at t=0 under
    the run's concurrency; the measured requests are sent once its last has finished, as the source's client
    sends its second batch, so they find the warm-up's prompts in the prefix cache. Requests with an index
    below the count are the warm-up's, left out of the scored records."""
    vocab = deployment.model.vocab_size
    measured = _plan(entry, published, vocab, max_prompts)
    count = client_warmup_requests(entry)
    if not count:
        return measured, 0
    warmup = list(_plan(entry, published, vocab, None).requests)[:count]
    drained = _drained_at(deployment, LoadPlan(warmup, max_concurrency=measured.max_concurrency))
    requests = [replace(r, index=i, arrival_time=0.0) for i, r in enumerate(warmup)]
    requests += [
        replace(r, index=len(warmup) + i, arrival_time=drained + r.arrival_time)
        for i, r in enumerate(measured.requests)
    ]
    return replace(measured, requests=requests, warmup=drained), len(warmup)


def _drained_at(deployment: Deployment, warmup: LoadPlan) -> float:
    """When the last warm-up request finishes on `deployment` (the simulator is deterministic: it finishes at the same
    time ahead of the measured requests)."""
    sink = MemorySink()
    deployment.sim_target().run(warmup, sink)
    return max(r.finish_time for r in sink.records)


def scored_duration(entry: dict[str, Any], records: list[RequestRecord]) -> float | None:
    """What the entry's throughputs are divided by, as its source divided them (`throughput`); None: the elapsed
    time, from the first send to the last finish."""
    if throughput_formula(entry) is ThroughputFormula.CONCURRENCY_OVER_SUM_E2E:
        return sum(r.e2el for r in records if r.ok) / entry["workload"]["max_concurrency"]
    return None


TierPrediction = Callable[[dict[str, Any], dict[str, Any], int | None], Replay | None]
"""A tier: (entry, published lengths, max_prompts) -> the entry predicted in that tier, or None when the tier cannot
predict it (no other run of its source and GPU to calibrate from)."""


def specs_only(entry: dict[str, Any], published: dict[str, Any], max_prompts: int | None) -> Replay:
    return replay(entry, published, max_prompts)


def measured_run(entry: dict[str, Any], published: dict[str, Any], deployment: Deployment) -> MeasuredRun:
    """A published run as `calibrate --from` reads a result file: the requests it sent and what it measured."""
    plan = _plan(entry, published, deployment.model.vocab_size, None)
    measured = {k: float(v) for k, v in entry["measured"].items() if k in MEASURED_KEYS and isinstance(v, int | float)}
    return MeasuredRun(entry["id"], ResultFormat.SERVELAB, tuple(plan.requests), plan.max_concurrency, measured, "file")


def calibration_run(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The run the calibrated tier fits `entry`'s environment on: the first other replayable run in the summary from
    the same source and GPU (file order), as a user calibrates from one run of their server and predicts the rest."""
    return next(
        (
            e
            for e in entries()
            if e["id"] != entry["id"]
            and source_of(e) == source_of(entry)
            and e["gpu"] == entry["gpu"]
            and e.get("in_summary", True)
            and e.get("gpu_stated", True)
            and e["era"] == entry["era"]
            and not not_replayable(e)
        ),
        None,
    )


@cache
def fitted_environment(reference_id: str) -> EnvironmentFit:
    """`calibrate --from` on one published run (as the user would: specs-only deployment, the run's requests)."""
    reference = next(e for e in entries() if e["id"] == reference_id)
    deployment = specs_deployment(reference)
    published = yaml.safe_load(LENGTHS.read_text())
    profile = fit_from_runs([measured_run(reference, published, deployment)], deployment, max_evaluations=20)
    assert profile.environment is not None
    return profile.environment


def calibrated_from_one_run(entry: dict[str, Any], published: dict[str, Any], max_prompts: int | None) -> Replay | None:
    """The entry predicted in the environment fitted on another run of its source and GPU (None: it has none, or
    calibrate --from refuses that run; V0-era runs are not scored, so not calibrated)."""
    reference = calibration_run(entry)
    if reference is None or entry["era"] != "v1":
        return None
    try:
        environment = fitted_environment(reference["id"])
    except CalibrateFromError:  # calibrate --from refuses the reference (a request longer than max_model_len)
        return None
    deployment = with_environment(specs_deployment(entry), environment)
    return replace(
        replay(entry, published, max_prompts, deployment, Tier.CALIBRATED_FROM_RUNS), calibrated_on=reference["id"]
    )


TIERS: dict[Tier, TierPrediction] = {Tier.SPECS_ONLY: specs_only, Tier.CALIBRATED_FROM_RUNS: calibrated_from_one_run}
"""The tiers scored: specs only, and calibrated from one run of the same source and GPU (predicting the others)."""


def run(
    only: set[str] | None = None, max_prompts: int | None = None, tier: Tier = Tier.SPECS_ONLY
) -> tuple[list[Replay], list[tuple[dict[str, Any], str]]]:
    """Every selected entry replayed in `tier`, and those that cannot be, with the reason."""
    published = yaml.safe_load(LENGTHS.read_text())
    predict = TIERS[tier]
    done, skipped = [], []
    for entry in entries():
        if only and entry["id"] not in only:
            continue
        reason = not_replayable(entry)
        try:
            row = None if reason else predict(entry, published, max_prompts)
        except PerfConfigError as refused:  # the deployment servelab refuses to build, though the source ran it
            row, reason = None, f"servelab refuses the deployment: {refused}"
        if row is None:
            skipped.append((entry, reason or f"tier {tier} cannot predict it"))
        else:
            done.append(row)
    return done, skipped


def run_tiers(
    only: set[str] | None = None, max_prompts: int | None = None
) -> tuple[list[Replay], list[tuple[dict[str, Any], str]]]:
    """Every selected entry replayed in every tier; the entries that cannot be replayed at all (specs only's)."""
    rows: list[Replay] = []
    skipped: list[tuple[dict[str, Any], str]] = []
    for tier in TIERS:
        done, left = run(only, max_prompts, tier)
        rows += done
        skipped += left if tier == Tier.SPECS_ONLY else []
    return rows, skipped


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.0f}%"


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _load(entry: dict[str, Any]) -> str:
    w = entry["workload"]
    if w.get("max_concurrency"):
        load = f"C={w['max_concurrency']}"
    elif str(w.get("request_rate", "inf")) == "inf":
        load = "burst (rate inf)"
    else:
        kind = "Poisson" if float(w.get("burstiness", 1)) == 1 else "constant"
        load = f"{kind} {w['request_rate']:g}/s"
    return f"{w['dataset']} {w.get('mean_input_len')}/{w.get('mean_output_len')}, {load}, n={w.get('num_prompts')}"


def _table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


def per_run_table(rows: list[Replay]) -> str:
    """One line per run: setup, then measured / predicted (error) for every metric the source gives."""
    lines = []
    for r in rows:
        cells = [
            f"{SHORT[m]} {_num(r.entry['measured'][m])} / {_num(float(r.predicted[m]))} ({_pct(r.error(m))})"
            for m in METRICS
            if r.entry["measured"].get(m) is not None and m in r.predicted
        ]
        gpu = (
            r.entry["gpu"]
            + ("" if r.entry.get("gpu_stated", True) else " (assumed)")
            + ("" if r.entry.get("in_summary", True) else " (not in summary)")
        )
        config = parse_engine_args(r.entry.get("engine_args") or "").config
        layout = f"TP{config.tensor_parallel_size}" + (
            " EP" if getattr(config, "enable_expert_parallel", False) else ""
        )
        lines.append(
            [
                r.entry["id"],
                gpu,
                f"{Path(r.entry['model']).name} {layout}",
                str(r.entry["vllm_version"]),
                _load(r.entry),
                _status(r),
                "<br>".join(cells),
            ]
        )
    return _table(["run", "GPU", "model", "vLLM", "workload", "class", "measured / predicted (error)"], lines)


def _status(r: Replay) -> str:
    """The run's regime, and why it is not scored where it is not."""
    why = (
        "match by construction"
        if r.by_construction
        else "not in summary"
        if not r.in_summary
        else "V0 era"
        if r.entry["era"] != "v1"
        else "served at the offered rate"
        if r.served_at_offered_rate
        else ""
    )
    return f"{r.regime}" + (f" ({why})" if why else "")


def summary_rows(rows: list[Replay]) -> list[tuple[str, int, float, float, float]]:
    """(metric, runs, MAPE, median |error|, MPE) over the runs in the summary, for metrics any run gives."""
    out = []
    for m in METRICS:
        errs = [e for r in rows if r.in_summary and (e := r.error(m)) is not None]
        if errs:
            out.append(
                (
                    m,
                    len(errs),
                    statistics.fmean(map(abs, errs)),
                    statistics.median(map(abs, errs)),
                    statistics.fmean(errs),
                )
            )
    return out


def summary_table(rows: list[Replay]) -> str:
    lines = [
        [SHORT[m], str(n), f"{100 * mape:.1f}%", f"{100 * med:.1f}%", f"{100 * mpe:+.1f}%"]
        for m, n, mape, med, mpe in summary_rows(rows)
    ]
    return _table(["metric", "runs", "MAPE", "median abs error", "MPE (signed)"], lines)


BLIS_COLUMNS = (
    "mean_e2el_ms",
    "p90_e2el_ms",
    "p99_e2el_ms",
    "mean_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p90_tpot_ms",
    "p99_tpot_ms",
)
"""inference-sim's sim-to-real columns (experiment/report.py _METRIC_COLS), TPOT in place of its ITL."""


def blis_table(rows: list[Replay], label: str) -> str:
    """One row of MAPE per column, in the layout of inference-sim's aggregate table, so the two can sit side by side."""
    mape = {m: (v, n) for m, n, v, _, _ in summary_rows(rows)}
    cells = [f"{100 * mape[m][0]:.1f} (n={mape[m][1]})" if m in mape else "N/A" for m in BLIS_COLUMNS]
    head = ["Simulator", *(m.replace("_ms", "").replace("e2el", "e2e") for m in BLIS_COLUMNS)]
    return _table(head, [[label, *cells]])


def floors(rows: list[Replay], floors_: dict[str, float], label: str) -> str:
    """Median |error| over the held-out runs against the floors, one verdict per metric."""
    parts = []
    for m, floor in floors_.items():
        errs = [abs(e) for r in rows if (e := r.scored_error(m)) is not None]
        med = statistics.median(errs) if errs else None
        parts.append(
            f"{SHORT[m]}: no run gives it"
            if med is None
            else f"{SHORT[m]} {100 * med:.1f}% over {len(errs)} "
            f"(floor {100 * floor:.0f}%: {'met' if med <= floor else 'missed'})"
        )
    return f"{label}: " + "; ".join(parts)


def _commit() -> str:
    """The commit the simulator ran at, and whether servelab/ had uncommitted changes (then the table is not that
    commit's)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, cwd=Path(__file__).parent, check=True
        ).stdout.strip()

    try:
        dirty = git("status", "--porcelain", "--", "servelab")
        return git("rev-parse", "--short", "HEAD") + (" with uncommitted changes to servelab/" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def _stats(errs: list[float]) -> list[str]:
    """runs, median |error|, MAPE, MPE as table cells ("—" for none)."""
    if not errs:
        return ["0", "—", "—", "—"]
    return [
        str(len(errs)),
        f"{100 * statistics.median(map(abs, errs)):.1f}%",
        f"{100 * statistics.fmean(map(abs, errs)):.1f}%",
        f"{100 * statistics.fmean(errs):+.1f}%",
    ]


def class_table(rows: list[Replay]) -> str:
    """The held-out headline: per regime and metric, over the scored runs where the metric can be wrong."""
    lines = []
    for regime in Regime:
        group = [r for r in rows if r.regime == regime]
        for m in HEADLINE:
            errs = [e for r in group if (e := r.scored_error(m)) is not None]
            if errs:
                lines.append([str(regime), SHORT[m], *_stats(errs)])
    return _table(["class", "metric", "runs", "median abs error", "MAPE", "MPE (signed)"], lines)


def source_table(rows: list[Replay]) -> str:
    """Median |error| per source (scored runs), one column per headline metric (runs in brackets)."""
    lines = []
    for source in sorted({r.source for r in rows if r.scored}):
        group = [r for r in rows if r.source == source and r.scored]
        classes = ", ".join(
            f"{sum(r.regime == g for r in group)} {g}" for g in Regime if any(r.regime == g for r in group)
        )
        cells = []
        for m in HEADLINE:
            errs = [e for r in group if (e := r.scored_error(m)) is not None]
            cells.append(f"{100 * statistics.median(map(abs, errs)):.1f}% ({len(errs)})" if errs else "—")
        lines.append([source, classes, *cells])
    return _table(["source", "runs by class", *(SHORT[m] for m in HEADLINE)], lines)


def tier_table(by_tier: dict[Tier, list[Replay]]) -> str:
    """Median |error| per tier and metric over the scored runs each tier predicted."""
    lines = []
    for tier, rows in by_tier.items():
        for m in HEADLINE:
            errs = [e for r in rows if (e := r.scored_error(m)) is not None]
            if errs:
                lines.append([str(tier), SHORT[m], *_stats(errs)])
    return _table(["tier", "metric", "runs", "median abs error", "MAPE", "MPE (signed)"], lines)


def apart_tables(rows: list[Replay]) -> list[str]:
    """What is left out of the headline, and why: throughput served at the offered rate, runs matching by
    construction."""
    parts = []
    offered = [r for r in rows if r.scored and r.served_at_offered_rate]
    if offered:
        errs = [e for r in offered if (e := r.error("request_throughput")) is not None]
        parts.append(
            f"**Served at the offered rate** ({len(offered)} open-loop runs under capacity, not in the "
            f"req/s and out tok/s headline: their throughput is the offered rate whatever the model): "
            f"req/s median |error| {100 * statistics.median(map(abs, errs)):.1f}% over {len(errs)} runs."
            if errs
            else f"**Served at the offered rate**: {len(offered)} runs, none publishes req/s."
        )
    for constant in constants_here():
        source = source_of(next(e for e in entries() if e["id"] == constant.runs[0]))
        group = [r for r in rows if r.source == source]
        lines = [
            [
                r.entry["id"],
                "read off" if r.entry["id"] in constant.runs else "sibling",
                str(r.regime),
                *(_pct(r.error(m)) for m in HEADLINE),
            ]
            for r in group
        ]
        parts += [
            f"**Match by construction**: {constant.name} ({constant.where}) is read off "
            f"{', '.join(constant.runs)}; every run of {source} leaves the scored set:",
            _table(["run", "", "class", *(SHORT[m] for m in HEADLINE)], lines),
        ]
    return parts


def residual_table(rows: list[Replay]) -> ResidualTable:
    """tier -> regime -> limit -> metric -> the scored runs' residuals, the data intervals are read from."""
    table: dict[str, dict[str, dict[str, dict[str, list[Residual]]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(dict))
    )
    for r in rows:
        for m in METRICS:
            value = r.residual(m)
            if value is not None:
                table[r.tier][r.regime][r.limit].setdefault(m, []).append(Residual(r.entry["id"], r.source, value))
    return table


CONDITIONS = tuple((regime, limit) for regime in Regime for limit in Limit)
"""Every (regime, limit) a prediction is filed under."""


def interval_table(table: ResidualTable) -> str:
    """Per tier, regime, limit and headline metric: the interval's bounds as ratios to the prediction, its runs and
    sources; the (regime, limit) cells without runs of their own are named after the table (they pool)."""
    lines, empty = [], []
    for tier, regimes in table.items():
        for regime, limit in CONDITIONS:
            own = regimes.get(regime, {}).get(limit, {})
            if not own:
                empty.append(f"{tier} {regime} {limit}")
                continue
            for m in HEADLINE:
                bounds = metric_bounds(table, Tier(tier), regime, limit, m)
                if bounds is None:
                    continue
                note = "" if bounds.pooled_from == ((regime, limit, m),) else f"pooled: {bounds.pooled_text(m)}"
                lines.append(
                    [
                        str(tier),
                        str(regime),
                        str(limit),
                        SHORT[m],
                        f"{len(own.get(m, []))} ({bounds.runs} used, {bounds.sources} sources)",
                        f"x{math.exp(bounds.low):.2f} .. x{math.exp(bounds.high):.2f}",
                        note,
                    ]
                )
    head = ["tier", "regime", "limit", "metric", "runs (used, sources)", f"{LEVEL:.0%} interval / prediction", "note"]
    after = f"\n\nWithout runs of their own, so pooled with the nearest cells (`nearest_cells`): {', '.join(empty)}."
    return _table(head, lines) + (after if empty else "")


def limited_by_api_server(rows: list[Replay]) -> str:
    """The scored runs filed under the API server's limit, per tier: the runs that make that cell."""
    parts = []
    for tier in TIERS:
        ids = [r.entry["id"] for r in rows if r.tier == tier and r.scored and r.limit == Limit.API_SERVER]
        parts.append(f"{tier}: {', '.join(ids) if ids else 'none'}")
    return (
        f"Limited by the API server (its core busy at least {API_SERVER_BOUND_SHARE:.0%} of the simulated run, "
        f"`classify_limit`), scored: {'; '.join(parts)}."
    )


def coverage_table(rows: list[Replay]) -> str:
    """Leave each source out, build the intervals from the others, count its measured values inside: per regime, limit
    and headline metric, over every metric with residuals, and over every metric with each source weighing one (a
    user's deployment is one new host, and one prolific host would otherwise decide the per-run share)."""
    hits: dict[tuple[str, str, str, str], list[bool]] = defaultdict(list)
    by_source: dict[tuple[str, str, str], dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for source in {r.source for r in rows if r.scored}:
        table = residual_table([r for r in rows if r.source != source])
        for r in (r for r in rows if r.source == source):
            for m in METRICS:
                value = r.residual(m)
                bounds = None if value is None else metric_bounds(table, r.tier, r.regime, r.limit, m)
                if value is not None and bounds is not None:
                    inside = bounds.low <= value <= bounds.high
                    hits[(r.tier, r.regime, r.limit, m)].append(inside)
                    hits[(r.tier, r.regime, r.limit, "all")].append(inside)
                    by_source[(r.tier, r.regime, r.limit)][source].append(inside)
    lines = []
    for tier in sorted({t for t, *_ in hits}):
        for regime, limit in CONDITIONS:
            if not by_source.get((tier, regime, limit)):
                continue
            cells = [
                (
                    f"{100 * sum(h) / len(h):.0f}% ({sum(h)}/{len(h)})"
                    if (h := hits.get((tier, regime, limit, m)))
                    else "—"
                )
                for m in (*HEADLINE, "all")
            ]
            shares = [sum(h) / len(h) for h in by_source[(tier, regime, limit)].values()]
            cells.append(f"{100 * sum(shares) / len(shares):.0f}% ({len(shares)} sources)")
            lines.append([str(tier), str(regime), str(limit), *cells])
    return _table(
        ["tier", "class", "limit", *(SHORT[m] for m in HEADLINE), "every metric", "every metric, each source one"],
        lines,
    )


def write_residuals(rows: list[Replay], path: Path = RESIDUALS) -> None:
    """The scored runs' residuals as servelab.metrics.intervals reads them, with the runs and sources they came from."""
    table = residual_table(rows)
    doc = {
        "residual": "log(measured / predicted)",
        "made_by": "PYTHONPATH=. .venv/bin/python benchmarks/gpu_accuracy.py --write-residuals",
        "commit": _commit(),
        "held_out": [{"constant": c.name, "runs": list(c.runs), "source": s} for s, c in fitted_sources().items()],
        "residuals": {
            str(tier): {
                str(regime): {
                    str(limit): {
                        m: [{"run": x.run, "source": x.source, "residual": round(x.value, 5)} for x in res]
                        for m, res in metrics.items()
                    }
                    for limit, metrics in limits.items()
                }
                for regime, limits in regimes.items()
            }
            for tier, regimes in table.items()
        },
    }
    header = (
        "# Held-out residuals of the simulator against published real-GPU runs, per tier, regime, limit and metric:\n"
        "# the data every simulated summary's 80% intervals are read from (servelab/metrics/intervals.py).\n"
        "# Written by benchmarks/gpu_accuracy.py --write-residuals; do not edit, rerun it.\n"
    )
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=120))


def report(rows: list[Replay], skipped: list[tuple[dict[str, Any], str]]) -> str:
    by_tier = {tier: [r for r in rows if r.tier == tier] for tier in TIERS}
    rows = by_tier[Tier.SPECS_ONLY]
    scored = [r for r in rows if r.scored]
    parts = [
        (
            f"{sum(r.prompts for r in rows):,} requests replayed in "
            f"{sum(r.seconds for r in rows):.0f} s. {len(scored)} runs scored (V1, in the summary, no constant read "
            f"off their source), from {len({r.source for r in scored})} sources."
        ),
        "### Held out: by class (specs only)",
        class_table(rows),
        "### Held out: by source (specs only; median abs error, runs)",
        source_table(rows),
        "### Held out: by tier",
        tier_table(by_tier),
        *apart_tables(rows),
        f"### {LEVEL:.0%} intervals (from every scored run)",
        limited_by_api_server(list(chain(*by_tier.values()))),
        interval_table(residual_table(list(chain(*by_tier.values())))),
        f"### Coverage of the {LEVEL:.0%} intervals, each source left out in turn",
        coverage_table(list(chain(*by_tier.values()))),
    ]
    for era, title in (("v1", "V1 engine (vLLM >= 0.8)"), ("v0", "V0-era engines (vLLM < 0.8)")):
        group = [r for r in rows if r.entry["era"] == era]
        if not group:
            continue
        parts += [
            f"### {title}: every run in the summary, not held out ({sum(r.in_summary for r in group)} runs; "
            "the runs matching by construction and the throughputs served at the offered rate included)",
            summary_table(group),
        ]
        if any(m in BLIS_COLUMNS for m, *_ in summary_rows(group)):
            parts += ["MAPE (%) in inference-sim's column layout:", blis_table(group, "servelab")]
        if era == "v1":
            parts += [
                floors(group, FLOORS, "Floors, held out, every class"),
                floors(
                    [r for r in group if r.regime == Regime.SATURATED],
                    FLOORS,
                    "Floors, held out, saturated class, specs only",
                ),
            ]
        parts += [f"### {title}: per run", per_run_table(group)]
    parts += [f"not replayed: {e['id']} ({why})" for e, why in skipped]
    return "\n\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="entry ids to run")
    ap.add_argument("--max-prompts", type=int, help="replay at most N requests per run (a quick look; not the table)")
    ap.add_argument(
        "--write-residuals",
        action="store_true",
        help=f"write the held-out residuals every simulated summary's intervals come from ({RESIDUALS.name})",
    )
    args = ap.parse_args()
    if args.write_residuals and (args.only or args.max_prompts):
        ap.error("--write-residuals needs every run replayed whole (no --only, no --max-prompts)")
    rows, skipped = run_tiers(set(args.only) if args.only else None, args.max_prompts)
    print(report(rows, skipped))
    if args.write_residuals:
        write_residuals(rows)


if __name__ == "__main__":
    main()
