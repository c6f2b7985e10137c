"""Build the tiny random-weight Qwen3-MoE model the real-vLLM mixture-of-experts tests serve.

Usage (with the vLLM venv's python, which has torch and transformers):

    python tests/support/make_tiny_moe_model.py OUT_DIR [--seed N] [--force]

The same idea as make_tiny_model.py (whose tokenizer, ChatML template and stamp logic it reuses): an
architecturally real model (Qwen3MoeForCausalLM: 8 routed experts, top-2, grouped-query attention) small and random
enough for a 2-core CPU to serve under load. Its outputs are noise; its routing through vLLM's fused-MoE path, its
token counts and timings are what the tests need.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from make_tiny_model import ENDOFTEXT, IM_END, STAMP_NAME, train_tokenizer  # noqa: E402

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
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
        num_experts=NUM_EXPERTS, num_experts_per_tok=EXPERTS_PER_TOKEN, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=8192, tie_word_embeddings=True,
        bos_token_id=endoftext, eos_token_id=endoftext, pad_token_id=endoftext,
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
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        tokenizer = train_tokenizer()
        build_model(tokenizer, seed).save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / STAMP_NAME).write_text(json.dumps(expected_stamp(seed)) + "\n")
        staging.chmod(0o755)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even if the stamp matches")
    args = parser.parse_args(argv)
    built = build(args.out_dir, seed=args.seed, force=args.force)
    print(f"{'built' if built else 'up to date'}: {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
