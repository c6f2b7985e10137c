"""The levers for the question the user asked, each priced before -> after on the simulator at this load.

"10 s answers" is a latency question: its levers are streaming (the wait a user
perceives becomes the first token's), shorter answers (an answer takes one
engine step per token, so E2E is linear in its length: `max_tokens`), fewer
streams per GPU (a smaller batch steps faster), a second GPU as tensor
parallelism versus as a replica, INT8 W8A8 or FP8 weights (faster tensor
cores), and an FP8 KV cache (half the bytes each step reads). "Why won't QPS go
up?" is a throughput question: its levers raise the simulated ceiling. The
diagnosis leads with the levers of the question asked (`--goal`, else latency
when a latency was reported), each with the figure before and after, so the
first thing read answers what was asked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from servelab.diagnose.capacity import saturation_rps
from servelab.targets.engine_terms import Terms
from servelab.schemas.diagnosis import Lever
from servelab.schemas.vocabulary import Goal
from servelab.diagnose.recommend import Outcome, prefetch, run, tp_link, tried_result
from servelab.diagnose.regions import Region, upgrades
from servelab.diagnose.scenario import Scenario
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import get_gpu
from servelab.targets.deployment import Deployment


MERGE_LORA = "merge the LoRA adapter into the base weights (PEFT merge_and_unload; serve without --enable-lora)"


def _e2e(o: Outcome) -> float:
    return o.value("median_e2el_ms")


@dataclass(frozen=True)
class _Candidate:
    change: str
    deployment: Callable[[], Deployment] | None = None
    scenario: Scenario | None = None
    note: str = ""


def _hardware(d: Deployment, t: Terms, region: Region | None) -> list[_Candidate]:
    """The levers that change what runs the steps: more GPUs, lower precision, a bigger chip, lighter steps."""
    return [*_second_gpu(d, t), *_low_precision(d, t), *_bigger_chips(d, region), *_lighter_steps(d, t)]


def _second_gpu(d: Deployment, t: Terms) -> list[_Candidate]:
    """A second GPU as a replica, or as tensor parallelism where a link joins the GPUs."""
    cfg, hw = d.config, d.hardware
    out = [
        _Candidate(
            f"a second GPU as a replica ({cfg.data_parallel_size * 2} behind a load balancer; failover)",
            lambda: d.with_changes(data_parallel_size=2 * cfg.data_parallel_size),
            note="a replica also gives failover: one GPU down, the other still serves",
        )
    ]
    if hw.interconnect_bandwidth > 0:
        tp_flag = t.setting("tensor_parallel_size", 2 * cfg.tensor_parallel_size)
        out.append(
            _Candidate(
                f"a second GPU as tensor parallelism ({tp_flag}; {tp_link(d)})",
                lambda: d.with_changes(tensor_parallel_size=2 * cfg.tensor_parallel_size),
                note="one GPU down stops the model; every step waits for the all-reduce",
            )
        )
    return out


def _low_precision(d: Deployment, t: Terms) -> list[_Candidate]:
    """Weights and activations in the chip's lowest tensor-core precision: FP8, else INT8."""
    hw = d.hardware
    out = []
    if hw.fp8_tflops > 0:
        out.append(
            _Candidate(
                f"FP8 weights and activations ({t.setting('quantization', 'fp8')})",
                lambda: d.with_changes(quantization="fp8"),
                note="FP8 tensor cores",
            )
        )
    elif hw.int8_tflops > 0:
        out.append(
            _Candidate(
                "INT8 W8A8 weights (a w8a8 checkpoint, which vLLM loads as compressed-tensors)",
                lambda: d.with_changes(quantization="int8"),
                note="INT8 tensor cores",
            )
        )
    return out


def _bigger_chips(d: Deployment, region: Region | None) -> list[_Candidate]:
    """One faster chip instead (those sold in `region`), with its bandwidth and compute beside the current one's."""
    hw = d.hardware
    out = []
    for name in upgrades(hw.name, region):
        chip = get_gpu(name)
        out.append(
            _Candidate(
                f"one {chip.name} instead of the {hw.name}",
                partial(d.rebuilt, hardware=chip),
                note=f"{chip.memory_bandwidth_gbs:,.0f} GB/s and {chip.bf16_tflops:,.0f} dense bf16 "
                f"TFLOP/s against {hw.memory_bandwidth_gbs:,.0f} and {hw.bf16_tflops:,.0f}",
            )
        )
    return out


