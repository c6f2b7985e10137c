"""`diagnose`: evidence -> ceilings -> ranked findings -> simulated recommendations.

The same path serves a measured run (records + timeline from `bench`) and a
described deployment (the simulator reproduces it first). Only the
simulator-backed parts (saturation, SLO rate, what-ifs) need the scenario.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypedDict, Unpack

from servelab.errors import InputError
from servelab.diagnose import parallel
from servelab.diagnose.advice import AdviceContext, check_advice, what_ifs as tip_what_ifs
from servelab.diagnose.capacity import DEFAULT_ATTAINMENT, overload, saturation_limit, saturation_rps, slo_max_rps
from servelab.diagnose.ceilings import compute_ceilings
from servelab.diagnose.engine_choice import compare_on_engines
from servelab.targets.engine_terms import Terms
from servelab.diagnose.evidence import gather, typed_part
from servelab.diagnose.observations import OBSERVATIONS_INCONSISTENT
from servelab.diagnose.observations import check as check_observations, idle_decode_ms
from servelab.diagnose.alternatives import price_alternatives, what_ifs as option_what_ifs
from servelab.diagnose.outside_engine import describe as describe_outside
from servelab.diagnose.fleet import fleet_findings
from servelab.diagnose.findings import UNDERLOADED, Context, caveats, detect, queue_reason
from servelab.diagnose.recommend import Outcome, prefetch, recommend, run as simulate_outcome, simulated_baseline
from servelab.diagnose.reconcile import (
    OBSERVED_VS_SIMULATED,
    TRIED,
    Figure,
    Reconciled,
    finding as reconcile,
    tried_finding,
)
from servelab.diagnose.tried import Tried, check_all as check_tried
from servelab.diagnose.levers import Goal, levers
from servelab.diagnose.regions import Region
from servelab.diagnose.text_tokens import Script
from servelab.diagnose.roofline import decode_step
from servelab.diagnose.sensitivity import Assumed, assumptions
from servelab.diagnose.scenario import Scenario, from_run
from servelab.schemas.diagnosis import (
    AdviceRow,
    Alternative,
    Ceilings,
    Diagnosis,
    Evidence,
    Finding,
    Lever,
    Utilization,
    WorkloadShape,
)
from servelab.schemas.diagnosis import Observed as ObservedFigures
from servelab.schemas.fleet import ReplicaLoad, RouterTime
from servelab.schemas.results import RunFlags, ServerInfo
from servelab.schemas.vocabulary import DiagnosisSource
from servelab.diagnose.utilization import utilization
from servelab.metrics.intervals import Regime, value_interval
from servelab.metrics.results import RunResult
from servelab.metrics.server_timings import describe
from servelab.metrics.slo import SLO
from servelab.sim.engines import SGLANG, TRTLLM
from servelab.targets.deployment import Deployment


@dataclass
class Observed:
    """What the user saw on the real deployment, when there is no run to read."""

    qps: float | None = None
    ttft_ms: float | None = None
    gpu_util: float | None = None
    e2e_ms: float | None = None
    tpot_ms: float | None = None
    tried: tuple[Tried, ...] = ()
    """Changes the user already made and what they saw them do (`--tried`)."""
    goal: Goal | None = None
    """The question asked (`--goal`); None: latency when a latency was reported, throughput when a QPS or a
    utilisation was, no question otherwise."""

    @property
    def question(self) -> Goal | None:
        if self.goal is not None:
            return self.goal
        if self.latency or self.ttft_ms is not None:
            return Goal.LATENCY
        return Goal.THROUGHPUT if self.qps is not None or self.gpu_util is not None else None

    @property
    def figures(self) -> dict[Figure, float]:
        """The figures reported, latency first: the order in which a gap from the simulation is explained."""
        pairs = (
            (Figure.E2E, self.e2e_ms),
            (Figure.TTFT, self.ttft_ms),
            (Figure.TPOT, self.tpot_ms),
            (Figure.QPS, self.qps),
            (Figure.UTIL, self.gpu_util),
        )
        return {f: v for f, v in pairs if v is not None}

    @property
    def reported(self) -> bool:
        """A figure seen in production besides the QPS: the described deployment is the user's own."""
        return any(v is not None for v in (self.ttft_ms, self.gpu_util, self.e2e_ms, self.tpot_ms))

    @property
    def seen(self) -> ObservedFigures:
        """The figures as diagnosis.json records them."""
        return ObservedFigures(
            qps=self.qps, ttft_ms=self.ttft_ms, gpu_util=self.gpu_util, e2e_ms=self.e2e_ms, tpot_ms=self.tpot_ms
        )

    @property
    def latency(self) -> bool:
        """A reported latency: the complaint is how long answers take, so the alternatives are priced on it."""
        return self.e2e_ms is not None or self.tpot_ms is not None


