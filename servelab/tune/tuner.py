"""`tune` end to end: the baseline and the space on the simulator, the top-k on real servers, tune.json.

`run(TuneRequest) -> TuneDocument` is the verb: the CLI only parses flags into a `TuneRequest` and prints what
this returns; servelab.api.tune is the same for Python.
tune.json is rewritten after stage 1 and after every stage-2 measurement, so
whatever was learnt survives an interruption.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from servelab.pool import TaskPool
from servelab.schemas.results import Json
from servelab.schemas.tune import (
    BASELINE,
    SearchInfo,
    Stage2,
    Stage2Row,
    Trial,
    TuneDeployment,
    TuneDocument,
    TuneWorkloads,
)
from servelab.schemas.vocabulary import Sampler, TrialStatus
from servelab.sim.engines import VLLM
from servelab.targets.deployment import Deployment
from servelab.tune.confirm import ServerCheck, ServerCommand, Stage2Config, confirm
from servelab.tune.engine_lines import launch_line
from servelab.tune.errors import TuneError
from servelab.tune.objectives import Objective
from servelab.tune.outcome import pick_for_confirmation, rank, tune_document, write_tune_json
from servelab.tune.space import GPU, SearchSpace, apply
from servelab.tune.study import SearchSettings, check_resumable, run_search
from servelab.tune.trial import SimJudge
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
    server_check: ServerCheck | None = None
    """Run on each stage-2 server before its measurement (the CLI re-times a calibration's reference step)."""
    pool: TaskPool | None = None
    """Where trials run side by side (`--ray-address`); None: one after another in this process."""
    gpu_resource: str = "GPU"
    """What a stage-2 trial holds on a pool, one per GPU of its configuration (a custom Ray resource name works too)."""

    def __post_init__(self) -> None:
        if self.space.engine != self.simulated.engine:
            raise TuneError(
                f"the search space holds --engine {self.space.engine}'s knobs, the deployment is "
                f"{self.simulated.engine}'s"
            )
        if self.top_k < 1:
            raise TuneError(f"--top-k must be at least 1, got {self.top_k}")
        if self.calibration is not None and GPU in self.space.dimensions:
            raise TuneError(
                f"the search space varies the GPU ({GPU}={','.join(map(str, self.space.dimensions[GPU]))}) but "
                f"--calibration {self.calibration} is fitted to one device ({self.simulated.hardware.name}); "
                f"drop the {GPU} dimension or the profile"
            )
        if self.pool is not None and self.server is not None and self.server.port is not None:
            raise TuneError(
                "--server-port with --ray-address: trials run side by side and may share a node; "
                "leave the port out so that each server picks a free one"
            )


@dataclass
class TuneProgress:
    """Callbacks for the CLI's live output; each is optional."""

    on_trial: Callable[[Trial, int, int], None] | None = None
    on_server_start: Callable[[Stage2Config], None] | None = None
    on_server_result: Callable[[Stage2Row], None] | None = None


def run(request: TuneRequest, progress: TuneProgress | None = None) -> TuneDocument:
    """The whole study: the baseline and the space on the simulator, then (with a server command) the top-k and the
    baseline measured on real servers; tune.json written after each stage-2 result and returned at the end."""
    progress = progress or TuneProgress()
    if request.resume:
        check_resumable(request.output, request.simulated.engine)
    judge = SimJudge(
        request.simulated, request.launch, request.sim_workload, request.objective, request.output / OPTIONS_DIR
    )
    baseline = judge.judge({})
    if baseline.status != TrialStatus.OK:
        raise TuneError(f"the current configuration cannot be simulated: {baseline.error}")
    trials = run_search(
        request.space,
        judge.judge,
        request.output,
        direction=request.objective.direction,
        settings=request.search,
        resume=request.resume,
        basis=_basis(request),
        on_trial=progress.on_trial,
        pool=request.pool,
    )
    study = _Study(request, baseline, trials)
    document = study.write(None)
    if request.server is None:
        return document
    return _confirm(request, study, progress)


@dataclass(frozen=True)
class _Study:
    """Stage 1's outcome, and how tune.json is written from it with whatever stage 2 has measured so far."""

    request: TuneRequest
    baseline: Trial
    trials: list[Trial]

    def write(self, stage2: Stage2 | None) -> TuneDocument:
        request, launch = self.request, self.request.launch
        document = tune_document(
            objective=request.objective.info(),
            deployment=TuneDeployment.model_validate(
                {
                    **launch.describe(),
                    "sim_args": request.sim_args,
                    "calibration": request.calibration,
                    "simulated": request.simulated.describe(),
                }
            ),
            space=request.space.describe(),
            search=SearchInfo(
                sampler=Sampler.GRID if request.search.exhaustive(request.space) else Sampler.TPE,
                n_trials=request.search.n_trials,
                budget=request.search.budget(request.space),
                space_size=request.space.size,
                seed=request.search.seed,
                evaluated=len(self.trials),
            ),
            workload=TuneWorkloads.model_validate(
                {"stage1": request.sim_workload.describe(), "stage2": request.bench_workload.describe()}
            ),
            baseline=self.baseline,
            trials=self.trials,
            stage2=stage2,
            launch_line=None
            if launch.engine == VLLM
            else lambda args: launch_line(launch.engine, args, launch.model.name),
        )
        write_tune_json(request.output, document)
        return document


def _confirm(request: TuneRequest, study: _Study, progress: TuneProgress) -> TuneDocument:
    """Stage 2: the baseline and the simulator's top-k, each measured on its own server, tune.json rewritten after
    each result (in the configurations' order, however a pool returns them)."""
    assert request.server is not None
    options_dir = request.output / OPTIONS_DIR
    configs = [Stage2Config(BASELINE, {}, study.baseline.engine_args, request.simulated)]
    for t in pick_for_confirmation(
        rank(study.trials, request.objective.direction), request.top_k, study.baseline.engine_args
    ):
        configs.append(
            Stage2Config(f"trial-{t.number}", t.params, t.engine_args, apply(request.simulated, t.params, options_dir))
        )
    stage2 = Stage2(
        server_cmd=request.server.template,
        env=dict(request.server.env),
        top_k=request.top_k,
        configs=[c.label for c in configs],
        results=[],
    )
    order = [c.label for c in configs]

    def on_result(result: Stage2Row) -> None:
        stage2.results.append(result)
        stage2.results.sort(key=lambda r: order.index(r.label))  # a pool returns them as they finish
        study.write(stage2)
        if progress.on_server_result:
            progress.on_server_result(result)

    confirm(
        configs,
        request.server,
        request.bench_workload,
        request.objective,
        request.output,
        resume=request.resume,
        on_start=progress.on_server_start,
        on_result=on_result,
        check_server=request.server_check,
        pool=request.pool,
        gpu_resource=request.gpu_resource,
    )
    return study.write(stage2)


def _basis(request: TuneRequest) -> Json:
    """What every stage-1 score rests on besides its knobs: a resumed study must share it (see open_study)."""
    simulated = request.simulated
    return {
        "deployment": {
            **simulated.describe(),
            "hardware": simulated.hardware.model_dump(),
            "network_latency": simulated.network_latency,
        },
        "workload": request.sim_workload.describe(),
        "objective": request.objective.info().model_dump(),
    }
