"""vLLM's measured CPU-side costs (data/vllm_cpu_costs.yaml), scaled to a GPU server's host core.

The API server (HTTP, tokenization, detokenization, SSE) and the engine
core's per-step Python are the same code on a GPU server as on the vLLM CPU
build, so benchmarks/cpu_side_costs.py times them there, with a tiny model
whose arithmetic is negligible. A GPU server's host core runs that Python
`speed_factor` times as long (the file says why its default is what it is).
These are the defaults for catalogue GPUs; `--gpu cpu` and calibrated
deployments use their fitted costs instead.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from functools import cache
from pathlib import Path

import yaml

from servelab.perf.cost_model import CostCoefficients

DATA = Path(__file__).parent / "data" / "vllm_cpu_costs.yaml"

OUTPUT_SLICE = 128
"""Outputs per slice of vLLM's API-server output handler: `VLLM_V1_OUTPUT_PROC_CHUNK_SIZE`'s default (vllm/envs.py).

`AsyncLLM.output_handler` takes one engine step's outputs at a time and processes them in slices of this many,
yielding the event loop (`asyncio.sleep(0)`) after every slice but the last, so the streams a slice woke send
their chunks before the next slice is processed. Since vLLM 0.7 (PR #12287; equal slices by `np.array_split`
until PR #32034, then slices of exactly 128, as in 0.32). A step of at most this many outputs is processed
without yielding, and the handler takes the next queued step at once, so a handler that falls behind merges
steps in the requests' collectors; a wider step gives every request one chunk of its one new token.
"""


@dataclass(frozen=True, slots=True)
class VllmCpuCosts:
    """Seconds of CPU on the measuring host; `scaled` gives them for a GPU server's host."""

    vllm_version: str
    measured_at: str
    reference_loop_s: float
    """The measuring host's pure-Python reference loop time (benchmarks/cpu_side_costs.py:reference_loop_s)."""
    default_speed_factor: float
    step_s: float
    """Engine core, every step: schedule, input preparation, output update."""
    per_scheduled_request_s: float
    admit_step_s: float
    """Engine core, once per step that admits new requests (the persistent batch changes)."""
    api_per_request_s: float
    """API server's event loop, per request: HTTP, request validation, the response's start and end."""
    api_per_prompt_token_s: float
    """API server, per prompt token (tokenization, mostly on the renderer's tokenizer thread beside the loop)."""
    api_per_output_token_s: float
    """API server's event loop, per output token streamed one token a chunk: `api_per_token_s + api_per_chunk_s`."""
    api_per_token_s: float
    """Event loop, per output token whatever the chunking (output handler: detokenize, update the request's state)."""
    api_per_chunk_s: float
    """Event loop, per SSE chunk (wake the request's task, build and serialize the chunk, write it). Under load a
    request's outputs merge in its RequestOutputCollector, so a chunk carries every token made since the last."""
    api_loop_per_prompt_token_s: float
    """The event loop's own share of `api_per_prompt_token_s`; the rest runs on the tokenizer thread beside it."""
    api_c1_overhead_s: float
    """Concurrency 1: client TTFT minus vLLM's queue and prefill, fixed part (HTTP, hops, output path)."""
    api_c1_overhead_per_prompt_token_s: float
    """Its part per prompt token. Less the loop's CPU for such a request, this is latency that occupies no core."""
    api_per_engine_step_s: float
    """Event loop, once per engine step: the output handler receives and decodes the step's outputs, records
    iteration stats and Prometheus metrics, whatever the number of requests in the step."""

    def coefficients(self, base: CostCoefficients, speed_factor: float | None = None) -> CostCoefficients:
        """`base` with its engine-core CPU terms set to these costs on a host `speed_factor` times as slow."""
        f = self.default_speed_factor if speed_factor is None else speed_factor
        return base.model_copy(
            update={
                "step_overhead_s": f * self.step_s,
                "per_request_overhead_s": f * self.per_scheduled_request_s,
                "prefill_step_overhead_s": f * self.admit_step_s,
            }
        )

    def api_server(self, speed_factor: float | None = None) -> ApiServerCosts:
        """The API server's costs on a host `speed_factor` times as slow as the measuring one."""
        f = self.default_speed_factor if speed_factor is None else speed_factor
        # The c=1 overhead less the event-loop CPU a 1-token request costs is time on no serial core: thread
        # hand-offs (tokenizer thread, ZMQ I/O), the engine core's input handling, waking the loop.
        loop_cpu_one_token = (
            self.api_per_request_s + self.api_per_token_s + self.api_per_chunk_s + self.api_per_engine_step_s
        )
        return ApiServerCosts(
            per_request_s=f * self.api_per_request_s,
            per_prompt_token_s=f * self.api_loop_per_prompt_token_s,
            per_output_token_s=f * self.api_per_token_s,
            per_chunk_s=f * self.api_per_chunk_s,
            per_output_step_s=f * self.api_per_engine_step_s,
            latency_s=f * max(0.0, self.api_c1_overhead_s - loop_cpu_one_token),
            latency_per_prompt_token_s=f
            * max(0.0, self.api_c1_overhead_per_prompt_token_s - self.api_loop_per_prompt_token_s),
        )


@dataclass(frozen=True, slots=True)
class ApiServerCosts:
    """What one vLLM API server costs a request, in seconds (see SimTarget for where each is charged).

    The first five are CPU time of its event loop, one core, served in time
    order; the latencies are time a request spends on no serial core (thread
    hand-offs, ZMQ hops), so they lengthen TTFT without limiting throughput.
    """

    per_request_s: float = 0.0
    per_prompt_token_s: float = 0.0
    per_output_token_s: float = 0.0
    per_chunk_s: float = 0.0
    per_output_step_s: float = 0.0
    latency_s: float = 0.0
    latency_per_prompt_token_s: float = 0.0

    @property
    def per_streamed_token_s(self) -> float:
        """Loop CPU per output token when every token is its own chunk (a light load)."""
        return self.per_output_token_s + self.per_chunk_s

    @property
    def any(self) -> bool:
        return any(v > 0 for v in astuple(self))


def measured(vllm_version: tuple[int, int] | None = None) -> VllmCpuCosts:
    """The costs measured on the oldest measured release at or after `vllm_version` (None: the modelled one, DATA).

    The API server's and engine core's Python changed between releases; one
    file per measured release (data/vllm_cpu_costs*.yaml). A release between
    two measured ones takes the later one's: the published light-load runs of
    vLLM 0.15-0.20 show the ~11 ms request path of 0.32's measurement, not the
    ~8 ms of 0.11's (docs/accuracy.md). A release after the newest measured one
    takes the newest's.
    """
    if vllm_version is None:
        return load(DATA)
    releases = sorted(_measured_releases(), key=_release)
    return next((c for c in releases if _release(c) >= vllm_version), releases[-1])


def burst_noise() -> dict[str, float]:
    """The largest relative deviation of one repeat from the mean over moderate bursts on the CPU build, per metric.

    Recorded by benchmarks/burst_costs.py (the data file's `bursts.repeat_noise`): the noise within which a
    prediction of such a burst on that build cannot be told from a repeat of the measurement.
    """
    noise = yaml.safe_load(DATA.read_text())["bursts"]["repeat_noise"]
    return {str(k): float(v) for k, v in noise.items()}


def _release(costs: VllmCpuCosts) -> tuple[int, int]:
    major, minor = costs.vllm_version.split(".")[:2]
    return int(major), int(minor)


@cache
def _measured_releases() -> tuple[VllmCpuCosts, ...]:
    return tuple(load(p) for p in sorted(DATA.parent.glob("vllm_cpu_costs*.yaml")))


@cache
def load(path: Path) -> VllmCpuCosts:
    doc = yaml.safe_load(path.read_text())
    engine, api = doc["engine_core"], doc["api_server"]
    return VllmCpuCosts(
        vllm_version=str(doc["vllm_version"]),
        measured_at=str(doc["measured_at"]),
        reference_loop_s=float(doc["host"]["reference_loop_s"]),
        default_speed_factor=float(doc["gpu_host"]["speed_factor"]),
        step_s=float(engine["step_s"]),
        per_scheduled_request_s=float(engine["per_scheduled_request_s"]),
        admit_step_s=float(engine["admit_step_s"]),
        api_per_request_s=float(api["per_request_s"]),
        api_per_prompt_token_s=float(api["per_prompt_token_s"]),
        api_per_output_token_s=float(api["per_output_token_s"]),
        api_per_token_s=float(api["per_token_s"]),
        api_per_chunk_s=float(api["per_chunk_s"]),
        api_per_engine_step_s=float(api["per_engine_step_s"]),
        api_loop_per_prompt_token_s=float(api["loop_per_prompt_token_s"]),
        api_c1_overhead_s=float(api["c1_overhead_s"]),
        api_c1_overhead_per_prompt_token_s=float(api["c1_overhead_per_prompt_token_s"]),
    )