def bottleneck(found: Sequence[Finding]) -> str | None:
    """What limits the deployment: the first finding that is about the server, not about the figures reported."""
    return next(
        (f.kind for f in found if f.kind not in (OBSERVATIONS_INCONSISTENT, OBSERVED_VS_SIMULATED, TRIED)), None
    )


def standing(e: Evidence, c: Ceilings) -> dict[str, float | None]:
    """Where the deployment stands, as a share of each ceiling."""
    running = e.mean_running if e.mean_running is not None else e.mean_in_flight
    per_replica = running / c.replicas

    def share(x: float, of: float | None) -> float | None:
        return x / of if of else None

    return {
        "prefill_compute": share(e.request_rate, c.prefill_compute_rps),
        "decode_bandwidth": share(e.output_throughput, c.decode_bandwidth_tps_at_max_batch),
        "kv_capacity": share(per_replica, c.kv_capacity_seqs),
        "max_num_seqs": share(per_replica, c.max_num_seqs),
        "slo_max_rps": share(e.request_rate, c.slo_max_rps),
        "saturation": share(e.request_rate, c.saturation_rps),
    }


def _attainment(run: RunResult, slo: SLO | None) -> float | None:
    if slo is None or not run.records:
        return None
    return sum(1 for r in run.records if slo.is_met(r)) / len(run.records)


def _ceilings(d: Deployment, scenario: Scenario, e: Evidence, slo: SLO | None, slo_share: float) -> Ceilings:
    """The cost model's ceilings at the batch the run achieved, then the simulator's: saturation and the SLO's rate."""
    batch = (e.mean_running if e.mean_running is not None else e.mean_in_flight) / d.config.data_parallel_size
    c = compute_ceilings(
        d.step_cost(),
        d.model,
        d.config,
        d.memory,
        input_len=scenario.mean_input,
        output_len=scenario.mean_output,
        achieved_batch=batch,
        cached_len=scenario.mean_input * (e.prefix_hit_rate or 0.0),
    )
    sat = saturation_rps(d, scenario)
    slo_rps = slo_max_rps(d, scenario, slo, upper=1.2 * sat, share=slo_share) if slo else None
    limit = saturation_limit(d, scenario)
    low_high = value_interval(sat, "request_throughput", d.prediction_tier, Regime.SATURATED, limit)
    interval = (low_high[0], low_high[1]) if low_high is not None else None
    return c.model_copy(update={"saturation_rps": sat, "saturation_rps_interval": interval, "slo_max_rps": slo_rps})


def _reported_first(
    found: list[Finding],
    ctx: Context,
    scenario: Scenario,
    observed: Observed,
    source: str,
    reconciled: Reconciled | None,
) -> list[Finding]:
    """The findings with those about the reported figures first: figures that cannot hold, or far from the
    simulation; then what the changes the user tried say, ranked among the rest."""
    d, c = ctx.d, ctx.c
    qps, qps_source = observed.qps, "observed"
    if qps is None and source == DiagnosisSource.DESCRIBED and scenario.nominal_rate and observed.reported:
        # A described deployment that comes with a figure seen in production describes that production: its
        # --request-rate is the QPS the user sees, and must fit with the figure they report beside it.
        qps, qps_source = scenario.nominal_rate, "offered (your --request-rate)"
    gap = reconciled.finding if reconciled is not None else None
    contradiction = check_observations(
        d,
        scenario,
        c,
        qps=qps,
        ttft_ms=observed.ttft_ms,
        gpu_util=observed.gpu_util,
        e2e_ms=observed.e2e_ms,
        tpot_ms=observed.tpot_ms,
        qps_source=qps_source,
        reconciled=gap is not None,
    )
    if contradiction is not None and gap is not None:  # one finding about the figures: the physics, then the inverse
        contradiction.evidence[-1:-1] = gap.evidence
    if gap is None and observed.tried:
        first_latency = next((f for f in observed.figures if f in (Figure.E2E, Figure.TTFT, Figure.TPOT)), Figure.E2E)
        report = tried_finding(d, scenario, observed.tried, first_latency)
        if report is not None:
            found.append(report)
            found.sort(key=lambda f: f.score, reverse=True)
    for first in (gap if contradiction is None else None, contradiction):
        if first is not None:
            found.insert(0, first)
    return found


