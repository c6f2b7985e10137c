"""TensorRT-LLM's `trtllm-serve MODEL ...` line (and its `--extra_llm_api_options` YAML), defaults and memory plan.

Defaults are the LLM API's (tensorrt_llm/llmapi/llm_args.py, PyTorch backend,
1.x): max_batch_size 2048, max_num_tokens 8192, chunked prefill off, KV-cache
block reuse on, 32 tokens per KV block, capacity scheduler policy
GUARANTEED_NO_EVICT, the overlap scheduler on, and
`free_gpu_memory_fraction` 0.9: the KV cache takes that share of the memory
still free after the weights are loaded and a warm-up forward pass of
max_num_tokens has run (KvCacheCreator in the PyTorch executor).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from servelab.perf.engine_config import EngineConfig
from servelab.perf.engine_args import FlagValue
from servelab.perf.engine_flags import Flag, FlagTable, ParsedLaunch, fraction, parse_flags, positive_int
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import Hardware
from servelab.perf.memory import (
    MemoryPlan,
    MemoryReserve,
    activation_bytes,
    kv_bytes_per_token_per_rank,
    weight_bytes_per_rank,
)
from servelab.perf.models import ModelSpec
from servelab.schemas.results import Json

GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
MAX_UTILIZATION = "MAX_UTILIZATION"
CAPACITY_POLICIES = (GUARANTEED_NO_EVICT, MAX_UTILIZATION)


@dataclass(frozen=True, slots=True)
class TRTLLMSettings:
    model: str | None = None
    tp_size: int = 1
    max_batch_size: int = 2048
    max_num_tokens: int = 8192
    max_seq_len: int | None = None
    free_gpu_memory_fraction: float = 0.9
    enable_chunked_prefill: bool = False
    enable_block_reuse: bool = True
    tokens_per_block: int = 32
    capacity_scheduler_policy: str = GUARANTEED_NO_EVICT
    disable_overlap_scheduler: bool = False
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    """Weight format, servelab's name (fp8, int8, awq): TensorRT-LLM reads it from the checkpoint or quant_config."""


FLAGS = FlagTable(
    engine="TensorRT-LLM",
    launchers=(("trtllm-serve", "serve"), ("trtllm-serve",)),
    modelled={
        "tp-size": Flag("tp_size", positive_int),
        "max-batch-size": Flag("max_batch_size", positive_int),
        "max-num-tokens": Flag("max_num_tokens", positive_int),
        "max-seq-len": Flag("max_seq_len", positive_int),
        "kv-cache-free-gpu-memory-fraction": Flag("free_gpu_memory_fraction", fraction),
        "extra-llm-api-options": Flag("extra_llm_api_options", str),
        "enable-chunked-prefill": Flag("enable_chunked_prefill"),
    },
    obsolete={
        "enable-overlap-scheduler": "the overlap scheduler is on by default; disable_overlap_scheduler in the YAML "
        "turns it off",
        "use-cuda-graph": "replaced by cuda_graph_config in --extra_llm_api_options",
    },
    not_modelled=frozenset({"pp-size", "ep-size", "max-beam-width", "backend", "moe-expert-parallel-size"}),
    harmless=frozenset(
        {
            "host",
            "port",
            "log-level",
            "tokenizer",
            "trust-remote-code",
            "num-postprocess-workers",
            "gpus-per-node",
            "cluster-size",
            "reasoning-parser",
            "server-role",
            "metadata-server-config-file",
            "fail-fast-on-attention-window-too-large",
        }
    ),
    switches=frozenset(
        {"trust-remote-code", "enable-overlap-scheduler", "use-cuda-graph", "fail-fast-on-attention-window-too-large"}
    ),
    aliases={"tensor-parallel-size": "tp-size"},
    positional="model",
    separator="_",
)

