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

from servelab.atomic import write_text_atomic
from servelab import SCHEMA_VERSION
from servelab.metrics.results import versions
from servelab.schemas.results import checked
from servelab.tune.confirm import BASELINE, Stage2Result
from servelab.schemas.tune import TuneDocument
from servelab.tune.study import StudyTrial
from servelab.renames import upgraded
from servelab.tune.trial import OK, TrialOutcome

TUNE_JSON = "tune.json"
PARETO_X = "output_throughput"
PARETO_Y = "p99_ttft_ms"


def _better_first(score: float, direction: str) -> float:
    return -score if direction == "maximize" else score


def rank(trials: Sequence[StudyTrial], direction: str) -> list[StudyTrial]:
    """Feasible configurations by score; then those that miss the SLO, nearest first; then the ones that cannot run."""

    def key(t: StudyTrial) -> tuple[int, float, int]:
        o = t.outcome
        if o.status != OK or o.score is None:
            return (2, 0.0, t.number)
        if o.feasible:
            return (0, _better_first(o.score, direction), t.number)
        return (1, float(o.violation or 0.0), t.number)

    return sorted(trials, key=key)


def pareto_front(trials: Sequence[StudyTrial]) -> list[StudyTrial]:
    """Configurations no other beats on both throughput (higher) and p99 TTFT (lower), by throughput."""
    points = [
        t for t in trials
        if t.outcome.status == OK and t.outcome.metrics.get(PARETO_X) is not None and t.outcome.metrics.get(PARETO_Y) is not None
    ]

    def dominated(a: TrialOutcome) -> bool:
        ax, ay = a.metrics[PARETO_X], a.metrics[PARETO_Y]
        return any(
            (b.metrics[PARETO_X] >= ax and b.metrics[PARETO_Y] <= ay) and (b.metrics[PARETO_X] > ax or b.metrics[PARETO_Y] < ay)
            for b in (p.outcome for p in points)
        )

    front = [t for t in points if not dominated(t.outcome)]
    return sorted(front, key=lambda t: (-t.outcome.metrics[PARETO_X], t.number))


def pick_for_confirmation(ranked: Sequence[StudyTrial], k: int, baseline_args: str) -> list[StudyTrial]:
    """The best `k` runnable configurations with distinct launch lines other than the baseline's."""
    seen = {baseline_args}
    picked: list[StudyTrial] = []
    for t in ranked:
        if len(picked) == k:
            break
        if t.outcome.status == OK and t.outcome.engine_args not in seen:
            seen.add(t.outcome.engine_args)
            picked.append(t)
    return picked


def gain(best: float | None, baseline: float | None, direction: str) -> float | None:
    """How many times better than the baseline (2.0 = twice the goodput, or half the cost)."""
    if best is None or baseline is None:
        return None
    if direction == "maximize":
        return best / baseline if baseline > 0 else None
    return baseline / best if best > 0 else None


def recommend(
    ranked: Sequence[StudyTrial], baseline: TrialOutcome, stage2: Sequence[Stage2Result], direction: str,
    launch_line: Callable[[str], str] | None = None,
) -> dict[str, Any] | None:
    """The configuration to run, from measurements when there are any, with its gain over the baseline.

    `launch_line` turns a simulated recommendation's flags into the command to paste (SGLang's and
    TensorRT-LLM's, whose flags are their own launch line); without it only stage 2's measured ones carry one."""
    measured = [r for r in stage2 if r.ok and r.measured_score is not None]
    if measured:
        feasible = [r for r in measured if (r.measured_violation or 0) <= 0] or measured
        best = min(feasible, key=lambda r: (_better_first(r.measured_score or 0.0, direction), r.label != BASELINE))
        base = next((r for r in measured if r.label == BASELINE), None)
        return {
            "source": "stage2",
            "label": best.label,
            "params": best.params,
            "engine_args": best.engine_args,
            "launch_line": best.launch_line,
            "score": best.measured_score,
            "slo_met": (best.measured_violation or 0) <= 0,
            "baseline_score": base.measured_score if base else None,
            "gain_over_baseline": gain(best.measured_score, base.measured_score if base else None, direction),
        }
    runnable = [t for t in ranked if t.outcome.status == OK]
    if not runnable:
        return None
    # The current configuration competes too: when nothing in the space beats it, the advice is to keep it.
    best_trial = rank([StudyTrial(-1, baseline), runnable[0]], direction)[0]
    return {
        "source": "stage1",
        "label": BASELINE if best_trial.number < 0 else f"trial-{best_trial.number}",
        "params": best_trial.outcome.params,
        "engine_args": best_trial.outcome.engine_args,
        "launch_line": None if launch_line is None else launch_line(best_trial.outcome.engine_args),
        "score": best_trial.outcome.score,
        "slo_met": best_trial.outcome.feasible,
        "baseline_score": baseline.score,
        "gain_over_baseline": gain(best_trial.outcome.score, baseline.score, direction),
    }


def tune_document(
    *,
    objective: dict[str, Any],
    deployment: dict[str, Any],
    space: dict[str, Any],
    search: dict[str, Any],
    workload: dict[str, Any],
    baseline: TrialOutcome,
    trials: Sequence[StudyTrial],
    direction: str,
    stage2: Sequence[Stage2Result] = (),
    stage2_info: dict[str, Any] | None = None,
    launch_line: Callable[[str], str] | None = None,
) -> dict[str, Any]:
    ranked = rank(trials, direction)
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "tune",
        "created_at": time.time(),
        "versions": versions(),
        "objective": objective,
        "deployment": deployment,
        "space": space,
        "search": search,
        "workload": workload,
        "baseline": baseline.to_dict(),
        "trials": [{"number": t.number, **t.outcome.to_dict()} for t in trials],
        "ranking": [t.number for t in ranked],
        "pareto": {"x": PARETO_X, "y": PARETO_Y, "trials": [t.number for t in pareto_front(trials)]},
        "stage2": None if stage2_info is None else {**stage2_info, "results": [r.to_dict() for r in stage2]},
        "recommendation": recommend(ranked, baseline, stage2, direction, launch_line),
    }


def write_tune_json(directory: Path, document: dict[str, Any]) -> Path:
    path = directory / TUNE_JSON
    write_text_atomic(path, json.dumps(checked(TuneDocument, document), indent=2, default=str) + "\n")
    return path


def read_tune_json(directory: Path) -> dict[str, Any]:
    document: dict[str, Any] = upgraded(json.loads((directory / TUNE_JSON).read_text(encoding="utf-8")), SCHEMA_VERSION)
    return document