def _levers(
    d: Deployment,
    scenario: Scenario,
    reconciled: Reconciled | None,
    goal: Goal | None,
    verdict: str | None,
    c: Ceilings,
    tried: tuple[tuple[Deployment, str], ...],
    region: Region | None,
) -> tuple[str, list[Lever]]:
    """The question's levers and where they were priced: where what the user sees is reproduced, when the likeliest
    explanation says where, else the described load."""
    if goal is None:
        return "", []
    at = reconciled.scenario if reconciled is not None else None
    label = reconciled.label if at is not None and reconciled is not None else "the described load"
    # Above the ceiling every latency is the queue's: whatever was asked, the levers are then the ones that raise the
    # ceiling (render says so).
    asked = Goal.THROUGHPUT if verdict else goal
    return label, levers(
        d,
        at or scenario,
        simulate_outcome(d, at or scenario, None),
        asked,
        tried,
        c.saturation_rps if at is None else None,
        region,
    )


def _advice(
    d: Deployment,
    scenario: Scenario,
    found: Sequence[Finding],
    e: Evidence,
    source: str,
    baseline: Outcome,
    alternatives: Sequence[Alternative],
) -> list[AdviceRow]:
    """The common tuning tips judged here, a change the options table priced taking the verdict it has there."""
    context = _advice_context(scenario, found, e, source)
    priced = {
        (a.gpu, a.engine_args or ""): (a.verdict, a.change)
        for a in alternatives
        if a.engine_args is not None and a.change != "as deployed"
    }
    return check_advice(d, scenario, context, baseline, priced)


def _advice_context(scenario: Scenario, found: Sequence[Finding], e: Evidence, source: str) -> AdviceContext:
    longest = max(s.input_len + s.output_len for s in scenario.shapes)
    return AdviceContext(
        tuple(f.kind for f in found), longest, e.median_ttft_ms, e.median_e2el_ms, source == DiagnosisSource.MEASURED
    )


def _price_ahead(
    ctx: Context, scenario: Scenario, found: Sequence[Finding], source: str, priced: bool, with_advice: bool
) -> None:
    """Start the options' and the tips' what-ifs in the background, where they run beside the findings' changes and
    the bisections that reproduce a reported figure (a chain of simulations, each waiting for the one before, that
    leaves a core free) instead of after them; the loops that price them later find them done. The tips are taken
    as the findings known now suggest them: one the final findings add is simulated when asked for."""
    jobs: list[tuple[Deployment | Callable[[], Deployment], Scenario, SLO | None]] = []
    if priced:
        jobs += option_what_ifs(ctx.d, ctx.e, scenario, ctx.region)
    if with_advice:
        jobs += tip_what_ifs(ctx.d, scenario, _advice_context(scenario, found, ctx.e, source))
    prefetch(jobs, background=True)


def _recommend(
    found: Sequence[Finding], ctx: Context, scenario: Scenario, baseline: Outcome, question: Goal | None
) -> None:
    """Each finding's changes, simulated at this load, best first."""
    for f in found:
        if f.kind == UNDERLOADED and question is Goal.LATENCY:
            continue  # more load per GPU lengthens answers: not a lever for a latency question
        f.recommendations = recommend(f, ctx, scenario, baseline)


