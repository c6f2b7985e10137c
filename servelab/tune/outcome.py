"""From evaluated trials to an answer: ranking, Pareto front, recommendation, and tune.json.

tune.json is the one file a later `report` reads, so its layout is a schema
(versioned with SCHEMA_VERSION, documented in docs/tune.md). A measured
stage-2 result outranks any prediction: when stage 2 ran, the recommendation
is its best measured configuration; otherwise it is the simulator's best.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from servelab import SCHEMA_VERSION
from servelab.atomic import write_text_atomic
from servelab.renames import upgraded
from servelab.schemas.results import Versions
from servelab.schemas.tune import (
    KeyMetrics,
    ObjectiveInfo,
    Pareto,
    Recommendation,
    SearchInfo,
    Stage2,
    Stage2Row,
    Trial,
    TuneDeployment,
    TuneDocument,
    TuneWorkloads,
)
from servelab.schemas.vocabulary import Direction, RecommendationSource
from servelab.schemas.tune import BASELINE

TUNE_JSON = "tune.json"
PARETO_X = "output_throughput"
PARETO_Y = "p99_ttft_ms"


def _better_first(score: float, direction: str) -> float:
    return -score if direction == Direction.MAXIMIZE else score


def rank(trials: Sequence[Trial], direction: str) -> list[Trial]:
    """Feasible configurations by score; then those that miss the SLO, nearest first; then the ones that cannot run."""

    def key(t: Trial) -> tuple[int, float, int]:
        number = -1 if t.number is None else t.number
        if not t.ran or t.score is None:
            return (2, 0.0, number)
        if t.feasible:
            return (0, _better_first(t.score, direction), number)
        return (1, float(t.violation or 0.0), number)

    return sorted(trials, key=key)


def _pareto_point(metrics: KeyMetrics) -> tuple[float, float] | None:
    x, y = metrics.statistic(PARETO_X), metrics.statistic(PARETO_Y)
    return None if x is None or y is None else (x, y)


def pareto_front(trials: Sequence[Trial]) -> list[Trial]:
    """Configurations no other beats on both throughput (higher) and p99 TTFT (lower), by throughput."""
    points = [(t, p) for t in trials if t.ran and (p := _pareto_point(t.metrics)) is not None]

    def dominated(a: tuple[float, float]) -> bool:
        return any(bx >= a[0] and by <= a[1] and (bx > a[0] or by < a[1]) for _, (bx, by) in points)

    front = [(t, p) for t, p in points if not dominated(p)]
    return [t for t, _ in sorted(front, key=lambda tp: (-tp[1][0], tp[0].number or 0))]


def pick_for_confirmation(ranked: Sequence[Trial], k: int, baseline_args: str) -> list[Trial]:
    """The best `k` runnable configurations with distinct launch lines other than the baseline's."""
    seen = {baseline_args}
    picked: list[Trial] = []
    for t in ranked:
        if len(picked) == k:
            break
        if t.ran and t.engine_args not in seen:
            seen.add(t.engine_args)
            picked.append(t)
    return picked


def gain(best: float | None, baseline: float | None, direction: str) -> float | None:
    """How many times better than the baseline (2.0 = twice the goodput, or half the cost)."""
    if best is None or baseline is None:
        return None
    if direction == Direction.MAXIMIZE:
        return best / baseline if baseline > 0 else None
    return baseline / best if best > 0 else None


def recommend(
    ranked: Sequence[Trial],
    baseline: Trial,
    stage2: Sequence[Stage2Row],
    direction: str,
    launch_line: Callable[[str], str] | None = None,
) -> Recommendation | None:
    """The configuration to run, from measurements when there are any, with its gain over the baseline.

    `launch_line` turns a simulated recommendation's flags into the command to paste (SGLang's and
    TensorRT-LLM's, whose flags are their own launch line); without it only stage 2's measured ones carry one."""
    measured = [r for r in stage2 if r.ok and r.measured_score is not None]
    if measured:
        return _measured_best(measured, direction)
    runnable = [t for t in ranked if t.ran]
    if not runnable:
        return None
    # The current configuration competes too: when nothing in the space beats it, the advice is to keep it.
    best = rank([baseline, runnable[0]], direction)[0]
    return Recommendation(
        source=RecommendationSource.STAGE1,
        label=BASELINE if best.number is None else f"trial-{best.number}",
        params=best.params,
        engine_args=best.engine_args,
        launch_line=None if launch_line is None else launch_line(best.engine_args),
        score=best.score,
        slo_met=best.feasible,
        baseline_score=baseline.score,
        gain_over_baseline=gain(best.score, baseline.score, direction),
    )


def _measured_best(measured: Sequence[Stage2Row], direction: str) -> Recommendation:
    """Stage 2's best measured configuration (one that held the SLO, if any did), against the measured baseline."""
    feasible = [r for r in measured if (r.measured_violation or 0) <= 0] or measured
    best = min(feasible, key=lambda r: (_better_first(r.measured_score or 0.0, direction), r.label != BASELINE))
    base = next((r.measured_score for r in measured if r.label == BASELINE), None)
    return Recommendation(
        source=RecommendationSource.STAGE2,
        label=best.label,
        params=best.params,
        engine_args=best.engine_args,
        launch_line=best.launch_line,
        score=best.measured_score,
        slo_met=(best.measured_violation or 0) <= 0,
        baseline_score=base,
        gain_over_baseline=gain(best.measured_score, base, direction),
    )


def tune_document(
    *,
    objective: ObjectiveInfo,
    deployment: TuneDeployment,
    space: dict[str, list[Any]],
    search: SearchInfo,
    workload: TuneWorkloads,
    baseline: Trial,
    trials: Sequence[Trial],
    stage2: Stage2 | None = None,
    launch_line: Callable[[str], str] | None = None,
) -> TuneDocument:
    """tune.json: the study so far, ranked, with its Pareto front and its recommendation."""
    ranked = rank(trials, objective.direction)
    return TuneDocument(
        schema_version=SCHEMA_VERSION,
        kind="tune",
        created_at=time.time(),
        versions=Versions.installed(),
        objective=objective,
        deployment=deployment,
        space=space,
        search=search,
        workload=workload,
        baseline=baseline,
        trials=list(trials),
        ranking=[t.number for t in ranked if t.number is not None],
        pareto=Pareto(x=PARETO_X, y=PARETO_Y, trials=[t.number for t in pareto_front(trials) if t.number is not None]),
        stage2=stage2,
        recommendation=recommend(ranked, baseline, stage2.results if stage2 else [], objective.direction, launch_line),
    )


def document_text(document: TuneDocument) -> str:
    """tune.json's text (also what `tune --json` prints)."""
    return json.dumps(document.model_dump(), indent=2, default=str)


def write_tune_json(directory: Path, document: TuneDocument) -> Path:
    path = directory / TUNE_JSON
    write_text_atomic(path, document_text(document) + "\n")
    return path


def read_tune_json(directory: Path) -> TuneDocument:
    """A study's tune.json, as this release names its statistics (older files are read through servelab.renames)."""
    data = upgraded(json.loads((directory / TUNE_JSON).read_text(encoding="utf-8")), SCHEMA_VERSION)
    return TuneDocument.model_validate(data)
