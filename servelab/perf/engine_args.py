"""vLLM's command line, read the way vLLM reads it, and its defaults, filled the way vLLM fills them.

Users paste their `vllm serve ...` line, so the parser accepts vLLM's own
spellings (`--flag value`, `--flag=value`, `--no-flag`, underscores, short
forms like `-tp 2`). The flag list it checks against is vLLM 0.32.0's
(data/vllm_flags.yaml): a flag vLLM would reject is an error here too; a flag
vLLM accepts but that does not change the performance model is accepted and
listed in `ignored`; a flag removed from vLLM is reported with the reason.

`resolve` reproduces `EngineArgs.get_batch_defaults` and
`_set_default_max_num_seqs_and_batched_tokens_args` in vllm/engine/arg_utils.py
(vLLM 0.32.0) for the simulated chip instead of the local one.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import yaml

from servelab.perf.engine_config import EngineConfig
from servelab.perf.engine_flags import choice, fraction
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import Hardware
from servelab.perf.models import ModelSpec
from servelab.perf.vllm_versions import LARGEST_BATCH_DEFAULTS_SINCE, V0_BATCH_LIMITS, is_v0

VLLM_FLAGS = Path(__file__).parent / "data" / "vllm_flags.yaml"
GiB = 2**30
VLLM_QUANTIZATION_METHODS = frozenset(
    {
        "aqlm",
        "awq",
        "deepspeedfp",
        "tpu_int8",
        "fp8",
        "ptpc_fp8",
        "fbgemm_fp8",
        "modelopt",
        "marlin",
        "gguf",
        "gptq_marlin_24",
        "gptq_marlin",
        "awq_marlin",
        "gptq",
        "compressed-tensors",
        "bitsandbytes",
        "qqq",
        "hqq",
        "experts_int8",
        "neuron_quant",
        "ipex",
        "quark",
        "moe_wna16",
    }
)
"""The values `vllm serve --quantization` accepts (vllm/model_executor/layers/quantization/__init__.py,
QUANTIZATION_METHODS, 0.7-0.8 era; later releases add to it). There is no `int8`: a W8A8 INT8 checkpoint is loaded as
compressed-tensors, the format llm-compressor writes."""
VLLM_QUANTIZATION_SPELLING = {
    "int8": "compressed-tensors",
    "w8a8": "compressed-tensors",
    "int8-w8a8": "compressed-tensors",
}
"""servelab's name for a modelled weight format -> the value vLLM's --quantization takes for it."""

# Flags vLLM V1 no longer has, with why they no longer matter; passing one is a warning.
OBSOLETE_FLAGS: dict[str, str] = {
    "use-v2-block-manager": "V1 has a single paged block manager; the flag was removed",
    "num-lookahead-slots": "lookahead slots served V0 speculative decoding; V1 has no such setting",
    "max-num-partial-prefills": "concurrent partial prefills were a V0 scheduler feature; V1 schedules prefills by "
    "token budget",
    "max-long-partial-prefills": "concurrent partial prefills were a V0 scheduler feature; V1 schedules prefills by "
    "token budget",
    "swap-space": "V1 preempts by recompute and never swaps KV blocks to CPU memory",
    "preemption-mode": "V1 always preempts by recompute",
    "num-scheduler-steps": "multi-step scheduling was removed; V1 overlaps CPU and GPU work with async scheduling",
    "multi-step-stream-outputs": "multi-step scheduling was removed in V1",
    "scheduler-delay-factor": "the V0 scheduler's prefill delay was removed in V1",
    "disable-log-requests": "request logging is off by default now (opt in with --enable-log-requests)",
    "disable-async-output-proc": "async output processing was a V0 option; V1 always processes outputs asynchronously",
    "worker-use-ray": "replaced by --distributed-executor-backend ray",
    "tokenizer-pool-size": "the tokenizer pool was removed; V1 tokenizes in the API server process",
    "speculative-model": "replaced by --speculative-config (which servelab does not model)",
    "max-seq-len-to-capture": "CUDA-graph capture sizes are set through --compilation-config now",
}

# Flags vLLM accepts that would change performance but that servelab does not model;
# the run is simulated as if they were absent, with a warning.
UNMODELLED_FLAGS = frozenset(
    {
        "speculative-config",
        "spec-model",
        "compilation-config",
        "attention-backend",
        "attention-config",
        "cpu-offload-gb",
        "max-num-scheduled-tokens",
        "max-num-active-seqs",
        "max-num-queued-reqs",
        "max-num-queued-tokens",
        "long-prefill-token-threshold-adaptive",
        "pipeline-parallel-size",
        "decode-context-parallel-size",
        "prefill-context-parallel-size",
        "kv-transfer-config",
        "scheduler-cls",
    }
)

# Flags that change performance in vLLM 0.32, are accepted, and are not modelled yet, each with what it would take.
NOT_MODELLED_BECAUSE: dict[str, str] = {
    "spec-method": "speculative decoding (draft tokens, acceptance rates) is not modelled; simulated without it",
    "spec-tokens": "speculative decoding (draft tokens, acceptance rates) is not modelled; simulated without it",
    "max-cudagraph-capture-size": (
        "CUDA-graph batch padding to capture sizes is not modelled (the roofline prices the real batch); "
        "batches above the largest size run eagerly in vLLM, which the cost model does not distinguish either"
    ),
    "kv-offloading-size": (
        "KV offloading to host memory (a second cache tier the prefix cache can hit) is not modelled; "
        "the GPU KV cache is simulated alone"
    ),
}

GPU_KERNEL_BLOCK = 16
"""vLLM 0.32's FlashAttention backend (the GPU default) takes KV blocks of a multiple of 16 tokens
(FlashAttentionBackend.get_supported_kernel_block_sizes: MultipleOf(16)); any other block size fails at start-up.
The CPU backend takes any size (it only warns off multiples of 32)."""


FlagValue = str | int | float | bool | None
"""A parsed flag's value, as the EngineConfig field it sets takes it."""


