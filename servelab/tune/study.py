"""Stage 1: search the space on the simulator with optuna, resumably.

The study lives in SQLite (`study.db` in the results directory) and every
evaluated candidate also gets its own directory with `trial.json` (written
once the study has recorded it, so a directory always means a finished trial), so a run
killed at any point (Ctrl-C, SIGKILL, a reboot) resumes with `--resume`:
completed trials are read back, never re-run; a trial that was cut off is
failed and its point queued again.

A small space is searched exhaustively (every point queued in order); a large
one with TPE. Every knob is categorical, so TPE proposes points it has
already seen; those are answered from the finished trial with the same
parameters and do not count as evaluations: the budget is distinct
configurations simulated, which is also what the efficiency benchmark counts.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from servelab.atomic import write_text_atomic
from servelab import SCHEMA_VERSION
from servelab.pool import TaskLost, TaskPool
from servelab.renames import upgraded
from servelab.sim.engines import VLLM
from servelab.tune.errors import TuneError
from servelab.tune.space import Candidate, SearchSpace, candidate_key
from servelab.tune.trial import OK, TrialOutcome

if TYPE_CHECKING:  # imported by the functions that search: `tune --help` starts without it
    import optuna

STUDY_DB = "study.db"
STUDY_NAME = "stage1"
TRIALS_DIR = "stage1"
OUTCOME = "outcome"
BASIS = "basis"
ENGINE = "engine"
DUPLICATE_OF = "duplicate_of"
SamplerName = Literal["auto", "grid", "tpe"]
SAMPLERS = ("auto", "grid", "tpe")
LOST_SIMULATION_ATTEMPTS = 3
"""Times a stage-1 simulation is submitted before a lost worker ends the search."""


@dataclass(frozen=True)
class SearchSettings:
    n_trials: int = 100
    """Distinct configurations to simulate (all of them when the space is no larger)."""
    sampler: SamplerName = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_trials < 1:
            raise TuneError(f"--n-trials must be at least 1, got {self.n_trials}")
        if self.sampler not in SAMPLERS:
            raise TuneError(f"unknown --sampler {self.sampler!r}; use one of {', '.join(SAMPLERS)}")

    def exhaustive(self, space: SearchSpace) -> bool:
        return self.sampler == "grid" or (self.sampler == "auto" and space.size <= self.n_trials)

    def budget(self, space: SearchSpace) -> int:
        return space.size if self.exhaustive(space) else min(self.n_trials, space.size)


@dataclass(frozen=True)
class StudyTrial:
    """One distinct evaluated configuration, by its optuna trial number."""

    number: int
    outcome: TrialOutcome


def storage_url(directory: Path) -> str:
    return f"sqlite:///{(directory / STUDY_DB).resolve()}"


def _sampler(settings: SearchSettings, space: SearchSpace, budget: int) -> optuna.samplers.BaseSampler:
    import optuna
    if settings.exhaustive(space):
        return optuna.samplers.RandomSampler(seed=settings.seed)  # every point is queued; never consulted
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=settings.seed, multivariate=True, n_startup_trials=max(4, min(10, budget // 5)),
        )


def _check_engine(study: optuna.Study, directory: Path, engine: str) -> None:
    """A study holds one engine's configurations; one begun before tune took --engine is vLLM's."""
    recorded = study.user_attrs.get(ENGINE, VLLM)
    if recorded != engine:
        raise TuneError(f"--resume: the study in {directory} searched --engine {recorded}, not --engine {engine}; "
                        f"resume it with --engine {recorded}, or pick another --result-dir")


def check_resumable(directory: Path, engine: str) -> None:
    """Refuse early (before the baseline is simulated) to resume a study of another engine; a directory without a
    study is left for open_study to refuse."""
    import optuna
    if not (directory / STUDY_DB).exists():
        return
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _check_engine(optuna.load_study(study_name=STUDY_NAME, storage=storage_url(directory)), directory, engine)


def open_study(
    directory: Path, direction: str, settings: SearchSettings, space: SearchSpace, *, resume: bool,
    basis: Mapping[str, Any] | None = None,
) -> optuna.Study:
    """Create the study, or load it with `resume`; refuse to silently mix two studies in one directory.

    `basis` is what a score rests on besides the knobs (the simulated
    deployment with its calibration, the workload, the objective): resuming
    on another basis, e.g. after recalibrating, would rank trials scored by
    two different simulators against each other, so it is refused.
    """
    import optuna
    directory.mkdir(parents=True, exist_ok=True)
    exists = (directory / STUDY_DB).exists()
    if exists and not resume:
        raise TuneError(f"{directory} already holds a tune study; pass --resume to continue it, or pick another --output")
    if resume and not exists:
        raise TuneError(f"--resume: {directory} holds no tune study ({STUDY_DB} is missing)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        storage=storage_url(directory), study_name=STUDY_NAME, direction=direction,  # type: ignore[arg-type]  # minimize or maximize, from Objective
        sampler=_sampler(settings, space, settings.budget(space)), load_if_exists=resume,
    )
    stored = study.user_attrs.get("space")
    if stored is None:
        study.set_user_attr("space", json.loads(json.dumps(space.describe())))
        study.set_user_attr("direction", direction)
        study.set_user_attr(ENGINE, space.engine)
    else:
        _check_engine(study, directory, space.engine)
        if stored != json.loads(json.dumps(space.describe())) or study.user_attrs.get("direction") != direction:
            raise TuneError(
                f"--resume: the study in {directory} was run with another search space or objective "
                f"({stored}); resume with the same flags, or pick another --output"
            )
    if basis is not None:
        expected = json.loads(json.dumps(basis, default=str))
        recorded = study.user_attrs.get(BASIS)
        if recorded is None:
            study.set_user_attr(BASIS, expected)
        elif recorded != expected:
            changed = sorted(k for k in expected.keys() | recorded.keys() if expected.get(k) != recorded.get(k))
            raise TuneError(
                f"--resume: the study in {directory} was scored with another {' and '.join(changed)} "
                f"(a different --gpu/--model/--calibration, --engine-args, workload or objective); "
                f"resume with the same flags, or pick another --output"
            )
    return study


def finished_trials(study: optuna.Study) -> list[StudyTrial]:
    """The distinct configurations evaluated so far (duplicates and interrupted trials left out).

    An outcome stored in the study carries no schema version, so each is read through servelab.renames as an
    old one: a study begun by an earlier release resumes under this one's statistic names (renaming a current
    outcome changes nothing, no new name being an old one)."""
    from optuna.trial import TrialState
    return [
        StudyTrial(t.number, TrialOutcome.from_dict(upgraded(t.user_attrs[OUTCOME], SCHEMA_VERSION)))
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if OUTCOME in t.user_attrs and DUPLICATE_OF not in t.user_attrs
    ]


def _requeue_interrupted(study: optuna.Study, space: SearchSpace) -> None:
    """Trials left RUNNING by a killed process are failed, and their point queued to run again."""
    from optuna.trial import TrialState
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(t.number, state=TrialState.FAIL)
        if set(t.params) == set(space.dimensions):
            study.enqueue_trial(t.params)


def _queue_grid(study: optuna.Study, space: SearchSpace, done: set[str]) -> None:
    from optuna.trial import TrialState
    waiting = {candidate_key(t.params) for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))}
    for candidate in space.grid():
        key = candidate_key(candidate)
        if key not in done and key not in waiting:
            study.enqueue_trial(candidate)


def _value(outcome: TrialOutcome, direction: str) -> float:
    if outcome.status == OK and outcome.score is not None:
        return outcome.score
    return math.inf if direction == "minimize" else 0.0


def _trial_dir(directory: Path, number: int) -> Path:
    return directory / TRIALS_DIR / f"trial-{number:04d}"


def write_trial_dir(directory: Path, number: int, outcome: TrialOutcome) -> Path:
    path = _trial_dir(directory, number)
    path.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path / "trial.json", json.dumps({"number": number, **outcome.to_dict()}, indent=2, default=str) + "\n")
    return path


def run_search(
    space: SearchSpace,
    judge: Callable[[Candidate], TrialOutcome],
    directory: Path,
    *,
    direction: str,
    settings: SearchSettings,
    resume: bool = False,
    basis: Mapping[str, Any] | None = None,
    on_trial: Callable[[StudyTrial, int, int], None] | None = None,
    pool: TaskPool | None = None,
) -> list[StudyTrial]:
    """Evaluate up to the budget of distinct candidates; returns every distinct one evaluated (old and new).

    `basis` is checked on resume as `open_study` says.
    `on_trial(trial, evaluated, budget)` is called after each new evaluation.
    A KeyboardInterrupt fails the running trial (its point is re-queued on
    resume) and propagates.

    With a `pool` (Ray, `--ray-address`), up to `pool.slots` candidates are
    simulated at once; each is told to the study as it returns, so the study
    and the trial directories are exactly what a sequential run leaves (trial
    numbers follow the order of asking, so a grid numbers its points alike).
    A simulation whose worker was lost is run again (it is deterministic).
    """
    from optuna.trial import TrialState
    study = open_study(directory, direction, settings, space, resume=resume, basis=basis)
    _requeue_interrupted(study, space)
    trials = finished_trials(study)
    for t in trials:  # a kill between tell and the write leaves a finished trial without its dir
        if not (_trial_dir(directory, t.number) / "trial.json").exists():
            write_trial_dir(directory, t.number, t.outcome)
    by_key = {candidate_key(t.outcome.params): t for t in trials}
    budget = settings.budget(space)
    if settings.exhaustive(space):
        _queue_grid(study, space, set(by_key))
    max_asks = 20 * budget  # TPE circling points it has seen: stop rather than spin
    asks = 0
    in_flight: dict[int, tuple[optuna.trial.Trial, Candidate, int]] = {}  # task id -> (trial, candidate, attempts)
    running: set[str] = set()  # the keys of the candidates in flight

    def record(trial: optuna.trial.Trial, candidate: Candidate, outcome: TrialOutcome) -> None:
        trial.set_user_attr(OUTCOME, json.loads(json.dumps(outcome.to_dict(), default=str)))
        trial.set_constraint("slo", _constraint(outcome))
        study.tell(trial, _value(outcome, direction))
        write_trial_dir(directory, trial.number, outcome)  # after tell: a dir always means a finished trial
        done = StudyTrial(trial.number, outcome)
        trials.append(done)
        by_key[candidate_key(candidate)] = done
        if on_trial:
            on_trial(done, len(by_key), budget)

    try:
        while True:
            room = len(by_key) + len(in_flight) < budget and asks < max_asks
            if room and (pool is None or len(in_flight) < pool.slots):
                asks += 1
                trial = study.ask()
                candidate = space.suggest(trial)
                key = candidate_key(candidate)
                if key in by_key:
                    seen = by_key[key]
                    trial.set_user_attr(OUTCOME, seen.outcome.to_dict())
                    trial.set_user_attr(DUPLICATE_OF, seen.number)
                    trial.set_constraint("slo", _constraint(seen.outcome))
                    study.tell(trial, _value(seen.outcome, direction))
                elif key in running:  # TPE proposing a point already being simulated: nothing to learn yet
                    study.tell(trial, state=TrialState.PRUNED)
                elif pool is None:
                    try:
                        outcome = judge(candidate)
                    except BaseException:
                        study.tell(trial, state=TrialState.FAIL)
                        raise
                    record(trial, candidate, outcome)
                else:
                    in_flight[pool.submit(judge, candidate)] = (trial, candidate, 1)
                    running.add(key)
                continue
            if not in_flight:
                break
            assert pool is not None
            task, value = pool.next_done()
            trial, candidate, attempts = in_flight.pop(task)
            if isinstance(value, TaskLost) and attempts < LOST_SIMULATION_ATTEMPTS:
                in_flight[pool.submit(judge, candidate)] = (trial, candidate, attempts + 1)  # deterministic: rerun
                continue
            running.discard(candidate_key(candidate))
            if isinstance(value, BaseException):
                study.tell(trial, state=TrialState.FAIL)
                if isinstance(value, TaskLost):
                    raise TuneError(f"a stage-1 simulation was lost {attempts} times on the cluster ({value}); "
                                    f"the study is kept: continue with --resume")
                raise value
            record(trial, candidate, value)
    except BaseException:
        for trial, _, _ in in_flight.values():
            study.tell(trial, state=TrialState.FAIL)
        if pool is not None:
            pool.cancel_all()
        raise
    return sorted(trials, key=lambda t: t.number)


def _constraint(outcome: TrialOutcome) -> float:
    """optuna's feasibility convention: <= 0 feasible. An invalid configuration is as infeasible as it gets."""
    if outcome.status != OK or outcome.violation is None:
        return 1e6
    return float(outcome.violation)
