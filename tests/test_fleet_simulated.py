"""A simulated fleet as a measured one is read: which replica served each request, each replica's load and prefix-cache
hits in run.json, diagnose's fleet findings priced with other routes, and the report's per-replica view."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.diagnose.scenario import from_run
from servelab.metrics.results import load_run

runner = CliRunner()

CHATS = (
    "--gpu",
    "a100-80gb",
    "--model",
    "qwen2.5-7b",
    "--replicas",
    "2",
    "--dataset-name",
    "multiturn",
    "--multiturn-turns",
    "4",
    "--prefix-len",
    "512",
    "--num-prefixes",
    "4",
    "--num-prompts",
    "160",
    "--request-rate",
    "8",
)
"""40 chats of 4 turns (1,024-token messages) opening with one of 4 system prompts, on two A100s."""


def _simulate(out: Path, router: str) -> Path:
    result = runner.invoke(app, ["simulate", *CHATS, "--router", router, "--result-dir", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def round_robin(tmp_path_factory) -> Path:
    return _simulate(tmp_path_factory.mktemp("fleet") / "round-robin", "round-robin")


def test_each_replica_s_requests_and_load_are_recorded_as_bench_records_a_real_fleet(round_robin):
    run = load_run(round_robin)
    assert {r.base_url for r in run.records} == {"replica-0", "replica-1"}
    loads = json.loads((round_robin / "run.json").read_text())["server_info"]["replicas"]
    assert [load["url"] for load in loads] == ["replica-0", "replica-1"]
    assert sum(load["requests_served"] for load in loads) == len(run.records) == 160
    for load in loads:
        served = sum(1 for r in run.records if r.base_url == load["url"])
        assert load["requests_served"] == served
        assert 0 < load["prefix_cache_hits"] < load["prefix_cache_queries"]
    summary = json.loads((round_robin / "summary.json").read_text())
    assert set(summary["replicas"]) == {"replica-0", "replica-1"}


def test_a_session_route_keeps_a_chat_s_history_on_its_replica(round_robin, tmp_path):
    def hit_rate(directory: Path) -> float:
        loads = json.loads((directory / "run.json").read_text())["server_info"]["replicas"]
        return sum(x["prefix_cache_hits"] for x in loads) / sum(x["prefix_cache_queries"] for x in loads)

    session = _simulate(tmp_path / "session", "session")
    assert hit_rate(session) > hit_rate(round_robin) + 0.1


def test_a_multiturn_run_replays_each_turn_after_the_previous_one_of_its_chat(round_robin):
    scenario = from_run(load_run(round_robin))
    assert scenario.prefix_len == 512
    assert sum(1 for s in scenario.shapes if s.after is not None) == 120  # every turn but each chat's first
    for i, shape in enumerate(scenario.shapes):
        if shape.after is not None:
            assert shape.after < i and shape.input_len > scenario.shapes[shape.after].input_len
    # a history resent: most of a prompt repeats an earlier one
    assert scenario.mean_shared / scenario.mean_input > 0.6


def test_diagnose_prices_a_cache_aware_route_for_a_fleet_that_scatters_chats(round_robin):
    result = runner.invoke(app, ["diagnose", str(round_robin), "--json"])
    assert result.exit_code == 0, result.output
    findings = {f["kind"]: f for f in json.loads(result.output)["findings"]}
    lost = findings["routing_cache_misses"]
    changes = [r["change"] for r in lost["recommendations"]]
    assert any("--router session" in c for c in changes), changes  # kept only when the simulator says it helps


def test_the_report_shows_each_replica_of_each_fleet(round_robin, tmp_path):
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", str(round_robin), "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert '<section id="replicas">' in page
    table = page.split('<section id="replicas">')[1].split("</section>")[0]
    assert table.count('<th scope="row">replica-') == 2
