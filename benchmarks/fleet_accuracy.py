"""Fleet routers: the simulator against published multi-replica runs that compare routers on one fleet and workload.

Each published load point is replayed with servelab's counterpart of every router the source compared (the counterparts
are listed per source; a router servelab does not model is shown, not scored), and with the source's client rebuilt: the
prompts it sent, in its order, at its rates (KubeAIClient, SharedPrefixClient; the llm-d stages each after the one
before has finished, as inference-perf ran them: drained_specs). Printed,
in markdown: per point and router, measured and predicted served throughput (KubeAI:
requests/s; llm-d: output tokens/s) and mean TTFT with their errors, and mean TPOT beside the published one (llm-d's
from its published ITL: llmd_tpot_ms; not scored), and the router's own time a request where its counterpart publishes
one (servelab.sim.router.ROUTER_COSTS); the simulated llm-d fleet's prefix-cache hit rate per stage and router (the
report publishes none); with --draws N, the noise table: each point replayed N times with its random
parts drawn again, and whether the two cache-blind routers' measured gap is one a repeat could reverse (noise); per load
point, the routers' order by mean TTFT (lower first), measured and predicted, and whether the best router is the same;
the counts of the brief: served throughput and mean TTFT within 20% where the published run was neither overloaded (its
mean TTFT at or over OVERLOADED_TTFT_S: queues of seconds mean the fleet was past what it serves) nor paced by its
client (client_limited); and, apart from the fleets, the single-replica L4 check (L4_RUNS). Deterministic (seeded).

    PYTHONPATH=. .venv/bin/python benchmarks/fleet_accuracy.py [--only kubeai|llm-d|llm-d-73] [--draws N]

Sources, setups and the published numbers: docs/accuracy.md, section Fleets.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from servelab.metrics import timeline as tl
from servelab.metrics.records import MemorySink
from servelab.metrics.timeline import TimelineSample
from servelab.metrics.summary import summarize
from servelab.schemas.results import Summary
from servelab.targets.base import TargetRun
from servelab.sim.router import LLMD_LOAD_PROFILE, LLMD_PREFIX_LOAD_PROFILE, ScorerWeights
from servelab.targets.deployment import Deployment, build_deployment
import numpy as np

from servelab.workload.arrival import ArrivalConfig, schedule
from servelab.workload.spec import LoadPlan, RequestSpec

sys.path.insert(0, str(Path(__file__).parent))
import gpu_accuracy  # noqa: E402  (the sibling benchmark whose replay of published single-GPU runs the L4 check uses)

OVERLOADED_TTFT_S = 2.0
"""A published mean TTFT at or above this is a fleet that queues for seconds: its ranking is scored, its values
shown but not held to 20%."""
TOLERANCE = 0.20
CLIENT_LIMITED_SHARE = 0.75
"""A closed-loop point whose fleet held (Little's law on its published numbers) under this share of the client's
--max-concurrency while its TTFT shows no queue was paced by its client, not its fleet: shown, not scored."""


@dataclass(frozen=True)
class Counterpart:
    """servelab's counterpart of a published router: a --router and, for llm-d's scorers, their --router-weights."""

    router: str
    weights: ScorerWeights | None = None

    def __str__(self) -> str:
        return self.router if self.weights is None else f"{self.router} {self.weights.flag()}"


@dataclass(frozen=True)
class Source:
    """One published experiment: the fleet and its routers' counterparts (its client is rebuilt below)."""

    name: str
    url: str
    gpu: str
    model: str
    engine_args: str
    replicas: int
    routers: dict[str, Counterpart | None]
    """Published router name -> servelab's counterpart (None: not modelled, shown only)."""
    throughput: str
    """The summary's throughput the source reports as what was served (its other rate is the one it offered)."""
    vllm_version: str | None = None
    """The vLLM release whose defaults the replay runs (`simulate --vllm-version`); None: the source does not say."""


KUBEAI = Source(
    name="kubeai",
    url="https://github.com/substratusai/kubeai/blob/main/docs/benchmarks/prefix-aware-load-balancing.md",
    gpu="l4",
    model="llama-3.1-8b",
    replicas=8,
    # Published with --kv-cache-dtype fp8, which v0.7.2's V1 engine did not apply to the cache's size: its model
    # runner sized every layer's cache in the attention layer's dtype (get_kv_cache_spec: FullAttentionSpec(dtype=
    # attn_module.dtype), and Attention.__init__ keeps torch.get_default_dtype(), the model's bf16), while the flag
    # reached only the kernel that writes K and V (reshape_and_cache_flash), so the output was unreadable (vLLM issue
    # #13133) and the cache bf16 (PR #14221: V1 "ignoring the parameter"). So the replay runs a bf16 cache.
    engine_args=(
        "--quantization fp8 --max-model-len 16384 --max-num-batched-tokens 16384 "
        "--gpu-memory-utilization 0.95 --enable-prefix-caching"
    ),
    routers={
        "k8s-service": Counterpart("random"),
        "least-load": Counterpart("least-outstanding"),
        "prefix-hash": Counterpart("prefix-hash"),
    },
    throughput="request_throughput",
    # v0.7.2 with VLLM_USE_V1=1: the V1 engine with its synchronous loop. 0.8 is the earliest release whose V1
    # defaults the simulator models (benchmarks/gpu_accuracy.py replays every earlier one as 0.8 too).
    vllm_version="0.8",
)
LLMD = Source(
    name="llm-d",
    url="https://github.com/llm-d/llm-d-kv-cache-manager/blob/main/benchmarking/37-capacity/README.md",
    gpu="h100",
    model="llama-3.1-70b",
    replicas=4,
    # 4 pods of TP=4; the report's per-pod KV of 461,376 tokens is 37.8 GB a GPU of Llama-3.1-70B's bf16 KV. Blocks
    # of 64 tokens: the precise scorer keys 64-token blocks (its tokenProcessorConfig blockSize: 64) and finds a pod's
    # blocks only where they equal the hashes the pod's KV events report, i.e. where vLLM runs --block-size 64, as
    # llm-d's precise prefix-cache guide runs it (guides/precise-prefix-cache-aware/ms-kv-events/values.yaml).
    engine_args="--tensor-parallel-size 4 --kv-cache-memory-bytes 37800000000 --enable-prefix-caching --block-size 64",
    # Each router with the scorers and weights its EndpointPickerConfig gives (llm-d-kv-cache-manager
    # benchmarking/37-capacity/README.md at edb766fdb1c0): "load" is active-request 1 + kv-cache 1, the other two add
    # a prefix-cache scorer weighted 2 (precise: KV events; estimate: its own routing history); no queue scorer. The
    # image that ran (llm-d-inference-scheduler b9c56d36 on GIE v0.5.1) released the active-request count at the
    # response's headers (servelab.sim.router.ActiveRelease.HEADERS), so that scorer moved no pick there either.
    routers={
        "random": Counterpart("random"),
        "load": Counterpart("prefix-aware", LLMD_LOAD_PROFILE),
        "precise-prefix-cache_load": Counterpart("prefix-aware", LLMD_PREFIX_LOAD_PROFILE),
        "estimate-prefix-cache_load": Counterpart("prefix-estimate", LLMD_PREFIX_LOAD_PROFILE),
    },
    # Its "Requests/s" is the rate requests were sent in a stage (20.04 at QPS 20, where 8,004 output tokens a
    # second is 8 requests of 1,000 tokens): what the fleet served is its output tokens per second.
    throughput="output_throughput",
)
LLMD73_LOAD = ScorerWeights(prefix=0.0, queue=1.0, kv=1.0, active=0.0)
"""The 73-capacity report's "load-scheduling": queue-scorer 1 and kv-cache-scorer 1, no other scorer."""
LLMD73_PRECISE = ScorerWeights(prefix=3.0, queue=2.0, kv=2.0, active=0.0)
"""The 73-capacity report's "precise-scheduling": the precise prefix-cache scorer 3, kv-cache 2, queue 2 (the
precise prefix-cache guide's weights), no active-request scorer."""
LLMD73 = Source(
    name="llm-d-73",
    url="https://github.com/llm-d/llm-d-kv-cache-manager/blob/d070ea6065d46b15426667c95a5087128bd12048/"
    "benchmarking/73-capacity/README.md",
    gpu="h100",
    model="qwen3-32b",
    replicas=8,
    # 8 pods of Qwen/Qwen3-32B, TP=2 on H100s (the report's workload header: "Pods: 8, KV/pod: 307,328"; llm-d's blog
    # kvcache-wins-you-can-see, Appendix A.1: "8 vLLM pods, each running on 2 NVIDIA H100 GPUs"). Qwen3-32B's bf16 KV
    # is 64 layers x 8 KV heads x 128 x 2 x 2 bytes = 256 KiB a token, 128 KiB on each of two GPUs: 307,328 tokens are
    # 40.28 GB a GPU, which an 80 GB H100 leaves at vLLM's default 0.9 beside 32.8 GB of weights. Blocks of 64 tokens,
    # as the precise scorer keys them (tokenProcessorConfig blockSize: 64) and as the 37-capacity replay runs them.
    engine_args="--tensor-parallel-size 2 --kv-cache-memory-bytes 40282095616 --enable-prefix-caching --block-size 64",
    # The report's EndpointPickerConfigs. "estimated-scheduling" is the estimate-mode prefix-cache-scorer with
    # hashBlockSize 64 (characters: 16 tokens a block, so its 256 blocks reach 4,096 tokens, inside the 6,000-token
    # system prompt) and lruCapacityPerServer 31,250, weighted 1 beside kv-cache 1 and queue 1. servelab's
    # prefix-estimate models the 37-capacity configuration (256-character blocks, 2,200 entries a pod,
    # servelab/sim/prefix_index.py) and takes no other: shown, not modelled.
    routers={
        "precise-scheduling": Counterpart("prefix-aware", LLMD73_PRECISE),
        "estimated-scheduling": None,
        "random-scheduling": Counterpart("random"),
        "load-scheduling": Counterpart("prefix-aware", LLMD73_LOAD),
    },
    throughput="output_throughput",
)

SOURCES = (KUBEAI, LLMD, LLMD73)

# (source, load point, published router, served throughput, mean TTFT s): KubeAI's request/s, llm-d's output
# tokens/s. KubeAI's load point is its client's --max-concurrency (with --request-rate 800 at 800 and 8000, 200
# otherwise), llm-d's the stage's QPS. llm-d-73: the 73-capacity report's "Per-QPS Results" (Output toks/s, TTFT
# mean), in its order.
PUBLISHED: list[tuple[str, float, str, float, float]] = [
    ("kubeai", 800, "k8s-service", 50.01, 1.31977),
    ("kubeai", 800, "least-load", 50.51, 0.81718),
    ("kubeai", 800, "prefix-hash", 76.43, 0.28020),
    ("kubeai", 1600, "k8s-service", 50.93, 10.36529),
    ("kubeai", 1600, "least-load", 52.28, 10.57901),
    ("kubeai", 1600, "prefix-hash", 72.73, 0.19613),
    ("kubeai", 3200, "k8s-service", 51.16, 27.18341),
    ("kubeai", 3200, "least-load", 52.48, 24.14786),
    ("kubeai", 3200, "prefix-hash", 71.84, 0.21392),
    ("kubeai", 8000, "k8s-service", 51.22, 48.58755),
    ("kubeai", 8000, "least-load", 52.43, 39.16380),
    ("kubeai", 8000, "prefix-hash", 74.15, 0.23706),
    ("llm-d", 3, "precise-prefix-cache_load", 2590.0, 0.246),
    ("llm-d", 3, "random", 2505.7, 1.102),
    ("llm-d", 3, "estimate-prefix-cache_load", 2573.6, 1.007),
    ("llm-d", 3, "load", 2545.4, 1.548),
    ("llm-d", 4, "precise-prefix-cache_load", 3345.2, 0.304),
    ("llm-d", 4, "estimate-prefix-cache_load", 3326.3, 1.497),
    ("llm-d", 4, "load", 2967.6, 5.021),
    ("llm-d", 4, "random", 2829.5, 7.257),
    ("llm-d", 5, "precise-prefix-cache_load", 3916.7, 0.270),
    ("llm-d", 5, "estimate-prefix-cache_load", 3691.2, 1.919),
    ("llm-d", 5, "random", 2898.2, 11.988),
    ("llm-d", 5, "load", 2943.6, 11.329),
    ("llm-d", 6, "precise-prefix-cache_load", 4640.3, 0.271),
    ("llm-d", 6, "estimate-prefix-cache_load", 3724.3, 9.700),
    ("llm-d", 6, "random", 2955.9, 23.742),
    ("llm-d", 6, "load", 2656.5, 31.824),
    ("llm-d", 8, "precise-prefix-cache_load", 5557.1, 0.248),
    ("llm-d", 8, "estimate-prefix-cache_load", 3571.6, 20.389),
    ("llm-d", 8, "random", 3108.8, 40.124),
    ("llm-d", 8, "load", 2506.3, 42.683),
    ("llm-d", 10, "precise-prefix-cache_load", 6264.0, 0.242),
    ("llm-d", 10, "estimate-prefix-cache_load", 3798.6, 26.567),
    ("llm-d", 10, "random", 3117.3, 46.359),
    ("llm-d", 10, "load", 2620.3, 47.727),
    ("llm-d", 12, "precise-prefix-cache_load", 6765.9, 0.255),
    ("llm-d", 12, "estimate-prefix-cache_load", 3773.5, 31.615),
    ("llm-d", 12, "random", 3140.8, 49.556),
    ("llm-d", 12, "load", 2897.6, 53.087),
    ("llm-d", 15, "precise-prefix-cache_load", 7345.1, 0.247),
    ("llm-d", 15, "estimate-prefix-cache_load", 3200.9, 38.253),
    ("llm-d", 15, "random", 3126.2, 58.760),
    ("llm-d", 15, "load", 2549.1, 67.339),
    ("llm-d", 20, "precise-prefix-cache_load", 8003.9, 0.250),
    ("llm-d", 20, "estimate-prefix-cache_load", 3017.1, 71.632),
    ("llm-d", 20, "random", 3241.0, 93.345),
    ("llm-d", 20, "load", 2334.5, 86.643),
    ("llm-d-73", 3, "estimated-scheduling", 1310.9, 0.3),
    ("llm-d-73", 3, "precise-scheduling", 1219.1, 0.291),
    ("llm-d-73", 3, "random-scheduling", 1314.0, 0.622),
    ("llm-d-73", 3, "load-scheduling", 1274.8, 0.944),
    ("llm-d-73", 10, "estimated-scheduling", 3842.4, 0.271),
    ("llm-d-73", 10, "precise-scheduling", 3902.1, 0.335),
    ("llm-d-73", 10, "random-scheduling", 3568.5, 0.826),
    ("llm-d-73", 10, "load-scheduling", 3607.0, 2.241),
    ("llm-d-73", 15, "estimated-scheduling", 5152.9, 0.232),
    ("llm-d-73", 15, "precise-scheduling", 5761.1, 0.249),
    ("llm-d-73", 15, "random-scheduling", 3791.1, 1.278),
    ("llm-d-73", 15, "load-scheduling", 3348.4, 4.013),
    ("llm-d-73", 20, "estimated-scheduling", 8082.6, 0.329),
    ("llm-d-73", 20, "precise-scheduling", 9184.5, 0.363),
    ("llm-d-73", 20, "random-scheduling", 4933.1, 25.073),
    ("llm-d-73", 20, "load-scheduling", 4902.5, 29.229),
    ("llm-d-73", 22, "precise-scheduling", 9382.0, 0.3),
    ("llm-d-73", 22, "estimated-scheduling", 8415.7, 0.407),
    ("llm-d-73", 22, "load-scheduling", 4785.5, 28.71),
    ("llm-d-73", 22, "random-scheduling", 4765.4, 28.185),
    ("llm-d-73", 25, "precise-scheduling", 9242.2, 0.303),
    ("llm-d-73", 25, "estimated-scheduling", 8445.1, 0.37),
    ("llm-d-73", 25, "random-scheduling", 4781.3, 30.689),
    ("llm-d-73", 25, "load-scheduling", 4872.8, 32.534),
    ("llm-d-73", 30, "precise-scheduling", 9221.8, 0.296),
    ("llm-d-73", 30, "estimated-scheduling", 8435.9, 0.373),
    ("llm-d-73", 30, "load-scheduling", 4888.7, 32.831),
    ("llm-d-73", 30, "random-scheduling", 4636.3, 32.212),
    ("llm-d-73", 35, "precise-scheduling", 9780.6, 0.275),
    ("llm-d-73", 35, "estimated-scheduling", 7443.5, 2.78),
    ("llm-d-73", 35, "load-scheduling", 4660.7, 33.874),
    ("llm-d-73", 35, "random-scheduling", 4332.6, 34.043),
    ("llm-d-73", 40, "precise-scheduling", 10270.8, 0.269),
    ("llm-d-73", 40, "estimated-scheduling", 8045.9, 13.16),
    ("llm-d-73", 40, "load-scheduling", 4946.4, 53.545),
    ("llm-d-73", 40, "random-scheduling", 4773.8, 54.196),
    ("llm-d-73", 43, "precise-scheduling", 10054.8, 0.281),
    ("llm-d-73", 43, "estimated-scheduling", 7969.6, 16.941),
    ("llm-d-73", 43, "random-scheduling", 4844.6, 53.247),
    ("llm-d-73", 43, "load-scheduling", 4973.3, 53.802),
    ("llm-d-73", 46, "precise-scheduling", 10128.7, 0.293),
    ("llm-d-73", 46, "estimated-scheduling", 7695.2, 18.081),
    ("llm-d-73", 46, "random-scheduling", 4969.5, 53.572),
    ("llm-d-73", 46, "load-scheduling", 4723.6, 56.746),
    ("llm-d-73", 49, "precise-scheduling", 10296.5, 0.311),
    ("llm-d-73", 49, "estimated-scheduling", 7455.9, 19.111),
    ("llm-d-73", 49, "random-scheduling", 4783.2, 56.13),
    ("llm-d-73", 49, "load-scheduling", 4004.8, 55.208),
    ("llm-d-73", 52, "precise-scheduling", 10284.6, 0.288),
    ("llm-d-73", 52, "estimated-scheduling", 7452.3, 21.94),
    ("llm-d-73", 52, "random-scheduling", 4845.1, 56.035),
    ("llm-d-73", 52, "load-scheduling", 3991.0, 58.807),
    ("llm-d-73", 55, "precise-scheduling", 10140.9, 0.308),
    ("llm-d-73", 55, "estimated-scheduling", 7100.7, 22.327),
    ("llm-d-73", 55, "random-scheduling", 4921.7, 54.844),
    ("llm-d-73", 55, "load-scheduling", 4671.9, 58.467),
    ("llm-d-73", 57, "precise-scheduling", 10313.9, 0.319),
    ("llm-d-73", 57, "estimated-scheduling", 7013.8, 23.423),
    ("llm-d-73", 57, "random-scheduling", 4764.2, 56.803),
    ("llm-d-73", 57, "load-scheduling", 3866.5, 61.75),
    ("llm-d-73", 60, "precise-scheduling", 10496.9, 0.283),
    ("llm-d-73", 60, "estimated-scheduling", 7247.9, 24.281),
    ("llm-d-73", 60, "random-scheduling", 4835.2, 57.426),
    ("llm-d-73", 60, "load-scheduling", 4745.1, 58.497),
]


@dataclass(frozen=True)
class KubeAIClient:
    """The requests KubeAI's benchmark client sends (benchmarks/chat-py/benchmark_serving.py, the one that takes
    `--max-conversations`, added with the benchmark on 2025-02-12, kubeai commit a2349bf).

    `sample_sharegpt_requests` turns every ShareGPT thread into one prompt per user turn: the thread's first 1, 3,
    5, ... messages as "User: ... Assistant: ..." text, the next (assistant) message's length as max_tokens. It
    keeps the first `--max-conversations` of these *prompts* (not threads), shuffles them once (`--seed`), then
    cycles through them in that order until `--num-prompts` are drawn. So 800 prompts from the first few dozen
    threads, each sent 10 times, 800 requests apart; the prompts of one thread share their history, and every
    one of them starts with the thread's first message (what PrefixHash hashes: the first 100 characters).

    The thread shape is the published totals' (6,656,338 prompt and 608,447 output tokens over 8,000 requests):
    every message `message_tokens` (76: the mean output, which is an assistant message), a thread's prompts
    growing by two messages a turn, `turns` prompts a thread so that their mean, turns x message_tokens, is the
    published 832. The dataset's real messages vary in length; their mean is what the cache and the steps see.
    """

    message_tokens: int = 76
    turns: int = 11
    prompts: int = 800
    requests: int = 8000
    seed: int = 12345

    def prompt_ids(self) -> list[np.ndarray]:
        """The kept prompts in the client's order: thread by thread, turn by turn, the first `prompts` of them."""
        rng = np.random.default_rng(self.seed)
        kept: list[np.ndarray] = []
        while len(kept) < self.prompts:
            messages = rng.integers(1000, 120000, size=(2 * self.turns - 1, self.message_tokens), dtype=np.int32)
            kept.extend(messages[: 2 * turn + 1].ravel() for turn in range(self.turns))
        return kept[: self.prompts]

    def specs(self) -> list[RequestSpec]:
        """The prompts shuffled once, then cycled: request i is prompt order[i % prompts]."""
        prompts = self.prompt_ids()
        order = np.random.default_rng(self.seed).permutation(len(prompts))
        return [
            RequestSpec(index=i, prompt_ids=prompts[order[i % len(prompts)]], max_tokens=self.message_tokens)
            for i in range(self.requests)
        ]


KUBEAI_CLIENT = KubeAIClient()

KUBEAI_TPOT_MS = {
    (800, "k8s-service"): 189.29,
    (800, "least-load"): 191.44,
    (800, "prefix-hash"): 86.55,
    (1600, "k8s-service"): 216.53,
    (1600, "least-load"): 212.39,
    (1600, "prefix-hash"): 78.51,
    (3200, "k8s-service"): 214.63,
    (3200, "least-load"): 211.98,
    (3200, "prefix-hash"): 78.73,
    (8000, "k8s-service"): 215.24,
    (8000, "least-load"): 214.09,
    (8000, "prefix-hash"): 79.99,
}
"""KubeAI's published mean TPOT (ms) per load point and router: with served rate and TTFT, the requests its fleet
held at once (client_limited)."""


def client_limited(name: str, load: float, published: str, served: float, ttft: float) -> bool:
    """Whether a KubeAI point's pace was set by its client: requests in flight (served/s x mean latency, Little's
    law) well under --max-concurrency, yet no queue in the fleet (TTFT under OVERLOADED_TTFT_S). A fleet that cannot
    keep up fills the client's concurrency and queues; one that keeps up is handed more. Neither: the one benchmark
    process (Python, one event loop, a new HTTP session per request) sent no faster. llm-d's stages are open-loop."""
    if name != "kubeai" or ttft >= OVERLOADED_TTFT_S:
        return False
    latency = ttft + (KUBEAI_CLIENT.message_tokens - 1) * KUBEAI_TPOT_MS[(int(load), published)] / 1000
    return served * latency < CLIENT_LIMITED_SHARE * load


LLMD_ITL_MS = {
    (3, "precise-prefix-cache_load"): 13,
    (3, "random"): 20,
    (3, "load"): 19,
    (4, "precise-prefix-cache_load"): 15,
    (4, "random"): 26,
    (4, "load"): 26,
    (5, "precise-prefix-cache_load"): 16,
    (5, "random"): 26,
    (5, "load"): 26,
    (6, "precise-prefix-cache_load"): 17,
    (6, "random"): 27,
    (6, "load"): 27,
    (8, "precise-prefix-cache_load"): 19,
    (8, "random"): 28,
    (8, "load"): 27,
    (10, "precise-prefix-cache_load"): 20,
    (10, "random"): 27,
    (10, "load"): 27,
    (12, "precise-prefix-cache_load"): 22,
    (12, "random"): 27,
    (12, "load"): 27,
    (15, "precise-prefix-cache_load"): 24,
    (15, "random"): 27,
    (15, "load"): 27,
    (20, "precise-prefix-cache_load"): 31,
    (20, "random"): 28,
    (20, "load"): 28,
}
"""llm-d's published "ITL mean" (ms) per stage and router: inference-perf's mean gap between the lines of the stream,
which is half the time per output token (llmd_tpot_ms); not scored (the brief's floors are throughput and TTFT)."""


def llmd_tpot_ms(itl_ms: float, output_tokens: int = 1000) -> float:
    """The mean time per output token behind llm-d's published mean ITL. The report's inference-perf (its September
    2025 code, `apis/completion.py`) stamped every line of the SSE stream, the blank line that ends each event
    included (the stamp came before its empty-line check; PR #452 moved it, April 2026), and averaged the gaps
    between consecutive stamps (`reportgen`'s inter_token_latency). N tokens are N events and [DONE], 2N + 2 lines:
    2N + 1 gaps spanning N - 1 token steps, so the mean gap is about half a token's time (the report's ITL median
    is 0.0000, the blank lines')."""
    return itl_ms * (2 * output_tokens + 1) / (output_tokens - 1)


LLMD_STAGE_S = {3: 210, 4: 180, 5: 120, 6: 120, 8: 90, 10: 70, 12: 60, 15: 50, 20: 50}
"""Each llm-d stage's length (s) in the report's inference-perf profile."""

LLMD73_ITL_MS = {
    (3, "estimated-scheduling"): 11,
    (3, "precise-scheduling"): 11,
    (3, "random-scheduling"): 12,
    (3, "load-scheduling"): 12,
    (10, "estimated-scheduling"): 13,
    (10, "precise-scheduling"): 13,
    (10, "random-scheduling"): 16,
    (10, "load-scheduling"): 16,
    (15, "estimated-scheduling"): 15,
    (15, "precise-scheduling"): 15,
    (15, "random-scheduling"): 20,
    (15, "load-scheduling"): 20,
    (20, "estimated-scheduling"): 21,
    (20, "precise-scheduling"): 21,
    (20, "random-scheduling"): 24,
    (20, "load-scheduling"): 24,
    (22, "precise-scheduling"): 20,
    (22, "estimated-scheduling"): 22,
    (22, "load-scheduling"): 24,
    (22, "random-scheduling"): 24,
    (25, "precise-scheduling"): 21,
    (25, "estimated-scheduling"): 22,
    (25, "random-scheduling"): 24,
    (25, "load-scheduling"): 24,
    (30, "precise-scheduling"): 21,
    (30, "estimated-scheduling"): 23,
    (30, "load-scheduling"): 24,
    (30, "random-scheduling"): 24,
    (35, "precise-scheduling"): 21,
    (35, "estimated-scheduling"): 26,
    (35, "load-scheduling"): 24,
    (35, "random-scheduling"): 24,
    (40, "precise-scheduling"): 27,
    (40, "estimated-scheduling"): 27,
    (40, "load-scheduling"): 25,
    (40, "random-scheduling"): 25,
    (43, "precise-scheduling"): 28,
    (43, "estimated-scheduling"): 26,
    (43, "random-scheduling"): 25,
    (43, "load-scheduling"): 25,
    (46, "precise-scheduling"): 28,
    (46, "estimated-scheduling"): 26,
    (46, "random-scheduling"): 25,
    (46, "load-scheduling"): 25,
    (49, "precise-scheduling"): 29,
    (49, "estimated-scheduling"): 26,
    (49, "random-scheduling"): 25,
    (49, "load-scheduling"): 25,
    (52, "precise-scheduling"): 29,
    (52, "estimated-scheduling"): 26,
    (52, "random-scheduling"): 25,
    (52, "load-scheduling"): 25,
    (55, "precise-scheduling"): 29,
    (55, "estimated-scheduling"): 26,
    (55, "random-scheduling"): 25,
    (55, "load-scheduling"): 25,
    (57, "precise-scheduling"): 29,
    (57, "estimated-scheduling"): 26,
    (57, "random-scheduling"): 25,
    (57, "load-scheduling"): 25,
    (60, "precise-scheduling"): 29,
    (60, "estimated-scheduling"): 26,
    (60, "random-scheduling"): 25,
    (60, "load-scheduling"): 25,
}
"""The 73-capacity report's per-stage "ITL mean" (ms; published in seconds to the millisecond): half the time per
output token, as the 37-capacity report's (llmd_tpot_ms); not scored."""
LLMD73_STAGE_S = {
    3: 20,
    10: 20,
    15: 20,
    20: 38,
    22: 34,
    25: 30,
    30: 25,
    35: 21,
    40: 38,
    43: 36,
    46: 33,
    49: 30,
    52: 29,
    55: 27,
    57: 26,
    60: 25,
}
"""Each 73-capacity stage's length (s) in the report's inference-perf profile ("Main ladder")."""


@dataclass(frozen=True)
class SharedPrefixClient:
    """The requests of inference-perf's `shared_prefix` data (inference_perf/datagen/shared_prefix_datagen.py):
    `groups` x `per_group` prompts made once, each a group's system prompt and a question of its own, shuffled once;
    request n of a stage sends prompt n mod (groups x per_group) (drained_specs). So a whole prompt, question
    included, recurs every 249 requests, and a replica that served it can hit all of it."""

    groups: int = 83
    per_group: int = 3
    system_tokens: int = 8000
    question_tokens: int = 1000
    output_tokens: int = 1000
    seed: int = 0

    def prompt_ids(self) -> list[np.ndarray]:
        rng = np.random.default_rng(self.seed)
        prompts: list[np.ndarray] = []
        for _ in range(self.groups):
            system = rng.integers(1000, 120000, size=self.system_tokens, dtype=np.int32)
            questions = rng.integers(1000, 120000, size=(self.per_group, self.question_tokens), dtype=np.int32)
            prompts.extend(np.concatenate([system, question]) for question in questions)
        return [prompts[i] for i in rng.permutation(len(prompts))]


LLMD_CLIENT = SharedPrefixClient()
LLMD_WARMUP = (10.0, 25.0)
"""The report's inference-perf warm-up stage: 10 QPS for 25 s, before the measured stages."""


@dataclass(frozen=True)
class StagedProfile:
    """An llm-d report's inference-perf run: its shared_prefix client, its warm-up stage and its measured stages
    ((QPS, seconds) each, in order), sent to one fleet each after the one before has finished (drained_specs); and its
    published per-stage "ITL mean" (ms)."""

    source: Source
    client: SharedPrefixClient
    warmup: tuple[float, float]
    stages: tuple[tuple[float, float], ...]
    itl_ms: dict[tuple[int, str], float]


STAGED = {
    profile.source.name: profile
    for profile in (
        StagedProfile(
            LLMD, LLMD_CLIENT, LLMD_WARMUP, tuple((float(q), float(s)) for q, s in LLMD_STAGE_S.items()), LLMD_ITL_MS
        ),
        # The 73-capacity profile: 150 groups of 5 users, 6,000-token system prompts, 1,200-token questions, 1,000
        # output tokens (ignore_eos), a warm-up of one full set (15 QPS for 50 s: 750 requests), then the ladder.
        StagedProfile(
            LLMD73,
            SharedPrefixClient(groups=150, per_group=5, system_tokens=6000, question_tokens=1200),
            (15.0, 50.0),
            tuple((float(q), float(s)) for q, s in LLMD73_STAGE_S.items()),
            LLMD73_ITL_MS,
        ),
    )
}
"""The sources replayed as inference-perf's staged runs, by name."""


STAGE_START_S = 1.0
"""inference-perf's run_stage schedules a stage's requests from 1 s after the stage starts (start_time = now + 1)."""
STAGE_INTERVAL_S = 1.0
"""inference-perf's pause between stages (LoadConfig.interval, default 1.0 s), after the stage before has drained."""


def inference_perf_offsets(rng: np.random.Generator, rate: float, seconds: float) -> np.ndarray:
    """A stage's send times from its start, as inference-perf's PoissonLoadTimer (September 2025) draws them: from
    STAGE_START_S on, second by second, a Poisson(rate) count of requests spread over that second by exponential gaps
    scaled to fill it; the stage sends int(rate x seconds) of them (run_stage's num_requests), however long that
    takes."""
    count = int(rate * seconds)
    times: list[float] = []
    second = STAGE_START_S
    while len(times) < count:
        in_second = int(rng.poisson(rate))
        if in_second:
            gaps = rng.exponential(1 / rate, in_second)
            times.extend(second + np.cumsum(gaps / gaps.sum()))
        second += 1.0
    return np.asarray(times[:count])


def drained_specs(profile: StagedProfile, seed: int) -> tuple[list[RequestSpec], dict[float, range]]:
    """The requests of an inference-perf run (its multi-process load generator, the default, from June 2025): each
    stage sends its requests numbered from 0, request n the datagen's prompt n mod its prompts (shared_prefix's
    get_request), then waits until every one of them has finished (run_stage polls its finished-request count),
    pauses STAGE_INTERVAL_S, and starts the next. The replay holds a stage's requests on the last one the stage
    before sent (depends_on, with think_time its pause, start and offset): with every output the same length, the
    last one sent is, up to the spread of the replicas' queues, the last one to finish. Returned with each measured
    stage's request indices by its rate."""
    client = replace(profile.client, seed=seed)
    prompts = client.prompt_ids()
    rng = np.random.default_rng(seed)
    specs: list[RequestSpec] = []
    stages: dict[float, range] = {}
    for number, (rate, seconds) in enumerate((profile.warmup, *profile.stages)):
        last = specs[-1].index if specs else None
        first = len(specs)
        for n, offset in enumerate(inference_perf_offsets(rng, rate, seconds)):
            spec = RequestSpec(index=first + n, prompt_ids=prompts[n % len(prompts)], max_tokens=client.output_tokens)
            if last is None:
                spec.arrival_time = float(offset)
            else:
                spec.depends_on, spec.think_time = last, STAGE_INTERVAL_S + float(offset)
            specs.append(spec)
        if number > 0:
            stages[rate] = range(first, len(specs))
    return specs, stages


@cache
def llmd_run(router: Counterpart, seed: int = 0, name: str = LLMD.name) -> dict[float, dict[str, float]]:
    """One simulated inference-perf run of every stage of the staged source `name` in order behind `router`: per
    stage's rate, the served output tokens/s, mean TTFT and mean TPOT of the requests sent in it, the fleet's
    prefix-cache hit rate over the stage, and the router's own time a request over the run. `seed` draws the
    prompts, their order and the arrival times (0: the headline run)."""
    profile = STAGED[name]
    specs, indices = drained_specs(profile, seed)
    deployment = _deployment(profile.source, router)
    sink, samples = MemorySink(), []
    run = deployment.sim_target().run(LoadPlan(requests=specs), sink, samples.append)
    stages: dict[float, dict[str, float]] = {}
    for rate in (rate for rate, _ in profile.stages):
        counted = [r for r in sink.records if r.index in indices[rate]]
        start, end = min(r.send_time for r in counted), max(r.finish_time for r in counted)
        stages[rate] = _measures(summarize(counted), profile.source) | {
            "router": _router_time(run),
            "hits": _hit_rate(samples, start, end),
        }
    return stages


def _hit_rate(samples: list[TimelineSample], start: float, end: float) -> float:
    """The share of the prompt tokens the fleet's replicas looked up between `start` and `end` (the last scrapes
    before each) that their prefix caches held: vLLM's prefix_cache_hits over prefix_cache_queries, summed over
    the replicas."""

    def at(t: float) -> tuple[float, float]:
        last = next((s for s in reversed(samples) if s.t <= t), None)
        return (0.0, 0.0) if last is None else (last.values[tl.PREFIX_HITS], last.values[tl.PREFIX_QUERIES])

    (hits0, queries0), (hits1, queries1) = at(start), at(end)
    return (hits1 - hits0) / (queries1 - queries0) if queries1 > queries0 else 0.0


@cache
def kubeai_run(load: float, router: Counterpart, seed: int = KUBEAI_CLIENT.seed) -> dict[str, float]:
    """One KubeAI load point: its client's 8,000 requests at the point's --request-rate and --max-concurrency.
    `seed` draws the threads, the prompts' order and the arrival times (the client's own 12345: the headline)."""
    client = replace(KUBEAI_CLIENT, seed=seed)
    arrival = ArrivalConfig(request_rate=200.0 if load in (1600, 3200) else 800.0, max_concurrency=int(load))
    specs = schedule(iter(client.specs()), arrival, np.random.default_rng(client.seed))
    deployment = _deployment(KUBEAI, router)
    sink = MemorySink()
    run = deployment.sim_target().run(LoadPlan(requests=specs, max_concurrency=arrival.max_concurrency), sink)
    return _measures(summarize(sink.records), KUBEAI) | {"router": _router_time(run)}


def _router_time(run: TargetRun) -> float:
    """The router's own time a request over the run (s): 0 for a router with no published cost."""
    return float((run.server_info.get("router_time") or {}).get("mean_s", 0.0))


def _deployment(source: Source, router: Counterpart) -> Deployment:
    deployment = build_deployment(
        source.gpu,
        source.model,
        source.engine_args,
        replicas=source.replicas,
        router=router.router,
        vllm_version=source.vllm_version,
    )
    return replace(deployment, router_weights=router.weights)


def _measures(summary: Summary, source: Source) -> dict[str, float]:
    return {
        "served": getattr(summary, source.throughput),
        "ttft": summary.mean_ttft_ms / 1000,
        "tpot": summary.mean_tpot_ms / 1000,
    }


def predict(source: Source, load: float, router: Counterpart, draw: int = 0) -> dict[str, float]:
    """Served throughput (the source's unit), mean TTFT and mean TPOT (s) of `router` at one published load point,
    in draw `draw` of its random parts (0: the headline run, with the published client seeds)."""
    if source.name in STAGED:
        return llmd_run(router, STAGED[source.name].client.seed + draw, source.name)[load]
    return kubeai_run(load, router, KUBEAI_CLIENT.seed + draw)


def _err(predicted: float, measured: float) -> float:
    return predicted / measured - 1


CACHE_BLIND = ("k8s-service", "least-load", "random", "load", "random-scheduling", "load-scheduling")
"""The published routers that read no cache: where two of them differ by a few percent, their order is noise."""
NOISE_SDS = 2.0
"""A measured gap between two routers within this many standard deviations of the simulated gap's draw-to-draw
spread (around 0) is one a repeat of the published run could reverse: their order is a coin toss, not scored."""


def noise(source: Source, load: float, draws: int) -> tuple[list[float], float, float] | None:
    """The two cache-blind routers at a load point: the simulated gap ln(TTFT first / TTFT second) in each draw of
    the run's random parts (prompts, their order, arrival times: what a repeat of the run redraws), the gaps' standard
    deviation, and the measured gap. None with fewer than two draws."""
    blind = [
        (router, ttft)
        for n, ld, p, _, ttft in PUBLISHED
        if n == source.name and ld == load and p in CACHE_BLIND and (router := source.routers[p]) is not None
    ]
    if draws < 2 or len(blind) != 2:
        return None
    (first, measured_first), (second, measured_second) = blind
    gaps = [
        math.log(predict(source, load, first, d)["ttft"] / predict(source, load, second, d)["ttft"])
        for d in range(draws)
    ]
    return gaps, statistics.stdev(gaps), math.log(measured_first / measured_second)


def _noise_table(noisy: dict[tuple[str, float], tuple[list[float], float, float]]) -> None:
    print(
        "\n| source | load | cache-blind pair | measured gap ln(TTFT ratio) | simulated gap per draw | sd | "
        "a repeat could reverse it |\n|---|---|---|---|---|---|---|"
    )
    for (name, load), (gaps, sd, measured) in noisy.items():
        pair = " / ".join(p for n, ld, p, _, _ in PUBLISHED if n == name and ld == load and p in CACHE_BLIND)
        print(
            f"| {name} | {load:g} | {pair} | {measured:+.2f} | {', '.join(f'{g:+.2f}' for g in gaps)} | {sd:.2f} | "
            f"{'yes' if abs(measured) <= NOISE_SDS * sd else 'no'} |"
        )


def _ranking(
    orders: dict[tuple[str, float], list[tuple[float, float, str]]],
    noisy: dict[tuple[str, float], tuple[list[float], float, float]],
) -> None:
    """Per load point: the routers by mean TTFT, measured and predicted; the full order and the best router; and,
    with draws, whether a wrong order is only the cache-blind pair whose measured gap is within the runs' noise."""
    print(
        "\n| source | load | order by mean TTFT, measured | predicted | same order | same best "
        "|\n|---|---|---|---|---|---|"
    )
    same = best = within_noise = 0
    for (name, load), rows in orders.items():
        measured = [r for _, _, r in sorted(rows)]
        predicted = [r for _, _, r in sorted(rows, key=lambda row: row[1])]
        same += measured == predicted
        best += measured[0] == predicted[0]
        gaps = noisy.get((name, load))
        coin_toss = gaps is not None and abs(gaps[2]) <= NOISE_SDS * gaps[1]
        within_noise += measured != predicted and measured[0] == predicted[0] and coin_toss
        verdict = "yes" if measured == predicted else "NO (cache-blind pair within noise)" if coin_toss else "NO"
        print(
            f"| {name} | {load:g} | {' < '.join(measured)} | {' < '.join(predicted)} | "
            f"{verdict} | {'yes' if measured[0] == predicted[0] else 'NO'} |"
        )
    print(
        f"\nfull ranking right at {same} of {len(orders)} load points ({same + within_noise} counting the cache-blind "
        f"pairs a repeat could reverse); the best router right at {best} of {len(orders)}"
    )


L4_RUNS = tuple(
    f"inference-bench-l4-qwen25-7b-{regime}-c{c}"
    for regime, cs in (("short", (1, 4, 16, 32, 64)), ("long", (1, 16, 64)))
    for c in cs
)
"""The single-replica L4 check, independent of the fleets: ree2raz/inference-bench's vLLM 0.8.5 runs of Qwen2.5-7B
(bf16, the same decoder shape as Llama-3.1-8B) on one L4 (perf/data/published.yaml), replayed as
benchmarks/gpu_accuracy.py replays every published run."""


def l4_check() -> None:
    """One L4, one replica: measured and predicted output throughput, mean TPOT and mean TTFT."""
    rows, _ = gpu_accuracy.run(only=set(L4_RUNS))
    print(
        "\n| one L4 (inference-bench, vLLM 0.8.5, Qwen2.5-7B bf16) | C | out tok/s meas | pred | err | "
        "mean TPOT ms meas | pred | err | mean TTFT ms meas | pred | err |\n" + "|---" * 11 + "|"
    )
    for row in sorted(rows, key=lambda r: L4_RUNS.index(r.entry["id"])):
        cells = [
            row.entry["id"].removeprefix("inference-bench-l4-qwen25-7b-"),
            str(row.entry["workload"]["max_concurrency"]),
        ]
        for metric in ("output_throughput", "mean_tpot_ms", "mean_ttft_ms"):
            error = row.error(metric)
            cells += [
                f"{row.entry['measured'][metric]:.1f}",
                f"{row.predicted[metric]:.1f}",
                f"{error:+.0%}" if error is not None else "",
            ]
        print(f"| {' | '.join(cells)} |")


def _row(
    name: str, load: float, published: str, router: Counterpart, served: float, ttft: float, got: dict[str, float]
) -> str:
    tpot = KUBEAI_TPOT_MS.get((int(load), published)) if name == "kubeai" else None
    if name in STAGED and (itl := STAGED[name].itl_ms.get((int(load), published))) is not None:
        tpot = llmd_tpot_ms(itl, STAGED[name].client.output_tokens)
    status = (
        "yes"
        if ttft >= OVERLOADED_TTFT_S
        else "client-paced"
        if client_limited(name, load, published, served, ttft)
        else "no"
    )
    return (
        f"| {name} | {load:g} | {published} ({router}) | {served:.2f} | {got['served']:.2f} | "
        f"{_err(got['served'], served):+.0%} | {ttft:.3f} | {got['ttft']:.3f} | {_err(got['ttft'], ttft):+.0%} | "
        f"{'' if tpot is None else f'{tpot:.0f}'} | {1000 * got['tpot']:.0f} | {status} |"
    )


def _hit_table(profile: StagedProfile) -> None:
    """A staged source's simulated fleet: its prefix-cache hit rate per stage and router (the reports publish none)."""
    rates = [rate for rate, _ in profile.stages]
    print(
        f"\n| {profile.source.name} router (servelab) | prefix-cache hit rate, simulated, at QPS "
        + " | ".join(f"{q:g}" for q in rates)
        + " |\n"
        + "|---" * (len(rates) + 1)
        + "|"
    )
    for published, router in profile.source.routers.items():
        if router is not None:
            run = llmd_run(router, profile.client.seed, profile.source.name)
            print(f"| {published} | " + " | ".join(f"{run[q]['hits']:.1%}" for q in rates) + " |")


def _scored_counts(scored: dict[str, dict[str, list[int]]]) -> None:
    """Served throughput and mean TTFT within TOLERANCE at the points neither overloaded nor client-paced: per source
    and over all of them."""
    total = {key: [sum(counts[key][i] for counts in scored.values()) for i in (0, 1)] for key in ("served", "ttft")}
    for name, counts in (*scored.items(), ("all sources", total)):
        print(
            f"{name}: served throughput within {TOLERANCE:.0%} at {counts['served'][0]} of {counts['served'][1]} and "
            f"mean TTFT at {counts['ttft'][0]} of {counts['ttft'][1]} not-overloaded points"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=[s.name for s in SOURCES])
    parser.add_argument(
        "--draws", type=int, default=1, help="draws of each run's random parts, for the noise table (1: none)"
    )
    args = parser.parse_args()
    sources = {s.name: s for s in SOURCES if args.only in (None, s.name)}
    print(
        "| source | load | router (servelab) | served meas | pred | err | mean TTFT s meas | pred | err "
        "| mean TPOT ms meas | pred | overloaded |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    scored = {name: {"served": [0, 0], "ttft": [0, 0]} for name in sources}
    orders: dict[tuple[str, float], list[tuple[float, float, str]]] = {}
    own: dict[tuple[str, Counterpart], float] = {}
    t0 = time.monotonic()
    for name, load, published, served, ttft in PUBLISHED:
        if name not in sources:
            continue
        router = sources[name].routers[published]
        if router is None:
            print(f"| {name} | {load:g} | {published} (not modelled) | {served:.2f} | | | {ttft:.3f} | | | | | |")
            continue
        got = predict(sources[name], load, router)
        orders.setdefault((name, load), []).append((ttft, got["ttft"], published))
        if ttft < OVERLOADED_TTFT_S and not client_limited(name, load, published, served, ttft):
            for key, measured in (("served", served), ("ttft", ttft)):
                scored[name][key][0] += abs(_err(got[key], measured)) <= TOLERANCE
                scored[name][key][1] += 1
        print(_row(name, load, published, router, served, ttft, got), flush=True)
        if got["router"]:
            own.setdefault((name, router), got["router"])
    for (name, router), seconds in own.items():
        print(
            f"\n{name} {router}: the router's own time, {1000 * seconds:.2f} ms a request over the run (ROUTER_COSTS)"
        )
    for name in sources:
        if name in STAGED:
            _hit_table(STAGED[name])
    noisy = {key: gaps for key in orders if (gaps := noise(sources[key[0]], key[1], args.draws)) is not None}
    if noisy:
        _noise_table(noisy)
    _ranking(orders, noisy)
    _scored_counts(scored)
    print(f"({time.monotonic() - t0:.0f} s)")
    if args.only is None:
        l4_check()


if __name__ == "__main__":
    main()