def analyse(
    deployment: Deployment,
    scenario: Scenario,
    run: RunResult,
    *,
    slo: SLO | None = None,
    source: DiagnosisSource,
    observed: Observed | None = None,
    slo_share: float = DEFAULT_ATTAINMENT,
    with_recommendations: bool = True,
    with_advice: bool = False,
    with_alternatives: bool | None = None,
    gpu_cost_per_hour: float | None = None,
    engines: Sequence[str] = (),
    assumed: tuple[Assumed, ...] = (),
    region: Region | None = None,
    characters: tuple[int | None, Script | None] = (None, None),
) -> Diagnosis:
    """Rank what limits the server, and price the common options when `with_alternatives` says so (None: when a
    latency is reported or a GPU price given, as a user asking "should we buy a GPU?" does); with `engines`, what
    switching to each would buy at this load. `region` limits the chips offered to those sold there; `characters`
    is a prompt length given in characters and its script, said among the assumptions."""
    observed = observed or Observed()
    tried = check_tried(deployment, observed.tried)  # a change servelab cannot build is an error before any simulation
    e = gather(run)
    fleet = _fleet_findings(run, scenario, e)  # the run's files read whole before any simulation
    c = _ceilings(deployment, scenario, e, slo, slo_share)
    ctx = Context(
        e, c, utilization(e, deployment), deployment, slo, _attainment(run, slo), scenario.mean_shared, tried, region
    )
    found = detect(ctx)
    priced = with_alternatives if with_alternatives is not None else (observed.latency or gpu_cost_per_hour is not None)
    described = source == DiagnosisSource.DESCRIBED
    baseline = (
        simulate_outcome(deployment, scenario, slo)
        if (with_recommendations and (found or fleet)) or with_advice or priced or described
        else None
    )
    if baseline is not None:
        _price_ahead(ctx, scenario, found, source, priced, with_advice)
    if with_recommendations and baseline is not None:
        _recommend([*found, *fleet], ctx, scenario, baseline, observed.question)
    reconciled = _reconciled(deployment, scenario, observed, c) if described else None
    found = _reported_first(found, ctx, scenario, observed, source, reconciled) + fleet
    dx = _read(ctx, scenario, source, found, observed)
    alternatives = (
        price_alternatives(deployment, e, scenario, baseline, gpu_cost_per_hour, tried, region)
        if priced and baseline is not None
        else []
    )
    dx.levers_at, dx.levers = _levers(deployment, scenario, reconciled, observed.question, dx.verdict, c, tried, region)
    hardware_asked = bool(alternatives) or any("instead" in lever.change for lever in dx.levers)
    dx.alternatives = alternatives
    dx.engine_comparison = compare_on_engines(deployment, scenario, slo, engines) if engines else None
    dx.assumptions = assumptions(deployment, scenario, assumed, characters=characters, region=(region, hardware_asked))
    dx.notes = notes(deployment, dx, e, ctx.u, observed)
    if with_advice and baseline is not None:
        dx.advice = _advice(deployment, scenario, found, e, source, baseline, alternatives)
    return dx


def _read(
    ctx: Context, scenario: Scenario, source: DiagnosisSource, found: list[Finding], observed: Observed
) -> Diagnosis:
    """The diagnosis as the run's evidence and the model's ceilings read it, before any option is priced: what
    limits the deployment, where it stands against each ceiling, whether the load is over it, the caveats."""
    e, c = ctx.e, ctx.c
    verdict = overload(
        e.offered_rate or scenario.offered_rate if scenario.max_concurrency is None else None,
        c.saturation_rps,
        c.saturation_rps_interval,
    )
    return Diagnosis(
        source=source,
        deployment=ctx.d.describe(),
        workload=workload_shape(scenario),
        bottleneck=bottleneck(found),
        ceilings=ctx.c,
        standing=standing(ctx.e, ctx.c),
        utilization=ctx.u,
        evidence=ctx.e,
        slo=ctx.slo.terms() if ctx.slo else None,
        slo_attainment=ctx.slo_attainment,
        observed=observed.seen,
        caveats=caveats(ctx),
        findings=found,
        alternatives=[],
        notes=[],
        advice=[],
        goal=observed.question,
        levers=[],
        levers_at="",
        verdict=verdict,
        assumptions=[],
    )


