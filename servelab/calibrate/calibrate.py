"""`calibrate`: probe a live server, fit the cost model to it, prove the fit in the simulator, write a profile.

The probes are chosen so each isolates one part of a step's cost:
  prefill   one request at a time, max_tokens 1, several prompt lengths:
            TTFT = prefill step(s) + the fixed client<->server latency (twice)
  decode    short prompts, long outputs, closed loop at several batch sizes B:
            time per output token = one decode step at batch B
  idle      the shortest prefill, sent at fixed spacings so the engine idles
            in between: the same step plus the cost of waking from idle
  mixed     prefill and decode in the same steps (checked in the simulator)
Probes run in repeated passes, interleaved, until the budget is spent; each
probe's figure is the lower quartile of its per-pass medians (upper quartile
for throughput). Other processes on a shared machine only ever slow a run
down, in bursts; the quartile estimates the machine's own speed while
ignoring the luckiest pass, and a burst spoils one pass, not the fit. Every probe run is kept
as a results directory next to the profile.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from servelab.calibrate.probes import (
    DECODE,
    IDLE,
    MIXED,
    PREFILL,
    PROBE_EXTRA_BODY,
    CalibrationError,
    Probe,
    bunched_fraction,
    client_stalled,
    probe_load,
    run_into,
)
from servelab.calibrate.calibrate_from import calibrate_from
from servelab.calibrate.reference import merged, time_reference
from servelab.calibrate.request import CalibrateRequest
from servelab.metrics import timeline as tl
from servelab.metrics.host import HostWatch
from servelab.metrics.records import MemorySink, RequestRecord
from servelab.metrics.scrape import server_cache_config
from servelab.metrics.summary import summarize
from servelab.metrics.timeline import TimelineSample
from servelab.errors import EXIT_DISTURBED, ServelabError
from servelab.perf.calibration import CostFit, StepObservation, fit_cost_model, model_spec_dict
from servelab.schemas.profile import CalibrationProfile
from servelab.perf.cost_model import StepBatch
from servelab.perf.engine_args import parse_engine_args
from servelab.perf.engine_config import EngineConfig
from servelab.perf.hardware import Hardware, get_gpu
from servelab.perf.models import ModelSpec, get_model
from servelab.perf.vllm_cpu_costs import ApiServerCosts
from servelab.schemas.results import RunInfo, Summary
from servelab.targets.deployment import Deployment
from servelab.targets.http import HttpTarget
from servelab.targets.sim import SimTarget
from servelab.targets.base import Target


class CalibrationUnreliable(ServelabError):
    """The profile is written, but its reference step time spread too wide to judge a server's speed by."""

    exit_code = EXIT_DISTURBED
    label = "unreliable"


_PREFILL_LENGTHS = (16, 128, 384, 768, 1280, 2048)
_DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
_DECODE_PROMPT, _DECODE_OUTPUT = 16, 64
_LONG_CONTEXT_PROMPT, _LONG_CONTEXT_BATCHES = 512, (2, 4)
"""Decode over long contexts: without them the KV-read term is never exercised and the fit splits attention arbitrarily.
Small batches, so that all their prompts fit one step's token budget and the decode steps that TPOT sees stay pure."""
_MIXED = ((2, 1024, 16), (4, 384, 32), (8, 128, 96))
"""(concurrency, prompt tokens, output tokens) of the mixed probes."""
_IDLE_SPACINGS_S = (0.02, 0.06, 0.2)
"""Arrival spacings of the idle probes: the engine idles ~17, ~57 and ~200 ms before each step. Back-to-back prefills
idle ~2 ms; the longest spacing pins the ceiling, which shorter ones alone leave to extrapolation (fits of 3-17 ms)."""
_IDLE_PROMPT = 16