@dataclass(frozen=True, slots=True)
class _Flag:
    """How one modelled vLLM flag lands in the parse result."""

    target: str
    convert: Callable[[str], FlagValue] | None = None
    """None for on/off switches."""


def _human_int(value: str) -> int:
    """vLLM's human_readable_int: 1k = 1000, 1K = 1024 (also m/M, g/G, t/T)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value.strip())
    if not match:
        return int(value)
    number, suffix = match.groups()
    if suffix.islower():
        return int(float(number) * 10 ** (3 * "kmgt".index(suffix) + 3))
    return int(number) * 2 ** (10 * "KMGT".index(suffix) + 10)


def _max_model_len(value: str) -> int | None:
    return None if value.strip().lower() in ("-1", "auto") else _positive(value)


def _quantization(value: str) -> str | None:
    return None if value.lower() in ("none", "") else value.lower()


def _non_negative_fraction(value: str) -> float:
    number = float(value)
    if not 0 <= number < 1:
        raise ValueError("must be in [0, 1)")
    return number


def _positive(value: str) -> int:
    number = _human_int(value)
    if number <= 0:
        raise ValueError("must be a positive integer")
    return number


_MODELLED: dict[str, _Flag] = {
    "max-num-seqs": _Flag("max_num_seqs", _positive),
    "max-num-batched-tokens": _Flag("max_num_batched_tokens", _positive),
    "enable-chunked-prefill": _Flag("enable_chunked_prefill"),
    "enable-prefix-caching": _Flag("enable_prefix_caching"),
    "long-prefill-token-threshold": _Flag("long_prefill_token_threshold", int),
    "gpu-memory-utilization": _Flag("gpu_memory_utilization", fraction),
    "device-memory-utilization": _Flag("gpu_memory_utilization", fraction),
    "async-scheduling": _Flag("async_scheduling"),
    "enforce-eager": _Flag("enforce_eager"),
    "enable-expert-parallel": _Flag("enable_expert_parallel"),
    "scheduler-reserve-full-isl": _Flag("scheduler_reserve_full_isl"),
    "watermark": _Flag("watermark", _non_negative_fraction),
    "api-server-count": _Flag("api_server_count", _positive),
    "stream-interval": _Flag("stream_interval", _positive),
    "max-model-len": _Flag("max_model_len", _max_model_len),
    "block-size": _Flag("block_size", _positive),
    "kv-cache-dtype": _Flag("kv_cache_dtype", choice("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")),
    "quantization": _Flag("quantization", _quantization),
    "dtype": _Flag("dtype", choice("auto", "bfloat16", "float16", "half", "float", "float32")),
    "tensor-parallel-size": _Flag("tensor_parallel_size", _positive),
    "data-parallel-size": _Flag("data_parallel_size", _positive),
    "scheduling-policy": _Flag("scheduling_policy", choice("fcfs", "priority")),
    "num-gpu-blocks-override": _Flag("num_gpu_blocks_override", _positive),
    "kv-cache-memory-bytes": _Flag("kv_cache_memory_bytes", _human_int),
    "model": _Flag("model", str),
    "performance-mode": _Flag("performance_mode", choice("balanced", "interactivity", "throughput")),
    "enable-lora": _Flag("enable_lora"),
    "max-loras": _Flag("max_loras", _positive),
    "max-lora-rank": _Flag("max_lora_rank", _positive),
}


_MODELLED_ENVIRONMENT: dict[str, _Flag] = {
    "VLLM_MXFP4_USE_MARLIN": _Flag("mxfp4_use_marlin", lambda value: bool(int(value))),
}
"""vLLM environment variables that change the performance model, as vllm/envs.py reads them (maybe_convert_bool:
an integer, non-zero is on)."""
VLLM_ENVIRONMENT = {spec.target: name for name, spec in _MODELLED_ENVIRONMENT.items()}
"""EngineConfig field -> the environment variable that sets it, for printing a launch line."""

ENVIRONMENT_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
"""A shell's leading `NAME=VALUE` word."""


