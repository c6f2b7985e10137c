"""Calibration profiles made without a server, for the verbs that take `--calibration`.

The shape is the tiny Qwen2 the vLLM tests serve; the fitted numbers are the
kind `servelab calibrate` finds on the CPU backend. Two profiles that differ
only in their coefficients let a test prove a verb used the profile's.
"""

from __future__ import annotations

import json
from pathlib import Path

from servelab.perf.calibration import model_spec_dict
from servelab.schemas.profile import CalibrationProfile
from servelab.perf.cost_model import CostCoefficients
from servelab.perf.hardware import get_gpu
from servelab.perf.models import get_model

TINY_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "num_hidden_layers": 2,
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 352,
    "vocab_size": 4096,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
PROBED_ARGS = "--max-num-seqs 32 --max-model-len 4096 --block-size 128 --kv-cache-memory-bytes 1073741824"
"""What calibrate mirrors from a vLLM CPU server: its block size, KV bytes and model length."""


def tiny_profile(directory: Path, *, step_overhead_s: float = 1.5e-3, bf16_tflops: float = 0.3) -> Path:
    """Write a profile of the tiny model on a fitted `cpu` device under `directory`; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    model_dir = directory / "tiny-config"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(TINY_CONFIG))
    hardware = get_gpu("cpu").model_copy(
        update={"bf16_tflops": bf16_tflops, "memory_bandwidth_gbs": 12, "placeholder": False}
    )
    profile = CalibrationProfile(
        created_at=0.0,
        hardware=hardware,
        gpu="cpu",
        model_source=str(model_dir),
        model_spec=model_spec_dict(get_model(model_dir)),
        engine_args=PROBED_ARGS,
        engine_config={},
        coefficients=CostCoefficients(
            compute_efficiency=0.4, step_overhead_s=step_overhead_s, per_request_overhead_s=2e-4
        ),
        network_latency_s=3e-3,
        rates={},
        fit={},
        simulated_probes=[],
        probes=[],
        budget_s=60,
        elapsed_s=60,
    )
    path = directory / "profile.json"
    profile.save(path)
    return path