# --extra_llm_api_options keys (nested as in the YAML) -> settings field; the rest are reported like flags.
_YAML_KEYS: dict[tuple[str, ...], str] = {
    ("max_batch_size",): "max_batch_size",
    ("max_num_tokens",): "max_num_tokens",
    ("max_seq_len",): "max_seq_len",
    ("enable_chunked_prefill",): "enable_chunked_prefill",
    ("disable_overlap_scheduler",): "disable_overlap_scheduler",
    ("kv_cache_config", "enable_block_reuse"): "enable_block_reuse",
    ("kv_cache_config", "free_gpu_memory_fraction"): "free_gpu_memory_fraction",
    ("kv_cache_config", "tokens_per_block"): "tokens_per_block",
    ("kv_cache_config", "dtype"): "kv_cache_dtype",
    ("scheduler_config", "capacity_scheduler_policy"): "capacity_scheduler_policy",
    ("quant_config", "quant_algo"): "quantization",
}
YAML_KEY_OF = {target: key for key, target in _YAML_KEYS.items()}
"""Settings field -> where the --extra_llm_api_options YAML sets it (the YAML overrides a flag for the same field)."""
_QUANT_ALGOS = {
    "FP8": "fp8",
    "FP8_PER_CHANNEL_PER_TOKEN": "fp8",
    "W8A8_SQ_PER_CHANNEL": "int8",
    "W4A16_AWQ": "awq",
    "W4A16_GPTQ": "gptq",
}
_YAML_OBSOLETE = {
    ("enable_overlap_scheduler",): "replaced by disable_overlap_scheduler (the overlap scheduler is on by default)",
    ("use_cuda_graph",): "replaced by cuda_graph_config",
    ("pytorch_backend_config",): "its fields moved to the top level of the LLM API options",
}


ParsedTRTLLM = ParsedLaunch[TRTLLMSettings]


