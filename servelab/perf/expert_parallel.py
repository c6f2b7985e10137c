"""Expert parallelism for mixture-of-experts models: who holds which experts, what the busiest GPU does, what moves.

vLLM's `--enable-expert-parallel` (SGLang's `--ep-size`) places whole experts on GPUs instead of slicing every
expert across the tensor-parallel ranks. Its expert-parallel group is all TP x DP ranks of the deployment:

- **TP only (DP = 1).** Attention stays tensor-parallel, so every rank holds every token; each rank runs its
  E/EP experts on the tokens routed to them and the results are summed by the all-reduce the layer already does.
  The weight bytes and FLOPs per rank average the same as tensor-parallel experts; what changes is that ranks are
  unevenly loaded (below), and the experts' GEMMs are full width instead of 1/TP wide.
- **With data-parallel attention (DP > 1; SGLang's `--enable-dp-attention`).** Each DP rank runs attention on its
  own requests; the MoE layer is shared: every token is dispatched to the ranks holding its k experts and the
  outputs are combined back, two all-to-alls per MoE layer over NVLink or PCIe, and the experts' weights are split
  across all TP x DP ranks, so each GPU holds 1/(TP x DP) of them.

**Load imbalance.** Routing B tokens with top-k over E experts, rank r receives on average B·k/EP token-rows and
E/EP·(1 - (1 - k/E)^B) distinct experts, but the MoE layer ends when the busiest rank ends. Treating each rank's
load as Gaussian (rows: a sum of B hypergeometric draws of k from E; touched experts: a binomial over its E/EP
experts), the expected maximum over EP ranks is mean + sd·sqrt(2 ln EP). At batch 1 with Qwen3-30B-A3B's 8 of 128
experts on EP = 8 the busiest rank does ~3x the average; at batch 256 ~1.1x. Routing is assumed uniform: real
routers' skew makes it worse, which vLLM's EPLB (`--enable-eplb`) counters and this does not model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servelab.perf.engine_config import EngineConfig
from servelab.perf.hardware import Hardware
from servelab.perf.memory import weight_bytes_with_experts
from servelab.perf.moe_kernels import mxfp4_padding
from servelab.perf.models import ModelSpec, MoESpec


@dataclass(frozen=True, slots=True)
class ExpertLayout:
    """How a MoE deployment spreads its experts: `ep_size` GPUs share them (1: tensor-parallel experts)."""

    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    expert_parallel: bool = False

    @property
    def ep_size(self) -> int:
        """GPUs the experts are split over by whole experts: TP x DP with expert parallelism, else 1."""
        return self.tensor_parallel_size * self.data_parallel_size if self.expert_parallel else 1

    @property
    def expert_shards(self) -> int:
        """Ways each MoE layer's routed-expert weights are divided: over TP x DP with EP, over TP without."""
        return self.ep_size if self.expert_parallel else self.tensor_parallel_size

    @property
    def dispatches(self) -> bool:
        """Whether tokens cross GPUs in all-to-alls (EP across data-parallel attention ranks)."""
        return self.expert_parallel and self.data_parallel_size > 1


def busiest_rank_factor(moe: MoESpec, num_tokens: float, ep_size: int) -> float:
    """The busiest expert-parallel rank's load over the average rank's, for a step routing `num_tokens` tokens.

    The larger of the two imbalances: token-rows (compute) and distinct experts touched (weight bytes read).
    """
    if ep_size <= 1 or num_tokens <= 0:
        return 1.0
    spread = math.sqrt(2 * math.log(ep_size))
    experts, k = moe.num_experts, moe.experts_per_token
    share = 1 / ep_size
    row_mean = num_tokens * k * share
    row_var = num_tokens * k * share * (1 - share) * (experts - k) / max(experts - 1, 1)
    local = experts * share
    touched_p = -math.expm1(num_tokens * math.log1p(-k / experts)) if k < experts else 1.0
    touched_mean = local * touched_p
    touched_var = local * touched_p * (1 - touched_p)
    rows = 1 + spread * math.sqrt(row_var) / row_mean
    touched = 1 + spread * math.sqrt(touched_var) / touched_mean if touched_mean > 0 else 1.0
    return max(rows, touched)


def all_to_all_time(
    model: ModelSpec, layout: ExpertLayout, tokens_per_rank: float, link_bytes_per_s: float, latency_s: float
) -> float:
    """Dispatch and combine of every MoE layer in one step, on one rank: each of its tokens' hidden states goes to
    its k experts' ranks and comes back (bf16 both ways), (EP-1)/EP of them off the GPU; 0 without dispatch."""
    if not layout.dispatches or not model.moe or tokens_per_rank <= 0:
        return 0.0
    ep = layout.ep_size
    sent = tokens_per_rank * model.moe.experts_per_token * model.hidden_size * model.dtype_bytes * (ep - 1) / ep
    return model.num_moe_layers * 2 * (latency_s + sent / link_bytes_per_s)


def expert_layer_scale(layout: ExpertLayout, moe: MoESpec, routed_tokens: float) -> float:
    """What a routed-expert layer priced with the experts sliced over TP costs on the busiest rank under `layout`:
    each rank holds 1/expert_shards of the experts instead of 1/TP, and waits for the busiest rank."""
    if not layout.expert_parallel:
        return 1.0
    return layout.tensor_parallel_size / layout.expert_shards * busiest_rank_factor(moe, routed_tokens, layout.ep_size)


def step_weight_bytes(model: ModelSpec, config: EngineConfig, hardware: Hardware, num_tokens: float) -> float:
    """Weight bytes one GPU reads in a step of `num_tokens` tokens (a replica's batch): all of a dense model's; for a
    mixture of experts, every non-expert weight plus the experts some token is routed to (uniform routing), so a
    small batch reads a few experts and a large one all of them, as vLLM pads them for their kernel. Embedding rows
    are counted whole, as the memory plan holds them; with expert parallelism over data-parallel ranks, the other
    ranks' tokens count too."""
    if not model.moe:
        return weight_bytes_with_experts(model, config, hardware, 1.0)
    layout = ExpertLayout(config.tensor_parallel_size, config.data_parallel_size, config.enable_expert_parallel)
    routed = num_tokens * (layout.data_parallel_size if layout.dispatches else 1)
    touched = model.moe.experts_touched(max(routed, 1.0)) / model.moe.num_experts
    return weight_bytes_with_experts(model, config, hardware, mxfp4_padding(model, hardware, config), touched)