@cache
def _vllm_flags() -> tuple[frozenset[str], frozenset[str], dict[str, str]]:
    data = yaml.safe_load(VLLM_FLAGS.read_text())
    return frozenset(data["value_flags"]), frozenset(data["switch_flags"]), dict(data["short_flags"])


@dataclass(slots=True)
class ParsedEngineArgs:
    """A vLLM command line as the model sees it."""

    config: EngineConfig
    model: str | None = None
    performance_mode: str = "balanced"
    warnings: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    """Flags vLLM accepts that have no effect on performance (--host, --port, --api-key, ...)."""
    given: frozenset[str] = frozenset()
    """The EngineConfig fields the line set itself, so a flag beside it (--tp) that disagrees can be refused."""


def _split(line: str | Sequence[str]) -> tuple[list[str], list[str]]:
    """The line's leading environment assignments (`VLLM_MXFP4_USE_MARLIN=1 vllm serve ...`, as a shell reads them)
    and its flags, the launcher dropped."""
    assignments, words = split_environment(shlex.split(line) if isinstance(line, str) else list(line))
    return assignments, _tokens(words)


def split_environment(words: list[str]) -> tuple[list[str], list[str]]:
    """A command's leading `NAME=VALUE` words (its environment, as a shell reads them) and the rest."""
    first = next((i for i, word in enumerate(words) if not ENVIRONMENT_ASSIGNMENT.match(word)), len(words))
    return words[:first], words[first:]


def _tokens(tokens: list[str]) -> list[str]:
    """The flags after the launcher (`vllm serve`, `python -m vllm.entrypoints...`)."""
    for launcher in (
        ["vllm", "serve"],
        ["python", "-m", "vllm.entrypoints.openai.api_server"],
        ["python3", "-m", "vllm.entrypoints.openai.api_server"],
    ):
        if tokens[: len(launcher)] == launcher:
            return tokens[len(launcher) :]
    return tokens


def _canonical(flag: str, short: dict[str, str]) -> str:
    if flag.startswith("--"):
        return flag[2:].replace("_", "-")
    return short.get(flag[1:], flag[1:])


def parse_engine_args(line: str | Sequence[str], base: EngineConfig | None = None) -> ParsedEngineArgs:
    """Parse a `vllm serve` line or `--engine-args` string into an EngineConfig (unset values stay None).

    Raises PerfConfigError on a flag vLLM itself would reject, a missing or bad value.
    """
    value_flags, switch_flags, short = _vllm_flags()
    values: dict[str, FlagValue] = {}
    result = ParsedEngineArgs(config=base or EngineConfig())
    assignments, tokens = _split(line)
    for assignment in assignments:
        _apply_environment(result, values, assignment)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("-"):
            if "model" in values:
                raise PerfConfigError(f"unexpected argument {token!r}: only one positional model is accepted")
            values["model"] = token
            continue
        flag, eq, inline = token.partition("=")
        name = _canonical(flag, short)
        negated = name.startswith("no-") and name[3:] in switch_flags
        if name in OBSOLETE_FLAGS:
            result.warnings.append(f"--{name} is obsolete in vLLM V1 and has no effect: {OBSOLETE_FLAGS[name]}")
            if not eq and i < len(tokens) and not tokens[i].startswith("-"):
                i += 1  # its value
            continue
        if (name[3:] if negated else name) in switch_flags:
            _apply_switch(result, values, flag, name, negated, has_value=bool(eq))
            continue
        if name not in value_flags:
            raise _unknown_flag(flag, name, value_flags | switch_flags)
        if not eq:
            if i >= len(tokens):
                raise PerfConfigError(f"{flag} needs a value")
            inline = tokens[i]
            i += 1
        _apply_value(result, values, flag, name, inline)

    result.given = frozenset(values)
    model, mode = values.pop("model", None), values.pop("performance_mode", "balanced")
    result.model, result.performance_mode = None if model is None else str(model), str(mode)
    result.config = result.config.with_(**values)
    return result


