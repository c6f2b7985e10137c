"""SGLang's `python -m sglang.launch_server` line, its defaults for a chip and its memory plan.

The defaults follow SGLang 0.5.x's server_args.py (`_handle_gpu_memory_settings`):
`chunked_prefill_size` and `cuda_graph_max_bs` come from buckets of GPU memory,
and `mem_fraction_static` (the share of the GPU for weights + KV pool) is what
is left after a reserve for activations of one chunk (1.5 MB per chunk token),
CUDA graphs (2 MB per captured batch size) and parallelism (1 GB per 8 ranks),
at least 10 GB on chips over 60 GB. The KV pool (model_runner.py,
`profile_max_num_token`) is then the static share minus the weights (and the
CUDA context), in tokens: SGLang's page size is 1, so one "block" is one token.
`max_running_requests` defaults to min(pool tokens / 2, the request-slot pool
of min(max(pool / context_len x 512, 2048), 4096)).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from servelab.perf.engine_config import EngineConfig
from servelab.perf.engine_flags import Flag, FlagTable, ParsedLaunch, choice, fraction, parse_flags, positive_int
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import Hardware
from servelab.perf.memory import MemoryPlan, MemoryReserve, kv_bytes_per_token_per_rank, weight_bytes_per_rank
from servelab.perf.models import ModelSpec

MB = 2**20
SCHEDULE_POLICIES = ("fcfs", "lpm", "random", "dfs-weight", "lof", "priority", "routing-key")
MODELLED_POLICIES = ("fcfs", "lpm")


@dataclass(frozen=True, slots=True)
class SGLangSettings:
    """The SGLang server arguments the model reads; None = SGLang's default for the chip."""

    model: str | None = None
    tp_size: int = 1
    dp_size: int = 1
    ep_size: int = 1
    """Expert-parallel GPUs (`--ep-size`): above 1, whole experts per GPU (perf/expert_parallel.py)."""
    enable_dp_attention: bool = False
    """Attention data-parallel over the dp_size ranks that share the experts (`--enable-dp-attention`)."""
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    """-1 turns chunked prefill off (prompts then go whole, up to max_prefill_tokens per batch)."""
    max_prefill_tokens: int = 16384
    schedule_policy: str = "fcfs"
    schedule_conservativeness: float = 1.0
    page_size: int = 1
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    context_length: int | None = None
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    dtype: str = "auto"
    cuda_graph_max_bs: int | None = None
    disable_cuda_graph: bool = False
    stream_interval: int = 1


def _chunk(text: str) -> int:
    value = int(text)
    if value == 0 or value < -1:
        raise ValueError("must be positive, or -1 for no chunked prefill")
    return value


