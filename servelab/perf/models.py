"""Model architectures: the few numbers of a dense transformer that set its cost.

A model is read from a Hugging Face `config.json` (built-ins are stored in the
same form in data/models.yaml, so there is one reading path). Only dense
decoder-only architectures whose cost these formulas describe are accepted;
a mixture-of-experts or unknown architecture is refused rather than priced
wrongly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from servelab.perf.errors import PerfConfigError

BUILTIN_MODELS = Path(__file__).parent / "data" / "models.yaml"

# Dense architectures with Llama-shaped blocks (GQA attention + gated MLP); the value says
# whether q/k/v projections carry a bias (Qwen2 does; Qwen3 reads `attention_bias`).
_DENSE_ARCHITECTURES: dict[str, bool | None] = {
    "LlamaForCausalLM": None,
    "MistralForCausalLM": None,
    "Qwen2ForCausalLM": True,
    "Qwen3ForCausalLM": None,
}
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape of one dense decoder-only transformer, as its config.json states it."""

    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    dtype: str = "bfloat16"
    qkv_bias: bool = False
    quantization: str | None = None
    """Weight quantization the checkpoint itself declares (awq, gptq, fp8), if any."""

    @property
    def dtype_bytes(self) -> int:
        return _DTYPE_BYTES[self.dtype]

    @property
    def layer_linear_params(self) -> int:
        """Matmul weights of one block: q, k, v, o projections and the gated MLP."""
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        attention = self.hidden_size * (q + 2 * kv) + q * self.hidden_size
        return attention + 3 * self.hidden_size * self.intermediate_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Separate output projection; 0 extra storage when tied to the embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        """Total parameter count, as `model.num_parameters()` reports it."""
        bias = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if self.qkv_bias else 0
        norms = 2 * self.hidden_size
        per_layer = self.layer_linear_params + bias + norms
        return self.num_layers * per_layer + self.embedding_params + self.lm_head_params + self.hidden_size

    @property
    def linear_flops_per_token(self) -> int:
        """Matmul FLOPs of all blocks for one token (2 per weight), LM head excluded."""
        return 2 * self.num_layers * self.layer_linear_params

    @property
    def lm_head_flops_per_token(self) -> int:
        """FLOPs to turn one hidden state into logits; paid only for tokens that are sampled."""
        return 2 * self.hidden_size * self.vocab_size

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs per (query token, key token) pair over all layers: QK^T and PV, 2 each per dim."""
        return 4 * self.num_layers * self.num_heads * self.head_dim

    def with_dtype(self, dtype: str) -> ModelSpec:
        """The same model run in another activation dtype (vLLM's --dtype); `auto` keeps it."""
        if dtype == "auto" or dtype == self.dtype:
            return self
        if dtype not in _DTYPE_BYTES:
            raise PerfConfigError(f"dtype {dtype!r} is not supported (bfloat16, float16, float32)")
        return replace(self, dtype=dtype)

    def kv_bytes_per_token(self, bytes_per_element: float | None = None) -> float:
        """KV-cache bytes one token occupies over all layers (K and V)."""
        element = self.dtype_bytes if bytes_per_element is None else bytes_per_element
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element


def _require(config: dict[str, Any], key: str, source: str) -> Any:
    if key not in config:
        raise PerfConfigError(f"{source}: config.json has no {key!r}, which the cost model needs")
    return config[key]


def _declared_quantization(config: dict[str, Any], source: str) -> str | None:
    quant = config.get("quantization_config")
    if not quant:
        return None
    method = str(quant.get("quant_method", "")).lower()
    if method in ("awq", "gptq", "fp8"):
        return method
    raise PerfConfigError(
        f"{source}: quantization method {method!r} is not supported yet "
        "(supported: awq, gptq, fp8; or pass the unquantized model with --quantization)"
    )


def model_from_hf_config(config: dict[str, Any], name: str, source: str | None = None) -> ModelSpec:
    """A ModelSpec from the parsed contents of a Hugging Face config.json."""
    source = source or name
    architectures = config.get("architectures") or []
    architecture = architectures[0] if architectures else config.get("model_type", "unknown")
    moe_keys = [k for k in _MOE_KEYS if config.get(k)]
    if moe_keys or "Moe" in architecture or "MoE" in architecture:
        raise PerfConfigError(
            f"{source}: {architecture} is a mixture-of-experts model; MoE is not supported yet "
            "(its cost depends on routed experts per token, which this dense cost model does not price)"
        )
    if architecture not in _DENSE_ARCHITECTURES:
        supported = ", ".join(sorted(_DENSE_ARCHITECTURES))
        raise PerfConfigError(f"{source}: architecture {architecture!r} is not supported yet (supported: {supported})")
    heads = int(_require(config, "num_attention_heads", source))
    hidden = int(_require(config, "hidden_size", source))
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    if dtype not in _DTYPE_BYTES:
        raise PerfConfigError(f"{source}: model dtype {dtype!r} is not supported (bfloat16, float16, float32)")
    bias_rule = _DENSE_ARCHITECTURES[architecture]
    return ModelSpec(
        name=name,
        architecture=architecture,
        num_layers=int(_require(config, "num_hidden_layers", source)),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        intermediate_size=int(_require(config, "intermediate_size", source)),
        vocab_size=int(_require(config, "vocab_size", source)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=int(_require(config, "max_position_embeddings", source)),
        dtype=dtype,
        qkv_bias=bias_rule if bias_rule is not None else bool(config.get("attention_bias", False)),
        quantization=_declared_quantization(config, source),
    )


def load_hf_config(path: str | Path) -> ModelSpec:
    """Read a model directory or its config.json file."""
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    try:
        config = json.loads(file.read_text())
    except OSError as exc:
        raise PerfConfigError(f"cannot read model config {file}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise PerfConfigError(f"model config {file} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise PerfConfigError(f"model config {file} must be a JSON object")
    return model_from_hf_config(config, name=file.parent.name, source=str(file))


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-")


@cache
def builtin_models() -> dict[str, ModelSpec]:
    """Built-in models keyed by normalised name and every alias."""
    catalogue: dict[str, ModelSpec] = {}
    for entry in yaml.safe_load(BUILTIN_MODELS.read_text()):
        spec = model_from_hf_config(entry["config"], name=entry["name"], source=entry["source"])
        for key in (entry["name"], *entry.get("aliases", ())):
            catalogue[_normalise(key)] = spec
    return catalogue


def get_model(name_or_path: str | Path) -> ModelSpec:
    """A built-in model by name (case-insensitive), or a Hugging Face model directory / config.json."""
    key = _normalise(str(name_or_path))
    catalogue = builtin_models()
    if key in catalogue:
        return catalogue[key]
    if Path(name_or_path).exists():
        return load_hf_config(name_or_path)
    known = ", ".join(sorted({spec.name for spec in catalogue.values()}))
    raise PerfConfigError(f"unknown model {str(name_or_path)!r}: not a built-in ({known}) and no such path")
