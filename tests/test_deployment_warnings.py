"""What a deployment warns of before it is simulated: flags that vLLM accepts and that do nothing here."""

from __future__ import annotations

from pathlib import Path

from servelab.targets.deployment import build_deployment

MOE_CONFIGS = Path(__file__).parent / "fixtures" / "moe_configs"


def test_expert_parallel_on_a_dense_model_is_said_to_do_nothing():
    dense = build_deployment("h100", "qwen2.5-7b", "--enable-expert-parallel -tp 2")
    assert any("--enable-expert-parallel has no effect" in w for w in dense.warnings), dense.warnings


def test_expert_parallel_on_a_mixture_of_experts_is_not_warned_of():
    moe = build_deployment("h100", MOE_CONFIGS / "qwen3-30b-a3b", "--enable-expert-parallel -tp 2")
    assert not any("expert-parallel" in w for w in moe.warnings), moe.warnings
