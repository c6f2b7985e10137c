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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servelab.atomic import write_text_atomic
from servelab import SCHEMA_VERSION
from servelab.pool import TaskLost, TaskPool
from servelab.renames import upgraded
from servelab.schemas.results import Json
from servelab.schemas.tune import Trial
from servelab.schemas.vocabulary import Direction, Sampler
from servelab.sim.engines import VLLM
from servelab.tune.errors import TuneError
from servelab.tune.space import Candidate, SearchSpace, candidate_key

if TYPE_CHECKING:  # imported by the functions that search: `tune --help` starts without it
    import optuna

STUDY_DB = "study.db"
STUDY_NAME = "stage1"
TRIALS_DIR = "stage1"
OUTCOME = "outcome"
BASIS = "basis"
ENGINE = "engine"
DUPLICATE_OF = "duplicate_of"
LOST_SIMULATION_ATTEMPTS = 3
"""Times a stage-1 simulation is submitted before a lost worker ends the search."""


@dataclass(frozen=True)
class SearchSettings:
    n_trials: int = 100
    """Distinct configurations to simulate (all of them when the space is no larger)."""
    sampler: Sampler = Sampler.AUTO
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_trials < 1:
            raise TuneError(f"--n-trials must be at least 1, got {self.n_trials}")
        if self.sampler not in tuple(Sampler):
            raise TuneError(f"unknown --sampler {self.sampler!r}; use one of {', '.join(Sampler)}")
        object.__setattr__(self, "sampler", Sampler(self.sampler))

    def exhaustive(self, space: SearchSpace) -> bool:
        return self.sampler == Sampler.GRID or (self.sampler == Sampler.AUTO and space.size <= self.n_trials)

    def budget(self, space: SearchSpace) -> int:
        return space.size if self.exhaustive(space) else min(self.n_trials, space.size)


def storage_url(directory: Path) -> str:
    return f"sqlite:///{(directory / STUDY_DB).resolve()}"


