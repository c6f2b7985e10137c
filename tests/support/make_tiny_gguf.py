"""Write the tiny GGUF model the llama.cpp server test serves.

Usage (with a python that has the `gguf` package, e.g. the llama.cpp venv scripts/test makes):

    python tests/support/make_tiny_gguf.py TINY_MODEL_DIR OUT.gguf

It is the suite's tiny Qwen2 (tests/support/make_tiny_model.py) in llama.cpp's
format: the same architecture and shapes (config.json) and the same byte-level
BPE tokenizer and chat template, so a prompt has the same token count on both
servers. The weights are random (seeded), like the HF model's: only shapes,
token counts and timings matter to the tests. llama.cpp's own converter
(convert_hf_to_gguf.py) refuses this tokenizer (it knows pre-tokenizers by the
hash of known models' vocabularies), so the file is written with gguf's writer.
An existing OUT is left alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import numpy as np

SEED = 0


def tensors(config: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Qwen2's GGUF tensors (PyTorch layout, out x in), the output projection tied to the embedding."""
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    out = {"token_embd.weight": w(vocab, hidden), "output_norm.weight": np.ones(hidden, np.float32)}
    for i in range(config["num_hidden_layers"]):
        blk = f"blk.{i}."
        out |= {
            blk + "attn_norm.weight": np.ones(hidden, np.float32),
            blk + "attn_q.weight": w(hidden, hidden),
            blk + "attn_q.bias": w(hidden),
            blk + "attn_k.weight": w(kv, hidden),
            blk + "attn_k.bias": w(kv),
            blk + "attn_v.weight": w(kv, hidden),
            blk + "attn_v.bias": w(kv),
            blk + "attn_output.weight": w(hidden, hidden),
            blk + "ffn_norm.weight": np.ones(hidden, np.float32),
            blk + "ffn_gate.weight": w(inter, hidden),
            blk + "ffn_up.weight": w(inter, hidden),
            blk + "ffn_down.weight": w(hidden, inter),
        }
    return out


def write(model_dir: Path, out: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = dict(tok["model"]["vocab"])
    for added in tok["added_tokens"]:
        vocab[added["content"]] = added["id"]
    special = {added["id"] for added in tok["added_tokens"] if added["special"]}
    tokens = sorted(vocab, key=vocab.__getitem__)
    tokens += [f"[PAD{i}]" for i in range(len(tokens), config["vocab_size"])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]

    writer = gguf.GGUFWriter(str(out) + ".part", "qwen2")
    writer.add_name("servelab tiny qwen2")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config.get("rope_parameters", {}).get("rope_theta", 10000.0))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(tokens))]
    )
    writer.add_token_merges(merges)
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_add_bos_token(False)
    writer.add_chat_template((model_dir / "chat_template.jinja").read_text())
    for name, array in tensors(config, np.random.default_rng(SEED)).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    Path(str(out) + ".part").replace(out)


if __name__ == "__main__":
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    if not out.exists():
        write(model_dir, out)