def _apply_environment(result: ParsedEngineArgs, values: dict[str, FlagValue], assignment: str) -> None:
    """One `NAME=VALUE` before the launcher: a modelled vLLM variable sets its field, any other is warned of."""
    name, _, value = assignment.partition("=")
    spec = _MODELLED_ENVIRONMENT.get(name)
    if spec is None:
        modelled = ", ".join(_MODELLED_ENVIRONMENT)
        result.warnings.append(f"{assignment}: of the environment only {modelled} is modelled; simulated as if unset")
        return
    try:
        values[spec.target] = spec.convert(value) if spec.convert else value
    except ValueError:
        raise PerfConfigError(f"bad value {value!r} for {name}: vLLM reads it as an integer (1 on, 0 off)") from None


def _apply_switch(
    result: ParsedEngineArgs, values: dict[str, FlagValue], flag: str, name: str, negated: bool, *, has_value: bool
) -> None:
    """An on/off flag (`--name` or `--no-name`): a modelled one sets its field, others are warned of or ignored."""
    base_name = name[3:] if negated else name
    if has_value:
        raise PerfConfigError(f"{flag} is an on/off switch and takes no value (use --{base_name} or --no-{base_name})")
    switch_value = not negated
    if base_name in _MODELLED:
        values[_MODELLED[base_name].target] = switch_value
        if base_name == "enable-chunked-prefill" and switch_value:
            result.warnings.append("--enable-chunked-prefill is the default in vLLM V1; the flag changes nothing")
    elif base_name in UNMODELLED_FLAGS:
        result.warnings.append(f"{flag} changes performance but is not modelled; simulated as if absent")
    else:
        result.ignored.append(flag)


def _unknown_flag(flag: str, name: str, known: frozenset[str]) -> PerfConfigError:
    """The error for a flag vLLM does not have, with the closest one it does."""
    close = difflib.get_close_matches(name, sorted(known | set(OBSOLETE_FLAGS)), n=1)
    hint = f" (did you mean --{close[0]}?)" if close else ""
    return PerfConfigError(f"unknown vLLM flag {flag}{hint}; vLLM 0.32 would reject it too")


def _apply_value(result: ParsedEngineArgs, values: dict[str, FlagValue], flag: str, name: str, value: str) -> None:
    """A flag with a value: a modelled one sets its field (converted, checked), others are warned of or ignored."""
    if name in _MODELLED:
        spec = _MODELLED[name]
        try:
            values[spec.target] = spec.convert(value) if spec.convert else value
        except ValueError as exc:
            raise PerfConfigError(f"bad value {value!r} for {flag}: {exc}") from None
        if name == "max-model-len" and values[spec.target] is None:
            result.warnings.append("--max-model-len auto is modelled as the model's maximum context length")
    elif name in NOT_MODELLED_BECAUSE:
        result.warnings.append(f"{flag} {value} accepted, not modelled: {NOT_MODELLED_BECAUSE[name]}")
    elif name in UNMODELLED_FLAGS:
        if name == "pipeline-parallel-size" and value.strip() not in ("1",):
            raise PerfConfigError("--pipeline-parallel-size > 1 is not supported yet; use tensor or data parallelism")
        if name != "pipeline-parallel-size":
            result.warnings.append(f"{flag} changes performance but is not modelled; simulated as if absent")
    else:
        result.ignored.append(flag)


