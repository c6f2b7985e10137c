"""The changes a team weighs before buying hardware, priced side by side at the user's own load.

"Should we buy a second GPU?" has no answer without the cheaper knobs next
to it: the token budget up and down, quantized weights, an FP8 KV cache,
then a second GPU as a replica or as tensor parallelism, or a bigger chip.
Each is simulated on the same workload at the same load and read on the
metrics users feel (TTFT, whole-answer latency) and on what it costs per
million output tokens. A change judged "no effect" says why, from the step
it does not shorten (the cost model's time for a lone sequence's step and
for a step at this load), so "it did not help" becomes physics, not luck.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from servelab.targets.engine_terms import Terms
from servelab.diagnose.recommend import Outcome, prefetch, run, tp_link, tried_result
from servelab.diagnose.regions import Region, upgrades
from servelab.diagnose.scenario import Scenario
from servelab.diagnose.pricing import price_of, usd_per_million_tokens
from servelab.perf.cost_model import StepBatch
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import get_gpu
from servelab.perf.memory import kv_bytes_per_token_per_rank
from servelab.perf.quantization import weight_format
from servelab.schemas.diagnosis import Alternative, Evidence
from servelab.schemas.vocabulary import Verdict
from servelab.targets.deployment import Deployment

EFFECT = 0.1
"""A change must move whole-answer latency by this much to count: the simulator's error on real GPUs is ~5-15%
(docs/accuracy.md), and a user does not notice less."""
HELPS, NO_EFFECT, HURTS = Verdict.HELPS, Verdict.NO_EFFECT, Verdict.HURTS


@dataclass(frozen=True)
class Option:
    """A change to price: built only when priced (a change the hardware cannot take raises PerfConfigError then)."""

    change: str
    build: Callable[[], Deployment]
    explain: Callable[[Deployment, Outcome], str] | None = None
    """Why it does not help, in the numbers of the step it does not shorten; None where the table says enough."""
    trade: str = ""
    """What the option gives or gives up besides speed, said whatever its verdict (a replica's failover, TP's link)."""


def _ms(summary: dict[str, object], key: str) -> float | None:
    value = summary.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def loaded_step(e: Evidence, scenario: Scenario, replicas: int) -> StepBatch:
    """A typical step at this load, from the run's own gauges: its decodes at their mean context, and the prompt
    tokens computed per step (those the prefix cache did not serve, spread over the steps the engine ran)."""
    running = max(1, round((e.mean_running if e.mean_running is not None else e.mean_in_flight) / replicas))
    context = round(scenario.mean_input + scenario.mean_output / 2)
    computed = e.request_rate * e.mean_input_tokens * (1 - (e.prefix_hit_rate or 0.0)) / replicas
    steps = e.steps_per_s / replicas if e.steps_per_s else e.output_throughput / replicas / running
    prefill = round(computed / steps) if steps > 0 else 0
    return StepBatch(prefill_chunks=[(prefill, context)] if prefill else [], decode_contexts=[context] * running)


@dataclass(frozen=True)
class _Why:
    """Why a change did not help, in the numbers of the step it does not shorten: the cost model's time for a lone
    sequence's decode step beside a step at this load (`step`, from the run's own gauges)."""

    d: Deployment
    e: Evidence
    scenario: Scenario
    step: StepBatch

    @property
    def lone(self) -> StepBatch:
        first = self.step.decode_contexts[0] if self.step.decode_contexts else round(self.scenario.mean_input)
        return StepBatch(decode_contexts=[first])

    def step_ms(self, x: Deployment, batch: StepBatch) -> float:
        return 1e3 * x.step_cost().step_time(batch)

    def shape(self) -> str:
        prefill = sum(n for n, _ in self.step.prefill_chunks)
        context = self.step.decode_contexts[0] if self.step.decode_contexts else 0
        decoding = len(self.step.decode_contexts)
        return f"{decoding} sequences decoding ~{context}-token contexts plus {prefill} prefill tokens"

    def budget(self, changed: Deployment, out: Outcome) -> str:
        """A token budget only moves prefill between steps: the tokens computed and the steps per answer stay."""
        cfg, new = self.d.config, changed.config.max_num_batched_tokens
        old = cfg.max_num_batched_tokens or cfg.max_num_seqs or 1
        computed = self.scenario.mean_input * (1 - (self.e.prefix_hit_rate or 0.0))
        return (
            f"a {new}-token budget instead of {old} only moves prefill between steps: the same {computed:.0f} "
            "prompt tokens a request brings past the prefix cache are computed, and every answer still takes one "
            "step per token "
            f"at a batch of {len(self.step.decode_contexts)} (TPOT p50 {_num(_ms(out.summary, 'median_tpot_ms'))} ms)"
        )

    def weights(self, changed: Deployment, out: Outcome) -> str:
        """Smaller weights shorten a lone step's weight read, not a loaded step's KV read or its arithmetic."""
        d, cfg, lone, step = self.d, self.d.config, self.lone, self.step
        fmt = weight_format(changed.config.quantization, changed.model, changed.hardware)
        kv = kv_bytes_per_token_per_rank(d.model, cfg.kv_cache_dtype, cfg.tensor_parallel_size) * sum(
            step.decode_contexts
        )
        return (
            f"{fmt.name} weights make a lone sequence's decode step {self.step_ms(d, lone):.1f} → "
            f"{self.step_ms(changed, lone):.1f} ms (the weight read shrinks), but a step at this load ({self.shape()}) "
            f"only {self.step_ms(d, step):.1f} → {self.step_ms(changed, step):.1f} ms: it also reads {kv / 1e9:.1f} GB "
            f"of KV cache ({1e3 * kv / d.hardware.memory_bandwidth:.0f} ms at {d.hardware.memory_bandwidth_gbs:,.0f} "
            f"GB/s) and multiplies on {fmt.compute_dtype} tensor cores either way; E2E p50 "
            f"{_num(_ms(out.summary, 'median_e2el_ms'))} ms"
        )


def _options(d: Deployment, e: Evidence, scenario: Scenario, region: Region | None) -> list[Option]:
    """Every change priced, cheapest first: the engine's own knobs, then more GPUs, then bigger chips."""
    why = _Why(d, e, scenario, loaded_step(e, scenario, d.config.data_parallel_size))
    return [*_knob_options(d, why), *_more_gpu_options(d), *_chip_options(d, region, why)]


