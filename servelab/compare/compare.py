"""`servelab compare`: one deployment and one workload on each modelled engine, and why their results differ.

Every engine runs the same load points (the same requests, seeded) on the
same GPU cost model; what differs is the engine's memory plan, defaults and
scheduler. The result is typed (EngineComparison, docs/schemas/compare.json):
per engine its memory plan (KV tokens, how many of this workload's requests
fit at once), and per load point throughput, latency, goodput under the SLO,
and how often it preempted (vLLM, TensorRT-LLM MAX_UTILIZATION) or retracted
(SGLang); then the ranking by peak throughput and the few scheduler
differences that explain the gap, in words with the numbers they rest on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from servelab.errors import InputError
from servelab.cells import MISSING

from servelab.metrics.records import MemorySink
from servelab.schemas.compare import EngineComparison, EngineMemory, EnginePoint, EngineResult
from servelab.metrics.slo import SLO
from servelab.schemas.vocabulary import ENGINES, LABELS, SGLANG, TRTLLM, VLLM

if TYPE_CHECKING:  # the models below need none of these: `servelab schema compare` and `schema diagnosis` stay light
    from servelab.targets.deployment import Deployment
    from servelab.workload.spec import LoadPlan


@dataclass(frozen=True)
class CompareRequest:
    """`servelab compare`: one GPU and model, the engines to run it on (each with its own launch flags, in its own
    spelling), and the load points every engine serves (a label and a function that builds the point's plan afresh,
    so each engine gets the same seeded requests)."""

    gpu: str
    model: str
    points: Sequence[tuple[str, Callable[[], LoadPlan]]]
    engines: Sequence[str] = ENGINES
    launch_flags: Mapping[str, str] = field(default_factory=dict)
    """Per engine, its launch flags (`vllm serve ...`, `python -m sglang.launch_server ...`, `trtllm-serve ...`)."""
    tensor_parallel_size: int | None = None
    slo: SLO | None = None


def run(request: CompareRequest) -> EngineComparison:
    """Build each engine's deployment (a bad flag fails here, before any simulation), then compare them."""
    from servelab.targets.engine_deployment import build_engine_deployment  # the simulator: not for `schema compare`

    deployments = [
        build_engine_deployment(
            e,
            request.gpu,
            request.model,
            request.launch_flags.get(e, ""),
            tensor_parallel_size=request.tensor_parallel_size,
        )
        for e in request.engines
    ]
    return compare_engines(deployments, request.points, request.slo)


