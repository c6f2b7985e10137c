"""The GPU options diagnose prices say how many GPUs they add, and a MoE on several GPUs is offered its other
layouts of the same GPUs (data-parallel attention with expert parallelism among them)."""

from __future__ import annotations

from pathlib import Path

from servelab.diagnose.alternatives import _more_gpu_options
from servelab.targets.deployment import build_deployment

QWEN3 = Path(__file__).parent / "fixtures" / "moe_configs" / "qwen3-30b-a3b"


def test_a_four_gpu_moe_is_offered_four_more_gpus_and_its_other_layouts():
    d = build_deployment("h100", str(QWEN3), "--tensor-parallel-size 4")
    options = {o.change: o for o in _more_gpu_options(d)}
    assert set(options) == {
        "+4 GPUs: 2 replicas",
        "expert parallel (EP)",
        "the same 4 GPUs as data-parallel attention + EP (DP=4)",
        "+4 GPUs: TP=8",
    }
    layout = options["the same 4 GPUs as data-parallel attention + EP (DP=4)"].build().config
    assert (layout.tensor_parallel_size, layout.data_parallel_size, layout.enable_expert_parallel) == (1, 4, True)
    doubled = options["+4 GPUs: 2 replicas"].build().config
    assert doubled.tensor_parallel_size * doubled.data_parallel_size == 8


def test_one_dense_gpu_is_offered_one_more():
    d = build_deployment("h100", "qwen2.5-7b", "")
    assert [o.change for o in _more_gpu_options(d)] == ["+1 GPU: 2 replicas", "+1 GPU: TP=2"]
