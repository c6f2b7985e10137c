"""Bottleneck detectors: each reads the evidence and says how much it limits.

A detector returns a Finding with a score in [0, 1] (how strongly the
evidence says this is what limits the deployment) and the numbers it
rests on. Ranking is by score; recommendations are attached afterwards by
simulation (diagnose/recommend.py). Thresholds are stated where they are
used, with the reason.

Findings are about the server. A starved or slow load generator is not a
limit of the server but a doubt on the figures, so it is a caveat
(`caveats`), shown above the findings with the size of the distortion and
never ranked among them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from servelab.diagnose.regions import Region
from servelab.diagnose.ceilings import Ceilings
from servelab.targets.engine_terms import Terms
from servelab.diagnose.outside_engine import describe as describe_outside
from servelab.diagnose.roofline import StepClass, decode_step
from servelab.metrics.server_timings import describe
from servelab.metrics.slo import SLO
from servelab.perf.cost_model import RooflineCostModel, StepBatch
from servelab.schemas.diagnosis import Evidence, Finding, Utilization
from servelab.schemas.vocabulary import FindingKind
from servelab.sim.engines import SGLANG
from servelab.targets.deployment import Deployment

CLIENT_BOUND = FindingKind.CLIENT_BOUND
UNDERLOADED = FindingKind.UNDERLOADED
MAX_NUM_SEQS_BOUND = FindingKind.MAX_NUM_SEQS_BOUND
KV_CAPACITY_BOUND = FindingKind.KV_CAPACITY_BOUND
PREFILL_COMPUTE_BOUND = FindingKind.PREFILL_COMPUTE_BOUND
DECODE_BANDWIDTH_BOUND = FindingKind.DECODE_BANDWIDTH_BOUND
DECODE_COMPUTE_BOUND = FindingKind.DECODE_COMPUTE_BOUND
FRONTEND_CPU_BOUND = FindingKind.FRONTEND_CPU_BOUND
SLO_TRADEOFF = FindingKind.SLO_TRADEOFF
PREFIX_CACHING_OFF = FindingKind.PREFIX_CACHING_OFF
LAUNCH_BOUND = FindingKind.LAUNCH_BOUND
KINDS = (
    UNDERLOADED,
    MAX_NUM_SEQS_BOUND,
    KV_CAPACITY_BOUND,
    PREFILL_COMPUTE_BOUND,
    DECODE_BANDWIDTH_BOUND,
    DECODE_COMPUTE_BOUND,
    FRONTEND_CPU_BOUND,
    SLO_TRADEOFF,
    PREFIX_CACHING_OFF,
    LAUNCH_BOUND,
)
"""What a finding can name: a limit of the server. CLIENT_BOUND is a caveat's kind, never a finding's."""

QUEUEING = 0.1
"""Share of samples with requests waiting above which the engine counts as turning work away."""
SATURATED = 0.85
"""Achieved/saturation throughput above which more offered load cannot raise throughput much."""


def make_finding(kind: FindingKind, title: str, score: float, evidence: list[str]) -> Finding:
    """A finding as its detector states it: recommendations are simulated afterwards (diagnose/recommend.py)."""
    return Finding(kind=kind, title=title, score=score, evidence=evidence, recommendations=[])


@dataclass(frozen=True)
class Context:
    e: Evidence
    c: Ceilings
    u: Utilization
    d: Deployment
    slo: SLO | None
    slo_attainment: float | None
    shared_prompt_tokens: float = 0.0
    """Mean prompt tokens a request shares with an earlier one (system prompt, resent chat history)."""
    tried: tuple[tuple[Deployment, str], ...] = ()
    """Changes the user already made (`--tried`), built, with what they saw each do."""
    region: Region | None = None
    """Where the user buys hardware: which chips a recommendation may name (None: anywhere)."""

    @property
    def load_ratio(self) -> float:
        return self.e.request_rate / self.c.saturation_rps if self.c.saturation_rps else 0.0

    @property
    def overloaded(self) -> bool:
        """More is offered than the deployment can serve (open loop): the queue grows without bound."""
        return bool(self.e.offered_rate and self.c.saturation_rps and self.e.offered_rate > self.c.saturation_rps)

    @property
    def queueing(self) -> float:
        return self.e.frac_waiting or 0.0

    @property
    def terms(self) -> Terms:
        """The diagnosed engine's names for its knobs: advice is in the flags the user runs."""
        return Terms(self.d.engine)

    @property
    def running_per_replica(self) -> float:
        running = self.e.max_running if self.e.max_running is not None else self.e.mean_in_flight
        return running / self.c.replicas


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def queue_reason(e: Evidence, c: Ceilings, t: Terms) -> str:
    """What requests queued in the engine were waiting for, from the server's gauges: a slot, KV blocks, or neither."""
    if e.max_running is not None and e.max_running >= 0.95 * c.max_num_seqs * c.replicas:
        return f"waiting for a sequence slot: {e.max_running:.0f} running at {t.knob('max_num_seqs')} {c.max_num_seqs}"
    if e.max_kv_usage is not None and e.max_kv_usage >= 0.95:
        return f"waiting for KV cache blocks: usage peaked at {_pct(e.max_kv_usage)}"
    return ""