FLAGS = FlagTable(
    engine="SGLang",
    launchers=(
        ("python", "-m", "sglang.launch_server"),
        ("python3", "-m", "sglang.launch_server"),
        ("sglang", "serve"),
    ),
    modelled={
        "model-path": Flag("model", str),
        "tp-size": Flag("tp_size", positive_int),
        "dp-size": Flag("dp_size", positive_int),
        "ep-size": Flag("ep_size", positive_int),
        "enable-dp-attention": Flag("enable_dp_attention"),
        "mem-fraction-static": Flag("mem_fraction_static", fraction),
        "max-running-requests": Flag("max_running_requests", positive_int),
        "max-total-tokens": Flag("max_total_tokens", positive_int),
        "chunked-prefill-size": Flag("chunked_prefill_size", _chunk),
        "max-prefill-tokens": Flag("max_prefill_tokens", positive_int),
        "schedule-policy": Flag("schedule_policy", choice(*SCHEDULE_POLICIES)),
        "schedule-conservativeness": Flag("schedule_conservativeness", float),
        "page-size": Flag("page_size", positive_int),
        "disable-radix-cache": Flag("disable_radix_cache"),
        "disable-overlap-schedule": Flag("disable_overlap_schedule"),
        "context-length": Flag("context_length", positive_int),
        "kv-cache-dtype": Flag("kv_cache_dtype", choice("auto", "fp8_e4m3", "fp8_e5m2", "bf16", "bfloat16")),
        "quantization": Flag("quantization", str),
        "dtype": Flag("dtype", str),
        "cuda-graph-max-bs": Flag("cuda_graph_max_bs", positive_int),
        "disable-cuda-graph": Flag("disable_cuda_graph"),
        "stream-interval": Flag("stream_interval", positive_int),
    },
    obsolete={
        "disable-flashinfer": "replaced by --attention-backend",
        "disable-flashinfer-sampling": "replaced by --sampling-backend",
        "enable-overlap-schedule": "the overlap scheduler is on by default (turn it off with "
        "--disable-overlap-schedule)",
        "schedule-heuristic": "renamed --schedule-policy",
        "disable-regex-jump-forward": "regex jump-forward decoding was removed",
    },
    not_modelled=frozenset(
        {
            "enable-mixed-chunk",
            "num-continuous-decode-steps",
            "speculative-algorithm",
            "attention-backend",
            "enable-torch-compile",
            "radix-eviction-policy",
            "pp-size",
            "enable-hierarchical-cache",
            "retraction-policy",
            "enable-priority-scheduling",
        }
    ),
    harmless=frozenset(
        {
            "host",
            "port",
            "trust-remote-code",
            "log-level",
            "served-model-name",
            "api-key",
            "tokenizer-path",
            "random-seed",
            "enable-metrics",
            "log-requests",
            "sampling-backend",
            "tokenizer-mode",
            "skip-tokenizer-init",
            "watchdog-timeout",
            "device",
            "revision",
            "chat-template",
            "reasoning-parser",
            "tool-call-parser",
        }
    ),
    switches=frozenset(
        {
            "enable-mixed-chunk",
            "enable-dp-attention",
            "disable-cuda-graph",
            "enable-torch-compile",
            "enable-hierarchical-cache",
            "enable-priority-scheduling",
            "trust-remote-code",
            "enable-metrics",
            "log-requests",
            "skip-tokenizer-init",
            "disable-flashinfer",
            "disable-flashinfer-sampling",
            "enable-overlap-schedule",
            "disable-regex-jump-forward",
        }
    ),
    aliases={
        "model": "model-path",
        "tp": "tp-size",
        "tensor-parallel-size": "tp-size",
        "dp": "dp-size",
        "ep": "ep-size",
        "expert-parallel-size": "ep-size",
        "data-parallel-size": "dp-size",
    },
)


ParsedSGLang = ParsedLaunch[SGLangSettings]


def parse_sglang_args(line: str | Sequence[str]) -> ParsedSGLang:
    """A `python -m sglang.launch_server ...` line (or just its flags) as SGLangSettings, with what was not modelled."""
    parsed = parse_flags(line, FLAGS)
    settings = SGLangSettings(**parsed.values)
    warnings = list(parsed.warnings)
    if settings.schedule_policy not in MODELLED_POLICIES:
        warnings.append(f"--schedule-policy {settings.schedule_policy} is not modelled; simulated as fcfs")
    if settings.page_size != 1:
        warnings.append(
            f"--page-size {settings.page_size}: the radix cache is modelled with SGLang's default page size 1"
        )
    return ParsedSGLang(settings, warnings, parsed.obsolete, parsed.unknown)


def memory_defaults(hardware: Hardware, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) SGLang picks from the GPU's memory (server_args.py buckets)."""
    gpu_mb = hardware.nvidia_smi_memory_mib
    small = tp < 4
    if gpu_mb < 20 * 1024:
        return 2048, 8
    if gpu_mb < 35 * 1024:
        return 2048, 24 if small else 80
    if gpu_mb < 60 * 1024:
        return 4096, 32 if small else 160
    if gpu_mb < 160 * 1024:
        return 8192, 256 if small else 512
    return 16384, 512


def default_mem_fraction_static(hardware: Hardware, s: SGLangSettings, chunk: int, graph_bs: int) -> float:
    gpu_mb = hardware.nvidia_smi_memory_mib
    reserved = 512.0 + max(chunk if chunk > 0 else s.max_prefill_tokens, 2048) * 1.5 + graph_bs * 2
    reserved += s.tp_size / 8 * 1024
    if gpu_mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mb - reserved) / gpu_mb, 3)


@dataclass(frozen=True, slots=True)
class SGLangPlan:
    settings: SGLangSettings
    """With every default filled for the chip."""
    config: EngineConfig
    """The same deployment in the simulator's common terms (block_size = page size 1)."""
    memory: MemoryPlan
    max_total_num_tokens: int


def _kv_dtype(name: str) -> str:
    return "fp8" if name.startswith("fp8") else "auto"