def what_ifs(
    d: Deployment, e: Evidence, scenario: Scenario, region: Region | None
) -> list[tuple[Callable[[], Deployment], Scenario, None]]:
    """The simulations price_alternatives will ask for, for `prefetch`."""
    return [(o.build, scenario, None) for o in _options(d, e, scenario, region)]


def _knob_options(d: Deployment, why: _Why) -> list[Option]:
    """Changes on the same GPUs: the token budget both ways, quantized weights, an FP8 KV cache, merged LoRA."""
    cfg = d.config
    seqs = cfg.max_num_seqs or 1  # both resolved by Deployment.build: never None here
    budget = cfg.max_num_batched_tokens or seqs
    lower = max(seqs, budget // 4)
    t = Terms(d.engine)
    options = [
        Option(
            t.setting("max_num_batched_tokens", 2 * budget),
            lambda: d.with_changes(max_num_batched_tokens=2 * budget),
            why.budget,
        ),
        Option(
            t.setting("max_num_batched_tokens", lower), lambda: d.with_changes(max_num_batched_tokens=lower), why.budget
        ),
        Option("AWQ/GPTQ 4-bit weights", lambda: d.with_changes(quantization="awq"), why.weights),
        Option("FP8 weights", lambda: d.with_changes(quantization="fp8"), why.weights),
    ]
    if d.hardware.fp8_tflops <= 0 < d.hardware.int8_tflops:  # weights *and* activations: INT8 tensor cores
        options.append(Option("INT8 W8A8 weights", lambda: d.with_changes(quantization="int8"), why.weights))
    options.append(Option("FP8 KV cache", lambda: d.with_changes(kv_cache_dtype="fp8")))
    if cfg.enable_lora:
        options.append(Option("LoRA merged into the weights", lambda: d.with_changes(enable_lora=False)))
    return options


def _more_gpu_options(d: Deployment) -> list[Option]:
    """As many GPUs again: as replicas, or as tensor parallelism where a link joins them; for a MoE on several
    GPUs, the same GPUs laid out otherwise (experts sliced over TP or whole per GPU, attention data-parallel)."""
    cfg = d.config
    gpus = cfg.tensor_parallel_size * cfg.data_parallel_size
    more = f"+{gpus} GPU{'s' if gpus > 1 else ''}"
    options = [
        Option(
            f"{more}: {2 * cfg.data_parallel_size} replicas",
            lambda: d.with_changes(data_parallel_size=2 * cfg.data_parallel_size),
            trade="failover: one GPU down, the others still serve",
        )
    ]
    if d.model.moe and gpus > 1:  # TP vs EP for the same GPUs
        options.append(
            Option(
                "experts sliced over TP" if cfg.enable_expert_parallel else "expert parallel (EP)",
                lambda: d.with_changes(enable_expert_parallel=not cfg.enable_expert_parallel),
            )
        )
        if cfg.tensor_parallel_size > 1:
            options.append(
                Option(
                    f"the same {gpus} GPUs as data-parallel attention + EP (DP={gpus})",
                    lambda: d.with_changes(
                        tensor_parallel_size=1, data_parallel_size=gpus, enable_expert_parallel=True
                    ),
                )
            )
    if d.hardware.interconnect_bandwidth > 0:
        options.append(
            Option(
                f"{more}: TP={2 * cfg.tensor_parallel_size}",
                lambda: d.with_changes(tensor_parallel_size=2 * cfg.tensor_parallel_size),
                trade=tp_link(d) + ": one GPU down stops the model",
            )
        )
    return options


def _chip_options(d: Deployment, region: Region | None, why: _Why) -> list[Option]:
    """One bigger chip instead (those sold in `region`), and with FP8 weights where it has FP8 tensor cores."""
    options = []
    gpus = d.config.tensor_parallel_size * d.config.data_parallel_size
    count = "one" if gpus == 1 else str(gpus)
    for name in upgrades(d.hardware.name, region):
        chip = get_gpu(name)
        options.append(Option(f"{count} {chip.name} instead", partial(d.rebuilt, hardware=chip)))
        if chip.fp8_tflops > 0:
            options.append(
                Option(
                    f"{count} {chip.name}, FP8 weights",
                    partial(d.rebuilt, hardware=chip, quantization="fp8"),
                    why.weights,
                )
            )
    return options


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}"


