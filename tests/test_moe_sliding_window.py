"""gpt-oss's sliding-window layers: read from config.json, planned as vLLM's hybrid KV-cache manager plans them (only
the full-attention layers keep every token) and priced with a window-bounded attention."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from servelab.perf.cost_model import RooflineCostModel
from servelab.perf.engine_args import resolve
from servelab.perf.engine_config import EngineConfig
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import get_gpu
from servelab.perf.memory import kv_bytes_per_token_per_rank, plan_memory
from servelab.perf.models import load_hf_config, model_from_hf_config

CONFIGS = Path(__file__).parent / "fixtures" / "moe_configs"
GPT_OSS = load_hf_config(CONFIGS / "gpt-oss-20b")
FULL_ATTENTION = replace(GPT_OSS, sliding_window=0, sliding_layers=0)


def test_layer_types_and_window_are_read_from_config_json():
    assert (GPT_OSS.sliding_window, GPT_OSS.sliding_layers, GPT_OSS.full_attention_layers) == (128, 12, 12)
    # Qwen3's config carries a sliding_window that use_sliding_window: false turns off; no layer_types, no window.
    qwen = load_hf_config(CONFIGS / "qwen3-30b-a3b")
    assert (qwen.sliding_window, qwen.sliding_layers) == (0, 0)


def test_layer_types_that_do_not_cover_every_layer_are_refused_naming_the_file():
    config = json.loads((CONFIGS / "gpt-oss-20b" / "config.json").read_text())
    config["layer_types"] = config["layer_types"][:-2]
    with pytest.raises(PerfConfigError, match="my-config.json: layer_types needs one entry per layer"):
        model_from_hf_config(config, "gpt-oss-20b", "my-config.json")


def _plan(model):
    hw = get_gpu("h100")
    return plan_memory(hw, model, resolve(EngineConfig(max_model_len=32768), hw, model))


def test_kv_pool_holds_tokens_of_the_full_attention_layers_only():
    hybrid, full = _plan(GPT_OSS), _plan(FULL_ATTENTION)
    assert hybrid.kv_cache_bytes == full.kv_cache_bytes  # same memory, ...
    assert hybrid.kv_bytes_per_token == kv_bytes_per_token_per_rank(GPT_OSS, "auto", 1) / 2  # 12 of 24 layers
    assert hybrid.num_blocks == pytest.approx(2 * full.num_blocks, abs=1)  # ... twice the tokens


@pytest.mark.parametrize("kernels", [True, False])
def test_attention_within_the_window_costs_the_same_and_beyond_it_less(kernels):
    hybrid = RooflineCostModel(get_gpu("h100"), GPT_OSS, EngineConfig(), kernels=kernels)
    full = RooflineCostModel(get_gpu("h100"), FULL_ATTENTION, EngineConfig(), kernels=kernels)
    # One decode at 100 tokens of context: inside the 128-token window every layer sees all of it.
    assert hybrid.step_time_aggregate(0, 0, 1, 100, 1) == pytest.approx(full.step_time_aggregate(0, 0, 1, 100, 1))
    # 64 decodes at 32K tokens: the sliding half of the layers reads 128 tokens each, the full half all of them.
    long_hybrid = hybrid.step_time_aggregate(0, 0, 64, 64 * 32768, 64)
    long_full = full.step_time_aggregate(0, 0, 64, 64 * 32768, 64)
    assert long_hybrid < long_full
    kv_time_full = long_full - full.step_time_aggregate(0, 0, 64, 64, 64)
    kv_time_hybrid = long_hybrid - hybrid.step_time_aggregate(0, 0, 64, 64, 64)
    assert kv_time_hybrid == pytest.approx(kv_time_full / 2, rel=0.05)


def test_a_long_prefill_chunk_attends_to_a_window_in_sliding_layers():
    hybrid = RooflineCostModel(get_gpu("h100"), GPT_OSS, EngineConfig(), kernels=False)
    full = RooflineCostModel(get_gpu("h100"), FULL_ATTENTION, EngineConfig(), kernels=False)
    chunk, cached = 8192, 24576
    work = chunk * cached + chunk * (chunk + 1) // 2
    assert hybrid.step_time_aggregate(chunk, work, 0, 0, 1, cached) < full.step_time_aggregate(
        chunk, work, 0, 0, 1, cached
    )
    assert GPT_OSS.windowed(work, chunk) == pytest.approx((work + chunk * 128) / 2)
