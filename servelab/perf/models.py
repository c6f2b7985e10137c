"""Model architectures: the few numbers of a decoder-only transformer that set its cost.

A model is read from a Hugging Face `config.json` (built-ins are stored in the
same form in data/models.yaml, so there is one reading path). Dense Llama-shaped
models and the mixture-of-experts families whose layers these formulas describe
(Mixtral, Qwen2/Qwen3-MoE, gpt-oss, DeepSeek-V2/V3 with multi-head latent
attention, GLM-4.5/4.6 with grouped-query attention) are accepted; any other
architecture is refused rather than priced wrongly.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from servelab.perf.errors import PerfConfigError
from servelab.schemas.results import Json

BUILTIN_MODELS = Path(__file__).parent / "data" / "models.yaml"

# Dense architectures with Llama-shaped blocks (GQA attention + gated MLP); the value says
# whether q/k/v projections carry a bias (Qwen2 does; Qwen3 reads `attention_bias`).
_DENSE_ARCHITECTURES: dict[str, bool | None] = {
    "LlamaForCausalLM": None,
    "MistralForCausalLM": None,
    "Qwen2ForCausalLM": True,
    "Qwen3ForCausalLM": None,
}
# Mixture-of-experts architectures; the value says whether q/k/v projections carry a bias (None: `attention_bias`).
_MOE_ARCHITECTURES: dict[str, bool | None] = {
    "MixtralForCausalLM": None,
    "Qwen2MoeForCausalLM": True,
    "Qwen3MoeForCausalLM": None,
    "GptOssForCausalLM": None,
    "DeepseekV2ForCausalLM": None,
    "DeepseekV3ForCausalLM": None,
    "Glm4MoeForCausalLM": None,
}
_SHARED_EXPERT_LAYOUT = frozenset({"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeForCausalLM"})
"""MoE families whose first `first_k_dense_replace` layers keep a dense MLP and whose MoE layers add `n_shared_experts`
always-active experts of the routed width (vLLM's models/deepseek_v2.py and glm4_moe.py build them so)."""
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_SINK_ARCHITECTURES = frozenset({"GptOssForCausalLM"})
"""Architectures whose attention adds a learned per-head sink logit to every softmax (vLLM's models/gpt_oss.py passes
its `sinks` parameter to the attention layer); config.json has no key for it, so the architecture tells."""


@dataclass(frozen=True, slots=True)
class MoESpec:
    """The routed feed-forward of a mixture-of-experts model: every MoE layer holds `num_experts` gated MLPs of width
    `expert_intermediate_size`, and each token runs through `experts_per_token` of them (plus the always-active shared
    experts, `shared_intermediate_size` wide in all). The first layers of some models (DeepSeek, GLM-4.5) keep a dense
    MLP."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_intermediate_size: int = 0
    num_dense_layers: int = 0
    """Layers whose MLP is dense (the model's `intermediate_size`) instead of routed experts."""

    def experts_touched(self, tokens: float) -> float:
        """Expected distinct experts a batch of `tokens` routes to in one layer, for uniform independent routing:
        E (1 - (1 - k/E)^B). One token reads k experts; a large batch reads all E."""
        if tokens <= 0:
            return 0.0
        e = self.num_experts
        return e * -math.expm1(tokens * math.log1p(-self.experts_per_token / e)) if self.experts_per_token < e else e


@dataclass(frozen=True, slots=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): keys and values are cached as one compressed latent of
    `kv_lora_rank` plus a shared RoPE key of `qk_rope_head_dim` per token and layer, whatever the head count."""

    kv_lora_rank: int
    q_lora_rank: int
    """0 when queries are projected directly from the hidden state (DeepSeek-V2-Lite)."""
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def cached_width(self) -> int:
        """Elements one token caches per layer (no separate K and V)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape of one decoder-only transformer, dense or mixture-of-experts, as its config.json states it."""

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
    """Weight quantization the checkpoint itself declares (awq, gptq, fp8, mxfp4, nvfp4), if any."""
    quantized_experts_only: bool = False
    """The declared quantization covers the routed experts only; attention, router and shared weights stay in
    `dtype` (gpt-oss: its MXFP4 config lists self_attn and the router in modules_to_not_convert)."""
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    sliding_window: int = 0
    """Keys a sliding-window layer attends to (its config's `sliding_window`); 0 when every layer is full."""
    sliding_layers: int = 0
    """Layers that config.json's `layer_types` marks `sliding_attention` (gpt-oss: every other one)."""

    @property
    def dtype_bytes(self) -> int:
        return _DTYPE_BYTES[self.dtype]

    @property
    def attention_sinks(self) -> bool:
        """Whether attention has per-head sink logits: an attention backend without them cannot run the model."""
        return self.architecture in _SINK_ARCHITECTURES

    @property
    def full_attention_layers(self) -> int:
        """Layers whose attention (and KV cache) spans the whole context."""
        return self.num_layers - self.sliding_layers

    def windowed(self, tokens: float, queries: int) -> float:
        """Layer-averaged share of `tokens` (query-key pairs, or context tokens read) that attention really touches
        when `queries` queries share them: full layers see them all, a sliding-window layer at most `sliding_window`
        per query. Exact for a single query; for a batch, min(sum, n x window) stands in for the sum of the minima."""
        if not self.sliding_layers:
            return tokens
        sliding = min(tokens, queries * self.sliding_window)
        return (self.full_attention_layers * tokens + self.sliding_layers * sliding) / self.num_layers

    @property
    def attention_linear_params(self) -> int:
        """Projection weights of one layer's attention: q, k, v, o (MLA: q, the latent down and up projections, o)."""
        h = self.hidden_size
        if self.mla:
            m = self.mla
            q_width = self.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
            q = m.q_lora_rank * (h + q_width) if m.q_lora_rank else h * q_width
            kv = h * m.cached_width + m.kv_lora_rank * self.num_heads * (m.qk_nope_head_dim + m.v_head_dim)
            return q + kv + self.num_heads * m.v_head_dim * h
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        return h * (q + 2 * kv) + q * h

    @property
    def replicated_attention_params(self) -> int:
        """Attention weights of one layer that every tensor-parallel rank holds and multiplies in full: MLA's down
        projections to the query and KV latents, which vLLM builds with `disable_tp=True` (`fused_qkv_a_proj`) or as
        a `ReplicatedLinear` (`kv_a_proj_with_mqa`, models/deepseek_v2.py, DeepseekV2MLAAttention); 0 otherwise."""
        if not self.mla:
            return 0
        return self.hidden_size * (self.mla.q_lora_rank + self.mla.cached_width)

    @property
    def layer_linear_params(self) -> int:
        """Matmul weights of one dense block: q, k, v, o projections and the gated MLP."""
        return self.attention_linear_params + 3 * self.hidden_size * self.intermediate_size

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.moe.num_dense_layers if self.moe else 0

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert (gate, up and down projections); 0 for a dense model."""
        return 3 * self.hidden_size * self.moe.expert_intermediate_size if self.moe else 0

    @property
    def routed_expert_params(self) -> int:
        """Weights of every routed expert of every MoE layer: all resident, few read per token."""
        return self.num_moe_layers * self.moe.num_experts * self.expert_params if self.moe else 0

    @property
    def moe_layer_dense_params(self) -> int:
        """Weights of one MoE layer's feed-forward that every token uses: the router and the shared experts."""
        if not self.moe:
            return 0
        return self.hidden_size * self.moe.num_experts + 3 * self.hidden_size * self.moe.shared_intermediate_size

    @property
    def non_expert_linear_params(self) -> int:
        """Matmul weights every token passes through: attention of all layers, dense MLPs, routers, shared experts."""
        if not self.moe:
            return self.num_layers * self.layer_linear_params
        dense_mlp = self.moe.num_dense_layers * 3 * self.hidden_size * self.intermediate_size
        return (
            self.num_layers * self.attention_linear_params
            + dense_mlp
            + self.num_moe_layers * self.moe_layer_dense_params
        )

    @property
    def linear_params(self) -> int:
        """All matmul weights held in memory (every expert of a MoE model)."""
        return self.non_expert_linear_params + self.routed_expert_params

    @property
    def active_linear_params(self) -> int:
        """Matmul weights one token is multiplied by: a MoE model's top-k experts, not all of them."""
        routed = self.num_moe_layers * self.moe.experts_per_token * self.expert_params if self.moe else 0
        return self.non_expert_linear_params + routed

    @property
    def mlp_activation_width(self) -> int:
        """Width of one token's widest feed-forward intermediate: the dense MLP, or k experts plus the shared ones."""
        if not self.moe:
            return self.intermediate_size
        routed = self.moe.experts_per_token * self.moe.expert_intermediate_size + self.moe.shared_intermediate_size
        return max(routed, self.intermediate_size if self.moe.num_dense_layers else 0)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Separate output projection; 0 extra storage when tied to the embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        """Total parameter count, as `model.num_parameters()` reports it (expert biases and MLA's norms left out)."""
        bias = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if self.qkv_bias else 0
        norms = 2 * self.hidden_size
        per_layer = bias + norms
        return (
            self.num_layers * per_layer
            + self.linear_params
            + self.embedding_params
            + self.lm_head_params
            + self.hidden_size
        )

    @property
    def active_params(self) -> int:
        """Parameters one token uses, as model cards count them (a MoE model's "A3B"): all but the idle experts."""
        return self.params - self.routed_expert_params + (self.active_linear_params - self.non_expert_linear_params)

    @property
    def linear_flops_per_token(self) -> int:
        """Matmul FLOPs of all blocks for one token (2 per weight it is multiplied by), LM head excluded."""
        return 2 * self.active_linear_params

    @property
    def non_expert_linear_flops_per_token(self) -> int:
        """The part of `linear_flops_per_token` outside the routed experts (all of it for a dense model)."""
        return 2 * self.non_expert_linear_params

    @property
    def routed_expert_flops_per_token(self) -> int:
        """Matmul FLOPs one token spends in its top-k routed experts over all MoE layers."""
        return 2 * (self.active_linear_params - self.non_expert_linear_params)

    @property
    def lm_head_flops_per_token(self) -> int:
        """FLOPs to turn one hidden state into logits; paid only for tokens that are sampled."""
        return 2 * self.hidden_size * self.vocab_size

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs per (query token, key token) pair over all layers: QK^T and PV, 2 each per dim.

        MLA's prefill attends with decompressed keys (nope + rope wide) and values (v wide) per head.
        """
        if self.mla:
            m = self.mla
            return 2 * self.num_layers * self.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
        return 4 * self.num_layers * self.num_heads * self.head_dim

    @property
    def decode_attention_flops_per_pair(self) -> int:
        """FLOPs per (query, cached token) pair when decoding. MLA's decode kernels absorb the up-projections and
        attend in the latent space: every head's QK^T spans kv_lora + rope and its PV kv_lora."""
        if self.mla:
            m = self.mla
            return 2 * self.num_layers * self.num_heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
        return self.attention_flops_per_pair

    def with_dtype(self, dtype: str) -> ModelSpec:
        """The same model run in another activation dtype (vLLM's --dtype); `auto` keeps it."""
        if dtype == "auto" or dtype == self.dtype:
            return self
        if dtype not in _DTYPE_BYTES:
            raise PerfConfigError(f"dtype {dtype!r} is not supported (bfloat16, float16, float32)")
        return replace(self, dtype=dtype)

    def kv_bytes_per_token(self, bytes_per_element: float | None = None) -> float:
        """KV-cache bytes one token occupies over all layers (K and V; MLA: the latent and its RoPE key)."""
        element = self.dtype_bytes if bytes_per_element is None else bytes_per_element
        if self.mla:
            return self.num_layers * self.mla.cached_width * element
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element


def _require(config: Json, key: str, source: str) -> Any:
    if key not in config:
        raise PerfConfigError(f"{source}: config.json has no {key!r}, which the cost model needs")
    return config[key]


_DECLARED_QUANTIZATION = {"awq": "awq", "gptq": "gptq", "fp8": "fp8", "mxfp4": "mxfp4", "modelopt_fp4": "nvfp4"}


def _declared_quantization(config: Json, source: str) -> tuple[str | None, bool]:
    """The checkpoint's weight format, and whether it leaves attention unquantized (so it covers experts only)."""
    quant = config.get("quantization_config")
    if not quant:
        return None, False
    method = str(quant.get("quant_method", "")).lower()
    if method not in _DECLARED_QUANTIZATION:
        raise PerfConfigError(
            f"{source}: quantization method {method!r} is not supported yet "
            f"(supported: {', '.join(_DECLARED_QUANTIZATION)}; or pass the unquantized model with --quantization)"
        )
    kept = " ".join(str(m) for m in quant.get("modules_to_not_convert") or ())
    return _DECLARED_QUANTIZATION[method], "self_attn" in kept


def _moe_spec(config: Json, architecture: str, num_layers: int, source: str) -> MoESpec:
    """Experts, top-k, expert and shared widths and the dense layers, in each family's own spelling."""
    experts = config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts")
    top_k = config.get("num_experts_per_tok") or config.get("experts_per_token")
    if not experts or not top_k:
        raise PerfConfigError(f"{source}: {architecture} config.json must give the expert count and experts per token")
    if architecture in (
        "MixtralForCausalLM",
        "GptOssForCausalLM",
    ):  # every layer routed; experts are intermediate_size wide
        return MoESpec(int(experts), int(top_k), int(_require(config, "intermediate_size", source)))
    width = int(_require(config, "moe_intermediate_size", source))
    if architecture in _SHARED_EXPERT_LAYOUT:
        first_dense, every = int(config.get("first_k_dense_replace") or 0), int(config.get("moe_layer_freq") or 1)
        dense = sum(1 for i in range(num_layers) if i < first_dense or i % every)
        shared = int(config.get("n_shared_experts") or 0) * width
        return MoESpec(int(experts), int(top_k), width, shared, dense)
    step, mlp_only = int(config.get("decoder_sparse_step") or 1), set(config.get("mlp_only_layers") or ())
    dense = sum(1 for i in range(num_layers) if i in mlp_only or (i + 1) % step)
    shared = int(config.get("shared_expert_intermediate_size") or 0)  # Qwen2-MoE's one shared expert
    return MoESpec(int(experts), int(top_k), width, shared, dense)


def _mla_spec(config: Json, source: str) -> MLASpec | None:
    if "kv_lora_rank" not in config:
        return None
    return MLASpec(
        kv_lora_rank=int(config["kv_lora_rank"]),
        q_lora_rank=int(config.get("q_lora_rank") or 0),
        qk_nope_head_dim=int(_require(config, "qk_nope_head_dim", source)),
        qk_rope_head_dim=int(_require(config, "qk_rope_head_dim", source)),
        v_head_dim=int(_require(config, "v_head_dim", source)),
    )


def _sliding_layers(config: Json, layers: int, source: str) -> tuple[int, int]:
    """(window, number of sliding-window layers) from `layer_types` and `sliding_window`; (0, 0) without them.

    Only configs that name each layer's type are read: Qwen2/Qwen3 configs carry a `sliding_window` that their
    `use_sliding_window: false` turns off, and vLLM runs them with full attention.
    """
    types = config.get("layer_types") or ()
    sliding = sum(1 for t in types if t == "sliding_attention")
    if not sliding:
        return 0, 0
    window = config.get("sliding_window")
    if not window or len(types) != layers:
        raise PerfConfigError(f"{source}: layer_types needs one entry per layer and a sliding_window")
    return int(window), sliding


def _architecture(config: Json, source: str) -> str:
    architectures = config.get("architectures") or []
    architecture = str(architectures[0] if architectures else config.get("model_type", "unknown"))
    if architecture in _DENSE_ARCHITECTURES or architecture in _MOE_ARCHITECTURES:
        return architecture
    supported = ", ".join(sorted((*_DENSE_ARCHITECTURES, *_MOE_ARCHITECTURES)))
    if any(config.get(k) for k in _MOE_KEYS) or "Moe" in architecture or "MoE" in architecture:
        raise PerfConfigError(
            f"{source}: {architecture} is a mixture-of-experts architecture that is not supported yet "
            f"(supported: {supported})"
        )
    raise PerfConfigError(f"{source}: architecture {architecture!r} is not supported yet (supported: {supported})")


def model_from_hf_config(config: Json, name: str, source: str | None = None) -> ModelSpec:
    """A ModelSpec from the parsed contents of a Hugging Face config.json."""
    source = source or name
    architecture = _architecture(config, source)
    heads = int(_require(config, "num_attention_heads", source))
    hidden = int(_require(config, "hidden_size", source))
    layers = int(_require(config, "num_hidden_layers", source))
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    if dtype not in _DTYPE_BYTES:
        raise PerfConfigError(f"{source}: model dtype {dtype!r} is not supported (bfloat16, float16, float32)")
    dense = architecture in _DENSE_ARCHITECTURES
    bias_rule = _DENSE_ARCHITECTURES[architecture] if dense else _MOE_ARCHITECTURES[architecture]
    mla = None if dense else _mla_spec(config, source)
    quantization, experts_only = _declared_quantization(config, source)
    window, sliding_layers = _sliding_layers(config, layers, source)
    return ModelSpec(
        name=name,
        architecture=architecture,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=mla.qk_nope_head_dim + mla.qk_rope_head_dim if mla else int(config.get("head_dim") or hidden // heads),
        intermediate_size=int(_require(config, "intermediate_size", source)),
        vocab_size=int(_require(config, "vocab_size", source)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=int(_require(config, "max_position_embeddings", source)),
        dtype=dtype,
        qkv_bias=bias_rule if bias_rule is not None else bool(config.get("attention_bias", False)),
        quantization=quantization,
        quantized_experts_only=experts_only and not dense,
        moe=None if dense else _moe_spec(config, architecture, layers, source),
        mla=mla,
        sliding_window=window,
        sliding_layers=sliding_layers,
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
