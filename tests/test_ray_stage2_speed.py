"""benchmarks/ray_stage2_speed.py says whether the sequential and the Ray stage 2 rank the candidates alike; the
ranking it compares is checked here on hand-made results (no server, no cluster)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from support.benchmark_script import load_benchmark


@pytest.fixture(scope="module")
def speed() -> ModuleType:
    return load_benchmark("ray_stage2_speed")


def result(label: str, score: float | None, violation: float | None = 0.0) -> dict[str, Any]:
    return {"label": label, "measured_score": score, "measured_violation": violation}


def test_higher_goodput_ranks_first(speed: ModuleType) -> None:
    results = [result("baseline", 1.9), result("trial-1", 1.95), result("trial-2", 1.8)]
    assert speed.ranking(results) == ["trial-1", "baseline", "trial-2"]


def test_a_trial_within_the_slo_beats_a_higher_score_that_misses_it(speed: ModuleType) -> None:
    results = [result("trial-1", 3.0, violation=0.2), result("trial-2", 1.0)]
    assert speed.ranking(results) == ["trial-2", "trial-1"]


def test_the_baseline_loses_a_tie_and_an_unmeasured_trial_comes_last(speed: ModuleType) -> None:
    results = [result("baseline", 2.0), result("trial-3", None, violation=None), result("trial-1", 2.0)]
    assert speed.ranking(results) == ["trial-1", "baseline", "trial-3"]


def test_only_pairs_both_runs_separate_are_compared(speed: ModuleType) -> None:
    one = [result("baseline", 1.0), result("trial-1", 2.0), result("trial-2", 2.02)]
    other = [result("baseline", 1.1), result("trial-1", 1.98), result("trial-2", 2.0)]
    assert speed.separated_pairs(one, other) == (2, 2)  # trial-1 vs trial-2 is a tie in both
    flipped = [result("baseline", 2.5), result("trial-1", 2.0), result("trial-2", 2.02)]
    assert speed.separated_pairs(one, flipped) == (2, 0)
