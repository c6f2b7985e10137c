"""tune over a fleet: the router is a knob beside the replica count, applied to the simulated fleet and named in the
recommendation (it is not an engine flag, so the engine's launch line cannot carry it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.schemas.tune import TuneDocument
from servelab.tune.errors import TuneError
from servelab.tune.space import SearchSpace

runner = CliRunner()


def test_a_chat_fleet_is_cheapest_behind_a_route_that_keeps_each_chat_on_its_replica(tmp_path: Path) -> None:
    out = tmp_path / "tune"
    result = runner.invoke(
        app,
        [
            "tune",
            "--gpu",
            "l4",
            "--model",
            "qwen2.5-7b",
            "--engine-args",
            "--max-model-len 8192",
            "--space",
            "data_parallel_size=2",
            "--space",
            "router=round-robin,session",
            "--objective",
            "cost",
            "--gpu-cost-per-hour",
            "0.8",
            "--goodput",
            "ttft:2000",
            "--dataset-name",
            "multiturn",
            "--multiturn-turns",
            "4",
            "--prefix-len",
            "512",
            "--num-prefixes",
            "4",
            "--random-input-len",
            "512",
            "--random-output-len",
            "128",
            "--request-rate",
            "4",
            "--num-prompts",
            "120",
            "--result-dir",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = TuneDocument.model_validate(json.loads((out / "tune.json").read_text()))
    scores = {t.params["router"]: t.score for t in doc.trials}
    assert scores["session"] < scores["round-robin"]  # $/Mtok: the chat's history is prefilled once, not again
    assert doc.recommendation is not None and doc.recommendation.params["router"] == "session"
    assert "--data-parallel-size 2 behind the session router" in " ".join(result.output.split())


def test_a_router_the_simulator_does_not_have_is_refused_before_any_trial() -> None:
    with pytest.raises(TuneError, match="router"):
        SearchSpace.from_items(["router=nearest"])


def test_a_recommendation_names_the_gpu_and_router_its_engine_flags_cannot_carry() -> None:
    from servelab.schemas.tune import Recommendation

    def recommended(params: dict) -> Recommendation:
        return Recommendation(
            source="stage1",
            label="trial-3",
            params=params,
            engine_args="--tensor-parallel-size 2",
            launch_line=None,
            score=0.2,
            slo_met=True,
            baseline_score=0.4,
            gain_over_baseline=0.5,
        )

    assert recommended({"gpu": "B200", "router": "session"}).placement() == " on B200 behind the session router"
    assert recommended({"tensor_parallel_size": 2}).placement() == ""
