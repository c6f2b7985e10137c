"""Figures a user reports, checked against what the deployment can physically do.

Users come with numbers that cannot all be true ("10 QPS of 1,500-token
prompts, GPU utilisation 30%"). A diagnosis built on them would explain a
deployment that does not exist, so the first finding says which figure is
off, by the physics that rules it out, what would reconcile it, and the one
measurement that decides. Each check is a bound, not a fit: the
deployment's ceiling for the QPS, the prefill FLOPs that must run on the
chip for the utilisation (even at the chip's peak), an idle GPU's prefill
for the TTFT, a lone sequence's decode step for the TPOT, and both for the
E2E latency. A figure *above* what the simulation gives is no contradiction
(the real load may be higher than described); the notes compare it.
"""

from __future__ import annotations

from servelab.diagnose.ceilings import Ceilings
from servelab.targets.engine_terms import Terms
from servelab.diagnose.findings import make_finding
from servelab.schemas.diagnosis import Finding
from servelab.schemas.vocabulary import FindingKind
from servelab.diagnose.scenario import Scenario
from servelab.diagnose.text_tokens import Script, tokens_from_characters
from servelab.perf.cost_model import StepBatch
from servelab.perf.quantization import weight_format
from servelab.targets.deployment import Deployment

OBSERVATIONS_INCONSISTENT = FindingKind.OBSERVATIONS_INCONSISTENT

ABOVE_CEILING = 1.1
"""Observed QPS above this multiple of the simulated ceiling cannot be sustained (the ceiling's own error is ~5-15%)."""
UTIL_SLACK = 0.05
"""nvidia-smi samples over ~1/6 s windows: a reading this far under the physical minimum is still plausible."""
TTFT_SLACK = 0.8
"""An observed TTFT under this share of an idle GPU's prefill is below what the kernels take (their error ~5%)."""


def idle_prefill_ms(d: Deployment, prompt_tokens: int) -> float:
    """One prompt's prefill on an idle GPU, in the step budget's chunks: the least any TTFT can be."""
    budget = d.config.max_num_batched_tokens or prompt_tokens
    cost, done, total = d.step_cost(), 0, 0.0
    while done < prompt_tokens:
        chunk = min(budget, prompt_tokens - done)
        total += cost.step_time(StepBatch(prefill_chunks=[(chunk, done)]))
        done += chunk
    return 1e3 * total


def idle_decode_ms(d: Deployment, context: int) -> float:
    """One decode step of a lone sequence with `context` tokens in KV: the least any TPOT can be (weights read once)."""
    return 1e3 * d.step_cost().step_time(StepBatch(decode_contexts=[context]))


def _throughput_bounds(
    d: Deployment,
    s: Scenario,
    c: Ceilings,
    qps: float | None,
    gpu_util: float | None,
    qps_source: str,
    reconciled: bool,
) -> list[tuple[str, list[str]]]:
    """The QPS above the simulated ceiling; the GPU utilisation below what the QPS's prefill alone keeps busy."""
    cfg = d.config
    gpus = cfg.tensor_parallel_size * cfg.data_parallel_size
    peak = d.hardware.peak_flops(weight_format(cfg.quantization, d.model, d.hardware).compute_dtype)
    prompt = s.mean_input
    off: list[tuple[str, list[str]]] = []
    if qps is not None and c.saturation_rps and qps > ABOVE_CEILING * c.saturation_rps:
        off.append(
            (
                "QPS",
                [
                    f"{qps:.2f} req/s {qps_source}, but this deployment's simulated ceiling for {prompt:.0f}-token "
                    f"prompts "
                    f"and {s.mean_output:.0f}-token outputs is {c.saturation_rps:.2f} req/s: above it the queue "
                    f"grows without "
                    "bound, so that rate cannot be sustained"
                ],
            )
        )
    if gpu_util is None or not qps:
        return off
    prefill = qps * c.prefill_flops_per_request / gpus
    least_busy = prefill / peak
    if gpu_util + UTIL_SLACK >= least_busy:
        return off
    fit_tokens = gpu_util * peak * gpus / (qps * c.prefill_flops_per_request / prompt)
    fit_qps = gpu_util * peak * gpus / c.prefill_flops_per_request
    lines = [
        f"{qps:.2f} req/s x {prompt:.0f} prompt tokens needs {prefill / 1e12:.0f} TFLOP/s of prefill "
        f"per GPU: even at the {d.hardware.name}'s peak of {peak / 1e12:.0f} TFLOP/s its kernels run at least "
        f"{least_busy:.0%} of the time, so nvidia-smi cannot read {gpu_util:.0%}"
    ]
    if not reconciled:
        lines.append(
            f"they fit together only if the prompts are at most ~{fit_tokens:.0f} tokens (were the {prompt:.0f} "
            f"characters of English, they would be ~{tokens_from_characters(round(prompt), Script.LATIN)} tokens), "
            f"or the rate at most "
            f"~{fit_qps:.2f} req/s"
        )
    return [*off, ("GPU utilisation", lines)]


