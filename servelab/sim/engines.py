"""The engines the simulator models, and how SimEngine gets another engine's scheduler and KV pool.

vLLM's scheduler is SimEngine's default; SGLang's and TensorRT-LLM's come
through a `SchedulerFactory`: given the KV capacity in blocks (tokens for
SGLang, whose page size is 1), it returns the scheduler and its pool, which
SimEngine drives exactly as it drives vLLM's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from servelab.perf.engine_config import EngineConfig
from servelab.perf.sglang_args import SGLangSettings
from servelab.perf.trtllm_args import TRTLLMSettings
from servelab.sim.block_pool import BlockPool
from servelab.sim.radix_cache import RadixCache
from servelab.sim.sglang_scheduler import SGLangScheduler
from servelab.sim.trtllm_scheduler import TRTLLMScheduler
from servelab.schemas.vocabulary import (
    ENGINES as ENGINES,
    LABELS as LABELS,
    SGLANG as SGLANG,
    TRTLLM as TRTLLM,
    VLLM as VLLM,
)  # named here for their importers

SchedulerFactory = Callable[[int], tuple[Any, Any]]
"""num_gpu_blocks -> (scheduler, KV pool), both with the interface SimEngine uses (see list_scheduler.py)."""


def sglang_factory(config: EngineConfig, settings: SGLangSettings) -> SchedulerFactory:
    def make(num_blocks: int) -> tuple[Any, Any]:
        cache = RadixCache(num_blocks, config.enable_prefix_caching)
        return SGLangScheduler(config, settings, cache), cache

    return make


def trtllm_factory(config: EngineConfig, settings: TRTLLMSettings) -> SchedulerFactory:
    def make(num_blocks: int) -> tuple[Any, Any]:
        pool = BlockPool(num_blocks, settings.enable_block_reuse)
        return TRTLLMScheduler(config, settings, pool), pool

    return make
