"""The engines the simulator models and the routers it puts before replicas, by name: what `--engine` and
`--router` take.

Kept apart from the schedulers and the engine loop so that the command line's help lists them without importing
the simulator.
"""

from __future__ import annotations

VLLM, SGLANG, TRTLLM = "vllm", "sglang", "trtllm"
ENGINES = (VLLM, SGLANG, TRTLLM)
LABELS = {VLLM: "vLLM", SGLANG: "SGLang", TRTLLM: "TensorRT-LLM"}

ROUND_ROBIN = "round-robin"
LEAST_LOADED = "least-loaded"
POLICIES = (ROUND_ROBIN, LEAST_LOADED)
"""How a router picks among data-parallel replicas (servelab.sim.router)."""