def default_batch_limits(
    hardware: Hardware, world_size: int, usage: str = "api_server", vllm_version: tuple[int, int] | None = None
) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that vLLM 0.32 picks for this chip when the user sets neither.

    `usage` is "api_server" (vllm serve) or "llm" (the offline LLM class). The split
    follows EngineArgs.get_batch_defaults: >= 160 GiB chips get the largest
    defaults (from 0.28; `vllm_version` None is today's), >= 70 GiB chips other
    than A100 the H100/H200 ones, the rest the conservative ones; the CPU
    backend scales with world size.
    """
    api = usage == "api_server"
    if is_v0(vllm_version) and hardware.vendor != "cpu":
        return V0_BATCH_LIMITS
    if hardware.vendor == "cpu":
        return (2048 if api else 4096) * world_size, (128 if api else 256) * world_size
    largest = vllm_version is None or vllm_version >= LARGEST_BATCH_DEFAULTS_SINCE
    if hardware.memory_bytes >= 160 * GiB and largest:
        return 16384, 1024
    if hardware.memory_bytes >= 70 * GiB and "a100" not in hardware.name.lower():
        return (8192 if api else 16384), 1024
    return (2048 if api else 8192), 256


def _checked_max_model_len(config: EngineConfig, hardware: Hardware, model: ModelSpec) -> int:
    """The context length the deployment serves, after the shape checks vLLM makes at start-up (block size on a GPU,
    heads divisible by TP, a context the model supports)."""
    tp = config.tensor_parallel_size
    if hardware.vendor != "cpu" and config.block_size % GPU_KERNEL_BLOCK:
        raise PerfConfigError(
            f"--block-size {config.block_size}: vLLM's attention kernels on a GPU ({hardware.name}) take a multiple "
            f"of {GPU_KERNEL_BLOCK} tokens (16, 32, 64, 128, ...); vLLM refuses it"
        )
    if model.num_heads % tp:
        raise PerfConfigError(
            f"--tensor-parallel-size (--tp) {tp}: {model.name} has {model.num_heads} attention heads, not divisible "
            f"by {tp}"
        )
    max_model_len = config.max_model_len or model.max_position_embeddings
    if max_model_len > model.max_position_embeddings:
        raise PerfConfigError(
            f"max_model_len {max_model_len} exceeds {model.name}'s max_position_embeddings "
            f"{model.max_position_embeddings}; vLLM refuses it"
        )
    return max_model_len


def _batch_limits(
    config: EngineConfig,
    hardware: Hardware,
    max_model_len: int,
    performance_mode: str,
    usage: str,
    vllm_version: tuple[int, int] | None,
) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens): the flags', else vLLM's defaults for the chip, checked as vLLM does."""
    default_tokens, default_seqs = default_batch_limits(hardware, config.tensor_parallel_size, usage, vllm_version)
    if performance_mode == "throughput":
        default_tokens, default_seqs = 2 * default_tokens, 2 * default_seqs

    max_num_seqs = config.max_num_seqs or default_seqs
    if config.max_num_batched_tokens is None:
        tokens = default_tokens
        if not config.enable_chunked_prefill:
            tokens = max(max_model_len, tokens)
        max_num_batched_tokens = min(max_num_seqs * max_model_len, tokens)
    else:
        max_num_batched_tokens = config.max_num_batched_tokens
    if config.max_num_seqs is None:
        max_num_seqs = min(max_num_seqs, max_num_batched_tokens)

    if not config.enable_chunked_prefill and max_num_batched_tokens < max_model_len:
        raise PerfConfigError(
            f"max_num_batched_tokens ({max_num_batched_tokens}) is smaller than max_model_len ({max_model_len}) "
            "with chunked prefill off; vLLM refuses this: increase --max-num-batched-tokens or decrease --max-model-len"
        )
    if max_num_batched_tokens < max_num_seqs:
        raise PerfConfigError(
            f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs ({max_num_seqs}), as vLLM "
            f"requires"
        )
    return max_num_seqs, max_num_batched_tokens


def resolve(
    config: EngineConfig,
    hardware: Hardware,
    model: ModelSpec,
    *,
    performance_mode: str = "balanced",
    usage: str = "api_server",
    vllm_version: tuple[int, int] | None = None,
) -> EngineConfig:
    """Fill every None in `config` as vLLM 0.32 (or `vllm_version`) would on `hardware`, and apply vLLM's checks.

    Defaults that are not None (async scheduling's aside) come from the
    EngineConfig the flags were parsed onto (perf/vllm_versions.py).
    """
    max_model_len = _checked_max_model_len(config, hardware, model)
    max_num_seqs, max_num_batched_tokens = _batch_limits(
        config, hardware, max_model_len, performance_mode, usage, vllm_version
    )
    # VllmConfig turns async scheduling on unless something is incompatible; CpuPlatform.check_and_update_config
    # then forces it off whatever the flag said ("async scheduling is not required on CPU").
    async_scheduling = hardware.vendor != "cpu" and config.async_scheduling is not False
    dtype = (
        model.dtype
        if config.dtype == "auto"
        else {"half": "float16", "float": "float32"}.get(config.dtype, config.dtype)
    )
    return config.with_(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        dtype=dtype,
        async_scheduling=async_scheduling,
        # vllm/entrypoints/cli/serve.py: with the internal load balancer, one API server per data-parallel engine.
        api_server_count=config.api_server_count or config.data_parallel_size,
    )


def flag_status(flag: str) -> str:
    """What vLLM 0.32 makes of a flag: "exists", "obsolete" or "unknown" (no such flag)."""
    name = flag.lstrip("-")
    if name in OBSOLETE_FLAGS:
        return "obsolete"
    value_flags, switch_flags, _ = _vllm_flags()
    return "exists" if name in value_flags or name in switch_flags else "unknown"