def ttft_split_evidence(x: Context, *parts: str) -> list[str]:
    """The server's own account of the TTFT (servelab/metrics/server_timings.py), when its largest part is one of
    `parts` ("api_server", "queue", "prefill"): measured evidence for the finding that names that part."""
    split = x.e.ttft_split
    if split is None:
        return []
    largest = max(split.parts, key=split.parts.__getitem__)
    if largest not in parts:
        return []
    http = [describe_outside(x.e.outside_engine)] if largest == "api_server" and x.e.outside_engine is not None else []
    return [describe(split, queue_reason(x.e, x.c, x.terms)), *http, *split.notes]


def caveats(x: Context) -> list[Finding]:
    """Doubts on the measurement itself (a starved or slow client), each with the size of its distortion."""
    if not x.e.client_may_be_bottleneck:
        return []
    evidence = [x.e.client_reason or "the client reported that it could not keep its send schedule"]
    if x.e.client_added_delay_ms is not None:
        evidence.append(
            f"estimated client-added delay {x.e.client_added_delay_ms:.1f} ms per timestamp against a measured "
            f"TTFT p50 of {x.e.median_ttft_ms:.1f} ms ({x.e.client_added_delay_ms / max(x.e.median_ttft_ms, 1e-9):.0%} "
            f"of it): "
            "client-side latencies read that much high; the server's own gauges and histograms below are not "
            "affected. Rerun with --workers or on another host before trusting the latencies"
        )
    return [make_finding(CLIENT_BOUND, "The load generator itself distorted the measurement", 1.0, evidence)]


API_BUSY = 0.8
"""API-server core utilisation above which it limits: one FIFO core at 80% already queues ~2 requests' work."""


def api_server_load(x: Context) -> tuple[float, float, float] | None:
    """(CPU seconds per request on the API server, utilisation of its cores, its ceiling in req/s), or None if unpriced.

    The work is the deployment's frontend costs (vLLM's measured ones for a
    catalogue GPU, or a calibration's) for this workload's mean lengths and
    the chunks the run streamed per request (a server that falls behind
    merges tokens into fewer chunks and pays less per token); one chunk per
    token, as at light load, where the run recorded no chunks. The rate is
    what was offered when known (a burst or a closed loop: achieved).
    """
    d, e = x.d, x.e
    a = d.api
    chunks = e.mean_output_tokens if e.mean_chunks is None else e.mean_chunks
    streamed = a.per_output_token_s * e.mean_output_tokens + a.per_chunk_s * chunks
    work = a.per_request_s + a.per_prompt_token_s * e.mean_input_tokens + streamed
    if work <= 0:
        return None
    servers = d.config.api_servers_behind(d.router)
    rate = max(e.request_rate, e.offered_rate or 0.0)
    return work, rate * work / servers, servers / work