def resolve_sglang(settings: SGLangSettings, hardware: Hardware, model: ModelSpec) -> SGLangPlan:
    """SGLang's defaults on this chip and its KV pool; PerfConfigError when the model does not fit."""
    s = settings
    _check_layout(s, model)
    chunk_default, graph_default = memory_defaults(hardware, s.tp_size)
    chunk = s.chunked_prefill_size if s.chunked_prefill_size is not None else chunk_default
    graph_bs = s.cuda_graph_max_bs or graph_default
    frac = s.mem_fraction_static or default_mem_fraction_static(hardware, s, chunk, graph_bs)
    context = s.context_length or model.max_position_embeddings
    m = model.with_dtype(s.dtype)
    total = hardware.memory_bytes
    weights = weight_bytes_per_rank(m, s.quantization, hardware, s.tp_size)
    context_bytes = MemoryReserve().non_torch_bytes
    kv_bytes = total * frac - weights - context_bytes
    per_token = kv_bytes_per_token_per_rank(m, _kv_dtype(s.kv_cache_dtype), s.tp_size)
    tokens = int(kv_bytes // per_token) if kv_bytes > 0 else 0
    if s.max_total_tokens is not None:
        tokens = min(tokens, s.max_total_tokens)
    if tokens < 1:
        raise PerfConfigError(
            f"{model.name} on {hardware.name}: mem_fraction_static {frac:g} leaves no room for the KV pool after "
            f"{weights / 2**30:.1f} GiB of weights; raise --mem-fraction-static or use more GPUs (--tp-size)"
        )
    request_slots = min(max(int(tokens / context * 512), 2048), 4096)
    running = min(s.max_running_requests or tokens // 2, request_slots)
    resolved = replace(
        s,
        chunked_prefill_size=chunk,
        cuda_graph_max_bs=graph_bs,
        mem_fraction_static=frac,
        context_length=context,
        max_running_requests=running,
    )
    memory = MemoryPlan(
        total_bytes=total,
        requested_bytes=int(total * frac),
        weight_bytes=weights,
        activation_bytes=total - int(total * frac),
        cuda_graph_bytes=0,
        non_torch_bytes=context_bytes,
        kv_cache_bytes=int(tokens * per_token),
        kv_bytes_per_token=per_token,
        block_size=1,
        num_blocks=tokens,
    )
    # A pool shorter than the context is not refused: SGLang caps a request's input at the pool (the scheduler's
    # max_req_input_len = min(context_len - 1, max_total_num_tokens - 1)).
    longest = min(context, tokens)
    config = _engine_config(s, running=running, chunk=chunk, frac=frac, context=longest, graph_bs=graph_bs)
    return SGLangPlan(resolved, config, memory, tokens)


def _check_layout(s: SGLangSettings, model: ModelSpec) -> None:
    """The parallel layouts SGLang refuses at start-up: EP not over the TP ranks, DP attention not dividing TP, heads
    not divisible by TP."""
    if s.ep_size not in (1, s.tp_size):
        raise PerfConfigError(
            f"--ep-size {s.ep_size}: SGLang's expert parallelism spans the --tp-size {s.tp_size} ranks"
        )
    if s.enable_dp_attention and s.tp_size % s.dp_size:
        raise PerfConfigError(f"--enable-dp-attention: --dp-size {s.dp_size} must divide --tp-size {s.tp_size}")
    if model.num_heads % s.tp_size:
        raise PerfConfigError(
            f"{model.name} has {model.num_heads} attention heads, not divisible by --tp-size {s.tp_size}"
        )


def _engine_config(
    s: SGLangSettings, *, running: int, chunk: int, frac: float, context: int, graph_bs: int
) -> EngineConfig:
    """The SGLang deployment in the simulator's engine knobs: its running-request cap as max_num_seqs, its prefill
    chunk as the token budget, its radix cache as prefix caching, one-token pages."""
    return EngineConfig(
        max_num_seqs=running,
        max_num_batched_tokens=chunk if chunk > 0 else s.max_prefill_tokens,
        enable_chunked_prefill=chunk > 0,
        enable_prefix_caching=not s.disable_radix_cache,
        gpu_memory_utilization=frac,
        max_model_len=context,
        block_size=1,
        kv_cache_dtype=_kv_dtype(s.kv_cache_dtype),
        quantization=s.quantization,
        dtype=s.dtype,
        # DP attention splits the TP group into dp_size attention ranks of tp/dp GPUs that share the experts,
        # vLLM's TP x DP layout with expert parallelism; without it, dp_size is replicas.
        tensor_parallel_size=s.tp_size // s.dp_size if s.enable_dp_attention else s.tp_size,
        data_parallel_size=s.dp_size,
        enable_expert_parallel=s.ep_size > 1,
        async_scheduling=not s.disable_overlap_schedule,
        stream_interval=s.stream_interval,
        enforce_eager=s.disable_cuda_graph,
        cuda_graph_max_batch=graph_bs,
        eager_prefill=True,
    )
