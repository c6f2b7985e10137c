"""The engines the simulator models and the routers it puts before replicas, by name: what `--engine` and
`--router` take.

Kept apart from the schedulers and the engine loop so that the command line's help lists them without importing
the simulator.
"""

from __future__ import annotations

from enum import StrEnum

VLLM, SGLANG, TRTLLM = "vllm", "sglang", "trtllm"
ENGINES = (VLLM, SGLANG, TRTLLM)
LABELS = {VLLM: "vLLM", SGLANG: "SGLang", TRTLLM: "TensorRT-LLM"}


class RouterPolicy(StrEnum):
    """How a router picks among data-parallel replicas (servelab.sim.router, docs/fleets.md)."""

    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"
    LEAST_OUTSTANDING = "least-outstanding"
    PREFIX_HASH = "prefix-hash"
    PREFIX_AWARE = "prefix-aware"
    SESSION = "session"


ROUND_ROBIN = RouterPolicy.ROUND_ROBIN
LEAST_LOADED = RouterPolicy.LEAST_LOADED
POLICIES = tuple(RouterPolicy)
