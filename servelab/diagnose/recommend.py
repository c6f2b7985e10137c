"""Concrete changes for a finding, each priced by the simulator on the same workload.

A recommendation is kept only if the simulator says it moves the metric
that matters for that finding in the right direction; "before" is the
simulation of the unchanged deployment on the same scenario, so the
comparison is like for like (the measured numbers are in the evidence).
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial

from servelab.diagnose import capacity, findings as fk, parallel
from servelab.diagnose.capacity import saturation_rps
from servelab.targets.engine_terms import Terms
from servelab.diagnose.evidence import gather
from servelab.diagnose.findings import Context
from servelab.schemas.diagnosis import Finding, Recommendation
from servelab.schemas.vocabulary import FindingKind, RouterPolicy
from servelab.diagnose.regions import Region, upgrades
from servelab.diagnose.scenario import Scenario, simulate
from servelab.metrics.results import RunResult
from servelab.metrics.slo import SLO
from servelab.metrics.summary import summarize
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import get_gpu
from servelab.perf.trtllm_args import GUARANTEED_NO_EVICT, MAX_UTILIZATION
from servelab.sim.engines import VLLM
from servelab.targets.deployment import Deployment

NO_EFFECT = "no-effect"
"""The result a user reports for a change that did nothing (diagnose/tried.py's TriedResult)."""
MIN_GAIN = 0.05
"""A change must move its metric by 5% to be worth a restart; below that the model cannot tell."""


@dataclass(frozen=True)
class Candidate:
    change: str
    deployment: Callable[[], Deployment] | None = None
    """Built only when priced: a change the hardware cannot take raises PerfConfigError then."""
    scenario: Scenario | None = None


@dataclass(frozen=True)
class Outcome:
    summary: dict[str, object]
    mean_running: float | None = None
    """Sequences the engine ran per step on average (the server's running gauge), over all replicas."""
    engine_busy: float | None = None
    """Share of the run a step was running: what nvidia-smi's utilisation reads."""

    def value(self, metric: str) -> float:
        return float(self.summary.get(metric) or 0.0)


CAPACITY = "capacity_rps"
"""Saturation throughput of the changed deployment: how far QPS could go, not what this load achieved."""
HIGHER_IS_BETTER = {"request_throughput", "request_goodput", "output_throughput", CAPACITY}
SHOWN = ("request_throughput", "p99_ttft_ms", "p99_tpot_ms")
UNSTABLE = ("p99_ttft_ms", "p99_tpot_ms")
"""Figures that grow with the run's length when the load exceeds the ceiling."""


_OUTCOMES: dict[tuple[object, ...], Outcome] = {}
_KEPT = 256
"""Outcomes remembered: findings, advice and the priced options often simulate the same change on the same workload,
and a background batch computes them before they are asked for."""


parallel.share(_OUTCOMES)


def _key(d: Deployment, scenario: Scenario, slo: SLO | None) -> tuple[object, ...]:
    return (
        json.dumps(d.describe(), sort_keys=True, default=str),
        d.router,  # not in describe(): a fleet's routes differ only here
        scenario.shapes,
        scenario.max_concurrency,
        scenario.prefix_len,
        scenario.seed,
        scenario.nominal_rate,
        json.dumps(slo.terms().model_dump(exclude_unset=True) if slo else None),
    )


def prefetch(
    jobs: Iterable[tuple[Deployment | Callable[[], Deployment], Scenario, SLO | None]],
    *,
    outcomes: bool = True,
    ceilings: bool = False,
    background: bool = False,
) -> None:
    """`run` (`outcomes`) and `saturation_rps` (`ceilings`) the what-ifs a loop is about to ask for, in parallel
    processes (diagnose/parallel.py); a job is (deployment or what builds it, scenario, SLO), and one the hardware
    cannot take is left to the loop. What a background batch is already computing is waited for, not run again.

    `background`: return at once, the batch running at a lower priority beside this process: for what-ifs a loop
    will ask for after other work (a lookup of one of them waits for the batch)."""
    todo: dict[tuple[object, ...], tuple[Deployment, Scenario, SLO | None]] = {}
    names: dict[tuple[object, ...], set[tuple[object, ...]]] = {}
    awaited: list[tuple[object, ...]] = []
    for build, scenario, slo in jobs:
        try:
            d = build if isinstance(build, Deployment) else build()
        except PerfConfigError:
            continue
        key = _key(d, scenario, slo)
        wanted = [outcome_key(key)] if outcomes and key not in _OUTCOMES else []
        if ceilings and not capacity.ceiling_known(d, scenario):
            wanted.append(capacity.ceiling_key(d, scenario))
        running = [name for name in wanted if parallel.claim(name)]
        awaited += running
        if len(running) < len(wanted):
            todo.setdefault(key, (d, scenario, slo))
            names.setdefault(key, set()).update(wanted)
    work = partial(_both, outcomes, ceilings, background)
    if background:
        parallel.start(work, list(todo.values()), list(names.values()), nice=BACKGROUND_NICE)
        return
    batch = parallel.start(work, list(todo.values()), ()) if len(todo) > 1 else None
    for name in awaited:
        parallel.wait_for(name)
    if batch is not None:
        batch.wait()
    else:
        for job in todo.values():
            work(job)


BACKGROUND_NICE = 10
"""How much lower a background batch's workers run: they take what the process they run beside leaves free."""


def _both(outcomes: bool, ceilings: bool, speculative: bool, job: tuple[Deployment, Scenario, SLO | None]) -> None:
    """A prefetched job: its outcome and its ceiling. A speculative one that fails is left to the loop that asks for
    it, which meets the same error where the serial code would."""
    try:
        if outcomes:
            run(*job)
        if ceilings:
            saturation_rps(job[0], job[1])
    except PerfConfigError:
        if not speculative:
            raise


def outcome_key(key: tuple[object, ...]) -> tuple[object, ...]:
    """`key` of _OUTCOMES as a background batch names it (apart from the ceilings' keys)."""
    return ("outcome", key)


def run(d: Deployment, scenario: Scenario, slo: SLO | None) -> Outcome:
    """The simulated summary of `d` serving `scenario`; a repeat of the same deployment and workload is not re-run,
    and one a background batch is computing is waited for."""
    key = _key(d, scenario, slo)
    if key not in _OUTCOMES:
        parallel.wait_for(outcome_key(key))
    if key not in _OUTCOMES:
        remember(key, simulate(d, scenario), slo)
    return _OUTCOMES[key]


def simulated_baseline(d: Deployment, scenario: Scenario, slo: SLO | None) -> RunResult:
    """`simulate(d, scenario)`, its ceiling simulated beside it, and its outcome kept for `run` (with `slo` and
    without): a described deployment's baseline is the same run as its what-ifs' reference."""
    prefetch([(d, scenario, None)], outcomes=False, ceilings=True, background=True)
    result = simulate(d, scenario)
    for kept in (slo, None) if slo is not None else (None,):
        remember(_key(d, scenario, kept), result, kept)
    return result


def remember(key: tuple[object, ...], result: RunResult, slo: SLO | None) -> None:
    """Keep the outcome of a simulated run under `key` (`_key` of the deployment, scenario and SLO it ran)."""
    if len(_OUTCOMES) >= _KEPT:
        _OUTCOMES.pop(next(iter(_OUTCOMES)))
    e = gather(result)
    _OUTCOMES[key] = Outcome(
        summarize(result.records, slo=slo).model_dump(exclude_unset=True), e.mean_running, e.engine_busy
    )


def _pow2_at_most(n: float) -> int:
    return 2 ** int(math.log2(max(1.0, n)))


def _quantized(d: Deployment, t: Terms, faster_math_only: bool = False) -> Iterator[Candidate]:
    """Weight formats with faster tensor cores or fewer bytes, where the chip runs them."""
    hw = d.hardware
    if hw.fp8_tflops > 0:
        yield Candidate(
            f"FP8 weights and activations ({t.setting('quantization', 'fp8')})",
            lambda: d.with_changes(quantization="fp8"),
        )
    elif hw.int8_tflops > 0:
        int8 = "--quantization compressed-tensors" if t.vllm else t.setting("quantization", "int8")
        yield Candidate(f"INT8 W8A8 weights (a w8a8 checkpoint; {int8})", lambda: d.with_changes(quantization="int8"))
    if faster_math_only:
        return
    awq = "--quantization awq_marlin" if t.vllm else t.setting("quantization", "awq")
    yield Candidate(f"4-bit AWQ weights (an AWQ checkpoint; {awq})", lambda: d.with_changes(quantization="awq"))


def tp_link(d: Deployment) -> str:
    """How TP's all-reduces travel on this chip, and what TP gives up against a replica: said wherever they are
    compared (TP over PCIe is not TP over NVLink; a replica survives a GPU failure, TP does not)."""
    hw = d.hardware
    link = {"pcie": "PCIe", "nvlink": "NVLink", "infinity-fabric": "Infinity Fabric"}.get(
        hw.interconnect, hw.interconnect
    )
    return f"all-reduce each step over {link} {hw.interconnect_gbs:,.0f} GB/s; no failover"


def _more_hardware(d: Deployment, t: Terms, region: Region | None) -> Iterator[Candidate]:
    replicas = d.config.data_parallel_size
    yield Candidate(
        f"{replicas * 2} replicas behind a load balancer (a second GPU as data parallelism; failover: one "
        "GPU down, the other still serves)",
        lambda: d.with_changes(data_parallel_size=replicas * 2),
    )
    if d.hardware.interconnect_bandwidth > 0:
        tp = d.config.tensor_parallel_size
        yield Candidate(
            f"tensor parallel on {tp * 2} GPUs ({t.setting('tensor_parallel_size', tp * 2)}; {tp_link(d)})",
            lambda: d.with_changes(tensor_parallel_size=tp * 2),
        )
    for name in upgrades(d.hardware.name, region):
        chip = get_gpu(name)
        yield Candidate(f"the same deployment on {chip.name}", partial(d.rebuilt, hardware=chip))


def _more_load(x: Context, scenario: Scenario) -> Iterator[Candidate]:
    """More load: the server has room for it."""
    cfg = x.d.config
    if scenario.max_concurrency is not None and scenario.offered_rate is None:
        deeper = max(2 * scenario.max_concurrency, min(cfg.max_num_seqs, x.c.kv_capacity_seqs) * cfg.data_parallel_size)
        yield Candidate(
            f"raise client concurrency to {deeper} (the engine can run {x.c.max_decode_batch} at once)",
            scenario=scenario.closed_loop(deeper),
        )
    rate = x.c.slo_max_rps or 0.8 * (x.c.saturation_rps or 0.0)
    if rate > x.e.request_rate:
        yield Candidate(
            f"send up to {rate:.2f} req/s (the highest rate that still meets the SLO)"
            if x.c.slo_max_rps
            else f"send up to {rate:.2f} req/s (80% of the simulated ceiling)",
            scenario=scenario.at_rate(rate),
        )


def _bigger_batch(x: Context, scenario: Scenario) -> Iterator[Candidate]:
    """A higher sequence cap, up to what the KV cache holds."""
    d, cfg, t = x.d, x.d.config, x.terms
    target = _pow2_at_most(min(4 * cfg.max_num_seqs, x.c.kv_capacity_seqs))
    for seqs in sorted({target, 2 * cfg.max_num_seqs}):
        if seqs > cfg.max_num_seqs:
            budget = {"max_num_batched_tokens": seqs} if seqs > cfg.max_num_batched_tokens else {}
            yield Candidate(
                f"raise {t.name('max_num_seqs')} to {seqs}",
                lambda seqs=seqs, budget=budget: d.with_changes(max_num_seqs=seqs, **budget),
            )


def _more_kv(x: Context, scenario: Scenario) -> Iterator[Candidate]:
    """More KV per sequence: a denser cache, more memory for it, fewer sequences, or more hardware."""
    d, cfg, t = x.d, x.d.config, x.terms
    yield Candidate(
        f"FP8 KV cache ({t.setting('kv_cache_dtype', 'fp8')}): twice the tokens in the same memory",
        lambda: d.with_changes(kv_cache_dtype="fp8"),
    )
    if cfg.gpu_memory_utilization < 0.95:
        yield Candidate(t.setting("gpu_memory_utilization", 0.95), lambda: d.with_changes(gpu_memory_utilization=0.95))
    if x.c.kv_capacity_seqs < cfg.max_num_seqs:
        yield Candidate(
            f"cap the batch at what the KV holds ({t.setting('max_num_seqs', max(1, x.c.kv_capacity_seqs))})",
            lambda: d.with_changes(max_num_seqs=max(1, x.c.kv_capacity_seqs)),
        )
    if d.engine_settings.get("capacity_scheduler_policy") == GUARANTEED_NO_EVICT:
        yield Candidate(
            f"admit on the prompt's KV, pausing when short ({t.setting('capacity_scheduler_policy', MAX_UTILIZATION)}"
            f"; {GUARANTEED_NO_EVICT}, the default, reserves every request's whole length)",
            lambda: d.with_changes(capacity_scheduler_policy=MAX_UTILIZATION),
        )
    yield from _quantized(d, t)
    yield from _more_hardware(d, t, x.region)


def _less_prefill(x: Context, scenario: Scenario) -> Iterator[Candidate]:
    """Fewer prompt tokens computed, or faster compute for them."""
    d, cfg, t = x.d, x.d.config, x.terms
    if scenario.prefix_len == 0:
        shared = int(scenario.mean_input * 2 / 3)
        yield Candidate(
            f"put the first {shared} prompt tokens in one shared system prompt (prefix caching, on by "
            "default, then skips them)",
            scenario=scenario.with_shared_prefix(shared),
        )
    if not cfg.enable_prefix_caching:
        yield Candidate(
            f"enable prefix caching ({t.setting('enable_prefix_caching', True)})",
            lambda: d.with_changes(enable_prefix_caching=True),
        )
    if scenario.prefix_len and d.engine_settings.get("schedule_policy") == "fcfs":
        yield Candidate(
            f"serve requests that share the longest cached prefix first ({t.setting('schedule_policy', 'lpm')})",
            lambda: d.with_changes(schedule_policy="lpm"),
        )
    yield from _quantized(d, t)
    yield from _more_hardware(d, t, x.region)
    yield Candidate(
        "halve the prompts (truncate history, compress retrieved context)", scenario=scenario.with_input_scale(0.5)
    )


def _faster_decode(x: Context, scenario: Scenario, compute_bound: bool = False) -> Iterator[Candidate]:
    """Fewer bytes (or faster math) per decode step, or more hardware."""
    d, cfg, t = x.d, x.d.config, x.terms
    # A compute-bound step gains nothing from smaller weights multiplied on the same tensor cores (W4A16).
    yield from _quantized(d, t, faster_math_only=compute_bound)
    if cfg.kv_cache_dtype != "fp8":
        yield Candidate(
            f"FP8 KV cache ({t.setting('kv_cache_dtype', 'fp8')}): half the bytes read per decoded token",
            lambda: d.with_changes(kv_cache_dtype="fp8"),
        )
    yield from _more_hardware(d, t, x.region)


def _prefix_caching(x: Context, scenario: Scenario) -> Iterator[Candidate]:
    """Prefix caching on."""
    d, cfg, t = x.d, x.d.config, x.terms
    if not cfg.enable_prefix_caching:
        how = "drop --no-enable-prefix-caching" if t.vllm else t.setting("enable_prefix_caching", True)
        yield Candidate(
            f"enable prefix caching ({how}; on by default)",
            lambda: d.with_changes(enable_prefix_caching=True),
        )


def _graphs(x: Context, scenario: Scenario) -> Iterator[Candidate]:
    """CUDA graphs for the batches decode runs."""
    d, cfg, t = x.d, x.d.config, x.terms
    if cfg.enforce_eager:
        yield Candidate(
            f"CUDA graphs on (drop {t.name('enforce_eager')}; on by default)",
            lambda: d.with_changes(enforce_eager=False),
        )
    elif cfg.cuda_graph_max_batch is not None:
        size = 2 ** math.ceil(math.log2(max(2.0, x.c.decode_batch)))
        yield Candidate(
            f"capture graphs up to the batch it runs ({t.setting('cuda_graph_max_batch', size)})",
            lambda: d.with_changes(cuda_graph_max_batch=size),
        )


def _token_budget(x: Context, scenario: Scenario) -> Iterator[Candidate]:
    """Other token budgets (chunked prefill on where it is off)."""
    d, cfg, t = x.d, x.d.config, x.terms
    budget = cfg.max_num_batched_tokens
    if not cfg.enable_chunked_prefill and t.knows("enable_chunked_prefill"):  # TensorRT-LLM: off by default
        yield Candidate(
            f"chunk long prompts ({t.setting('enable_chunked_prefill', True)})",
            lambda: d.with_changes(enable_chunked_prefill=True),
        )
    for tokens in (budget // 4, budget // 2, budget * 2, budget * 4):
        if tokens >= max(cfg.max_num_seqs, 256):
            yield Candidate(
                t.setting("max_num_batched_tokens", tokens),
                lambda tokens=tokens: d.with_changes(max_num_batched_tokens=tokens),
            )


def _better_route(x: Context, scenario: Scenario) -> Iterator[Candidate]:
    """A fleet that loses cache hits or queues on one replica: the routes that keep a request where its prefix is
    cached and weigh load (docs/fleets.md), and one more replica."""
    d = x.d
    replicas = d.config.data_parallel_size
    if replicas < 2:
        return
    chats = any(s.after is not None for s in scenario.shapes)
    routes = [
        (RouterPolicy.SESSION, "session affinity: a chat's turns go where its first went (an X-Session-ID key)"),
        (RouterPolicy.PREFIX_AWARE, "precise prefix-cache-aware routing (llm-d's scorer: cached prefix, queue, KV)"),
        (RouterPolicy.PREFIX_HASH, "prefix-hash routing with a load bound (KubeAI's CHWBL)"),
        (RouterPolicy.LEAST_OUTSTANDING, "least-outstanding-requests routing"),
    ]
    for route, what in routes[0 if chats else 1 :]:
        if d.router != route:
            yield Candidate(f"{what} (servelab simulate --router {route})", partial(replace, d, router=str(route)))
    yield Candidate(
        f"{replicas + 1} replicas behind the same router (one more GPU)",
        lambda: d.with_changes(data_parallel_size=replicas + 1),
    )


CANDIDATES: dict[str, Callable[[Context, Scenario], Iterator[Candidate]]] = {
    fk.UNDERLOADED: _more_load,
    fk.MAX_NUM_SEQS_BOUND: _bigger_batch,
    fk.KV_CAPACITY_BOUND: _more_kv,
    fk.PREFILL_COMPUTE_BOUND: _less_prefill,
    fk.DECODE_BANDWIDTH_BOUND: _faster_decode,
    fk.DECODE_COMPUTE_BOUND: partial(_faster_decode, compute_bound=True),
    fk.PREFIX_CACHING_OFF: _prefix_caching,
    fk.LAUNCH_BOUND: _graphs,
    fk.SLO_TRADEOFF: _token_budget,
    FindingKind.ROUTING_CACHE_MISSES: _better_route,
    FindingKind.FLEET_IMBALANCE: _better_route,
}
"""Each finding's changes worth pricing, named in the diagnosed engine's own flags."""


def candidates(kind: str, x: Context, scenario: Scenario) -> Iterator[Candidate]:
    """The changes worth pricing for a finding, each named in the diagnosed engine's own flags."""
    make = CANDIDATES.get(kind)
    return make(x, scenario) if make is not None else iter(())


def metric_for(kind: str, x: Context, scenario: Scenario) -> str:
    if x.slo is not None:
        return "request_goodput"
    if kind == fk.SLO_TRADEOFF:
        return "p99_itl_ms"
    open_loop = scenario.offered_rate is not None and scenario.max_concurrency is None
    if kind == fk.UNDERLOADED or not open_loop:
        return "request_throughput"
    return "p99_ttft_ms" if x.load_ratio < fk.SATURATED else CAPACITY


def confirm_command(scenario: Scenario, engine_args: str | None, engine: str = VLLM) -> str:
    if scenario.offered_rate is not None:
        load = f"--request-rate {scenario.offered_rate:.2f}"
    elif scenario.max_concurrency is not None:
        load = f"--max-concurrency {scenario.max_concurrency}"
    else:  # every request at once, as the measured burst was sent
        load = "--request-rate inf"
    restart = f"restart the server with `{Terms(engine).launch_command(engine_args)}`, then " if engine_args else ""
    # A shared prefix must be sent as one, or the run confirming a prefix-cache change cannot show it (chats, whose
    # turns resend their history, keep the random line: bench's prefix dataset has no history).
    chat = any(s.after is not None for s in scenario.shapes)
    dataset = (
        f"prefix --prefix-len {scenario.prefix_len} --random-input-len {scenario.mean_input - scenario.prefix_len:.0f}"
        if scenario.prefix_len and not chat
        else f"random --random-input-len {scenario.mean_input:.0f}"
    )
    return (
        f"{restart}servelab bench --base-url URL --dataset-name {dataset} "
        f"--random-output-len {scenario.mean_output:.0f} --ignore-eos {load} --num-prompts {len(scenario.shapes)}"
    )


def same_change(a: Deployment, b: Deployment) -> bool:
    """Two what-ifs are the same change when they run the same flags on the same chip."""
    return (a.hardware.name, shlex.split(a.engine_args())) == (b.hardware.name, shlex.split(b.engine_args()))


def tried_result(d: Deployment, tried: Sequence[tuple[Deployment, str]]) -> str | None:
    """What the user saw `d`'s change do, when they tried that very change."""
    return next((result for made, result in tried if same_change(d, made)), None)


def recommend(
    finding: Finding, x: Context, scenario: Scenario, baseline: Outcome, limit: int = 4
) -> list[Recommendation]:
    metric = metric_for(finding.kind, x, scenario)
    higher = metric in HIGHER_IS_BETTER
    before = x.c.saturation_rps or 0.0 if metric == CAPACITY else baseline.value(metric)
    out: list[Recommendation] = []
    cands = list(candidates(finding.kind, x, scenario))
    prefetch(((c.deployment or x.d, c.scenario or scenario, x.slo) for c in cands), ceilings=metric == CAPACITY)
    for cand in cands:
        changed = cand.scenario or scenario
        try:
            d = cand.deployment() if cand.deployment is not None else x.d
            outcome = run(d, changed, x.slo)
            after = saturation_rps(d, changed) if metric == CAPACITY else outcome.value(metric)
        except PerfConfigError:
            continue  # the change does not fit this hardware (e.g. too little memory): not a recommendation
        gain = (after - before) / before if before else (1.0 if after > 0 else 0.0)
        if (gain if higher else -gain) < MIN_GAIN:
            continue
        engine_args = d.engine_args() if cand.deployment is not None else None
        out.append(
            Recommendation(
                change=cand.change,
                engine_args=engine_args,
                metric=metric,
                before=before,
                after=after,
                # An overloaded baseline's latency percentiles measure its unstable queue, not the server: left out.
                effects={
                    m: (baseline.value(m), outcome.value(m))
                    for m in SHOWN
                    if m != metric and not (x.overloaded and m in UNSTABLE)
                },
                confirm=confirm_command(cand.scenario or scenario, engine_args, d.engine),
                tried=tried_result(d, x.tried) if cand.deployment is not None else None,
                gain=(after - before) / before if before else 0.0,
            )
        )
    # Best first, except that a change the user already saw do nothing is never the first thing recommended.
    out.sort(key=lambda r: (r.tried == NO_EFFECT, -(r.gain if higher else -r.gain)))
    return out[:limit]