def _reconciled(d: Deployment, scenario: Scenario, observed: Observed, c: Ceilings) -> Reconciled | None:
    """A described deployment's simulation set against the figures the user reported (None: none reported): the
    likeliest explanation of a gap between them."""
    if not observed.figures:
        return None
    as_simulated = simulate_outcome(d, scenario, None)
    return reconcile(d, scenario, as_simulated, observed.figures, observed.tried, c.saturation_rps)


def _fleet_findings(run: RunResult, scenario: Scenario, e: Evidence) -> list[Finding]:
    """A fleet's findings from the replicas' loads `bench` recorded (none for a single server); the client's mean
    TTFT is set against the replicas' own only when it went through a router (`--replica-metrics-urls`)."""
    server, flags = run.run_info.server_info or ServerInfo(), run.run_info.flags or RunFlags()
    repeated = scenario.mean_shared / scenario.mean_input if scenario.mean_input else None
    behind_router = bool(flags.replica_metrics_urls)
    loads = [typed_part(ReplicaLoad, r, run, "server_info.replicas in run.json") for r in server.replicas or []]
    spent = server.router_time
    router_time = (
        (typed_part(RouterTime, spent, run, "server_info.router_time in run.json"), e.mean_ttft_ms) if spent else None
    )
    return fleet_findings(loads, repeated, e.mean_ttft_ms if behind_router else None, router_time)


def workload_shape(scenario: Scenario) -> WorkloadShape:
    return WorkloadShape(
        requests=len(scenario.shapes),
        mean_input_tokens=scenario.mean_input,
        mean_output_tokens=scenario.mean_output,
        offered_rate=scenario.offered_rate,
        max_concurrency=scenario.max_concurrency,
    )


class Asked(TypedDict, total=False):
    """What a diagnosis is asked for besides its evidence: `analyse`'s options, as the verb passes them on."""

    slo: SLO | None
    observed: Observed | None
    slo_share: float
    with_recommendations: bool
    with_advice: bool
    with_alternatives: bool | None
    gpu_cost_per_hour: float | None
    engines: Sequence[str]
    assumed: tuple[Assumed, ...]
    region: Region | None
    characters: tuple[int | None, Script | None]


def diagnose_run(run: RunResult, deployment: Deployment, *, warmup: float = 0.0, **asked: Unpack[Asked]) -> Diagnosis:
    scenario = from_run(run, warmup)
    source = DiagnosisSource.SIMULATED_RUN if run.run_info.source == "sim" else DiagnosisSource.MEASURED
    with parallel.settled():
        return analyse(deployment, scenario, run, source=source, **asked)


def diagnose_described(deployment: Deployment, scenario: Scenario, **asked: Unpack[Asked]) -> Diagnosis:
    longest = max(s.input_len + s.output_len for s in scenario.shapes)
    limit = deployment.config.max_model_len
    if limit is not None and longest > limit:
        raise InputError(
            f"--input-len + --output-len (with --prefix-len and earlier --turns: {longest:,} tokens) exceed "
            f"the deployment's max_model_len {limit:,}: the server would refuse every request"
        )
    observed = asked.get("observed")
    check_tried(deployment, observed.tried if observed else ())  # before the first simulation
    with parallel.settled():
        run = simulated_baseline(deployment, scenario, asked.get("slo"))
        return analyse(deployment, scenario, run, source=DiagnosisSource.DESCRIBED, **asked)