def _verdict(before: float | None, after: float | None) -> Verdict:
    if not before or after is None:
        return NO_EFFECT
    change = (after - before) / before
    return HELPS if change <= -EFFECT else HURTS if change >= EFFECT else NO_EFFECT


def _row(
    change: str,
    d: Deployment,
    out: Outcome,
    base: Deployment,
    gpu_cost: float | None,
    verdict: Verdict,
    why: str,
    engine_args: str | None,
    tried: str | None = None,
) -> Alternative:
    s = out.summary
    gpus = d.config.tensor_parallel_size * d.config.data_parallel_size
    price = price_of(d.hardware.name, gpu_cost, base.hardware.name)
    tps = float(s.get("output_throughput") or 0.0)  # type: ignore[arg-type]
    return Alternative(
        change=change,
        engine_args=engine_args,
        gpus=gpus,
        gpu=d.hardware.name,
        usd_per_hour=price.usd_per_hour if price else None,
        price_source=price.source if price else None,
        median_ttft_ms=_ms(s, "median_ttft_ms"),
        p99_ttft_ms=_ms(s, "p99_ttft_ms"),
        median_e2el_ms=_ms(s, "median_e2el_ms"),
        p99_e2el_ms=_ms(s, "p99_e2el_ms"),
        median_tpot_ms=_ms(s, "median_tpot_ms"),
        output_throughput=tps,
        usd_per_mtok=usd_per_million_tokens(price.usd_per_hour, gpus, tps) if price else None,
        verdict=verdict,
        why=why,
        tried=tried,
    )


def price_alternatives(
    d: Deployment,
    e: Evidence,
    scenario: Scenario,
    baseline: Outcome,
    gpu_cost_per_hour: float | None = None,
    tried: Sequence[tuple[Deployment, str]] = (),
    region: Region | None = None,
) -> list[Alternative]:
    """The deployment as it is, then each option, simulated on `scenario` at its own load; judged on E2E p50."""
    before = _ms(baseline.summary, "median_e2el_ms")
    rows = [_row("as deployed", d, baseline, d, gpu_cost_per_hour, Verdict.AS_DEPLOYED, "", d.engine_args())]
    options = _options(d, e, scenario, region)
    prefetch((o.build, scenario, None) for o in options)
    for option in options:
        try:
            changed = option.build()
            out = run(changed, scenario, None)
        except PerfConfigError as exc:
            rows.append(
                Alternative(
                    change=option.change,
                    engine_args=None,
                    gpus=0,
                    gpu=d.hardware.name,
                    usd_per_hour=None,
                    price_source=None,
                    median_ttft_ms=None,
                    p99_ttft_ms=None,
                    median_e2el_ms=None,
                    p99_e2el_ms=None,
                    median_tpot_ms=None,
                    output_throughput=0.0,
                    usd_per_mtok=None,
                    verdict=HURTS,
                    why=f"not possible here: {exc}",
                )
            )
            continue
        verdict = _verdict(before, _ms(out.summary, "median_e2el_ms"))
        why = option.explain(changed, out) if option.explain is not None and verdict != HELPS else ""
        why = "; ".join(part for part in (why, option.trade) if part)
        rows.append(
            _row(
                option.change,
                changed,
                out,
                d,
                gpu_cost_per_hour,
                verdict,
                why,
                changed.engine_args(),
                tried_result(changed, tried),
            )
        )
    return rows