def _lighter_steps(d: Deployment, t: Terms) -> list[_Candidate]:
    """Steps that read and compute less on the same chip: LoRA merged away, an FP8 KV cache."""
    cfg = d.config
    out = []
    if cfg.enable_lora:
        out.append(
            _Candidate(
                MERGE_LORA,
                lambda: d.with_changes(enable_lora=False),
                note="no adapter slots in the KV budget, no LoRA kernels in each step; one fine-tune only",
            )
        )
    if cfg.kv_cache_dtype != "fp8":
        out.append(
            _Candidate(
                f"FP8 KV cache ({t.setting('kv_cache_dtype', 'fp8')})",
                lambda: d.with_changes(kv_cache_dtype="fp8"),
                note="half the KV bytes each step reads",
            )
        )
    return out


def _latency_candidates(d: Deployment, s: Scenario, region: Region | None) -> list[_Candidate]:
    fewer = (
        [
            _Candidate(
                f"half the streams per GPU (client concurrency {s.max_concurrency // 2})",
                scenario=s.closed_loop(s.max_concurrency // 2),
                note="a smaller batch steps faster; the other half wait or go to another GPU",
            )
        ]
        if s.max_concurrency and not s.offered_rate and s.max_concurrency >= 2
        else [
            _Candidate(
                f"half the arrivals per GPU ({s.offered_rate / 2:.2f} req/s)",
                scenario=s.at_rate(s.offered_rate / 2),
                note="the other half to another GPU",
            )
        ]
        if s.offered_rate
        else []
    )
    return [
        _Candidate(
            f"answers half as long (max_tokens ~{s.mean_output / 2:.0f}, or a prompt asking for brevity)",
            scenario=s.with_output_scale(0.5),
            note="an answer takes one engine step per token",
        ),
        *fewer,
        *_hardware(d, Terms(d.engine), region),
    ]


def levers(
    d: Deployment,
    s: Scenario,
    baseline: Outcome,
    goal: Goal,
    tried: Sequence[tuple[Deployment, str]] = (),
    ceiling: float | None = None,
    region: Region | None = None,
) -> list[Lever]:
    """The question's levers, best first: E2E p50 (and streaming's perceived wait) for latency, the simulated
    ceiling for throughput."""
    out: list[Lever] = []
    if goal is Goal.LATENCY:
        before = _e2e(baseline)
        ttft = baseline.value("median_ttft_ms")
        out.append(
            Lever(
                change="stream the answer (if the client waits for all of it)",
                metric="perceived wait p50 ms",
                before=before,
                after=ttft,
                note="the user reads from the first token on; throughput unchanged",
            )
        )
        candidates = _latency_candidates(d, s, region)
        prefetch((c.deployment or d, c.scenario or s, None) for c in candidates)
    else:
        before = ceiling or saturation_rps(d, s)
        candidates = _hardware(d, Terms(d.engine), region)
        prefetch(((c.deployment or d, c.scenario or s, None) for c in candidates), outcomes=False, ceilings=True)
    for c in candidates:
        try:
            changed = c.deployment() if c.deployment is not None else d
            scenario = c.scenario or s
            after = _e2e(run(changed, scenario, None)) if goal is Goal.LATENCY else saturation_rps(changed, scenario)
        except PerfConfigError:
            continue
        metric = "E2E p50 ms" if goal is Goal.LATENCY else "ceiling req/s"
        out.append(
            Lever(
                change=c.change,
                metric=metric,
                before=before,
                after=after,
                note=c.note,
                tried=tried_result(changed, tried) if c.deployment is not None else None,
            )
        )
    # Best first; a change the user saw do nothing goes last whatever the simulator says.
    return sorted(out, key=lambda x: (x.tried == "no-effect", x.after if goal is Goal.LATENCY else -x.after))
