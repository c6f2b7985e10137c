"""Build the tiny random-weight Qwen2 model the real-vLLM tests serve.

Usage (with the vLLM venv's python, which has torch and transformers):

    python tests/support/make_tiny_model.py OUT_DIR [--seed N] [--force]

Why a model of our own: the tests must run on a fresh machine with no model
hub, and a 2-core CPU must serve it fast enough for load tests. So the model
is architecturally real (Qwen2ForCausalLM, grouped-query attention, ChatML
template, byte-level BPE) but tiny and random. Its outputs are noise; its
token counts, timings and scheduling behaviour are what the tests need.

The tokenizer is trained on the Python standard library's own source, text
that exists wherever Python does and is identical for a given Python version,
so the build needs nothing from the network and is deterministic under the
seed. A stamp file records the recipe version: a directory whose stamp
matches is left alone, anything else is rebuilt in a temporary directory and
swapped in whole, so a half-finished build is never mistaken for a good one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

RECIPE_VERSION = 1
"""Bump when anything below changes what gets built, so caches are rebuilt."""

STAMP_NAME = ".servelab-tiny-model.json"
SERVED_NAME = "tiny-qwen"
VOCAB_SIZE = 4096
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS_PACKAGES = ("asyncio", "email", "json", "http", "unittest", "logging", "concurrent", "importlib")
"""Stdlib packages whose source is the tokenizer's corpus: a few MB of prose and code."""


def expected_stamp(seed: int) -> dict[str, object]:
    """The stamp a finished build with this recipe and seed carries."""
    return {
        "recipe_version": RECIPE_VERSION,
        "seed": seed,
        "python": sys.version.split()[0],
    }


def is_built(out_dir: Path, seed: int) -> bool:
    """True when out_dir holds a finished build of this recipe and seed."""
    stamp = out_dir / STAMP_NAME
    try:
        return json.loads(stamp.read_text()) == expected_stamp(seed)
    except (OSError, ValueError):
        return False


def corpus_lines() -> Iterator[str]:
    """The stdlib source of CORPUS_PACKAGES, in a fixed order, line by line."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for package in CORPUS_PACKAGES:
        for path in sorted((stdlib / package).rglob("*.py")):
            if "test" in path.relative_to(stdlib).parts[1:-1]:
                continue
            yield from path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)


def train_tokenizer():  # -> transformers.PreTrainedTokenizerFast
    """A byte-level BPE with Qwen-style special tokens and a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus_lines(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_model(tokenizer, seed: int):  # -> transformers.Qwen2ForCausalLM
    """Random Qwen2 weights, in bf16 (the vLLM CPU build runs bf16 natively on x86 and arm64)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    endoftext = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=endoftext,
        eos_token_id=endoftext,
        pad_token_id=endoftext,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = [im_end, endoftext]
    model.generation_config.pad_token_id = endoftext
    return model


def build(out_dir: Path, seed: int = 0, force: bool = False) -> bool:
    """Build the model into out_dir unless a matching build is there. Returns True if it built."""
    if not force and is_built(out_dir, seed):
        return False
    save_atomically(out_dir, lambda tokenizer: build_model(tokenizer, seed), expected_stamp(seed))
    return True


def save_atomically(out_dir: Path, make_model, stamp: dict[str, object]) -> None:
    """Train the tokenizer, make the model with it, and put both with their stamp at out_dir in one rename, so a
    build cut short never leaves a half-written model where a test would load it."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a one-shard save needs no progress bar in test logs
    staging = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        tokenizer = train_tokenizer()
        make_model(tokenizer).save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / STAMP_NAME).write_text(json.dumps(stamp) + "\n")
        staging.chmod(0o755)  # mkdtemp makes it private; the model is meant to be shared
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def main(argv: list[str] | None = None, build=build, description: str = __doc__.splitlines()[0]) -> int:
    """The command line of a tiny-model maker: OUT_DIR [--seed N] [--force]."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even if the stamp matches")
    args = parser.parse_args(argv)
    built = build(args.out_dir, seed=args.seed, force=args.force)
    print(f"{'built' if built else 'up to date'}: {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
