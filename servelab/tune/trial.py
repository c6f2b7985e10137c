"""One candidate judged on the simulator: deployment built, workload run, objective scored.

The base deployment is the user's current launch line. A candidate changes
some knobs of it; the launch line printed for a candidate is the user's own
line with those changes (flags the candidate resets to `default` disappear),
while the simulator may see extra model-only settings (`sim_args`, e.g. the
CPU backend's fixed KV space) that must not end up on a real command line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from servelab.perf.errors import PerfConfigError
from servelab.schemas.tune import KeyMetrics, Trial
from servelab.schemas.vocabulary import TrialStatus
from servelab.sim.engines import VLLM
from servelab.targets.deployment import Deployment
from servelab.targets.errors import TargetError
from servelab.tune.objectives import Evaluation, Objective, evaluate, key_metrics
from servelab.tune.space import Candidate, apply, candidate_flags, gpu_count
from servelab.tune.workload import TuneWorkload


@dataclass(frozen=True)
class SimJudge:
    """Scores candidates on the simulator against one workload and objective."""

    base: Deployment
    """What the simulator runs for the baseline: the user's line plus the model-only `sim_args`."""
    launch_base: Deployment
    """The user's line alone: what candidate launch lines are printed from."""
    workload: TuneWorkload
    objective: Objective
    options_dir: Path | None = None
    """Where a TensorRT-LLM candidate's own --extra_llm_api_options YAML is written (servelab.tune.engine_lines)."""

    def engine_args(self, candidate: Candidate) -> str:
        """The flags a server would be started with for this candidate (vLLM defaults left out; another engine's
        line is the user's with the candidate's flags written in)."""
        if self.launch_base.engine != VLLM:
            return candidate_flags(self.launch_base, candidate, self.options_dir)
        try:
            return apply(self.launch_base, candidate).engine_args()
        except PerfConfigError:
            return _requested_args(self.launch_base, candidate)

    def judge(self, candidate: Candidate) -> Trial:
        """The candidate simulated and scored: a trial without a number (the study numbers it)."""
        began = time.perf_counter()
        try:
            deployment = apply(self.base, candidate, self.options_dir)
            target = deployment.sim_target()
        except (PerfConfigError, TargetError) as exc:
            requested = (
                _requested_args(self.launch_base, candidate)
                if self.launch_base.engine == VLLM
                else self.engine_args(candidate)
            )
            return Trial(
                params=dict(candidate),
                engine_args=requested,
                status=TrialStatus.INVALID,
                score=None,
                violation=None,
                feasible=False,
                rate=None,
                gpu=None,
                gpus=None,
                cost_per_million_tokens=None,
                metrics=KeyMetrics(),
                probes=[],
                error=str(exc),
                sim_wall_s=time.perf_counter() - began,
                engine_config={},
            )
        gpus = gpu_count(deployment)
        result = evaluate(target, self.workload, self.objective, gpu=deployment.hardware.name, gpus=gpus)
        return self._outcome(candidate, deployment, result, time.perf_counter() - began)

    def _outcome(self, candidate: Candidate, deployment: Deployment, result: Evaluation, wall: float) -> Trial:
        gpus = gpu_count(deployment)
        return Trial(
            params=dict(candidate),
            engine_args=self.engine_args(candidate),
            status=TrialStatus.OK,
            score=result.score,
            violation=result.violation,
            feasible=result.feasible,
            rate=result.rate,
            gpu=deployment.hardware.name,
            gpus=gpus,
            cost_per_million_tokens=self.objective.cost_per_million_tokens(
                result.summary, deployment.hardware.name, gpus
            ),
            metrics=key_metrics(result.summary),
            probes=[p.brief() for p in result.probes],
            error=None,
            sim_wall_s=wall,
            engine_config={k: getattr(deployment.config, k) for k in deployment.config.__dataclass_fields__},
        )


def _requested_args(launch_base: Deployment, candidate: Candidate) -> str:
    """The launch line of a candidate that cannot be resolved: the raw flags, for the user to read."""
    knobs = " ".join(f"{k}={v}" for k, v in candidate.items())
    return f"{launch_base.engine_args()} [{knobs}]".strip()