def outside_engine_gap(e: Evidence) -> tuple[float, float, str] | None:
    """(ms outside the engine, ms inside it, what "inside" is) for the mean request, or None without server timings.

    With the server's queue and prefill histograms, inside is the engine core's queue + prefill and the rest of
    the client's TTFT is outside (servelab/metrics/server_timings.py): the server's own TTFT starts after HTTP
    and tokenization but still includes the API process's event loop and the trip to the engine core, which is
    where a burst of short requests waits. Without them, the server's TTFT is the best inside there is.
    """
    split = e.ttft_split
    if split is not None:
        return 1e3 * split.api_server_s, 1e3 * (split.queue_s + split.prefill_s), "in the engine core (queue + prefill)"
    if e.mean_server_ttft_ms is not None:
        return e.mean_ttft_ms - e.mean_server_ttft_ms, e.mean_server_ttft_ms, "the engine's own TTFT"
    return None


def waits_outside_engine(e: Evidence) -> bool:
    """The mean request waited outside the engine for a material time: 50 ms is far above loopback/network noise,
    and half the engine's own time makes it a large part of the first token's."""
    gap_engine = outside_engine_gap(e)
    return gap_engine is not None and gap_engine[0] >= max(50.0, 0.5 * gap_engine[1])


def frontend_cpu_bound(x: Context) -> Finding | None:
    """The API server's CPU (HTTP, tokenize, detokenize, stream) limits the deployment, or adds latency the engine
    does not see.

    Two independent signs: the client's TTFT far above the engine's own
    (requests queue in the API process: measured runs), and the API server's
    priced work per request times the request rate filling its cores.
    """
    evidence: list[str] = []
    score = 0.0
    gap_engine = outside_engine_gap(x.e)
    if gap_engine is not None and waits_outside_engine(x.e):
        gap, engine, inside = gap_engine
        score = 0.5 + 0.45 * gap / (gap + engine)
        evidence.append(
            f"client-measured mean TTFT {x.e.mean_ttft_ms:.0f} ms vs {engine:.0f} ms {inside}: "
            f"{gap:.0f} ms spent outside the engine (tokenization, queueing in the API process, streaming)"
        )
    load = api_server_load(x)
    if load is not None and load[1] >= API_BUSY:
        work, busy, ceiling = load
        servers = x.d.config.api_servers_behind(x.d.router)
        score = max(score, 0.5 + 0.45 * min(1.0, busy))
        source = {
            "measured": "vLLM's CPU-side costs measured on its CPU build, scaled to this host"
            + ("" if x.terms.vllm else f", standing in for {x.terms.label}'s (not measured)"),
            "given": "the calibrated API-server cost",
            "fitted_from_runs": "the API-server cost fitted to your runs",
        }.get(x.d.cpu_costs_source, "the configured API-server cost")
        evidence.append(
            f"the API server spends {1e3 * work:.2f} ms of CPU per request here ({source}): at "
            f"{max(x.e.request_rate, x.e.offered_rate or 0.0):.1f} req/s that is {_pct(busy)} of "
            f"{servers} API-server core{'s' if servers > 1 else ''}, whose ceiling is {ceiling:.1f} req/s"
        )
        if x.e.engine_busy is not None:
            evidence.append(
                f"meanwhile the engine was busy {_pct(x.e.engine_busy)} of the time: the GPU waits for the API server"
                if x.e.engine_busy < SATURATED
                else f"the engine was busy {_pct(x.e.engine_busy)} of the time too: both are near their limits"
            )
        if x.terms.vllm:  # vLLM's flag; the other engines' frontend processes are not modelled
            more = servers * 2
            while more / work < 1.25 * max(x.e.request_rate, x.e.offered_rate or 0.0) and more < 64:
                more *= 2
            replicas = 1 if x.d.config.replica_api_servers(x.d.router) is None else x.d.config.data_parallel_size
            each = " on each replica" if replicas > 1 else ""
            evidence.append(
                f"--api-server-count {more // replicas}{each} spreads that work over {more} processes: "
                f"API-server ceiling {more / work:.1f} req/s (x{more / servers:.0f}), "
                "then the engine's own limits apply"
            )
    if not evidence:
        return None
    evidence.extend(ttft_split_evidence(x, "api_server"))
    title = (
        "The API server's CPU, not the GPU, limits throughput"
        if load is not None and load[1] >= API_BUSY
        else "Requests wait in the API server before the engine sees them"
    )
    return make_finding(FRONTEND_CPU_BOUND, title, score, evidence)