def probe_plan(config: EngineConfig) -> list[Probe]:
    """The probes for a resolved engine config: lengths within one step's token budget, batches within max_num_seqs."""
    assert config.max_num_batched_tokens and config.max_num_seqs and config.max_model_len, "resolve() first"
    longest = min(config.max_num_batched_tokens, config.max_model_len - 1)
    lengths = sorted({min(n, longest) for n in _PREFILL_LENGTHS})
    batches = [b for b in _DECODE_BATCHES if b <= config.max_num_seqs]
    probes = [Probe(f"prefill-{n}", PREFILL, n, 1, 1, 6) for n in lengths]
    probes += [Probe(f"decode-b{b}", DECODE, _DECODE_PROMPT, _DECODE_OUTPUT, b, max(4, 2 * b)) for b in batches]
    for b in (b for b in _LONG_CONTEXT_BATCHES if b <= config.max_num_seqs):
        long_prompt = min(
            _LONG_CONTEXT_PROMPT, config.max_model_len - _DECODE_OUTPUT - 1, config.max_num_batched_tokens // b
        )
        probes.append(Probe(f"decode-b{b}-p{long_prompt}", DECODE, long_prompt, _DECODE_OUTPUT, b, 2 * b))
    probes += [
        Probe(
            f"idle-{_IDLE_PROMPT}-every-{1e3 * g:g}ms",
            IDLE,
            _IDLE_PROMPT,
            1,
            1,
            max(4, min(8, int(0.5 / g))),
            spacing_s=g,
        )
        for g in _IDLE_SPACINGS_S
    ]
    for c, p, n in _MIXED:
        c = min(c, config.max_num_seqs)
        p = min(p, config.max_model_len - n - 1)
        probes.append(Probe(f"mixed-c{c}-p{p}-o{n}", MIXED, p, n, c, 3 * c))
    return probes


def interleaved(probes: list[Probe]) -> list[Probe]:
    """One pass in an order that alternates kinds, so a slow spell is spread over all of them."""
    by_kind = [[p for p in probes if p.kind == k] for k in (PREFILL, DECODE, IDLE, MIXED)]
    order: list[Probe] = []
    while any(by_kind):
        for group in by_kind:
            if group:
                order.append(group.pop(0))
    return order


# -- measuring ----------------------------------------------------------------


def measured_figures(
    records: list[RequestRecord], samples: list[TimelineSample], summary: Summary
) -> dict[str, float | None]:
    """What a probe contributes: client medians, and the engine's own step count when it exports one."""
    iterations = tl.counter_delta(samples, tl.ITERATION_TOKENS_COUNT)
    generated = tl.counter_delta(samples, tl.GENERATION_TOKENS)
    prefill_s = tl.counter_delta(samples, tl.PREFILL_TIME_SUM)
    prefills = tl.counter_delta(samples, tl.PREFILL_TIME_COUNT)
    return {
        "median_ttft_ms": summary.median_ttft_ms if summary.completed else None,
        "median_tpot_ms": summary.median_tpot_ms if summary.completed else None,
        "output_throughput": summary.output_throughput,
        "failed": summary.failed,
        "engine_steps": iterations,
        "tokens_per_step": (generated / iterations) if generated and iterations else None,
        "server_prefill_ms": (1e3 * prefill_s / prefills) if prefill_s and prefills else None,
        "bunched": bunched_fraction(records),
    }


_CLIENT_FIGURES = frozenset({"median_ttft_ms", "median_tpot_ms", "output_throughput"})