def _walk(tree: Json, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    items: list[tuple[tuple[str, ...], Any]] = []
    for key, value in tree.items():
        path = (*prefix, str(key))
        if isinstance(value, dict) and path not in _YAML_OBSOLETE:
            items.extend(_walk(value, path))
        else:
            items.append((path, value))
    return items


def _read_options(path: str, out: ParsedTRTLLM, values: dict[str, FlagValue]) -> None:
    """Fold an --extra_llm_api_options YAML file into `values`, reporting obsolete and unknown keys."""
    try:
        tree = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise PerfConfigError(f"--extra_llm_api_options {path}: cannot read it ({exc})") from None
    if not isinstance(tree, dict):
        raise PerfConfigError(f"--extra_llm_api_options {path}: expected a mapping of LLM API options")
    for key, value in _walk(tree):
        dotted = ".".join(key)
        if key in _YAML_KEYS:
            values[_YAML_KEYS[key]] = value
        elif key in _YAML_OBSOLETE:
            out.obsolete.append(dotted)
            out.warnings.append(f"{dotted} (in {path}) is obsolete in TensorRT-LLM: {_YAML_OBSOLETE[key]}")
        else:
            out.unknown.append(dotted)
            out.warnings.append(f"{dotted} (in {path}) is not modelled; simulated as if absent")


def parse_trtllm_args(line: str | Sequence[str]) -> ParsedTRTLLM:
    """A `trtllm-serve MODEL ...` line (or its flags) as TRTLLMSettings, with what was obsolete, unknown or
    unmodelled."""
    parsed = parse_flags(line, FLAGS)
    values = dict(parsed.values)
    out = ParsedTRTLLM(TRTLLMSettings(), list(parsed.warnings), list(parsed.obsolete), list(parsed.unknown))
    options = values.pop("extra_llm_api_options", None)
    if options is not None:
        _read_options(options, out, values)
    if "quantization" in values:
        algo = str(values["quantization"]).upper()
        if algo not in _QUANT_ALGOS:
            raise PerfConfigError(f"quant_config.quant_algo {algo}: modelled are {', '.join(_QUANT_ALGOS)}")
        values["quantization"] = _QUANT_ALGOS[algo]
    policy = str(values.get("capacity_scheduler_policy", GUARANTEED_NO_EVICT)).upper()
    if policy not in CAPACITY_POLICIES:
        out.warnings.append(f"capacity_scheduler_policy {policy} is not modelled; simulated as {GUARANTEED_NO_EVICT}")
        policy = GUARANTEED_NO_EVICT
    values["capacity_scheduler_policy"] = policy
    try:
        out.settings = TRTLLMSettings(**values)
    except TypeError as exc:
        raise PerfConfigError(f"TensorRT-LLM options: {exc}") from None
    return out


@dataclass(frozen=True, slots=True)
class TRTLLMPlan:
    settings: TRTLLMSettings
    config: EngineConfig
    memory: MemoryPlan


def resolve_trtllm(settings: TRTLLMSettings, hardware: Hardware, model: ModelSpec) -> TRTLLMPlan:
    """TensorRT-LLM's defaults on this chip and its KV cache; PerfConfigError when the model does not fit."""
    s = settings
    if model.num_heads % s.tp_size:
        raise PerfConfigError(
            f"{model.name} has {model.num_heads} attention heads, not divisible by --tp_size {s.tp_size}"
        )
    seq_len = s.max_seq_len or model.max_position_embeddings
    config = EngineConfig(
        max_num_seqs=s.max_batch_size,
        max_num_batched_tokens=s.max_num_tokens,
        enable_chunked_prefill=s.enable_chunked_prefill,
        enable_prefix_caching=s.enable_block_reuse,
        gpu_memory_utilization=s.free_gpu_memory_fraction,
        max_model_len=seq_len,
        block_size=s.tokens_per_block,
        kv_cache_dtype="fp8" if str(s.kv_cache_dtype).startswith("fp8") else "auto",
        quantization=s.quantization,
        tensor_parallel_size=s.tp_size,
        async_scheduling=not s.disable_overlap_scheduler,
    )
    # TRT-LLM's warm-up samples without vLLM's full-vocabulary sort: fp32 logits and about two copies of them.
    reserve = MemoryReserve(sampler_bytes_per_logit=12.0)
    total = hardware.memory_bytes
    weights = weight_bytes_per_rank(model, s.quantization, hardware, s.tp_size)
    # The warm-up pass is max_num_tokens of activations with up to max_batch_size logits rows; the sampler term
    # uses at most max_num_tokens rows, as the engine never samples more rows than it has tokens.
    activations = activation_bytes(
        model, replace(config, max_num_seqs=min(s.max_batch_size, s.max_num_tokens)), reserve
    )
    free = total - weights - activations - reserve.non_torch_bytes - reserve.cuda_graph_bytes
    kv_bytes = free * s.free_gpu_memory_fraction
    per_token = kv_bytes_per_token_per_rank(model, config.kv_cache_dtype, s.tp_size)
    blocks = int(kv_bytes // (per_token * s.tokens_per_block)) if kv_bytes > 0 else 0
    if blocks * s.tokens_per_block < seq_len:
        raise PerfConfigError(
            f"{model.name} on {hardware.name}: free_gpu_memory_fraction {s.free_gpu_memory_fraction:g} of the "
            f"{max(free, 0) / 2**30:.1f} GiB left after {weights / 2**30:.1f} GiB of weights holds "
            f"{blocks * s.tokens_per_block} tokens, less than max_seq_len {seq_len}; lower --max_seq_len or use more "
            f"GPUs"
        )
    memory = MemoryPlan(
        total_bytes=total,
        requested_bytes=total,
        weight_bytes=weights,
        activation_bytes=activations,
        cuda_graph_bytes=reserve.cuda_graph_bytes,
        non_torch_bytes=reserve.non_torch_bytes,
        kv_cache_bytes=int(blocks * per_token * s.tokens_per_block),
        kv_bytes_per_token=per_token,
        block_size=s.tokens_per_block,
        num_blocks=blocks,
    )
    return TRTLLMPlan(replace(s, max_seq_len=seq_len), config, memory)
