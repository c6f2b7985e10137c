"""The forum's tuning advice, checked one item at a time against this deployment.

Each item says whether its flag exists in current vLLM, whether it is
already the default, and either the simulated effect of following it (on
the diagnosed workload, at the same load) or why the simulator cannot
judge it. The catalogue is data: adding advice means adding an entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from servelab.diagnose.findings import FRONTEND_CPU_BOUND
from servelab.diagnose.recommend import Outcome, prefetch, run
from servelab.diagnose.scenario import Scenario
from servelab.perf.engine_args import flag_status
from servelab.perf.errors import PerfConfigError
from servelab.perf.models import get_model
from servelab.schemas.diagnosis import AdviceRow
from servelab.schemas.vocabulary import Verdict
from servelab.targets.deployment import Deployment

HELPS, NO_EFFECT, HURTS, TRADE_OFF = Verdict.HELPS, Verdict.NO_EFFECT, Verdict.HURTS, Verdict.TRADE_OFF
OBSOLETE, OUTSIDE = Verdict.OBSOLETE, Verdict.OUTSIDE
EFFECT = 0.05
"""Relative change below which the simulator's answer is "no effect" (its own noise is smaller)."""


@dataclass(frozen=True)
class Variant:
    """A what-if: the changed deployment and/or workload, and what it is compared with."""

    deployment: Deployment
    scenario: Scenario
    reference: tuple[Deployment, Scenario] | None = None
    """Compare with this instead of the diagnosed deployment (for "A vs B" advice)."""


@dataclass(frozen=True)
class Item:
    id: int
    advice: str
    flag: str | None
    judge: Callable[[Deployment, Scenario, AdviceContext], Variant | tuple[str, str]]
    """A Variant to simulate, or a fixed (verdict, why)."""


@dataclass(frozen=True)
class AdviceContext:
    findings: tuple[str, ...]
    max_len: int
    median_ttft_ms: float
    median_e2el_ms: float
    measured: bool
    """A real run: only then can client and engine timings be compared."""


def _same(d: Deployment, s: Scenario, **changes: object) -> Variant:
    return Variant(d.with_changes(**changes), s)


def _fixed(verdict: str, why: str) -> Callable[..., tuple[str, str]]:
    return lambda d, s, x: (verdict, why)


def _max_model_len(d: Deployment, s: Scenario, x: AdviceContext) -> Variant | tuple[str, str]:
    if x.max_len > 2048:
        return (
            HURTS,
            f"requests of up to {x.max_len} tokens would be rejected; V1 allocates KV per block, not per max_model_len",
        )
    return _same(d, s, max_model_len=2048)


def _bigger_batch_weights(d: Deployment, s: Scenario, x: AdviceContext) -> Variant:
    quant = "fp8" if d.hardware.fp8_tflops > 0 else "awq"
    return _same(d, s, quantization=quant)


def _memory_utilization(d: Deployment, s: Scenario, x: AdviceContext) -> Variant:
    return Variant(d.with_changes(gpu_memory_utilization=0.95), s, (d.with_changes(gpu_memory_utilization=0.85), s))


def _tp_vs_replicas(d: Deployment, s: Scenario, x: AdviceContext) -> Variant | tuple[str, str]:
    if d.hardware.interconnect_bandwidth <= 0:
        return OUTSIDE, f"{d.hardware.name} has no GPU interconnect for tensor parallelism"
    return Variant(d.with_changes(tensor_parallel_size=2), s, (d.with_changes(data_parallel_size=2), s))


def _smaller_model(d: Deployment, s: Scenario, x: AdviceContext) -> Variant:
    return Variant(d.rebuilt(model=get_model("qwen2.5-3b")), s)


def _frontend(d: Deployment, s: Scenario, x: AdviceContext) -> tuple[str, str]:
    if not x.measured:
        return OUTSIDE, "needs a measured run: the gap between client and engine TTFT shows it (bench, then diagnose)"
    if FRONTEND_CPU_BOUND in x.findings:
        return (
            HELPS,
            "the evidence shows time spent outside the engine (see frontend_cpu_bound); try --api-server-count 2+",
        )
    return NO_EFFECT, "client and engine TTFT agree, so tokenization/detokenization is not what limits this run"


