"""GPU and model catalogues: every number cited, known datasheet and config.json values, clear refusals."""

from __future__ import annotations

import json

import pytest

from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import builtin_gpus, get_gpu, load_gpu_file
from servelab.perf.models import builtin_models, get_model, load_hf_config

REQUIRED_GPUS = [
    "A100-40GB-SXM",
    "A100-80GB-SXM",
    "A100-80GB-PCIe",
    "H100-SXM",
    "H100-PCIe",
    "H100-NVL",
    "H200",
    "H20",
    "L40S",
    "L4",
    "A10G",
    "RTX-4090",
    "MI300X",
    "cpu",
    "B200",
    "GB200",
    "B300",
    "RTX-PRO-6000",
    "A800-80GB-SXM",
    "A800-80GB-PCIe",
    "H800-SXM",
    "H800-PCIe",
    "L20",
]


def test_catalogue_has_every_required_chip_with_a_source():
    by_name = {gpu.name: gpu for gpu in builtin_gpus()}
    assert sorted(by_name) == sorted(REQUIRED_GPUS)
    for gpu in by_name.values():
        assert gpu.sources.get("datasheet", "").strip(), gpu.name


def test_known_datasheet_numbers():
    a100 = get_gpu("A100-80GB-SXM")
    assert a100.peak_flops("bf16") == 312e12
    assert a100.memory_bandwidth == 2039e9
    assert a100.peak_flops("fp8") == 0 and a100.peak_flops("int8") == 624e12
    h100 = get_gpu("h100")
    assert h100.bf16_tflops == pytest.approx(989.4) and h100.fp8_tflops == pytest.approx(1978.9)


@pytest.mark.parametrize(
    "alias, name",
    [
        ("a100", "A100-80GB-SXM"),
        ("A100-80GB", "A100-80GB-SXM"),
        ("H100", "H100-SXM"),
        ("mi300x", "MI300X"),
        ("rtx_4090", "RTX-4090"),
    ],
)
def test_aliases_are_case_insensitive(alias, name):
    assert get_gpu(alias).name == name


def test_unknown_gpu_lists_the_known_ones():
    with pytest.raises(PerfConfigError, match="unknown GPU 'x9000'.*A100-80GB-SXM"):
        get_gpu("x9000")


def test_user_gpu_file_adds_a_chip(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "- name: MyChip\n  aliases: [mine]\n  memory_gib: 32\n  memory_bandwidth_gbs: 1000\n"
        "  bf16_tflops: 200\n  fp8_tflops: 400\n  int8_tflops: 400\n  interconnect_gbs: 64\n  pcie_gbs: 64\n"
        "  sources: {datasheet: my lab measurement}\n"
    )
    assert get_gpu("MINE", extra_file=path).bf16_tflops == 200


def test_user_gpu_file_without_sources_is_refused_with_the_field(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "- name: MyChip\n  memory_gib: 32\n  memory_bandwidth_gbs: 1000\n  bf16_tflops: 200\n"
        "  fp8_tflops: 0\n  int8_tflops: 0\n  interconnect_gbs: 0\n  pcie_gbs: 64\n  sources: {memory_gib: x}\n"
    )
    with pytest.raises(PerfConfigError, match="MyChip.*no source for memory_bandwidth_gbs"):
        load_gpu_file(path)


def test_user_gpu_file_with_a_bad_value_names_file_and_field(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text("- name: Bad\n  memory_gib: -1\n")
    with pytest.raises(PerfConfigError, match=r"gpus.yaml, Bad: memory_gib"):
        load_gpu_file(path)


@pytest.mark.parametrize(
    "name, billions",
    [
        ("Qwen2.5-7B", 7.62),
        ("Llama-3.1-8B", 8.03),
        ("Mistral-7B", 7.25),
        ("Qwen2.5-1.5B", 1.54),
        ("Qwen2.5-72B", 72.7),
        ("Llama-3.1-70B", 70.6),
        ("Qwen2.5-14B", 14.7),
        ("Qwen2.5-32B", 32.5),
        ("Qwen3-14B", 14.8),
        ("Qwen3-32B", 32.8),
    ],
)
def test_parameter_counts_match_published_sizes(name, billions):
    assert get_model(name).params / 1e9 == pytest.approx(billions, rel=0.02)


def test_kv_bytes_per_token():
    assert get_model("llama-3.1-8b").kv_bytes_per_token() == 131072
    assert get_model("qwen2.5-7b").kv_bytes_per_token() == 2 * 28 * 4 * 128 * 2
    assert get_model("llama-3.1-8b").kv_bytes_per_token(1) == 65536


def test_linear_flops_are_twice_the_block_weights():
    model = get_model("llama-3.1-8b")
    non_block = model.embedding_params + model.lm_head_params
    assert model.linear_flops_per_token == pytest.approx(2 * (model.params - non_block), rel=0.001)


def test_every_builtin_model_reads_its_own_architecture():
    assert {spec.architecture for spec in builtin_models().values()} == {
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "LlamaForCausalLM",
        "MistralForCausalLM",
    }


def _write_config(tmp_path, **overrides):
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "num_hidden_layers": 28,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "max_position_embeddings": 40960,
        "torch_dtype": "bfloat16",
    }
    config.update(overrides)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_hf_config_directory_with_explicit_head_dim(tmp_path):
    spec = load_hf_config(_write_config(tmp_path))
    assert spec.head_dim == 128 and spec.num_heads * spec.head_dim != spec.hidden_size
    assert get_model(str(tmp_path / "config.json")).params == spec.params
    assert spec.params / 1e9 == pytest.approx(0.596, rel=0.02)  # Qwen3-0.6B


def test_an_undescribed_moe_config_is_refused(tmp_path):
    _write_config(tmp_path, architectures=["DbrxForCausalLM"], num_experts=16)
    with pytest.raises(PerfConfigError, match="mixture-of-experts.*not supported yet"):
        load_hf_config(tmp_path)


def test_unknown_architecture_is_refused(tmp_path):
    _write_config(tmp_path, architectures=["MambaForCausalLM"])
    with pytest.raises(PerfConfigError, match="'MambaForCausalLM' is not supported yet"):
        load_hf_config(tmp_path)


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(PerfConfigError, match="unknown model"):
        get_model(str(tmp_path / "nope"))