@dataclass
class ProbeRuns:
    """Every pass of one probe: figures per pass and where each run is kept."""

    probe: Probe
    passes: list[dict[str, float | None]] = field(default_factory=list)
    directories: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def figure(self, key: str) -> float | None:
        """The probe's value of `key` over passes: lower quartile of times, upper of throughput, median otherwise.

        Client figures leave out passes in which the client stalled (see MAX_BUNCHED); the server's own are kept.
        """
        client = key in _CLIENT_FIGURES
        values = [
            p[key]
            for p in self.passes
            if p.get(key) is not None and not p.get("failed") and not (client and client_stalled(p))
        ]
        if not values:
            return None
        q = {"median_ttft_ms": 25, "median_tpot_ms": 25, "server_prefill_ms": 25, "output_throughput": 75}.get(key, 50)
        return float(np.percentile(values, q))

    def describe(self) -> dict[str, object]:
        keys = ("median_ttft_ms", "median_tpot_ms", "output_throughput", "tokens_per_step", "server_prefill_ms")
        return {
            **asdict(self.probe),
            "passes": len(self.passes),
            "stalled_passes": sum(client_stalled(p) for p in self.passes),
            "measured": {k: self.figure(k) for k in keys},
            "directories": self.directories,
        }


def run_probes(
    target: Target,
    probes: list[Probe],
    *,
    vocab_size: int,
    budget_s: float,
    directory: Path,
    run_info: RunInfo,
    progress: Callable[[str], None] = lambda _: None,
    clock: Callable[[], float] = time.monotonic,
) -> list[ProbeRuns]:
    """A warm-up pass (kept, not used), then interleaved passes until the next probe would overrun the budget."""
    start = clock()
    for probe in probes:  # first use of each shape compiles kernels on the CPU backend: keep it out of the figures
        short = Probe(
            probe.name,
            probe.kind,
            probe.prompt_len,
            min(probe.max_tokens, 8),
            probe.concurrency,
            max(probe.concurrency, 2 if probe.spacing_s else 1),
            probe.spacing_s,
        )
        run_into(target, probe_load(short, vocab_size, seed=10_000), directory / "warmup" / probe.name, run_info)
    runs = {p.name: ProbeRuns(p) for p in probes}
    order = interleaved(probes)
    passes = 0
    while True:
        for probe in order:
            r = runs[probe.name]
            estimate = max(r.seconds) if r.seconds else 0.0
            if passes and clock() - start + estimate > budget_s:
                progress(f"budget reached after {passes} full passes")
                return list(runs.values())
            t0 = clock()
            sub = directory / f"pass-{passes + 1:02d}" / probe.name
            records, samples, summary = run_into(target, probe_load(probe, vocab_size, seed=passes), sub, run_info)
            r.seconds.append(clock() - t0)
            figures = measured_figures(records, samples, summary)
            if figures["failed"]:
                reasons = ", ".join(sorted({str(rec.error_kind) for rec in records if not rec.ok}))
                raise CalibrationError(
                    f"probe {probe.name} had {figures['failed']} failed requests ({reasons}); see {sub}"
                )
            r.passes.append(figures)
            r.directories.append(str(sub))
        passes += 1
        progress(f"pass {passes} done at {clock() - start:.0f} s of {budget_s:.0f} s")


# -- fitting ------------------------------------------------------------------


def prefill_steps(prompt_len: int, config: EngineConfig) -> tuple[StepBatch, ...]:
    """The steps that prefill one prompt alone: chunks of at most max_num_batched_tokens."""
    budget = config.max_num_batched_tokens or prompt_len
    steps, done = [], 0
    while done < prompt_len:
        n = min(budget, prompt_len - done)
        steps.append(StepBatch(prefill_chunks=[(n, done)]))
        done += n
    return tuple(steps)