def kv_capacity_bound(x: Context) -> Finding | None:
    preempted = x.e.preemptions or 0.0
    kv = x.e.max_kv_usage or 0.0
    if preempted <= 0 and not (kv >= 0.95 and x.queueing >= QUEUEING):
        return None
    per_request = preempted / max(1, x.e.completed)
    evidence = [
        f"KV cache usage peaked at {_pct(kv)}; {preempted:.0f} {x.terms.preemptions} "
        f"({per_request:.2f} per completed request) recomputed prompts",
        f"KV holds {x.c.kv_capacity_seqs} sequences of {x.e.mean_input_tokens:.0f}+{x.e.mean_output_tokens:.0f} tokens "
        f"per replica ({x.d.memory.num_blocks} blocks of {x.d.memory.block_size}); {x.terms.knob('max_num_seqs')} is "
        f"{x.c.max_num_seqs}",
        *ttft_split_evidence(x, "queue"),
    ]
    return make_finding(
        KV_CAPACITY_BOUND,
        "The KV cache is too small for this concurrency",
        0.8 + 0.15 * min(1.0, per_request) if preempted else 0.75,
        evidence,
    )


def max_num_seqs_bound(x: Context) -> Finding | None:
    if x.running_per_replica < 0.95 * x.c.max_num_seqs or x.queueing < QUEUEING:
        return None
    if (x.e.preemptions or 0) > 0:
        return None
    evidence = [
        f"{x.running_per_replica:.0f} requests running per replica = {x.terms.knob('max_num_seqs')} "
        f"{x.c.max_num_seqs}, "
        f"with requests waiting in {_pct(x.queueing)} of samples (up to {x.e.max_waiting or 0:.0f})",
        f"the KV cache could hold {x.c.kv_capacity_seqs} such sequences (peak usage {_pct(x.e.max_kv_usage or 0)})",
        *ttft_split_evidence(x, "queue"),
    ]
    score = 0.6 + 0.3 * x.queueing
    if x.u.compute_headroom >= 0.8:
        score *= 0.7  # the GPU is already compute-saturated: more sequences mostly add latency
    title = f"{x.terms.knob('max_num_seqs')} caps the batch while requests queue"
    # The cap is the cause when a bigger batch would cost the step little (below the ridge, the weight read is shared);
    # when the tensor cores are already saturated, a full batch under overload is the symptom.
    at_cap = decode_step(x.d, x.c.max_num_seqs, x.e.mean_input_tokens + x.e.mean_output_tokens / 2)
    saturated = x.u.compute_headroom >= 0.8 or at_cap.bound is StepClass.COMPUTE
    if x.overloaded and saturated:
        evidence.insert(
            0,
            f"{x.e.offered_rate:.2f} req/s offered against a simulated ceiling of "
            f"{x.c.saturation_rps or 0:.2f} req/s: any batch limit fills when more arrives than the "
            "engine can finish, so this is a consequence of what limits the ceiling, ranked under it",
        )
        title = f"{x.terms.knob('max_num_seqs')} is full because more arrives than the engine serves (a consequence)"
        score = min(score, 0.3)
    return make_finding(MAX_NUM_SEQS_BOUND, title, score, evidence)


PREFILL_SHARE = 0.5
"""Share of the client's mean TTFT that prefill, measured, accounts for above which the prompts set the first
token's time: more than everything else (network, API server, waiting for a slot or KV) together."""


@dataclass(frozen=True)
class PrefillTime:
    """What prefill costs the mean request by the server's histograms (the split), ms."""

    prefill_ms: float
    budget_queue_ms: float
    """The engine queue when it waits for other prompts' prefill: prompts longer than the token budget fill every
    step, so a waiting request (no slot or KV shortage) waits for the running prompt's chunks; else 0."""
    share: float
    """(prefill + budget queue) / the client's mean TTFT."""