def save(comparison: EngineComparison, out: Path) -> None:
    """compare.json at `out` (its directory made); an unwritable path is the user's input, named."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(comparison.model_dump_json(indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--out {out}: cannot write it ({exc})") from None


def _memory(d: Deployment, seq_len: float) -> EngineMemory:
    m, c = d.memory, d.config
    return EngineMemory(
        kv_cache_gib=m.kv_cache_bytes / 2**30,
        kv_token_capacity=m.kv_token_capacity,
        block_size=m.block_size,
        max_running=c.max_num_seqs or 0,
        token_budget=c.max_num_batched_tokens or 0,
        sequences_fit=min(int(m.kv_token_capacity // max(seq_len, 1)), c.max_num_seqs or 0),
    )


def _point(d: Deployment, label: str, plan: LoadPlan, slo: SLO | None) -> EnginePoint:
    from servelab.metrics.intervals import simulated_run_intervals
    from servelab.metrics.summary import summarize

    target = d.sim_target()
    sink = MemorySink()
    run = target.run(plan, sink)
    s = summarize(sink.records, duration=run.duration if run.duration > 0 else None, slo=slo).model_dump(
        exclude_unset=True
    )
    shown = set(EnginePoint.model_fields)
    intervals = (
        simulated_run_intervals(sink.records, plan.max_concurrency, s, target.tier, run.client_stats)["intervals"]
        if s["completed"]
        else {}
    )
    return EnginePoint(
        label=label,
        request_throughput=s["request_throughput"],
        output_throughput=s["output_throughput"],
        mean_ttft_ms=s["mean_ttft_ms"],
        p99_ttft_ms=s.get("p99_ttft_ms"),
        mean_tpot_ms=s["mean_tpot_ms"],
        p99_tpot_ms=s.get("p99_tpot_ms"),
        mean_e2el_ms=s.get("mean_e2el_ms"),
        p99_e2el_ms=s.get("p99_e2el_ms"),
        request_goodput=s.get("request_goodput"),
        preemptions=sum(e.scheduler.num_preemptions for e in target.last_engines),
        completed=s["completed"],
        intervals={k: v for k, v in intervals.items() if k in shown} or None,
    )


def _lengths(plan: LoadPlan) -> tuple[float, float]:
    specs = list(plan.requests)
    if not specs:
        return 0.0, 0.0
    return (sum(len(r.prompt_ids) for r in specs) / len(specs), sum(r.max_tokens for r in specs) / len(specs))


def compare_engines(
    deployments: Sequence[Deployment],
    points: Sequence[tuple[str, Callable[[], LoadPlan]]],
    slo: SLO | None = None,
) -> EngineComparison:
    """Run every point on every deployment (same GPU and model, one per engine) and explain the differences."""
    prompt, output = _lengths(points[0][1]())
    results = []
    for d in deployments:
        results.append(
            EngineResult(
                engine=d.engine,
                label=LABELS[d.engine],
                launch_flags=d.engine_args(),
                warnings=list(d.warnings),
                settings=d.engine_settings or {k: getattr(d.config, k) for k in d.config.__dataclass_fields__},
                memory=_memory(d, prompt + output),
                points=[_point(d, label, make(), slo) for label, make in points],
            )
        )
    peak = {r.engine: max(p.output_throughput for p in r.points) for r in results}
    ranking = sorted(peak, key=lambda e: -peak[e])
    first = deployments[0]
    return EngineComparison(
        gpu=first.hardware.name,
        model=first.model.name,
        mean_prompt_tokens=prompt,
        mean_output_tokens=output,
        slo={
            k: v
            for k, v in (("ttft_ms", slo.ttft_ms), ("tpot_ms", slo.tpot_ms), ("e2el_ms", slo.e2el_ms))
            if v is not None
        }
        if slo is not None
        else None,
        engines=results,
        ranking=ranking,
        explanations=explain(results, peak, prompt, output),
    )


def _ms(value: float | None) -> str:
    return MISSING if value is None else f"{value:,.0f} ms"


def ranking_line(peaks: Sequence[tuple[str, float]]) -> str:
    """`vLLM 1,700 tok/s > SGLang 1,657 tok/s = TensorRT-LLM 1,657 tok/s: ...`, best first; engines whose peaks
    print the same are ties (`=`), never ranked by digits the line does not show."""
    shown = [(label, f"{value:,.0f}") for label, value in peaks]
    line = f"{shown[0][0]} {shown[0][1]} tok/s" + "".join(
        f" {'=' if text == before else '>'} {label} {text} tok/s"
        for (_, before), (label, text) in zip(shown, shown[1:])
    )
    (best, top), (worst, bottom) = peaks[0], peaks[-1]
    if len(peaks) > 1 and bottom > 0 and shown[0][1] != shown[-1][1]:
        line += f": {best} peaks {top / bottom:.2f}x {worst}"
    return line


def explain(results: Sequence[EngineResult], peak: dict[str, float], prompt: float, output: float) -> list[str]:
    """The differences worth a sentence, each with its numbers; the first is the ranking itself."""
    from servelab.perf.trtllm_args import GUARANTEED_NO_EVICT

    by = {r.engine: r for r in results}
    ranked = sorted(peak, key=lambda e: -peak[e])
    lines = [ranking_line([(by[e].label, peak[e]) for e in ranked])]
    seq = prompt + output
    fits = ", ".join(
        f"{r.label} {r.memory.kv_token_capacity:,} KV tokens ({r.memory.kv_cache_gib:.1f} GiB) = "
        f"{r.memory.sequences_fit:,} requests of {seq:,.0f} tokens"
        for r in results
    )
    lines.append(f"Memory plan: {fits}.")
    top = {r.engine: r.points[-1] for r in results}
    if TRTLLM in by:
        r = by[TRTLLM]
        guaranteed = r.memory.kv_token_capacity // max(int(seq), 1)
        if r.settings.get("capacity_scheduler_policy") == GUARANTEED_NO_EVICT and guaranteed < r.memory.max_running:
            lines.append(
                f"TensorRT-LLM's GUARANTEED_NO_EVICT capacity scheduler (its default) admits a request only when KV "
                f"for its "
                f"whole length ({seq:,.0f} tokens) is free beside every running request's: at most ~{guaranteed:,} "
                f"run at once, "
                f"never preempted ({top[TRTLLM].preemptions} preemptions at {top[TRTLLM].label}), where vLLM admits "
                f"on the prompt's blocks."
            )
    if SGLANG in by:
        s = top[SGLANG]
        lines.append(
            f"SGLang runs a prefill batch or a decode batch, never both (mixed chunks off by default), so decodes "
            f"pause while "
            f"prompts are prefilled: mean TPOT {_ms(s.mean_tpot_ms)} at {s.label}"
            + (
                f" vs vLLM's {_ms(top[VLLM].mean_tpot_ms)} (chunked prefill mixed into decode steps)"
                if VLLM in top
                else ""
            )
            + f"; its new-token-ratio estimate admits requests against 70% (decaying to ~10%) of their remaining "
            f"outputs, "
            f"retracting when it guessed wrong: {s.preemptions} retractions at {s.label}."
        )
    if VLLM in by:
        v = top[VLLM]
        lines.append(
            f"vLLM admits while the prompt's KV blocks are free and preempts (recompute) the newest request when a "
            f"decode "
            f"block is missing: {v.preemptions} preemptions at {v.label}; mean TTFT {_ms(v.mean_ttft_ms)}."
        )
    return lines
