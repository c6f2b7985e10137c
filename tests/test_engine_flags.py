"""SGLang and TensorRT-LLM launch lines: modelled flags set, obsolete and unknown ones reported, defaults per chip."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import get_gpu
from servelab.perf.models import get_model
from servelab.perf.sglang_args import parse_sglang_args, resolve_sglang
from servelab.perf.trtllm_args import MAX_UTILIZATION, parse_trtllm_args, resolve_trtllm


def test_sglang_line_as_pasted():
    parsed = parse_sglang_args(
        "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct --tp 2 --mem-fraction-static 0.8 "
        "--schedule-policy lpm --chunked-prefill-size=4096 --disable-radix-cache --host 0.0.0.0 --port 30000 "
        "--disable-flashinfer --enable-mixed-chunk --frobnicate 3"
    )
    s = parsed.settings
    assert (
        s.model,
        s.tp_size,
        s.mem_fraction_static,
        s.schedule_policy,
        s.chunked_prefill_size,
        s.disable_radix_cache,
    ) == ("meta-llama/Llama-3.1-8B-Instruct", 2, 0.8, "lpm", 4096, True)
    assert parsed.obsolete == ["--disable-flashinfer"]
    assert parsed.unknown == ["--frobnicate"]
    text = " ".join(parsed.warnings)
    assert "--disable-flashinfer is obsolete" in text and "--attention-backend" in text
    assert "--enable-mixed-chunk" in text and "--frobnicate" in text


@pytest.mark.parametrize(
    "line",
    ["--mem-fraction-static 1.5", "--max-running-requests", "--disable-radix-cache=1", "--schedule-policy shortest"],
)
def test_sglang_bad_values_are_one_error(line):
    with pytest.raises(PerfConfigError):
        parse_sglang_args(line)


def test_sglang_defaults_by_gpu_memory():
    model = get_model("llama-3.1-8b")
    h100 = resolve_sglang(parse_sglang_args("").settings, get_gpu("h100-sxm"), model)
    # 81,559 MB: chunk 8192 and 256 graph batch sizes; reserve max(512 + 8192 x 1.5 + 256 x 2 + 1024/8, 10240) MB
    assert h100.settings.chunked_prefill_size == 8192 and h100.settings.cuda_graph_max_bs == 256
    assert h100.settings.mem_fraction_static == round((81559 - 13440) / 81559, 3)
    assert h100.config.block_size == 1 and h100.memory.num_blocks == h100.max_total_num_tokens
    # max_running_requests: min(pool / 2, the request-slot pool min(max(pool / context x 512, 2048), 4096))
    slots = min(max(int(h100.max_total_num_tokens / 131072 * 512), 2048), 4096)
    assert h100.config.max_num_seqs == min(h100.max_total_num_tokens // 2, slots)
    a100_40 = resolve_sglang(parse_sglang_args("--context-length 8192").settings, get_gpu("a100-40gb"), model)
    assert a100_40.settings.chunked_prefill_size == 4096
    assert a100_40.settings.mem_fraction_static == round((40960 - (512 + 4096 * 1.5 + 32 * 2 + 128)) / 40960, 3)


def test_sglang_model_that_does_not_fit_is_refused():
    with pytest.raises(PerfConfigError, match="mem_fraction_static"):
        resolve_sglang(
            parse_sglang_args("--mem-fraction-static 0.1").settings, get_gpu("a100-40gb"), get_model("llama-3.1-8b")
        )


def test_sglang_pool_shorter_than_the_context_caps_the_longest_request():
    """SGLang starts when its KV pool is shorter than the context and caps a request's input at the pool
    (scheduler.py: max_req_input_len = min(context_len - 1, max_total_num_tokens - 1)): gpt-oss-120b on one H100."""
    plan = resolve_sglang(
        parse_sglang_args("").settings,
        get_gpu("h100-sxm"),
        get_model(Path(__file__).parent / "fixtures" / "moe_configs" / "gpt-oss-120b"),
    )
    assert 0 < plan.max_total_num_tokens < plan.settings.context_length
    assert plan.config.max_model_len == plan.max_total_num_tokens


def test_trtllm_line_and_its_yaml_options(tmp_path):
    options = tmp_path / "extra.yaml"
    options.write_text(
        "enable_chunked_prefill: true\n"
        "kv_cache_config:\n  free_gpu_memory_fraction: 0.85\n  enable_block_reuse: false\n"
        "scheduler_config:\n  capacity_scheduler_policy: MAX_UTILIZATION\n"
        "use_cuda_graph: true\nspeculative_config:\n  decoding_type: Eagle\n"
    )
    parsed = parse_trtllm_args(
        f"trtllm-serve meta-llama/Llama-3.1-8B-Instruct --max_batch_size 256 --max_num_tokens 4096 --tp_size 1 "
        f"--backend pytorch --host 0.0.0.0 --extra_llm_api_options {options} --enable_overlap_scheduler --bogus_flag 2"
    )
    s = parsed.settings
    assert (
        s.model,
        s.max_batch_size,
        s.max_num_tokens,
        s.enable_chunked_prefill,
        s.free_gpu_memory_fraction,
        s.enable_block_reuse,
        s.capacity_scheduler_policy,
    ) == ("meta-llama/Llama-3.1-8B-Instruct", 256, 4096, True, 0.85, False, MAX_UTILIZATION)
    assert parsed.obsolete == ["--enable_overlap_scheduler", "use_cuda_graph"]
    assert parsed.unknown == ["--bogus_flag", "speculative_config.decoding_type"]


def test_trtllm_defaults_and_memory_plan():
    plan = resolve_trtllm(parse_trtllm_args("").settings, get_gpu("h100-sxm"), get_model("llama-3.1-8b"))
    c = plan.config
    assert (
        c.max_num_seqs,
        c.max_num_batched_tokens,
        c.enable_chunked_prefill,
        c.enable_prefix_caching,
        c.block_size,
    ) == (2048, 8192, False, True, 32)
    m = plan.memory
    free = m.total_bytes - m.weight_bytes - m.activation_bytes - m.non_torch_bytes - m.cuda_graph_bytes
    assert m.num_blocks == int(0.9 * free // (m.kv_bytes_per_token * 32))
