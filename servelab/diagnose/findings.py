"""Bottleneck detectors: each reads the evidence and says how much it limits.

A detector returns a Finding with a score in [0, 1] (how strongly the
evidence says this is what limits the deployment) and the numbers it
rests on. Ranking is by score; recommendations are attached afterwards by
simulation (diagnose/recommend.py). Thresholds are stated where they are
used, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from servelab.diagnose.ceilings import Ceilings
from servelab.diagnose.evidence import Evidence
from servelab.diagnose.utilization import Utilization
from servelab.metrics.slo import SLO
from servelab.targets.deployment import Deployment

CLIENT_BOUND = "client_bound"
UNDERLOADED = "underloaded"
MAX_NUM_SEQS_BOUND = "max_num_seqs_bound"
KV_CAPACITY_BOUND = "kv_capacity_bound"
PREFILL_COMPUTE_BOUND = "prefill_compute_bound"
DECODE_BANDWIDTH_BOUND = "decode_bandwidth_bound"
FRONTEND_CPU_BOUND = "frontend_cpu_bound"
SLO_TRADEOFF = "slo_tradeoff"
KINDS = (
    CLIENT_BOUND, UNDERLOADED, MAX_NUM_SEQS_BOUND, KV_CAPACITY_BOUND,
    PREFILL_COMPUTE_BOUND, DECODE_BANDWIDTH_BOUND, FRONTEND_CPU_BOUND, SLO_TRADEOFF,
)

QUEUEING = 0.1
"""Share of samples with requests waiting above which the engine counts as turning work away."""
SATURATED = 0.85
"""Achieved/saturation throughput above which more offered load cannot raise throughput much."""


@dataclass
class Recommendation:
    change: str
    engine_args: str | None
    """The full launch flags after the change (None for workload or hardware changes)."""
    metric: str
    before: float
    after: float
    effects: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Other metrics, before -> after."""
    confirm: str = ""
    """The command that would confirm the prediction on the real server."""

    @property
    def gain(self) -> float:
        return (self.after - self.before) / self.before if self.before else 0.0

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "gain": self.gain}


@dataclass
class Finding:
    kind: str
    title: str
    score: float
    evidence: list[str]
    recommendations: list[Recommendation] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind, "title": self.title, "score": round(self.score, 3), "evidence": self.evidence,
            "recommendations": [r.as_dict() for r in self.recommendations],
        }


@dataclass(frozen=True)
class Context:
    e: Evidence
    c: Ceilings
    u: Utilization
    d: Deployment
    slo: SLO | None
    slo_attainment: float | None

    @property
    def load_ratio(self) -> float:
        return self.e.request_rate / self.c.saturation_rps if self.c.saturation_rps else 0.0

    @property
    def queueing(self) -> float:
        return self.e.frac_waiting or 0.0

    @property
    def running_per_replica(self) -> float:
        running = self.e.max_running if self.e.max_running is not None else self.e.mean_in_flight
        return running / self.c.replicas


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def client_bound(x: Context) -> Finding | None:
    if not x.e.client_may_be_bottleneck:
        return None
    return Finding(CLIENT_BOUND, "The load generator itself may be the bottleneck", 0.97,
                   [x.e.client_reason or "the client reported that it could not keep its send schedule"])


def frontend_cpu_bound(x: Context) -> Finding | None:
    """The API server's CPU (tokenize, detokenize, stream) adds latency the engine does not see."""
    server = x.e.server_ttft_mean_ms
    if server is None:
        return None
    gap = x.e.ttft_mean_ms - server
    # 50 ms is far above loopback/network noise; half the engine's own TTFT makes it the larger part.
    if gap < max(50.0, 0.5 * server):
        return None
    share = gap / (gap + server)
    return Finding(FRONTEND_CPU_BOUND, "Requests wait in the API server before the engine sees them",
                   0.5 + 0.45 * share, [
        f"client-measured mean TTFT {x.e.ttft_mean_ms:.0f} ms vs the engine's own {server:.0f} ms: "
        f"{gap:.0f} ms spent outside the engine (tokenization, queueing in the API process, streaming)",
    ])


def kv_capacity_bound(x: Context) -> Finding | None:
    preempted = x.e.preemptions or 0.0
    kv = x.e.max_kv_usage or 0.0
    if preempted <= 0 and not (kv >= 0.95 and x.queueing >= QUEUEING):
        return None
    per_request = preempted / max(1, x.e.completed)
    evidence = [
        f"KV cache usage peaked at {_pct(kv)}; {preempted:.0f} preemptions "
        f"({per_request:.2f} per completed request) recomputed prompts",
        f"KV holds {x.c.kv_capacity_seqs} sequences of {x.e.mean_input_tokens:.0f}+{x.e.mean_output_tokens:.0f} tokens "
        f"per replica ({x.d.memory.num_blocks} blocks of {x.d.memory.block_size}); max_num_seqs is {x.c.max_num_seqs}",
    ]
    return Finding(KV_CAPACITY_BOUND, "The KV cache is too small for this concurrency",
                   0.8 + 0.15 * min(1.0, per_request) if preempted else 0.75, evidence)


def max_num_seqs_bound(x: Context) -> Finding | None:
    if x.running_per_replica < 0.95 * x.c.max_num_seqs or x.queueing < QUEUEING:
        return None
    if (x.e.preemptions or 0) > 0:
        return None
    evidence = [
        f"{x.running_per_replica:.0f} requests running per replica = max_num_seqs {x.c.max_num_seqs}, "
        f"with requests waiting in {_pct(x.queueing)} of samples (up to {x.e.max_waiting or 0:.0f})",
        f"the KV cache could hold {x.c.kv_capacity_seqs} such sequences (peak usage {_pct(x.e.max_kv_usage or 0)})",
    ]
    score = 0.6 + 0.3 * x.queueing
    if x.u.compute_headroom >= 0.8:
        score *= 0.7  # the GPU is already compute-saturated: more sequences mostly add latency
    return Finding(MAX_NUM_SEQS_BOUND, "max_num_seqs caps the batch while requests queue", score, evidence)