def prefill_time(x: Context) -> PrefillTime | None:
    """The measured prefill account, or None without the split or when the answer after its first token took the
    engine longer than the prefill (then the prompt is not what a request's time goes to, however much of the first
    token's wait it is: four users with short prompts are not prefill-bound). The answer's time is the client's
    (E2E - TTFT, medians): the simulator exports no decode histogram."""
    split, e = x.e.ttft_split, x.e
    if split is None or split.client_ttft_s <= 0 or e.median_e2el_ms - e.median_ttft_ms > 1e3 * split.prefill_s:
        return None
    budget = x.d.config.max_num_batched_tokens or 0
    computed = e.mean_input_tokens * (1 - (e.prefix_hit_rate or 0.0))
    queue = split.queue_s if computed >= budget and not queue_reason(e, x.c, x.terms) else 0.0
    return PrefillTime(1e3 * split.prefill_s, 1e3 * queue, (split.prefill_s + queue) / split.client_ttft_s)


def _steps(tokens: float, budget: int) -> str:
    steps = max(1, -(-round(tokens) // max(budget, 1)))
    return f"~{steps} step" + ("s" if steps > 1 else "")


def prefill_measured(x: Context, p: PrefillTime) -> Finding:
    """Prefill, by the server's own histograms, takes most of the first token's time (a real server whose chip the
    cost model cannot price in FLOPs, such as the CPU build): the evidence is the split, not an MFU estimate."""
    computed = x.e.mean_input_tokens * (1 - (x.e.prefix_hit_rate or 0.0))
    budget = x.d.config.max_num_batched_tokens or 0
    evidence = [
        f"the engine spent {p.prefill_ms:.0f} ms per request on prefill: {computed:.0f} computed prompt tokens at "
        f"{1e3 * computed / max(p.prefill_ms, 1e-9):,.0f} tokens/s, in steps of at most {budget} tokens "
        f"({x.terms.name('max_num_batched_tokens')}; {_steps(computed, budget)} a prompt)",
    ]
    if p.budget_queue_ms:
        evidence.append(
            f"and {p.budget_queue_ms:.0f} ms queued behind other prompts: each fills every step's {budget}-token "
            "budget, so a waiting prompt is scheduled only in the last chunk of the one before it"
        )
    evidence.append(f"prefill accounts for {_pct(p.share)} of the client's mean TTFT")
    evidence.extend(ttft_split_evidence(x, "prefill", "queue"))
    return make_finding(
        PREFILL_COMPUTE_BOUND,
        "Prompt processing takes most of the time to the first token",
        0.5 + 0.4 * p.share,
        evidence,
    )


def prefill_compute_bound(x: Context) -> Finding | None:
    if x.u.compute_headroom < 0.6 or x.u.prefill_flop_share < 0.5:
        measured = prefill_time(x)
        return prefill_measured(x, measured) if measured is not None and measured.share >= PREFILL_SHARE else None
    hit = x.e.prefix_hit_rate or 0.0
    computed = x.e.mean_input_tokens * (1 - hit)  # the prefix cache serves the rest
    flops_per_token = x.c.prefill_flops_per_request / max(1.0, computed)
    tokens = (
        f"{computed:.0f} computed prompt tokens ({_pct(hit)} from the prefix cache)"
        if hit
        else f"{computed:.0f} prompt tokens"
    )
    evidence = [
        f"{x.e.request_rate:.2f} req/s x {tokens} x "
        f"{flops_per_token / 1e9:.1f} GFLOP/token = {x.u.flops_per_gpu * x.u.prefill_flop_share / 1e12:.0f} TFLOP/s "
        f"of prefill per GPU, {x.u.flops_per_gpu / 1e12:.0f} TFLOP/s in all, on a {x.u.peak_flops / 1e12:.0f} TFLOP/s "
        f"{x.d.hardware.name} (MFU {_pct(x.u.mfu)}; ~{_pct(x.d.coefficients.compute_efficiency)} is the practical "
        f"maximum)",
        f"prefill alone caps this workload at {x.c.prefill_compute_rps:.2f} req/s; "
        f"the simulated ceiling with decode included is {x.c.saturation_rps or 0:.2f} req/s",
        *ttft_split_evidence(x, "prefill"),
    ]
    return make_finding(
        PREFILL_COMPUTE_BOUND,
        "Prompt processing saturates the GPU's tensor cores",
        0.5 + 0.45 * min(1.0, x.u.compute_headroom),
        evidence,
    )


def decode_bandwidth_bound(x: Context) -> Finding | None:
    busy = x.e.engine_busy if x.e.engine_busy is not None else x.load_ratio
    if busy < 0.9 or x.load_ratio < SATURATED or x.u.prefill_flop_share >= 0.5:
        return None
    if x.queueing >= QUEUEING and x.running_per_replica >= 0.95 * x.c.max_num_seqs:
        return None  # the batch is held back by max_num_seqs, not by the memory system
    step = decode_step(x.d, x.c.decode_batch, x.e.mean_input_tokens + x.e.mean_output_tokens / 2)
    evidence = [
        f"the engine is busy {_pct(busy)} of the time, mostly decoding: {x.e.output_throughput:.0f} output tok/s at "
        f"~{x.c.decode_batch:.0f} sequences per step (MBU {_pct(x.u.mbu)} of "
        f"{x.d.hardware.memory_bandwidth_gbs:.0f} GB/s, MFU {_pct(x.u.mfu)})",
        step.evidence(),
        f"decode ceiling at this batch {x.c.decode_bandwidth_tps:.0f} tok/s; at the largest batch the deployment "
        f"holds ({x.c.max_decode_batch}) {x.c.decode_bandwidth_tps_at_max_batch:.0f} tok/s",
    ]
    kind = DECODE_COMPUTE_BOUND if step.bound is StepClass.COMPUTE else DECODE_BANDWIDTH_BOUND
    return make_finding(
        kind, step.title(), 0.55 + 0.35 * min(1.0, max(x.u.bandwidth_headroom, x.u.compute_headroom)), evidence
    )


def underloaded(x: Context) -> Finding | None:
    if not x.c.saturation_rps or x.load_ratio >= 0.75 or x.queueing >= QUEUEING:
        return None
    if waits_outside_engine(x.e):
        return None  # requests are stuck in front of the engine (frontend_cpu_bound): the load is not light
    evidence = [
        f"{x.e.request_rate:.2f} req/s achieved; the simulator puts this deployment's ceiling for this workload at "
        f"{x.c.saturation_rps:.2f} req/s ({_pct(x.load_ratio)} used)",
        f"on average {x.e.mean_in_flight:.1f} requests were in flight and nothing waited for a slot",
        *ttft_split_evidence(x, "api_server", "prefill"),
    ]
    if x.e.max_concurrency:
        evidence.append(f"the client keeps at most {x.e.max_concurrency} requests outstanding")
    return make_finding(
        UNDERLOADED,
        "The server has capacity to spare: the load, not the engine, sets the throughput",
        0.9 - 0.5 * x.load_ratio,
        evidence,
    )


def slo_tradeoff(x: Context) -> Finding | None:
    """Chunked prefill trades TTFT against ITL through the token budget."""
    if x.e.p99_itl_ms is None or not x.e.median_tpot_ms:
        return None  # no request had a second token: no inter-token latency to trade
    stall = x.e.p99_itl_ms / x.e.median_tpot_ms
    how = (
        f"decodes pause while a prefill batch of up to {x.d.config.max_num_batched_tokens} tokens runs (SGLang runs "
        "prefill and decode batches apart)"
        if x.d.engine == SGLANG
        else f"decodes that share a step with a {x.d.config.max_num_batched_tokens}-token prefill chunk wait for it"
    )
    evidence = [f"ITL p99 {x.e.p99_itl_ms:.0f} ms vs TPOT p50 {x.e.median_tpot_ms:.0f} ms: {how}"]
    if x.slo is not None and x.slo_attainment is not None:
        if x.slo_attainment >= 0.9:
            return None
        evidence.insert(
            0,
            f"only {_pct(x.slo_attainment)} of requests meet the SLO {x.slo.terms().model_dump(exclude_unset=True)} "
            f"(ms)",
        )
        return make_finding(
            SLO_TRADEOFF,
            "The token budget trades time-to-first-token against inter-token latency",
            0.45 + 0.3 * (1 - x.slo_attainment),
            evidence,
        )
    if stall < 3:
        return None
    return make_finding(SLO_TRADEOFF, "Prefill chunks stall running decodes", 0.4, evidence)


def prefix_caching_off(x: Context) -> Finding | None:
    """Requests share prompt tokens (a system prompt, resent history) that the server recomputes every time.

    Evidence: the deployment runs with prefix caching off, or the server
    counted prefix-cache queries and no hit, while the workload shares a
    material part of each prompt.
    """
    share = x.shared_prompt_tokens / max(1.0, x.e.mean_input_tokens)
    no_hits = x.e.prefix_hit_rate is not None and x.e.prefix_hit_rate < 0.01
    if share < 0.1 or not (not x.d.config.enable_prefix_caching or no_hits):
        return None
    evidence = [
        f"{x.shared_prompt_tokens:.0f} of each prompt's {x.e.mean_input_tokens:.0f} tokens ({_pct(share)}) repeat an "
        "earlier request's (a shared system prompt or resent history), and the server computes them again every time",
        f"{x.terms.setting('enable_prefix_caching', False)} is set: KV blocks of a finished request are never reused"
        if not x.d.config.enable_prefix_caching
        else f"the server's prefix cache answered {_pct(x.e.prefix_hit_rate or 0.0)} of its lookups",
    ]
    return make_finding(
        PREFIX_CACHING_OFF,
        "Shared prompt tokens are recomputed: prefix caching is off",
        0.6 + 0.4 * min(1.0, share),
        evidence,
    )


def launch_bound(x: Context) -> Finding | None:
    """Decode steps wait on the host launching their kernels one by one: CUDA graphs are off, or (SGLang) the batch
    is above the largest one captured.

    Evidence: the modelled decode step at the observed batch is at least 10% longer than the same step replayed
    from a graph (below that the launches hide behind the kernels, as on a slow GPU or at a large batch).
    """
    cfg = x.d.config
    batch = max(1, math.ceil(x.c.decode_batch))
    cost = x.d.cost_model()
    if not cost.runs_eagerly(batch, has_prefill=False):
        return None
    context = round(x.e.mean_input_tokens + x.e.mean_output_tokens / 2)
    step = StepBatch(decode_contexts=[context] * batch)
    eager = cost.step_time(step)
    graphs = RooflineCostModel(
        x.d.hardware, x.d.model, replace(cfg, enforce_eager=False, cuda_graph_max_batch=None), x.d.coefficients
    ).step_time(step)
    if eager < 1.1 * graphs:
        return None
    layers, per_layer = x.d.model.num_layers, x.d.coefficients.eager_launch_s_per_layer
    if cfg.enforce_eager:
        why = (
            f"{x.terms.setting('enforce_eager', True)} is set: every step's kernels are launched one by one from Python"
        )
    else:
        graph_cap = x.terms.setting("cuda_graph_max_batch", cfg.cuda_graph_max_batch)
        why = (
            f"decode batches of ~{batch} are above {graph_cap}: "
            "they run without a CUDA graph, launched one by one from Python"
        )
    evidence = [
        why,
        f"at ~{batch} sequences a decode step's kernels take {graphs * 1e3:.1f} ms, but launching {layers} layers' "
        f"kernels takes ~{cost.eager_launch_s * 1e3:.1f} ms ({per_layer * 1e3:.2f} ms a layer, the default host "
        f"figure), "
        f"so a step takes {eager * 1e3:.1f} ms",
    ]
    if x.e.median_tpot_ms:
        evidence.append(f"measured TPOT p50 {x.e.median_tpot_ms:.1f} ms")
    return make_finding(
        LAUNCH_BOUND,
        "Decode steps wait on the CPU launching kernels: CUDA graphs do not cover them",
        min(0.95, 0.6 + 0.4 * (eager / graphs - 1)),
        evidence,
    )


DETECTORS: tuple[Callable[[Context], Finding | None], ...] = (
    prefix_caching_off,
    frontend_cpu_bound,
    kv_capacity_bound,
    max_num_seqs_bound,
    prefill_compute_bound,
    decode_bandwidth_bound,
    underloaded,
    slo_tradeoff,
    launch_bound,
)


def detect(x: Context) -> list[Finding]:
    found = [f for f in (detector(x) for detector in DETECTORS) if f is not None]
    return sorted(found, key=lambda f: f.score, reverse=True)
