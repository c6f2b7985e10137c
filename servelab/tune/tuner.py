"""`tune` end to end: the baseline and the space on the simulator, the top-k on real servers, tune.json.

The CLI only parses flags into a `TuneRequest` and prints what this returns.
tune.json is rewritten after stage 1 and after every stage-2 measurement, so
whatever was learnt survives an interruption.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.pool import TaskPool
from servelab.targets.deployment import Deployment
from servelab.tune.confirm import BASELINE, ServerCheck, ServerCommand, Stage2Config, Stage2Result, confirm
from servelab.tune.errors import TuneError
from servelab.tune.objectives import Objective
from servelab.tune.outcome import pick_for_confirmation, rank, tune_document, write_tune_json
from servelab.sim.engines import VLLM
from servelab.tune.engine_lines import launch_line
from servelab.tune.space import GPU, SearchSpace, apply
from servelab.tune.study import SearchSettings, StudyTrial, check_resumable, run_search
from servelab.tune.trial import OK, SimJudge
from servelab.tune.workload import TuneWorkload

OPTIONS_DIR = "llm-api-options"
"""Under the study's directory: the --extra_llm_api_options YAML files TensorRT-LLM candidates name."""


@dataclass(frozen=True)
class TuneRequest:
    simulated: Deployment
    """What stage 1 simulates for the baseline, and what stage 2's predictions come from: the user's line plus
    `sim_args`, on a catalogue GPU or on the fitted hardware and coefficients of a calibration profile."""
    launch: Deployment
    """The user's current line alone: the baseline every candidate changes, and what launch lines are printed from."""
    space: SearchSpace
    objective: Objective
    sim_workload: TuneWorkload
    """What each stage-1 trial simulates (modest: hundreds of trials must fit in minutes)."""
    bench_workload: TuneWorkload
    """What stage 2 sends to each real server (and what its predictions are made for)."""
    search: SearchSettings
    output: Path
    sim_args: str = ""
    """Recorded in tune.json: the flags only `simulated` has (e.g. `--block-size 128 --kv-cache-memory-bytes 1G`)."""
    calibration: str | None = None
    """The profile `simulated` was built from, recorded in tune.json; None = the catalogue's uncalibrated rates."""
    resume: bool = False
    server: ServerCommand | None = None
    top_k: int = 3
    http_options: dict[str, Any] = field(default_factory=dict)
    server_check: ServerCheck | None = None
    """Run on each stage-2 server before its measurement (the CLI re-times a calibration's reference step)."""
    pool: TaskPool | None = None
    """Where trials run side by side (`--ray-address`); None: one after another in this process."""
    gpu_resource: str = "GPU"
    """What a stage-2 trial holds on a pool, one per GPU of its configuration (a custom Ray resource name works too)."""

    def __post_init__(self) -> None:
        if self.space.engine != self.simulated.engine:
            raise TuneError(f"the search space holds --engine {self.space.engine}'s knobs, the deployment is "
                            f"{self.simulated.engine}'s")
        if self.top_k < 1:
            raise TuneError(f"--top-k must be at least 1, got {self.top_k}")
        if self.calibration is not None and GPU in self.space.dimensions:
            raise TuneError(
                f"the search space varies the GPU ({GPU}={','.join(map(str, self.space.dimensions[GPU]))}) but "
                f"--calibration {self.calibration} is fitted to one device ({self.simulated.hardware.name}); "
                f"drop the {GPU} dimension or the profile"
            )
        if self.pool is not None and self.server is not None and self.server.port is not None:
            raise TuneError("--server-port with --ray-address: trials run side by side and may share a node; "
                            "leave the port out so that each server picks a free one")


@dataclass
class TuneProgress:
    """Callbacks for the CLI's live output; each is optional."""

    on_trial: Callable[[StudyTrial, int, int], None] | None = None
    on_server_start: Callable[[Stage2Config], None] | None = None
    on_server_result: Callable[[Stage2Result], None] | None = None