def prefill_compute_bound(x: Context) -> Finding | None:
    if x.u.compute_headroom < 0.6 or x.u.prefill_flop_share < 0.5:
        return None
    flops_per_token = x.c.prefill_flops_per_request / max(1.0, x.e.mean_input_tokens)
    evidence = [
        f"{x.e.request_rate:.2f} req/s x {x.e.mean_input_tokens:.0f} prompt tokens x "
        f"{flops_per_token / 1e9:.1f} GFLOP/token = {x.u.flops_per_gpu * x.u.prefill_flop_share / 1e12:.0f} TFLOP/s "
        f"of prefill per GPU, {x.u.flops_per_gpu / 1e12:.0f} TFLOP/s in all, on a {x.u.peak_flops / 1e12:.0f} TFLOP/s "
        f"{x.d.hardware.name} (MFU {_pct(x.u.mfu)}; ~{_pct(x.d.coefficients.compute_efficiency)} is the practical maximum)",
        f"prefill alone caps this workload at {x.c.prefill_compute_rps:.2f} req/s; "
        f"the simulated ceiling with decode included is {x.c.saturation_rps or 0:.2f} req/s",
    ]
    return Finding(PREFILL_COMPUTE_BOUND, "Prompt processing saturates the GPU's tensor cores",
                   0.5 + 0.45 * min(1.0, x.u.compute_headroom), evidence)


def decode_bandwidth_bound(x: Context) -> Finding | None:
    busy = x.e.engine_busy if x.e.engine_busy is not None else x.load_ratio
    if busy < 0.9 or x.load_ratio < SATURATED or x.u.prefill_flop_share >= 0.5:
        return None
    if x.queueing >= QUEUEING and x.running_per_replica >= 0.95 * x.c.max_num_seqs:
        return None  # the batch is held back by max_num_seqs, not by the memory system
    regime = "compute" if x.u.compute_headroom >= x.u.bandwidth_headroom else "memory bandwidth"
    evidence = [
        f"the engine is busy {_pct(busy)} of the time, mostly decoding: {x.e.output_throughput:.0f} output tok/s at "
        f"~{x.c.decode_batch:.0f} sequences per step",
        f"MBU {_pct(x.u.mbu)} of {x.d.hardware.memory_bandwidth_gbs:.0f} GB/s, MFU {_pct(x.u.mfu)}: "
        f"decode steps here are {regime}-bound",
        f"decode ceiling at this batch {x.c.decode_bandwidth_tps:.0f} tok/s; at the largest batch the deployment "
        f"holds ({x.c.max_decode_batch}) {x.c.decode_bandwidth_tps_at_max_batch:.0f} tok/s",
    ]
    return Finding(DECODE_BANDWIDTH_BOUND, "Token generation is limited by how fast the GPU streams weights and KV",
                   0.55 + 0.35 * min(1.0, max(x.u.bandwidth_headroom, x.u.compute_headroom)), evidence)


def underloaded(x: Context) -> Finding | None:
    if not x.c.saturation_rps or x.load_ratio >= 0.75 or x.queueing >= QUEUEING:
        return None
    evidence = [
        f"{x.e.request_rate:.2f} req/s achieved; the simulator puts this deployment's ceiling for this workload at "
        f"{x.c.saturation_rps:.2f} req/s ({_pct(x.load_ratio)} used)",
        f"on average {x.e.mean_in_flight:.1f} requests were in flight and nothing waited for a slot",
    ]
    if x.e.max_concurrency:
        evidence.append(f"the client keeps at most {x.e.max_concurrency} requests outstanding")
    return Finding(UNDERLOADED, "The server has capacity to spare: the load, not the engine, sets the throughput",
                   0.9 - 0.5 * x.load_ratio, evidence)


def slo_tradeoff(x: Context) -> Finding | None:
    """Chunked prefill trades TTFT against ITL through the token budget."""
    stall = x.e.itl_p99_ms / x.e.tpot_p50_ms if x.e.tpot_p50_ms else 0.0
    evidence = [
        f"ITL p99 {x.e.itl_p99_ms:.0f} ms vs TPOT p50 {x.e.tpot_p50_ms:.0f} ms: decodes that share a step with a "
        f"{x.d.config.max_num_batched_tokens}-token prefill chunk wait for it",
    ]
    if x.slo is not None and x.slo_attainment is not None:
        if x.slo_attainment >= 0.9:
            return None
        evidence.insert(0, f"only {_pct(x.slo_attainment)} of requests meet the SLO {x.slo.as_dict()} (ms)")
        return Finding(SLO_TRADEOFF, "The token budget trades time-to-first-token against inter-token latency",
                       0.45 + 0.3 * (1 - x.slo_attainment), evidence)
    if stall < 3:
        return None
    return Finding(SLO_TRADEOFF, "Prefill chunks stall running decodes", 0.4, evidence)


DETECTORS: tuple[Callable[[Context], Finding | None], ...] = (
    client_bound, frontend_cpu_bound, kv_capacity_bound, max_num_seqs_bound,
    prefill_compute_bound, decode_bandwidth_bound, underloaded, slo_tradeoff,
)


def detect(x: Context) -> list[Finding]:
    found = [f for f in (detector(x) for detector in DETECTORS) if f is not None]
    return sorted(found, key=lambda f: f.score, reverse=True)