def observations(runs: Iterable[ProbeRuns], config: EngineConfig) -> list[StepObservation]:
    """Closed-form observations from the prefill, idle and decode probes (mixed ones are judged in the simulator).

    Where the server exports them, its iteration metrics refine the figures:
    the engine's own prefill time is a prefill step without the latency
    (which separates the latency from the step's own costs), and a decode
    probe's batch is the engine's count of generated tokens per step
    (requests admitted one by one make it smaller than the concurrency).

    Every prefill here starts on an idle engine. It idled since its previous
    first token: for back-to-back requests that is the client's turnaround
    (the client TTFT minus the engine's part), for spaced ones the spacing
    minus the engine's part. Without the engine's figure the idle time is
    unknown and taken as 0 (back to back) or the spacing minus the TTFT.
    """
    out: list[StepObservation] = []
    for r in runs:
        p, weight = r.probe, float(len(r.passes))
        if not r.passes:
            continue
        if p.kind in (PREFILL, IDLE) and (ttft := r.figure("median_ttft_ms")):
            steps = prefill_steps(p.prompt_len, config)
            server = r.figure("server_prefill_ms")
            engine_ms = server if server is not None else (ttft if p.spacing_s else None)
            if p.spacing_s:
                idle = max(0.0, p.spacing_s - engine_ms / 1e3)
            else:
                idle = max(0.0, (ttft - engine_ms) / 1e3) if engine_ms is not None else 0.0
            out.append(StepObservation(p.name, steps, ttft / 1e3, 2, weight, idle))
            if server is not None:
                out.append(StepObservation(f"{p.name} (engine)", steps, server / 1e3, 0, weight, idle))
        elif p.kind == DECODE and (tpot := r.figure("median_tpot_ms")):
            realized = r.figure("tokens_per_step")
            batch = p.concurrency if realized is None else int(round(min(max(realized, 1.0), p.concurrency)))
            context = p.prompt_len + p.max_tokens // 2
            out.append(StepObservation(p.name, (StepBatch(decode_contexts=[context] * batch),), tpot / 1e3, 0, weight))
    return out


# -- proving the fit in the simulator ------------------------------------------


def compare(measured: dict[str, float | None], simulated: dict[str, float | None]) -> dict[str, float | None]:
    """Signed % error of simulated against measured, per metric (None where either is missing or zero)."""
    out: dict[str, float | None] = {}
    for k, m in measured.items():
        s = simulated.get(k)
        out[k] = None if m in (None, 0) or s is None else 100.0 * (s - m) / m
    return out


def simulate_probes(target: SimTarget, runs: list[ProbeRuns], vocab_size: int) -> list[dict[str, object]]:
    """Every probe re-served by the simulated engine with the fitted profile, against its measured figures."""
    out = []
    keys = ("median_ttft_ms", "median_tpot_ms", "output_throughput")
    for r in runs:
        sink = MemorySink()
        target.run(probe_load(r.probe, vocab_size, seed=0), sink)
        summary = summarize(sink.records)
        simulated = {
            "median_ttft_ms": summary.median_ttft_ms,
            "median_tpot_ms": summary.median_tpot_ms if r.probe.max_tokens > 1 else None,
            "output_throughput": summary.output_throughput,
        }
        measured = {k: r.figure(k) for k in keys}
        if r.probe.max_tokens <= 1:
            measured["median_tpot_ms"] = None
        out.append(
            {
                "probe": r.probe.name,
                "kind": r.probe.kind,
                "measured": measured,
                "simulated": simulated,
                "error_pct": compare(measured, simulated),
            }
        )
    return out


# -- the server's own view of its configuration --------------------------------


def mirrored_engine_args(engine_args: str, cache: dict[str, str], served: dict[str, object]) -> str:
    """The user's flags plus what the server reports and the user did not set: block size, KV bytes, max model len.

    The CPU backend uses 128-token blocks and a fixed KV space whatever the
    flags say; mirroring the server keeps the simulated KV pool its size. The
    block size the server reports wins over a flag that says otherwise.
    """
    config = parse_engine_args(engine_args).config
    extra: list[str] = []
    if cache.get("block_size", "").isdigit() and int(cache["block_size"]) != config.block_size:
        extra.append(f"--block-size {cache['block_size']}")  # later flags win: the server's own block size
    if config.kv_cache_memory_bytes is None and cache.get("kv_cache_memory_bytes", "").isdigit():
        extra.append(f"--kv-cache-memory-bytes {cache['kv_cache_memory_bytes']}")
    if config.max_model_len is None and isinstance(served.get("max_model_len"), int):
        extra.append(f"--max-model-len {served['max_model_len']}")
    return " ".join([engine_args.strip(), *extra]).strip()


