"""Quantization rules and the vLLM-style memory plan."""

from __future__ import annotations

import pytest

from servelab.perf.engine_args import parse_engine_args, resolve
from servelab.perf.engine_config import EngineConfig
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import get_gpu
from servelab.perf.memory import (
    MemoryReserve,
    activation_bytes,
    forward_activation_bytes,
    plan_memory,
    sampler_activation_bytes,
    weight_bytes_per_rank,
)
from servelab.perf.models import get_model
from servelab.perf.quantization import kv_bytes_per_element, weight_format
from servelab.perf.vllm_versions import parse_version, version_defaults

GB = 1e9


def _plan(gpu: str, model: str, **config):
    hw, spec = get_gpu(gpu), get_model(model)
    return plan_memory(hw, spec, resolve(EngineConfig(**config), hw, spec))


def test_qwen7b_on_a100_80gb_leaves_about_60gb_of_kv():
    plan = _plan("a100-80gb", "qwen2.5-7b")
    assert 14.5 * GB < plan.weight_bytes < 16 * GB
    assert 55 * GB < plan.kv_cache_bytes < 65 * GB
    assert plan.num_blocks == plan.kv_cache_bytes // (16 * 57344)
    assert plan.max_concurrency(2048) == plan.num_blocks // 128


def test_lower_utilization_means_fewer_blocks():
    assert (
        _plan("a100-80gb", "qwen2.5-7b", gpu_memory_utilization=0.5).num_blocks
        < _plan("a100-80gb", "qwen2.5-7b").num_blocks
    )


def test_fp8_kv_cache_doubles_the_blocks():
    auto = _plan("h100", "llama-3.1-8b", max_model_len=8192)
    fp8 = _plan("h100", "llama-3.1-8b", max_model_len=8192, kv_cache_dtype="fp8")
    assert fp8.num_blocks == pytest.approx(2 * auto.num_blocks, abs=1)


def test_tensor_parallel_halves_weights_and_kv_per_gpu():
    one = _plan("h100", "llama-3.1-70b", tensor_parallel_size=4, max_model_len=8192)
    assert one.weight_bytes == pytest.approx(get_model("llama-3.1-70b").params * 2 / 4, rel=0.01)
    assert one.kv_bytes_per_token == 327680 / 4


def test_kv_heads_are_replicated_beyond_their_count():
    # Qwen2.5-7B has 4 KV heads: at TP=4 each rank keeps one, and TP cannot split it further.
    hw, spec = get_gpu("h100"), get_model("qwen2.5-7b")
    assert (
        plan_memory(hw, spec, resolve(EngineConfig(tensor_parallel_size=4), hw, spec)).kv_bytes_per_token
        == 2 * 28 * 128 * 2
    )


def test_model_that_does_not_fit_names_the_numbers():
    with pytest.raises(PerfConfigError, match=r"Llama-3.1-70B does not fit: weights 131\.\d GiB"):
        _plan("a100-80gb", "llama-3.1-70b")


def test_max_model_len_beyond_kv_capacity_is_refused():
    with pytest.raises(PerfConfigError, match="max_model_len 131072 is larger than"):
        _plan("a100-40gb", "llama-3.1-8b", gpu_memory_utilization=0.6)


def test_kv_cache_memory_bytes_overrides_utilization():
    plan = _plan("cpu", "qwen2.5-1.5b", kv_cache_memory_bytes=4 * 2**30, max_model_len=4096)
    assert plan.kv_cache_bytes == 4 * 2**30
    assert plan.num_blocks == 4 * 2**30 // (16 * 28672)


def test_num_gpu_blocks_override_wins():
    assert _plan("a100-80gb", "qwen2.5-7b", num_gpu_blocks_override=4096).num_blocks == 4096


def test_weight_formats_follow_vllm_kernels():
    a100, h100, l4, model = get_gpu("a100"), get_gpu("h100"), get_gpu("l4"), get_model("llama-3.1-8b")
    assert weight_format(None, model, a100).compute_dtype == "bf16"
    assert weight_format("fp8", model, h100).compute_dtype == "fp8"
    fallback = weight_format("fp8", model, a100)
    assert fallback.compute_dtype == "bf16" and fallback.bytes_per_param == 1 and "Marlin" in fallback.note
    assert weight_format("int8", model, a100).compute_dtype == "int8"
    w4 = weight_format("awq", model, l4)
    assert w4.compute_dtype == "bf16" and 0.5 < w4.bytes_per_param < 0.55


