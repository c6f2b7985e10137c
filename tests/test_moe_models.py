"""Mixture-of-experts architectures read from real config.json files: parameters, routing, MLA's cache, memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from servelab.perf.engine_config import EngineConfig
from servelab.perf.hardware import get_gpu
from servelab.perf.memory import kv_bytes_per_token_per_rank, plan_memory, rank_weight_bytes, weight_bytes_per_rank
from servelab.perf.models import MoESpec, get_model, load_hf_config, model_from_hf_config
from servelab.perf.moe_kernels import mxfp4_held_padding, mxfp4_padding
from servelab.perf.vllm_versions import version_defaults

CONFIGS = Path(__file__).parent / "fixtures" / "moe_configs"  # sources: SOURCES.md there


def moe_model(name: str):
    return load_hf_config(CONFIGS / name)


@pytest.mark.parametrize(
    "name, total_b, active_b",
    [
        # Model cards: Qwen3-30B-A3B 30.5B / 3.3B; gpt-oss-20b 20.9B / 3.6B (active without the input embedding);
        # DeepSeek-V2-Lite 15.7B / 2.4B (without the embedding); Mixtral-8x7B 46.7B / 12.9B.
        ("qwen3-30b-a3b", 30.5, 3.3),
        ("gpt-oss-20b", 20.9, 3.6),
        ("deepseek-v2-lite", 15.7, 2.4),
        ("mixtral-8x7b", 46.7, 12.9),
    ],
)
def test_parameter_counts_match_the_model_cards(name, total_b, active_b):
    model = moe_model(name)
    assert model.params / 1e9 == pytest.approx(total_b, rel=0.02)
    active = model.active_params
    if name in ("gpt-oss-20b", "deepseek-v2-lite"):
        active -= model.embedding_params
    assert active / 1e9 == pytest.approx(active_b, rel=0.03)


def test_each_family_is_read_in_its_own_spelling():
    qwen3, gpt, deepseek, mixtral = (
        moe_model(n) for n in ("qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v2-lite", "mixtral-8x7b")
    )
    assert qwen3.moe == MoESpec(128, 8, 768)
    assert gpt.moe == MoESpec(32, 4, 2880) and gpt.qkv_bias
    assert gpt.quantization == "mxfp4" and gpt.quantized_experts_only
    assert deepseek.moe == MoESpec(64, 6, 1408, shared_intermediate_size=2 * 1408, num_dense_layers=1)
    assert deepseek.mla is not None and deepseek.mla.q_lora_rank == 0 and deepseek.mla.cached_width == 576
    assert mixtral.moe == MoESpec(8, 2, 14336)


def test_qwen2_moe_shared_expert_is_always_active():
    # Qwen/Qwen1.5-MoE-A2.7B config.json: 14.3B parameters, 2.7B activated (model card).
    config = {
        "architectures": ["Qwen2MoeForCausalLM"],
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "vocab_size": 151936,
        "max_position_embeddings": 8192,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    model = model_from_hf_config(config, "Qwen1.5-MoE-A2.7B")
    assert model.moe is not None and model.moe.shared_intermediate_size == 5632 and model.qkv_bias
    assert model.params / 1e9 == pytest.approx(14.3, rel=0.02)
    assert model.active_params / 1e9 == pytest.approx(2.7, rel=0.05)
    every_other = model_from_hf_config({**config, "decoder_sparse_step": 2}, "half-sparse")
    assert every_other.moe is not None and every_other.moe.num_dense_layers == 12


def test_distinct_experts_touched_match_random_routing():
    moe = moe_model("qwen3-30b-a3b").moe
    assert moe is not None
    rng = np.random.default_rng(0)
    for tokens in (1, 4, 16, 64, 256):
        draws = [len({e for _ in range(tokens) for e in rng.choice(128, 8, replace=False)}) for _ in range(200)]
        assert moe.experts_touched(tokens) == pytest.approx(np.mean(draws), rel=0.02)
    assert moe.experts_touched(1) == pytest.approx(8)
    assert moe.experts_touched(4096) == pytest.approx(128)


def test_mla_caches_one_latent_per_token_on_every_rank():
    deepseek = moe_model("deepseek-v2-lite")
    assert deepseek.kv_bytes_per_token() == 27 * (512 + 64) * 2
    # What the same 16 heads would cache as plain multi-head attention (K 192 wide, V 128): 8.9x more.
    mha = 27 * 16 * (192 + 128) * 2
    assert mha / deepseek.kv_bytes_per_token() == pytest.approx(8.9, rel=0.01)
    assert kv_bytes_per_token_per_rank(deepseek, "auto", 1) == kv_bytes_per_token_per_rank(deepseek, "auto", 2)
    assert kv_bytes_per_token_per_rank(deepseek, "fp8", 1) == deepseek.kv_bytes_per_token() / 2


def test_all_experts_are_resident_and_gpt_oss_fits_in_16_gb():
    h100 = get_gpu("h100")
    qwen3 = moe_model("qwen3-30b-a3b")
    assert weight_bytes_per_rank(qwen3, None, h100, 1) / 2 == pytest.approx(qwen3.params, rel=0.001)
    assert weight_bytes_per_rank(qwen3, None, h100, 2) == pytest.approx(weight_bytes_per_rank(qwen3, None, h100, 1) / 2)
    # OpenAI: gpt-oss-20b "can run within 16GB of memory" with its MXFP4 experts (attention stays bf16).
    gpt = moe_model("gpt-oss-20b")
    assert 12e9 < weight_bytes_per_rank(gpt, None, h100, 1) < 16e9
    config = EngineConfig(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=8192)
    plans = {m.name: plan_memory(h100, m, config) for m in (qwen3, gpt)}
    assert plans[gpt.name].kv_cache_bytes > plans[qwen3.name].kv_cache_bytes + 40 * 2**30


def test_a_dense_model_has_no_experts():
    dense = get_model("Qwen3-32B")
    assert dense.moe is None and dense.mla is None
    assert dense.active_params == dense.params and dense.linear_params == dense.num_layers * dense.layer_linear_params


@pytest.mark.parametrize(
    ("gpu", "version", "weights_gib"),
    [
        ("h100", (0, 10), 65.97),  # vllm#23278's log on vLLM 0.10.1: "Model loading took 65.97 GiB" (Marlin)
        ("a100", None, 65.97),  # an A100 runs MXFP4 experts in Marlin in every release
        # OpenAI's Triton kernel pads the 2,880-wide experts to 64 (nothing to add) and their swizzled scales' rows to
        # 256; vllm#33155's log on vLLM 0.14.1, which keeps the checkpoint's scales too: "Model loading took 64.38 GiB"
        ("h100", (0, 14), 64.38),
        ("h100", None, 60.8),
    ],
)
def test_vllm_holds_gpt_oss_experts_padded_for_the_kernel_that_runs_them(gpu, version, weights_gib):
    """Marlin needs each expert's hidden size a multiple of 256 and its width of 128: vLLM allocates gpt-oss-120b's
    2,880 x 2,880 experts as 3,072 x 2,944, 9% more than the checkpoint (quantization/mxfp4.py, create_weights)."""
    gpt = load_hf_config(CONFIGS / "gpt-oss-120b")
    held = rank_weight_bytes(gpt, version_defaults(version), get_gpu(gpu)) / 2**30
    assert held == pytest.approx(weights_gib, rel=0.01)


@pytest.mark.parametrize(
    "name, layers, total_b, active_b",
    [
        # Model cards (zai-org/GLM-4.5, arXiv 2508.06471): GLM-4.5-Air 106B total / 12B active; GLM-4.6 (GLM-4.5's
        # architecture) 355B / 32B. The totals leave out the multi-token-prediction layer (num_nextn_predict_layers),
        # whose weights vLLM skips unless speculative decoding is asked for (glm4_moe.py, skip_spec_layers): with its
        # own MoE block, projection, embedding and head copies, GLM-4.5-Air's checkpoint holds ~110B, 4% over the card.
        # The active counts leave out the input embedding and the output head.
        ("glm-4.5-air", 46, 106, 12),
        ("glm-4.6", 92, 355, 32),
    ],
)
def test_glm_parameter_counts_match_the_model_cards_without_the_mtp_layer(name, layers, total_b, active_b):
    model = moe_model(name)
    assert model.num_layers == layers  # num_hidden_layers: the MTP layer is not one of them
    assert model.params / 1e9 == pytest.approx(total_b, rel=0.02)
    active = model.active_params - model.embedding_params - model.lm_head_params
    assert active / 1e9 == pytest.approx(active_b, rel=0.03)


def test_glm_keeps_its_first_layers_dense_and_one_shared_expert_with_gqa_attention():
    """vLLM's glm4_moe.py: layers below first_k_dense_replace get a dense MLP `intermediate_size` wide, every other
    layer 8 of the routed experts plus n_shared_experts x moe_intermediate_size always active; q/k/v carry a bias
    (attention_bias) and attention is grouped-query with an explicit head_dim (96 x 128 is wider than the hidden
    size)."""
    air, glm46 = moe_model("glm-4.5-air"), moe_model("glm-4.6")
    assert air.moe == MoESpec(128, 8, 1408, shared_intermediate_size=1408, num_dense_layers=1)
    assert glm46.moe == MoESpec(160, 8, 1536, shared_intermediate_size=1536, num_dense_layers=3)
    for model in (air, glm46):
        assert model.mla is None and model.qkv_bias and model.quantization is None
        assert (model.num_heads, model.num_kv_heads, model.head_dim) == (96, 8, 128)
        routed_and_shared = 9 * model.moe.expert_intermediate_size
        assert model.mlp_activation_width == max(routed_and_shared, model.intermediate_size)


def test_glm_kv_cache_is_eight_kv_heads_of_128_per_layer():
    # K and V, 8 heads x 128, bf16, every layer: 184 KiB a token for GLM-4.5-Air, twice that for GLM-4.6's 92 layers.
    assert moe_model("glm-4.5-air").kv_bytes_per_token() == 2 * 46 * 8 * 128 * 2 == 188_416
    assert moe_model("glm-4.6").kv_bytes_per_token() == 2 * 92 * 8 * 128 * 2 == 376_832
    glm46 = moe_model("glm-4.6")
    assert kv_bytes_per_token_per_rank(glm46, "auto", 8) == glm46.kv_bytes_per_token() / 8


GPT_OSS_120B_EXPERT_BYTES = {
    # vLLM release: bytes of one gpt-oss-120b expert (hidden 2,880, width 2,880) on one H100 in OpenAI's Triton
    # kernel, gate/up then down, as packed weights (bytes x rows) + swizzled scales (rows padded to 256 x 90 columns)
    # + the checkpoint's scales where kept (rows x 90).
    (0, 14): 1440 * 5760 + 5888 * 90 + 5760 * 90 + 1440 * 2880 + 3072 * 90 + 2880 * 90,
    # Triton 3.6's value layout pads each packed matrix to 64 bytes each way: 1,440 -> 1,472.
    (0, 19): 1472 * 5760 + 5888 * 90 + 5760 * 90 + 1472 * 2880 + 3072 * 90 + 2880 * 90,
    # 0.25 frees the checkpoint's scales (vLLM PR #46549).
    (0, 25): 1440 * 5760 + 5888 * 90 + 1440 * 2880 + 3072 * 90,
}


@pytest.mark.parametrize("version", sorted(GPT_OSS_120B_EXPERT_BYTES))
def test_openais_triton_kernel_holds_gpt_oss_experts_in_its_swizzled_layouts(version):
    """What one H100 holds of each expert, shape by shape, differs from what the kernel reads and multiplies
    (mxfp4_padding: the checkpoint's 2,880 x 2,880, nothing padded), and from release to release."""
    gpt, h100 = moe_model("gpt-oss-120b"), get_gpu("h100")
    config = version_defaults(version)
    published = gpt.expert_params * (0.5 + 1 / 32)
    assert mxfp4_padding(gpt, h100, config) == 1
    held = mxfp4_held_padding(gpt, h100, config) * published
    assert held == pytest.approx(GPT_OSS_120B_EXPERT_BYTES[version], rel=1e-9)


@pytest.mark.parametrize(("gpu", "version"), [("h100", (0, 11)), ("a100", None), ("b200", None), ("b200", (0, 14))])
def test_marlin_and_blackwell_hold_mxfp4_experts_as_they_read_them(gpu, version):
    """Marlin (before the Triton kernel shipped, or on an A100) and Blackwell's FP4 kernels pad weights and scales
    alike: held = read, each padded shape (Marlin 3,072 x 2,944; Blackwell 3,072 x 3,072) over the checkpoint's."""
    gpt, hardware = moe_model("gpt-oss-120b"), get_gpu(gpu)
    config = version_defaults(version)
    assert mxfp4_held_padding(gpt, hardware, config) == mxfp4_padding(gpt, hardware, config) > 1.05


def test_the_triton_kernels_memory_layout_changes_at_the_releases_that_changed_it():
    def config(version: tuple[int, int]):
        return version_defaults(version)

    assert (
        config((0, 24)).mxfp4_triton_keeps_checkpoint_scales
        and not config((0, 25)).mxfp4_triton_keeps_checkpoint_scales
    )
    pads = {minor: config((0, minor)).mxfp4_triton_pads_values_to_64_bytes for minor in (12, 16, 17, 21, 22, 32)}
    assert pads == {12: False, 16: False, 17: True, 21: True, 22: False, 32: False}