# -- the whole verb --------------------------------------------------------------


def fit_runs(runs: list[ProbeRuns], probed: Deployment, source: str) -> tuple[CostFit, Deployment]:
    """The fit of the probed deployment's cost model to the runs, and the same deployment with the fitted roofline
    and frontend."""
    fit = fit_cost_model(probed.hardware, probed.model, probed.config, observations(runs, probed.config), source=source)
    deployment = Deployment.build(
        fit.hardware,
        probed.model,
        probed.requested,
        coefficients=fit.coefficients,
        network_latency=fit.network_latency_s,
        performance_mode=probed.performance_mode,
    )
    return fit, fit_frontend(runs, deployment)


_MAX_FRONTEND_S = 5e-3


def fit_frontend(runs: list[ProbeRuns], deployment: Deployment) -> Deployment:
    """The API server's serial admission cost per request, from the decode probes' bursts, on the simulator.

    A closed loop at concurrency B sends B requests at once; vLLM's API server
    admits them one after another on one core, so the last reaches the engine
    about B x (per-request cost) after the first, and the probe's median TTFT
    grows with B far beyond what the engine alone explains. Single requests
    cannot show it: for them the admission cost is part of the fixed latency
    the step-model fit found. So the per-request frontend cost F is fitted
    here, one dimension, by re-serving the burst probes on the simulator
    (queueing is not closed-form), with the one-way latency lowered by F/2 so
    that a lone request's TTFT stays what the step model fitted.
    """
    bursts = [
        (r.probe, ttft)
        for r in runs
        if r.probe.kind == DECODE and r.probe.concurrency > 1 and (ttft := r.figure("median_ttft_ms"))
    ]
    latency = deployment.network_latency
    if not bursts or latency <= 0:
        return deployment

    def with_frontend(f: float) -> Deployment:
        return replace(deployment, api=ApiServerCosts(per_request_s=f), network_latency=latency - f / 2)

    def loss(f_ms: float) -> float:
        sim = with_frontend(f_ms / 1e3).sim_target()
        total = 0.0
        for probe, measured in bursts:
            sink = MemorySink()
            sim.run(probe_load(probe, deployment.model.vocab_size, seed=0), sink)
            total += math.log(summarize(sink.records).median_ttft_ms / measured) ** 2
        return total

    # The loss jumps where a slower admission splits a burst over one more engine step, so a local search alone can
    # stop in a step; a coarse grid (0 included: no frontend cost at all) finds the basin, a bounded search refines it.
    top = 1e3 * min(_MAX_FRONTEND_S, 2 * latency)
    grid = [0.0, *np.geomspace(0.02, top, 16)] if top > 0.02 else [0.0]
    tried = {f: loss(f) for f in grid}
    i = grid.index(min(tried, key=tried.__getitem__))
    if i > 0:
        lo, hi = grid[i - 1], grid[min(i + 1, len(grid) - 1)]
        from scipy.optimize import minimize_scalar  # scipy only where a fit runs: the CLI's start-up stays light

        refined = minimize_scalar(loss, bounds=(lo, hi), method="bounded", options={"xatol": 0.01})
        tried[float(refined.x)] = float(refined.fun)
    return with_frontend(min(tried, key=tried.__getitem__) / 1e3)


def run(request: CalibrateRequest, progress: Callable[[str], None] = lambda _: None) -> CalibrationProfile:
    """`servelab calibrate`: probe the live server, or fit to the results given; the profile goes to `request.out`."""
    return probe_server(request, progress) if request.live else calibrate_from(request, progress)


@dataclass(frozen=True)
class _ProbedServer:
    """The live server as calibrate found it: what it serves, its own cache figures, and the deployment mirrored
    from them (the flags the probes ran with)."""

    target: HttpTarget
    model: str
    max_model_len: object
    cache: dict[str, str]
    engine_args: str
    deployment: Deployment