def test_quantized_weights_shrink_memory():
    hw, model = get_gpu("a100"), get_model("llama-3.1-8b")
    bf16 = weight_bytes_per_rank(model, None, hw, 1)
    assert weight_bytes_per_rank(model, "fp8", hw, 1) < 0.6 * bf16
    assert 5.5e9 < weight_bytes_per_rank(model, "gptq", hw, 1) < 6e9  # linears 4-bit, embeddings bf16


def test_int8_on_a_chip_without_int8_is_refused():
    with pytest.raises(PerfConfigError, match="INT8 W8A8 needs INT8 tensor cores"):
        weight_format("int8", get_model("qwen2.5-7b"), get_gpu("cpu"))


def test_unknown_quantization_and_kv_dtype_are_refused():
    model = get_model("qwen2.5-7b")
    with pytest.raises(PerfConfigError, match="not modelled"):
        weight_format("bitsandbytes", model, get_gpu("a100"))
    with pytest.raises(PerfConfigError, match="not modelled"):
        kv_bytes_per_element("nvfp4", model)
    assert kv_bytes_per_element("auto", model) == 2 and kv_bytes_per_element("fp8", model) == 1


def _resolved(gpu: str, model: str, version: str | None = None, flags: str = ""):
    hw, spec, v = get_gpu(gpu), get_model(model), parse_version(version)
    return hw, spec, resolve(parse_engine_args(flags, base=version_defaults(v)).config, hw, spec, vllm_version=v)


def test_activation_peak_is_the_larger_of_forward_and_sampler_not_their_sum():
    _, spec, config = _resolved("h100", "llama-3.1-8b")
    reserve = MemoryReserve()
    forward, sampler = forward_activation_bytes(spec, config, reserve), sampler_activation_bytes(spec, config, reserve)
    assert activation_bytes(spec, config, reserve) == max(forward, sampler) < forward + sampler


def test_sampler_peak_grows_with_sequences_and_vocabulary():
    _, spec, config = _resolved("h100", "llama-3.1-8b")
    reserve = MemoryReserve()
    few = sampler_activation_bytes(spec, config.with_(max_num_seqs=64), reserve)
    many = sampler_activation_bytes(spec, config, reserve)
    assert config.max_num_seqs == 1024 and many > 8 * few
    _, qwen, qconfig = _resolved("h100", "qwen3-0.6b")  # a 152k vocabulary, 1024 rows too
    assert sampler_activation_bytes(qwen, qconfig, reserve) > sampler_activation_bytes(spec, config, reserve) * 0.95
    # The full-vocabulary sort holds at least the fp32 logits, the sorted values and their int64 indices.
    rows = min(config.max_num_seqs, config.max_num_batched_tokens)
    assert many > rows * spec.vocab_size * (4 + 4 + 8)


def test_forward_peak_wins_at_a_huge_token_budget_with_few_sequences():
    _, spec, config = _resolved("h100", "llama-3.1-8b", flags="--max-num-batched-tokens 65536 --max-num-seqs 8")
    reserve = MemoryReserve()
    assert activation_bytes(spec, config, reserve) == forward_activation_bytes(spec, config, reserve)
    smaller = config.with_(max_num_batched_tokens=32768)
    assert forward_activation_bytes(spec, smaller, reserve) < forward_activation_bytes(spec, config, reserve)


def test_cuda_graphs_leave_the_kv_budget_only_from_vllm_0_21_and_never_when_eager():
    old = plan_memory(*_resolved("h100", "qwen2.5-7b", "0.11.0"))
    new = plan_memory(*_resolved("h100", "qwen2.5-7b", "0.21.0"))
    eager = plan_memory(*_resolved("h100", "qwen2.5-7b", "0.21.0", "--enforce-eager"))
    assert old.cuda_graph_bytes == 0 == eager.cuda_graph_bytes < new.cuda_graph_bytes
    assert eager.kv_cache_bytes - new.kv_cache_bytes == new.cuda_graph_bytes


def test_releases_0_17_to_0_19_profile_a_smaller_sampler_peak():
    sorted_peak = plan_memory(*_resolved("h100", "qwen2.5-7b", "0.16.0")).activation_bytes
    unsorted_peak = plan_memory(*_resolved("h100", "qwen2.5-7b", "0.19.0")).activation_bytes
    assert unsorted_peak < sorted_peak / 2
