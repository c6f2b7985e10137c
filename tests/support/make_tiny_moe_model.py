"""Build the tiny random-weight Qwen3-MoE model the real-vLLM mixture-of-experts tests serve.

Usage (with the vLLM venv's python, which has torch and transformers):

    python tests/support/make_tiny_moe_model.py OUT_DIR [--seed N] [--force]

The same idea as make_tiny_model.py (whose tokenizer, ChatML template and stamp logic it reuses): an
architecturally real model (Qwen3MoeForCausalLM: 8 routed experts, top-2, grouped-query attention) small and random
enough for a 2-core CPU to serve under load. Its outputs are noise; its routing through vLLM's fused-MoE path, its
token counts and timings are what the tests need.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from make_tiny_model import ENDOFTEXT, IM_END, STAMP_NAME, main, save_atomically  # noqa: E402

RECIPE_VERSION = 1
"""Bump when anything below changes what gets built, so caches are rebuilt."""

SERVED_NAME = "tiny-qwen3-moe"
NUM_EXPERTS, EXPERTS_PER_TOKEN = 8, 2


def expected_stamp(seed: int) -> dict[str, object]:
    """The stamp a finished build with this recipe and seed carries."""
    return {"recipe_version": RECIPE_VERSION, "seed": seed, "model": "qwen3-moe", "python": sys.version.split()[0]}


def is_built(out_dir: Path, seed: int) -> bool:
    """True when out_dir holds a finished build of this recipe and seed."""
    try:
        return json.loads((out_dir / STAMP_NAME).read_text()) == expected_stamp(seed)
    except (OSError, ValueError):
        return False


def build_model(tokenizer, seed: int):  # -> transformers.Qwen3MoeForCausalLM
    """Random Qwen3-MoE weights in bf16: every layer routed, no shared expert (as Qwen3-30B-A3B)."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    endoftext = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_experts=NUM_EXPERTS,
        num_experts_per_tok=EXPERTS_PER_TOKEN,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=endoftext,
        eos_token_id=endoftext,
        pad_token_id=endoftext,
    )
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids(IM_END), endoftext]
    model.generation_config.pad_token_id = endoftext
    return model


def build(out_dir: Path, seed: int = 0, force: bool = False) -> bool:
    """Build the model into out_dir unless a matching build is there. Returns True if it built."""
    if not force and is_built(out_dir, seed):
        return False
    save_atomically(out_dir, lambda tokenizer: build_model(tokenizer, seed), expected_stamp(seed))
    return True


if __name__ == "__main__":
    sys.exit(main(build=build, description=__doc__.splitlines()[0]))