def notes(d: Deployment, dx: Diagnosis, e: Evidence, u: Utilization, observed: Observed) -> list[str]:
    """Plain-language explanations of what users misread most: GPU utilisation and 'memory full'."""
    out = []
    if e.ttft_split is not None:  # the server's own account of the first token comes first: it is measured
        out.append(
            f"Where the first token's time went: "
            f"{describe(e.ttft_split, queue_reason(e, dx.ceilings, Terms(d.engine)))}."
        )
        if e.outside_engine is not None:
            out.append(f"Outside the engine, by the client's HTTP phases: {describe_outside(e.outside_engine)}.")
    busy = (
        f"here a step is running {100 * u.engine_busy:.0f}% of the time"
        if u.engine_busy is not None
        else "how much of the time a step runs is not known here"
    )
    gpu_util = observed.gpu_util
    seen = f"You saw {100 * gpu_util:.0f}% GPU utilisation. " if gpu_util is not None else ""
    one = decode_step(d, 1, e.mean_input_tokens)
    ridge = one.ridge / one.intensity  # sequences per step at which the weight GEMMs turn compute-bound
    out.append(
        f"{seen}nvidia-smi's utilisation is the share of time any kernel runs ({busy}); it is neither MFU nor "
        f"bandwidth use, which are separate figures: here MFU {100 * u.mfu:.0f}% of {u.peak_flops / 1e12:.0f} TFLOP/s "
        f"and memory bandwidth utilisation {100 * u.mbu:.0f}% of {u.peak_bandwidth / 1e9:.0f} GB/s ({u.source} "
        f"estimate). A decode step's weight multiplications are bandwidth-bound below ~{ridge:.0f} sequences on this "
        "chip and compute-bound above; prefill is compute-bound."
    )
    out.append(
        f"'GPU memory full' is by design: {memory_plan(d)}; the KV actually in use peaked at "
        f"{100 * (e.max_kv_usage or 0):.0f}%."
    )
    if observed.qps is not None and dx.ceilings.saturation_rps:
        out.append(
            f"You observe {observed.qps:.2f} req/s; the simulated ceiling for this workload is "
            f"{dx.ceilings.saturation_rps:.2f} req/s."
        )
    if observed.ttft_ms is not None and dx.verdict is None:  # an unstable queue's percentiles say nothing
        out.append(
            f"You observe TTFT {observed.ttft_ms:.0f} ms; the simulation gives p50 {e.median_ttft_ms:.0f} ms "
            f"and p99 {e.p99_ttft_ms:.0f} ms at this load."
        )
    if observed.latency:
        out.append(latency_note(d, e, observed))
    out.extend(d.warnings)
    return out


def memory_plan(d: Deployment) -> str:
    """How the engine sized its KV cache at start-up, in its own knob's words."""
    m, share = d.memory, d.config.gpu_memory_utilization
    kv = f"{m.kv_cache_bytes / 2**30:.1f} GiB"
    if d.engine == SGLANG:
        return (
            f"SGLang takes {share:.0%} of the GPU (--mem-fraction-static {share:g}) for the weights and its KV pool "
            f"at start-up, and the pool gets {kv} of it ({m.num_blocks:,} tokens)"
        )
    if d.engine == TRTLLM:
        return (
            f"TensorRT-LLM gives {share:.0%} (--kv_cache_free_gpu_memory_fraction {share:g}) of the memory still free "
            f"after the weights and a warm-up pass to the KV cache at start-up: {kv} ({m.num_blocks:,} blocks of "
            f"{m.block_size})"
        )
    return (
        f"vLLM reserves {share:.0%} of the GPU at start-up and gives {kv} of it to the KV cache ({m.num_blocks} blocks)"
    )


def latency_note(d: Deployment, e: Evidence, o: Observed) -> str:
    """Why an answer takes as long as it does at this load: its first token, then one engine step per token."""
    seen = ", ".join(
        f"{label} {value:,.0f} ms" for label, value in (("E2E", o.e2e_ms), ("TPOT", o.tpot_ms)) if value is not None
    )
    tpot = e.median_tpot_ms or 0.0
    running = e.mean_running if e.mean_running is not None else e.mean_in_flight
    alone = idle_decode_ms(d, round(e.mean_input_tokens + e.mean_output_tokens / 2))
    return (
        f"You observe {seen}. An answer is its first token (TTFT p50 {e.median_ttft_ms:,.0f} ms here) and then one "
        f"engine "
        f"step per token: ~{e.mean_output_tokens:.0f} tokens x TPOT p50 {tpot:.1f} ms = "
        f"~{e.mean_output_tokens * tpot:,.0f} ms (E2E p50 {e.median_e2el_ms:,.0f} ms at this load). A step decodes "
        f"every "
        f"running sequence at once (~{running:.0f} here, each reading its {e.mean_input_tokens:.0f}-token context "
        f"from the KV cache) and carries the prefill of newly arrived turns, so TPOT grows with concurrency: "
        f"alone, a sequence's step takes {alone:.1f} ms. Fine at low load and slow under concurrency is this, "
        "not a fault: only more compute and bandwidth per running sequence (or fewer of them) shortens it."
    )