def _connect(request: CalibrateRequest, hardware: Hardware, spec: ModelSpec) -> _ProbedServer:
    """Check the server answers (preflight) and mirror its configuration: the flags given plus what it reports."""
    assert request.base_url is not None, "a live calibration"
    target = HttpTarget(
        request.base_url,
        model=request.served_model,
        api_key=request.api_key,
        ignore_eos=True,
        extra_body=PROBE_EXTRA_BODY,
        request_timeout=120.0,
    )
    info = target.preflight()
    served: dict[str, object] = next((m for m in info["models"] if m.get("id") == info["model"]), {})
    cache = server_cache_config(request.base_url)
    probed_args = mirrored_engine_args(request.engine_args, cache, served)
    config = parse_engine_args(probed_args).config
    deployment = Deployment.build(hardware, spec, config)
    return _ProbedServer(target, info["model"], served.get("max_model_len"), cache, probed_args, deployment)


def probe_server(request: CalibrateRequest, progress: Callable[[str], None] = lambda _: None) -> CalibrationProfile:
    """Probe the server at `request.base_url` within its budget, fit, check in the simulator, write the profile."""
    hardware, spec = get_gpu(request.gpu), get_model(request.model)
    server = _connect(request, hardware, spec)
    probed, target = server.deployment, server.target
    directory = request.probe_dir
    t0 = time.monotonic()
    run_info = RunInfo.begun(verb="calibrate", engine_args=server.engine_args)
    host = HostWatch().start()
    reference_args = (probed.config.max_num_seqs, spec.vocab_size)
    before = time_reference(target, *reference_args, directory / "reference-before", run_info, warm_up=True)
    runs = run_probes(
        target,
        probe_plan(probed.config),
        vocab_size=spec.vocab_size,
        budget_s=request.budget_s,
        directory=directory,
        run_info=run_info,
        progress=progress,
    )
    after = time_reference(target, *reference_args, directory / "reference-after", run_info)
    elapsed = time.monotonic() - t0
    source = (
        f"fitted by servelab calibrate against {request.base_url} ({server.model}) on "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}; not a datasheet rate"
    )
    fit, deployment = fit_runs(runs, probed, source)
    profile = CalibrationProfile(
        created_at=time.time(),
        server=_server_report(server),
        hardware=fit.hardware,
        gpu=hardware.name,
        model_source=str(request.model),
        model_spec=model_spec_dict(spec),
        engine_args=server.engine_args,
        engine_config=asdict(probed.config),
        coefficients=fit.coefficients,
        network_latency_s=deployment.network_latency,
        frontend_s_per_request=deployment.api.per_request_s,
        rates=fit.rates,
        fit=fit_report(fit),
        simulated_probes=simulate_probes(deployment.sim_target(), runs, spec.vocab_size),
        probes=[r.describe() for r in runs],
        budget_s=request.budget_s,
        elapsed_s=elapsed,
        host=host.conditions(gpus=True),
        reference=merged(before, after),
    )
    profile.save(request.out)
    return profile


def _server_report(server: _ProbedServer) -> dict[str, object]:
    """The profile's `server`: where it was measured and what the server reported of its cache."""
    cache_keys = ("block_size", "kv_cache_memory_bytes", "num_gpu_blocks")
    return {
        "base_url": server.target.base_url,
        "model": server.model,
        "max_model_len": server.max_model_len,
        "cache_config": {k: server.cache[k] for k in cache_keys if k in server.cache},
    }


def fit_report(fit: CostFit) -> dict[str, object]:
    return {
        "converged": fit.converged,
        "message": fit.message,
        "rms_rel_error": fit.rms_rel_error,
        "max_abs_rel_error": fit.max_abs_rel_error,
        "observations": [
            {
                "label": r.label,
                "measured_ms": r.measured_s * 1e3,
                "predicted_ms": r.predicted_s * 1e3,
                "error_pct": 100 * r.rel_error,
            }
            for r in fit.residuals
        ],
    }
