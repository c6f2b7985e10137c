"""vLLM command lines parsed with vLLM's spellings, and defaults filled as vLLM 0.32 fills them."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.perf.engine_args import default_batch_limits, parse_engine_args, resolve
from servelab.perf.engine_config import EngineConfig
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import get_gpu
from servelab.perf.models import get_model, load_hf_config


def test_pasted_vllm_serve_line():
    parsed = parse_engine_args(
        "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-seqs 256 --max_num_batched_tokens=8192 "
        "--no-enable-prefix-caching -tp 2 --gpu-memory-utilization 0.85 --kv-cache-dtype fp8 "
        "--host 0.0.0.0 --port 8000 --api-key secret"
    )
    config = parsed.config
    assert parsed.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (256, 8192)
    assert config.enable_prefix_caching is False and config.tensor_parallel_size == 2
    assert config.gpu_memory_utilization == 0.85 and config.kv_cache_dtype == "fp8"
    assert parsed.ignored == ["--host", "--port", "--api-key"]
    assert parsed.warnings == []


def test_engine_args_string_without_launcher_and_human_readable_ints():
    config = parse_engine_args("--max-model-len 32k --max-num-batched-tokens 16K --enable-prefix-caching").config
    assert config.max_model_len == 32000 and config.max_num_batched_tokens == 16384
    assert config.enable_prefix_caching is True


def test_obsolete_flags_warn_with_the_reason_and_consume_their_value():
    parsed = parse_engine_args("--use-v2-block-manager --num-lookahead-slots 4 --swap-space 8 --max-num-seqs 64")
    assert parsed.config.max_num_seqs == 64
    assert len(parsed.warnings) == 3
    assert "V1 has a single paged block manager" in parsed.warnings[0]
    assert "recompute" in parsed.warnings[2]


def test_chunked_prefill_flag_is_reported_as_default():
    parsed = parse_engine_args("--enable-chunked-prefill")
    assert parsed.config.enable_chunked_prefill is True
    assert "default in vLLM V1" in parsed.warnings[0]


def test_unmodelled_performance_flags_warn():
    parsed = parse_engine_args("--attention-backend FLASHINFER --speculative-config {}")
    assert all("not modelled" in w for w in parsed.warnings) and len(parsed.warnings) == 2


def test_environment_before_the_launcher_is_read_as_vllm_reads_it():
    """`VLLM_MXFP4_USE_MARLIN=1 vllm serve ...` (a shell's leading assignment) sets the modelled variable, as
    vllm/envs.py reads it (an integer, non-zero on); any other variable is warned of, never mistaken for a model."""
    parsed = parse_engine_args("VLLM_MXFP4_USE_MARLIN=1 vllm serve openai/gpt-oss-120b --max-num-seqs 64")
    assert parsed.config.mxfp4_use_marlin is True and parsed.model == "openai/gpt-oss-120b"
    assert parsed.config.max_num_seqs == 64 and parsed.warnings == []
    assert parse_engine_args("VLLM_MXFP4_USE_MARLIN=0 -tp 2").config.mxfp4_use_marlin is False
    assert parse_engine_args("-tp 2").config.mxfp4_use_marlin is False
    other = parse_engine_args("VLLM_USE_DEEP_GEMM=1 --max-num-seqs 8")
    assert other.config.max_num_seqs == 8 and "VLLM_USE_DEEP_GEMM=1" in other.warnings[0]
    with pytest.raises(PerfConfigError, match="bad value 'yes' for VLLM_MXFP4_USE_MARLIN"):
        parse_engine_args("VLLM_MXFP4_USE_MARLIN=yes")


def test_enforce_eager_is_modelled_and_pasted_back():
    from servelab.targets.deployment import build_deployment

    parsed = parse_engine_args("--enforce-eager")
    assert parsed.config.enforce_eager is True and parsed.warnings == []
    assert parse_engine_args("--no-enforce-eager").config.enforce_eager is False
    assert "--enforce-eager" in build_deployment("a100-80gb", "llama-3.1-8b", "--enforce-eager").engine_args().split()


def test_vllm_032_scheduler_and_frontend_flags_are_modelled():
    c = parse_engine_args(
        "--no-async-scheduling --no-scheduler-reserve-full-isl --watermark 0.01 -asc 2 --stream-interval 4"
    ).config
    assert c.async_scheduling is False and c.scheduler_reserve_full_isl is False
    assert (c.watermark, c.api_server_count, c.stream_interval) == (0.01, 2, 4)
    defaults = parse_engine_args("").config
    assert defaults.async_scheduling is None  # resolved per platform: on for GPUs, off on CPU
    assert defaults.scheduler_reserve_full_isl is True and defaults.gpu_memory_utilization == 0.92


def test_device_memory_utilization_is_the_same_setting_as_gpu_memory_utilization():
    for flag in ("--device-memory-utilization", "--gpu-memory-utilization"):
        parsed = parse_engine_args(f"{flag} 0.7")
        assert parsed.config.gpu_memory_utilization == 0.7 and parsed.ignored == [] and parsed.warnings == []


@pytest.mark.parametrize(
    "flag", ["--spec-method ngram", "--spec-tokens 3", "--max-cudagraph-capture-size 128", "--kv-offloading-size 32"]
)
def test_accepted_but_unmodelled_flags_say_why(flag):
    parsed = parse_engine_args(f"{flag} --max-num-seqs 8")
    assert parsed.config.max_num_seqs == 8 and parsed.ignored == []
    (warning,) = parsed.warnings
    assert warning.startswith(f"{flag} accepted, not modelled: ")


@pytest.mark.parametrize(
    "line, message",
    [
        ("--watermark 1", r"must be in \[0, 1\)"),
        ("--api-server-count 0", "must be a positive integer"),
        ("--max-num-seq 3", "did you mean --max-num-seqs"),
        ("--max-num-seqs", "needs a value"),
        ("--max-num-seqs lots", "bad value 'lots' for --max-num-seqs"),
        ("--gpu-memory-utilization 1.5", r"must be in \(0, 1\]"),
        ("--kv-cache-dtype int3", "must be one of"),
        ("--enable-prefix-caching=false", "takes no value"),
        ("--pipeline-parallel-size 2", "not supported yet"),
        ("model-a model-b", "only one positional model"),
    ],
)
def test_bad_lines_get_one_clear_error(line, message):
    with pytest.raises(PerfConfigError, match=message):
        parse_engine_args(line)


@pytest.mark.parametrize(
    "gpu, expected",
    [
        ("a100-80gb", (2048, 256)),  # A100 is excluded from the large defaults (vLLM PR #17885)
        ("a100-40gb", (2048, 256)),
        ("l40s", (2048, 256)),
        ("h100", (8192, 1024)),
        ("h200", (8192, 1024)),
        ("mi300x", (16384, 1024)),  # >= 160 GiB
    ],
)
def test_vllm_batch_defaults_by_chip(gpu, expected):
    assert default_batch_limits(get_gpu(gpu), world_size=1) == expected


def test_cpu_defaults_scale_with_world_size():
    assert default_batch_limits(get_gpu("cpu"), world_size=2) == (4096, 256)
    assert default_batch_limits(get_gpu("h100"), world_size=1, usage="llm") == (16384, 1024)


def test_resolve_fills_defaults_like_vllm():
    resolved = resolve(EngineConfig(), get_gpu("h100"), get_model("qwen2.5-7b"))
    assert (resolved.max_num_batched_tokens, resolved.max_num_seqs, resolved.max_model_len) == (8192, 1024, 32768)
    assert resolved.enable_chunked_prefill and resolved.enable_prefix_caching
    assert resolved.dtype == "bfloat16"


def test_resolve_keeps_user_values_and_applies_throughput_mode():
    hw, model = get_gpu("a100"), get_model("llama-3.1-8b")
    assert resolve(EngineConfig(max_num_seqs=32), hw, model).max_num_seqs == 32
    doubled = resolve(EngineConfig(), hw, model, performance_mode="throughput")
    assert (doubled.max_num_batched_tokens, doubled.max_num_seqs) == (4096, 512)


def test_resolve_without_chunked_prefill_raises_the_token_budget_to_max_model_len():
    resolved = resolve(
        EngineConfig(enable_chunked_prefill=False, max_model_len=16384), get_gpu("a100"), get_model("llama-3.1-8b")
    )
    assert resolved.max_num_batched_tokens == 16384


def test_resolve_caps_the_default_budget_by_seqs_times_length():
    resolved = resolve(EngineConfig(max_num_seqs=2, max_model_len=512), get_gpu("h100"), get_model("llama-3.1-8b"))
    assert resolved.max_num_batched_tokens == 1024


@pytest.mark.parametrize(
    "config, message",
    [
        (EngineConfig(max_model_len=200_000), "exceeds Llama-3.1-8B's max_position_embeddings"),
        (EngineConfig(tensor_parallel_size=3), r"--tensor-parallel-size \(--tp\) 3: .* not divisible by 3"),
        (EngineConfig(max_num_seqs=512, max_num_batched_tokens=256), r"must be >= max_num_seqs"),
        (
            EngineConfig(enable_chunked_prefill=False, max_num_batched_tokens=4096, max_model_len=8192),
            "smaller than max_model_len",
        ),
    ],
)
def test_resolve_refuses_what_vllm_refuses(config, message):
    with pytest.raises(PerfConfigError, match=message):
        resolve(config, get_gpu("a100"), get_model("llama-3.1-8b"))


def test_a_deployment_prints_the_modelled_variable_leading_its_launch_line():
    """The line a deployment prints (run.json, advice) keeps the variable, and reads back to the same deployment."""
    from servelab.targets.deployment import build_deployment

    gpt_oss = load_hf_config(Path(__file__).parent / "fixtures" / "moe_configs" / "gpt-oss-20b")
    deployment = build_deployment("h100", gpt_oss, "VLLM_MXFP4_USE_MARLIN=1 --max-num-seqs 64")
    assert deployment.engine_args() == "VLLM_MXFP4_USE_MARLIN=1 --max-num-seqs 64"
    assert build_deployment("h100", gpt_oss, deployment.engine_args()).config == deployment.config
    assert "VLLM_MXFP4" not in build_deployment("h100", gpt_oss, "--max-num-seqs 64").engine_args()