def _latency_bounds(
    d: Deployment, s: Scenario, ttft_ms: float | None, tpot_ms: float | None, e2e_ms: float | None
) -> list[tuple[str, list[str]]]:
    """Latencies below what an idle GPU takes for one request of this shape."""
    prompt = s.mean_input
    off: list[tuple[str, list[str]]] = []
    if ttft_ms is not None:
        least = idle_prefill_ms(d, round(prompt))
        if ttft_ms < TTFT_SLACK * least:
            off.append(
                (
                    "TTFT",
                    [
                        f"TTFT {ttft_ms:.0f} ms observed, but one {prompt:.0f}-token prompt's prefill alone takes "
                        f"{least:.0f} ms on an idle {d.hardware.name}: the prompts are shorter than described, or "
                        f"hit the "
                        "prefix cache"
                    ],
                )
            )
    least_tpot = (
        idle_decode_ms(d, round(prompt + s.mean_output / 2)) if tpot_ms is not None or e2e_ms is not None else 0.0
    )
    if tpot_ms is not None and tpot_ms < TTFT_SLACK * least_tpot:
        off.append(
            (
                "TPOT",
                [
                    f"TPOT {tpot_ms:.1f} ms observed, but one decode step of a single sequence reads the weights "
                    f"once and "
                    f"takes {least_tpot:.1f} ms on an idle {d.hardware.name}: no batch decodes faster (speculative "
                    f"decoding, "
                    "or a TPOT averaged over tokens that arrived in one chunk, would explain it)"
                ],
            )
        )
    if e2e_ms is not None:
        least_e2e = idle_prefill_ms(d, round(prompt)) + (s.mean_output - 1) * least_tpot
        if e2e_ms < TTFT_SLACK * least_e2e:
            off.append(
                (
                    "E2E latency",
                    [
                        f"E2E {e2e_ms:.0f} ms observed, but a {prompt:.0f}-token prompt and a "
                        f"{s.mean_output:.0f}-token answer "
                        f"take at least {least_e2e:.0f} ms on an idle {d.hardware.name} (prefill, then one decode "
                        f"step per "
                        "token): the answers are shorter than described (they end at EOS?), or the prompts hit the "
                        "prefix cache"
                    ],
                )
            )
    return off


def check(
    d: Deployment,
    s: Scenario,
    c: Ceilings,
    *,
    qps: float | None,
    ttft_ms: float | None,
    gpu_util: float | None,
    e2e_ms: float | None = None,
    tpot_ms: float | None = None,
    qps_source: str = "observed",
    reconciled: bool = False,
) -> Finding | None:
    """The first finding when the reported figures contradict this deployment and workload's physics; else None.

    `qps_source` says where the QPS came from in the evidence: "observed" (--observed-qps) or the described load.
    `reconciled`: the simulated inverse (diagnose/reconcile.py) says what would reconcile the figures, so the
    arithmetic bound's guesses are left out.
    """
    found = [
        *_throughput_bounds(d, s, c, qps, gpu_util, qps_source, reconciled),
        *_latency_bounds(d, s, ttft_ms, tpot_ms, e2e_ms),
    ]
    off = [name for name, _ in found]
    evidence = [line for _, lines in found for line in lines]
    prompt = s.mean_input
    if not off:
        return None
    if not reconciled:
        evidence.append(
            "what would reconcile them: prompt lengths counted in characters or words instead of tokens; a QPS "
            "summed over several replicas or read at a peak minute; a utilisation averaged over several GPUs or "
            "sampled off-peak, or a different counter (DCGM's SM-active share reads lower than nvidia-smi's)"
        )
    evidence.append(
        "the measurement that decides: during peak load, the server's own token counters (the rate of "
        f"{Terms(d.engine).token_counters} on /metrics) beside `nvidia-smi dmon -s u -d 1`; or "
        f"`servelab bench --base-url URL --dataset-name random --random-input-len {prompt:.0f} --random-output-len "
        f"{s.mean_output:.0f} --request-rate {qps or 1:.2f} --num-prompts 600`, which records both in one "
        "timeline (the GPU through NVML, or a DCGM exporter with --gpu-metrics-url)"
    )
    names = " and ".join(off) if len(off) < 3 else ", ".join(off[:-1]) + f" and {off[-1]}"
    return make_finding(
        OBSERVATIONS_INCONSISTENT, f"The reported {names} cannot hold for this deployment and workload", 1.0, evidence
    )