def _sampler(settings: SearchSettings, space: SearchSpace, budget: int) -> optuna.samplers.BaseSampler:
    import optuna

    if settings.exhaustive(space):
        return optuna.samplers.RandomSampler(seed=settings.seed)  # every point is queued; never consulted
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=settings.seed,
            multivariate=True,
            n_startup_trials=max(4, min(10, budget // 5)),
        )


def _check_engine(study: optuna.Study, directory: Path, engine: str) -> None:
    """A study holds one engine's configurations; one begun before tune took --engine is vLLM's."""
    recorded = study.user_attrs.get(ENGINE, VLLM)
    if recorded != engine:
        raise TuneError(
            f"--resume: the study in {directory} searched --engine {recorded}, not --engine {engine}; "
            f"resume it with --engine {recorded}, or pick another --result-dir"
        )


def check_resumable(directory: Path, engine: str) -> None:
    """Refuse early (before the baseline is simulated) to resume a study of another engine; a directory without a
    study is left for open_study to refuse."""
    import optuna

    if not (directory / STUDY_DB).exists():
        return
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _check_engine(optuna.load_study(study_name=STUDY_NAME, storage=storage_url(directory)), directory, engine)


def open_study(
    directory: Path,
    direction: str,
    settings: SearchSettings,
    space: SearchSpace,
    *,
    resume: bool,
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
        raise TuneError(
            f"{directory} already holds a tune study; pass --resume to continue it, or pick another --output"
        )
    if resume and not exists:
        raise TuneError(f"--resume: {directory} holds no tune study ({STUDY_DB} is missing)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        storage=storage_url(directory),
        study_name=STUDY_NAME,
        direction=direction,  # type: ignore[arg-type]  # minimize or maximize, from Objective
        sampler=_sampler(settings, space, settings.budget(space)),
        load_if_exists=resume,
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


def finished_trials(study: optuna.Study) -> list[Trial]:
    """The distinct configurations evaluated so far (duplicates and interrupted trials left out).

    An outcome stored in the study carries no schema version, so each is read through servelab.renames as an
    old one: a study begun by an earlier release resumes under this one's statistic names (renaming a current
    outcome changes nothing, no new name being an old one)."""
    from optuna.trial import TrialState

    return [
        _stored_trial(t.number, upgraded(t.user_attrs[OUTCOME], SCHEMA_VERSION))
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if OUTCOME in t.user_attrs and DUPLICATE_OF not in t.user_attrs
    ]


def _stored_trial(number: int, outcome: Json) -> Trial:
    """A trial as the study stored it, numbered by optuna; keys this release no longer writes are dropped."""
    return Trial.model_validate({**{k: v for k, v in outcome.items() if k in Trial.model_fields}, "number": number})


def _stored(trial: Trial) -> Json:
    """What the study keeps of a trial (optuna's user attributes are JSON; its number is optuna's own)."""
    stored: Json = json.loads(json.dumps(trial.model_dump(exclude={"number"}), default=str))
    return stored


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


def _value(trial: Trial, direction: str) -> float:
    if trial.ran and trial.score is not None:
        return trial.score
    return math.inf if direction == Direction.MINIMIZE else 0.0


def _trial_dir(directory: Path, number: int) -> Path:
    return directory / TRIALS_DIR / f"trial-{number:04d}"


def write_trial_dir(directory: Path, trial: Trial) -> Path:
    """stage1/trial-NNNN/trial.json: the trial, numbered (docs/schemas/trial.json)."""
    assert trial.number is not None, "only a numbered trial has a directory"
    path = _trial_dir(directory, trial.number)
    path.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path / "trial.json", json.dumps(trial.model_dump(), indent=2, default=str) + "\n")
    return path


def run_search(
    space: SearchSpace,
    judge: Callable[[Candidate], Trial],
    directory: Path,
    *,
    direction: str,
    settings: SearchSettings,
    resume: bool = False,
    basis: Mapping[str, Any] | None = None,
    on_trial: Callable[[Trial, int, int], None] | None = None,
    pool: TaskPool | None = None,
) -> list[Trial]:
    """Evaluate up to the budget of distinct candidates; returns every distinct one evaluated (old and new), numbered.

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
    study = open_study(directory, direction, settings, space, resume=resume, basis=basis)
    _requeue_interrupted(study, space)
    trials = finished_trials(study)
    for t in trials:  # a kill between tell and the write leaves a finished trial without its dir
        if not (_trial_dir(directory, t.number or 0) / "trial.json").exists():
            write_trial_dir(directory, t)
    search = _Search(study, space, judge, directory, direction, settings.budget(space), on_trial, pool, trials)
    if settings.exhaustive(space):
        _queue_grid(study, space, set(search.by_key))
    try:
        search.run()
    except BaseException:
        search.abandon()
        raise
    return sorted(search.trials, key=lambda t: t.number or 0)


@dataclass
class _Search:
    """One search's state: the trials so far, by number and by configuration, and the simulations in flight."""

    study: optuna.Study
    space: SearchSpace
    judge: Callable[[Candidate], Trial]
    directory: Path
    direction: str
    budget: int
    on_trial: Callable[[Trial, int, int], None] | None
    pool: TaskPool | None
    trials: list[Trial]
    by_key: dict[str, Trial] = field(init=False)
    asks: int = 0
    in_flight: dict[int, tuple[optuna.trial.Trial, Candidate, int]] = field(default_factory=dict)
    """Task id -> (optuna's trial, the candidate, how many times it was submitted)."""
    running: set[str] = field(default_factory=set)
    """The keys of the candidates in flight."""

    def __post_init__(self) -> None:
        self.by_key = {candidate_key(t.params): t for t in self.trials}

    def run(self) -> None:
        max_asks = 20 * self.budget  # TPE circling points it has seen: stop rather than spin
        while True:
            room = len(self.by_key) + len(self.in_flight) < self.budget and self.asks < max_asks
            if room and (self.pool is None or len(self.in_flight) < self.pool.slots):
                self.ask()
            elif self.in_flight:
                self.collect()
            else:
                return

    def ask(self) -> None:
        """One candidate from the sampler: answered from a finished twin, skipped while its twin runs, or simulated."""
        from optuna.trial import TrialState

        self.asks += 1
        trial = self.study.ask()
        candidate = self.space.suggest(trial)
        key = candidate_key(candidate)
        if key in self.by_key:
            seen = self.by_key[key]
            trial.set_user_attr(OUTCOME, _stored(seen))
            trial.set_user_attr(DUPLICATE_OF, seen.number)
            trial.set_constraint("slo", _constraint(seen))
            self.study.tell(trial, _value(seen, self.direction))
        elif key in self.running:  # TPE proposing a point already being simulated: nothing to learn yet
            self.study.tell(trial, state=TrialState.PRUNED)
        elif self.pool is None:
            try:
                judged = self.judge(candidate)
            except BaseException:
                self.study.tell(trial, state=TrialState.FAIL)
                raise
            self.record(trial, candidate, judged)
        else:
            self.in_flight[self.pool.submit(self.judge, candidate)] = (trial, candidate, 1)
            self.running.add(key)

    def collect(self) -> None:
        """The next simulation back from the pool: recorded, or run again when its worker was lost."""
        from optuna.trial import TrialState

        assert self.pool is not None
        task, value = self.pool.next_done()
        trial, candidate, attempts = self.in_flight.pop(task)
        if isinstance(value, TaskLost) and attempts < LOST_SIMULATION_ATTEMPTS:
            self.in_flight[self.pool.submit(self.judge, candidate)] = (trial, candidate, attempts + 1)  # deterministic
            return
        self.running.discard(candidate_key(candidate))
        if isinstance(value, BaseException):
            self.study.tell(trial, state=TrialState.FAIL)
            if isinstance(value, TaskLost):
                raise TuneError(
                    f"a stage-1 simulation was lost {attempts} times on the cluster ({value}); "
                    f"the study is kept: continue with --resume"
                )
            raise value
        self.record(trial, candidate, value)

    def record(self, trial: optuna.trial.Trial, candidate: Candidate, judged: Trial) -> None:
        done = judged.model_copy(update={"number": trial.number})
        trial.set_user_attr(OUTCOME, _stored(done))
        trial.set_constraint("slo", _constraint(done))
        self.study.tell(trial, _value(done, self.direction))
        write_trial_dir(self.directory, done)  # after tell: a dir always means a finished trial
        self.trials.append(done)
        self.by_key[candidate_key(candidate)] = done
        if self.on_trial:
            self.on_trial(done, len(self.by_key), self.budget)

    def abandon(self) -> None:
        """Fail every trial still in flight (their points are queued again on resume) and cancel the pool's tasks."""
        from optuna.trial import TrialState

        for trial, _, _ in self.in_flight.values():
            self.study.tell(trial, state=TrialState.FAIL)
        if self.pool is not None:
            self.pool.cancel_all()


def _constraint(trial: Trial) -> float:
    """optuna's feasibility convention: <= 0 feasible. An invalid configuration is as infeasible as it gets."""
    if not trial.ran or trial.violation is None:
        return 1e6
    return float(trial.violation)