def _streaming(d: Deployment, s: Scenario, x: AdviceContext) -> tuple[str, str]:
    """Judged on what it is meant to move, the wait a user perceives (first token vs whole answer), not throughput."""
    why = (
        f"users would see the first token after {x.median_ttft_ms:.0f} ms (p50) instead of the whole answer after "
        f"{x.median_e2el_ms:.0f} ms; throughput is unchanged"
    )
    if x.median_e2el_ms <= 0:
        return NO_EFFECT, why
    cut = 1 - x.median_ttft_ms / x.median_e2el_ms
    return (HELPS if cut >= 2 * EFFECT else NO_EFFECT), f"{why} (perceived wait {-cut:+.0%})"


CATALOGUE: tuple[Item, ...] = (
    Item(1, "lower max_num_seqs to 64", "--max-num-seqs", lambda d, s, x: _same(d, s, max_num_seqs=64)),
    Item(
        2,
        "raise max_num_seqs (x2)",
        "--max-num-seqs",
        lambda d, s, x: _same(
            d,
            s,
            max_num_seqs=2 * d.config.max_num_seqs,
            max_num_batched_tokens=max(d.config.max_num_batched_tokens, 2 * d.config.max_num_seqs),
        ),
    ),
    Item(3, "lower max_model_len to 2048", "--max-model-len", _max_model_len),
    Item(4, "raise client concurrency to 256", None, lambda d, s, x: Variant(d, s.closed_loop(256))),
    Item(
        5,
        "enable prefix caching for a shared 1,000-token system prompt",
        "--enable-prefix-caching",
        lambda d, s, x: Variant(d, s.with_shared_prefix(min(1000, int(s.mean_input * 2 / 3)))),
    ),
    Item(
        6,
        "--scheduling-policy priority",
        "--scheduling-policy",
        lambda d, s, x: _same(d, s, scheduling_policy="priority"),
    ),
    Item(
        7,
        "--use-v2-block-manager",
        "--use-v2-block-manager",
        _fixed(OBSOLETE, "V1 has a single paged block manager; the flag was removed"),
    ),
    Item(8, "FP8 or AWQ weights to fit a bigger batch", "--quantization", _bigger_batch_weights),
    Item(
        9,
        "enable chunked prefill",
        "--enable-chunked-prefill",
        lambda d, s, x: _same(d, s, enable_chunked_prefill=True),
    ),
    Item(
        10,
        "upgrade vLLM",
        None,
        _fixed(OUTSIDE, "servelab models vLLM 0.32's scheduler; other versions are not simulated"),
    ),
    Item(
        11,
        "gpu_memory_utilization 0.95 (more KV) instead of 0.85 (room for compute)",
        "--gpu-memory-utilization",
        _memory_utilization,
    ),
    Item(
        12,
        "raise max_num_batched_tokens to 8192",
        "--max-num-batched-tokens",
        lambda d, s, x: _same(d, s, max_num_batched_tokens=8192),
    ),
    Item(
        13,
        "lower max_num_batched_tokens (half)",
        "--max-num-batched-tokens",
        lambda d, s, x: _same(
            d, s, max_num_batched_tokens=max(d.config.max_num_seqs, d.config.max_num_batched_tokens // 2)
        ),
    ),
    Item(
        14,
        "turn on continuous batching",
        None,
        _fixed(NO_EFFECT, "vLLM always batches continuously; there is no flag to turn on"),
    ),
    Item(15, "--kv-cache-dtype fp8", "--kv-cache-dtype", lambda d, s, x: _same(d, s, kv_cache_dtype="fp8")),
    Item(16, "tensor parallel on 2 GPUs instead of 2 replicas", "--tensor-parallel-size", _tp_vs_replicas),
    Item(
        17,
        "a smaller KV block size (8)",
        "--block-size",
        _fixed(
            NO_EFFECT,
            "V1's CUDA attention backends need block sizes that are multiples of 16; fragmentation is already "
            "under one block per sequence",
        ),
    ),
    Item(
        18,
        "speculative decoding",
        "--speculative-config",
        _fixed(
            OUTSIDE,
            "its gain depends on the draft's acceptance rate on your traffic; it helps at small batches and costs "
            "throughput at large ones",
        ),
    ),
    Item(19, "a smaller (distilled 3B) model", None, _smaller_model),
    Item(
        20,
        "--disable-custom-all-reduce on one GPU",
        "--disable-custom-all-reduce",
        lambda d, s, x: (
            (NO_EFFECT, "with one GPU there is no all-reduce")
            if d.config.tensor_parallel_size == 1
            else (OUTSIDE, "NCCL's all-reduce instead of vLLM's custom one: slightly slower steps, not modelled")
        ),
    ),
    Item(
        21,
        "--max-parallel-loading-workers 1",
        "--max-parallel-loading-workers",
        _fixed(NO_EFFECT, "it only changes how fast weights load at start-up"),
    ),
    Item(
        22,
        "avoid --swap-space",
        "--swap-space",
        _fixed(OBSOLETE, "V1 preempts by recompute and never swaps KV to CPU memory"),
    ),
    Item(23, "tokenizer/detokenizer CPU bottleneck", "--api-server-count", _frontend),
    Item(
        24,
        "prompt compression / history truncation (half the prompt)",
        None,
        lambda d, s, x: Variant(d, s.with_input_scale(0.5)),
    ),
    Item(25, "streaming for perceived latency", None, _streaming),
)


def _delta(after: Outcome, before: Outcome, metric: str) -> float | None:
    b = before.value(metric)
    return (after.value(metric) - b) / b if b else None


def verdict(d_thr: float | None, d_ttft: float | None, d_tpot: float | None) -> str:
    gains = [(d_thr or 0) >= EFFECT, (d_ttft or 0) <= -2 * EFFECT, (d_tpot or 0) <= -2 * EFFECT]
    losses = [(d_thr or 0) <= -EFFECT, (d_ttft or 0) >= 2 * EFFECT, (d_tpot or 0) >= 2 * EFFECT]
    if any(gains) and any(losses):
        return TRADE_OFF
    return HELPS if any(gains) else HURTS if any(losses) else NO_EFFECT


def _flag(item: Item, d: Deployment) -> str:
    if item.flag is None:
        return "not a flag"
    status = flag_status(item.flag)
    if status != "exists":
        return status
    defaults = {
        "--enable-chunked-prefill": d.config.enable_chunked_prefill,
        "--enable-prefix-caching": d.config.enable_prefix_caching,
    }
    return "default already" if defaults.get(item.flag) else "exists"


def _judged(
    item: Item,
    d: Deployment,
    scenario: Scenario,
    context: AdviceContext,
    baseline: Outcome,
    options: Mapping[tuple[str, str], tuple[str, str]],
) -> AdviceRow:
    """One tip: simulated when it names a change the simulator can make, else its fixed verdict and why."""
    row = AdviceRow(
        id=item.id,
        advice=item.advice,
        flag_status=_flag(item, d),
        d_throughput=None,
        d_p99_ttft=None,
        d_p99_tpot=None,
        verdict="",
        why="",
    )
    try:
        judged = item.judge(d, scenario, context)
    except PerfConfigError as exc:
        row.verdict, row.why = HURTS, f"not possible here: {exc}"
        return row
    if not isinstance(judged, Variant):
        row.verdict, row.why = judged
        return row
    try:
        after = run(judged.deployment, judged.scenario, None)
        before = run(*judged.reference, None) if judged.reference else baseline
    except PerfConfigError as exc:
        row.verdict, row.why = HURTS, f"not possible here: {exc}"
        return row
    row.d_throughput = _delta(after, before, "request_throughput")
    row.d_p99_ttft = _delta(after, before, "p99_ttft_ms")
    row.d_p99_tpot = _delta(after, before, "p99_tpot_ms")
    row.verdict = verdict(row.d_throughput, row.d_p99_ttft, row.d_p99_tpot)
    row.why = "simulated on this workload at the same load" + (
        "; compared with the alternative it replaces" if judged.reference else ""
    )
    key = (judged.deployment.hardware.name, judged.deployment.engine_args())
    if judged.reference is None and judged.scenario is scenario and key in options:
        row.verdict, label = options[key]
        row.why = f'the same change as "{label}" in the options table, judged there on E2E p50'
    return row


def what_ifs(d: Deployment, scenario: Scenario, context: AdviceContext) -> Iterator[tuple[Deployment, Scenario, None]]:
    """The simulations check_advice will ask for, for `prefetch` (a tip that cannot be built is left to it)."""
    for item in CATALOGUE:
        try:
            judged = item.judge(d, scenario, context)
        except PerfConfigError:
            continue
        if isinstance(judged, Variant):
            yield judged.deployment, judged.scenario, None
            if judged.reference:
                yield *judged.reference, None


def check_advice(
    d: Deployment,
    scenario: Scenario,
    context: AdviceContext,
    baseline: Outcome,
    options: Mapping[tuple[str, str], tuple[str, str]] | None = None,
) -> list[AdviceRow]:
    """Each tip simulated on this workload. `options`: the options table's verdicts and labels, by (GPU, launch
    flags): the same change at the same load takes that verdict here, so a report never gives one change two."""
    prefetch(what_ifs(d, scenario, context))
    return [_judged(item, d, scenario, context, baseline, options or {}) for item in CATALOGUE]