def run_tune(request: TuneRequest, progress: TuneProgress | None = None) -> dict[str, Any]:
    progress = progress or TuneProgress()
    simulated, launch = request.simulated, request.launch
    if request.resume:
        check_resumable(request.output, simulated.engine)
    options_dir = request.output / OPTIONS_DIR
    judge = SimJudge(simulated, launch, request.sim_workload, request.objective, options_dir)
    baseline = judge.judge({})
    if baseline.status != OK:
        raise TuneError(f"the current configuration cannot be simulated: {baseline.error}")
    direction = request.objective.direction
    trials = run_search(
        request.space, judge.judge, request.output, direction=direction, settings=request.search,
        resume=request.resume, basis=_basis(request), on_trial=progress.on_trial, pool=request.pool,
    )

    def document(stage2: list[Stage2Result], stage2_info: dict[str, Any] | None) -> dict[str, Any]:
        doc = tune_document(
            objective=_describe_objective(request.objective),
            deployment={**launch.describe(), "sim_args": request.sim_args, "calibration": request.calibration,
                        "simulated": simulated.describe()},
            space=request.space.describe(),
            search={"sampler": "grid" if request.search.exhaustive(request.space) else "tpe",
                    "n_trials": request.search.n_trials, "budget": request.search.budget(request.space),
                    "space_size": request.space.size, "seed": request.search.seed, "evaluated": len(trials)},
            workload={"stage1": request.sim_workload.describe(), "stage2": request.bench_workload.describe()},
            baseline=baseline, trials=trials, direction=direction, stage2=stage2, stage2_info=stage2_info,
            launch_line=None if launch.engine == VLLM else lambda args: launch_line(launch.engine, args, launch.model.name),
        )
        write_tune_json(request.output, doc)
        return doc

    doc = document([], None)
    if request.server is None:
        return doc
    configs = [Stage2Config(BASELINE, {}, baseline.engine_args, simulated)]
    for t in pick_for_confirmation(rank(trials, direction), request.top_k, baseline.engine_args):
        configs.append(Stage2Config(f"trial-{t.number}", t.outcome.params, t.outcome.engine_args,
                                    apply(simulated, t.outcome.params, options_dir)))
    info = {"server_cmd": request.server.template, "env": dict(request.server.env), "top_k": request.top_k,
            "configs": [c.label for c in configs]}
    measured: list[Stage2Result] = []

    order = [c.label for c in configs]

    def on_result(result: Stage2Result) -> None:
        measured.append(result)
        measured.sort(key=lambda r: order.index(r.label))  # a pool returns them as they finish
        document(measured, info)
        if progress.on_server_result:
            progress.on_server_result(result)

    confirm(configs, request.server, request.bench_workload, request.objective, request.output,
            resume=request.resume, http_options=request.http_options, on_start=progress.on_server_start,
            on_result=on_result, check_server=request.server_check, pool=request.pool,
            gpu_resource=request.gpu_resource)
    return document(measured, info)


def _basis(request: TuneRequest) -> dict[str, Any]:
    """What every stage-1 score rests on besides its knobs: a resumed study must share it (see open_study)."""
    simulated = request.simulated
    return {
        "deployment": {**simulated.describe(), "hardware": simulated.hardware.model_dump(),
                       "network_latency": simulated.network_latency},
        "workload": request.sim_workload.describe(),
        "objective": _describe_objective(request.objective),
    }


def _describe_objective(objective: Objective) -> dict[str, Any]:
    return {
        "kind": objective.kind, "direction": objective.direction, "unit": objective.unit,
        "slo": objective.slo.terms().model_dump(exclude_unset=True) if objective.slo else None, "percentile": objective.percentile,
        "target_rate": objective.target_rate, "gpu_cost_per_hour": dict(objective.gpu_cost_per_hour),
    }
