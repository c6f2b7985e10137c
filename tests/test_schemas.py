"""The published JSON Schemas (docs/schemas) are the models' own, and every file servelab writes validates against them.

The files come from real runs in this test (simulate, a sweep, diagnose of a run and of a described deployment,
tune's stage 1, a profile) checked with a JSON Schema validator; bench, calibrate, validate and tune's stage 2
against the real vLLM are checked where their tests already produce them (test_bench_vllm.py,
test_calibrate_vllm.py, test_tune_vllm.py, test_faults_vllm.py), compare's file in test_compare.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rich.console import Console

from servelab.cli import app
from servelab.cli.schema import SCHEMAS, schema_text
from servelab.metrics.results import load_run
from servelab.schemas.results import Summary
from servelab.perf.calibration import load_profile
from servelab.report.terminal import summary_table
from support.profiles import tiny_profile
from support.schemas import SCHEMA_DIR, assert_files_match_schemas

SIM = ["--gpu", "a100-80gb", "--model", "qwen2.5-7b", "--random-input-len", "256", "--random-output-len", "32"]


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_published_schema_is_the_models(name: str) -> None:
    published = SCHEMA_DIR / f"{name}.json"
    assert published.is_file(), "regenerate: servelab schema --write docs/schemas"
    assert published.read_text() == schema_text(name), (
        "docs/schemas is stale: run `servelab schema --write docs/schemas`"
    )


def test_schema_command_prints_the_published_schema_and_refuses_an_unknown_name() -> None:
    assert cli("schema", "summary") == (SCHEMA_DIR / "summary.json").read_text()
    result = CliRunner().invoke(app, ["schema", "nope"])
    assert result.exit_code == 2 and "run, record, summary" in result.output


def test_every_file_simulate_diagnose_tune_and_a_profile_write_validates(tmp_path: Path) -> None:
    run, sweep, tune = tmp_path / "run", tmp_path / "sweep", tmp_path / "tune"
    slo = "--goodput ttft:200 --goodput tpot:50".split()
    cli("simulate", *SIM, "--num-prompts", "40", "--request-rate", "8", *slo, "--result-dir", str(run))
    cli("simulate", *SIM, "--num-prompts", "20", "--sweep", "max-concurrency=1,4", "--result-dir", str(sweep))
    cli("diagnose", str(run), "--gpu", "a100-80gb", "--model", "qwen2.5-7b", *slo, "--check-advice")
    described = tmp_path / "described.json"
    load = "--input-len 500 --output-len 50 --request-rate 2".split()
    cli("diagnose", "--gpu", "a100-80gb", "--model", "qwen2.5-7b", *load, "--save", str(described))
    search = "--space max-num-seqs=32,64 --n-trials 2 --sim-prompts 30 --request-rate 4".split()
    cli("tune", *SIM, *search, "--goodput", "ttft:500", "--goodput", "tpot:50", "--result-dir", str(tune), "--json")
    profile = tiny_profile(tmp_path / "profile")

    seen = assert_files_match_schemas(tmp_path, {described: "diagnosis", profile: "profile"})
    assert seen == {
        "run": 3,
        "summary": 3,
        "record": 3,
        "timeline": 3,
        "sweep": 1,
        "diagnosis": 2,
        "tune": 1,
        "trial": 2,
        "profile": 1,
    }, seen


BEFORE = Path(__file__).parent / "data" / "results-before-schemas"
"""A sweep (two points) and a diagnosis written by servelab at main 319f98e, before the models existed
(`simulate ... --sweep max-concurrency=2,4`, then `diagnose` of one point)."""


def test_a_results_directory_from_before_the_models_validates_and_opens(tmp_path: Path) -> None:
    assert assert_files_match_schemas(BEFORE) == {
        "sweep": 1,
        "run": 2,
        "summary": 2,
        "record": 2,
        "timeline": 2,
        "diagnosis": 1,
    }
    point = BEFORE / "max-concurrency=4"
    assert load_run(point).summary["completed"] == 12
    diagnosed = json.loads(
        cli(
            "diagnose",
            str(point),
            "--gpu",
            "a100-80gb",
            "--model",
            "qwen2.5-7b",
            "--json",
            "--save",
            str(tmp_path / "diagnosis.json"),
        )
    )
    assert diagnosed["findings"] and diagnosed["workload"]["requests"] == 12
    cli("report", str(BEFORE), "-o", str(tmp_path / "report.html"))
    assert (tmp_path / "report.html").stat().st_size > 0


def test_a_schema_2_profile_validates_and_loads(tmp_path: Path) -> None:
    """Calibration profiles of schema 2 (no host conditions, no reference step) are still read, and still valid."""
    path = tiny_profile(tmp_path)
    data = json.loads(path.read_text())
    old = {k: v for k, v in data.items() if k not in ("host", "reference")} | {"schema_version": 2}
    path.write_text(json.dumps(old))
    assert assert_files_match_schemas(tmp_path / "none", {path: "profile"}) == {"profile": 1}
    profile = load_profile(path)
    assert profile.schema_version == 2 and profile.reference is None and profile.host == {}


SCHEMA_1 = Path(__file__).parent / "data" / "results-schema-1"
"""Written by servelab at main d375cc9, before the statistics took vLLM's names (see its README.md): a simulated
sweep with a diagnosis (--check-advice), a bench of the real vLLM server, a validate report (the trimmed one of
support/synthetic_results, so not checked against the schema), a profile and a tune study's tune.json and trials."""


def test_a_results_directory_of_schema_1_validates_opens_reports_and_diagnoses(tmp_path: Path) -> None:
    assert assert_files_match_schemas(SCHEMA_1, {SCHEMA_1 / "profile.json": "profile"}) == {
        "sweep": 1,
        "run": 3,
        "summary": 3,
        "record": 3,
        "timeline": 3,
        "diagnosis": 1,
        "profile": 1,
        "tune": 1,
        "trial": 2,
    }
    stats = load_run(SCHEMA_1 / "bench").summary["client_stats"]
    assert stats["p99_schedule_lag_ms"] is not None and stats["added_delay"]["median_ms"] is not None
    assert "schedule_lag_p99_ms" not in stats
    typed = Summary.model_validate(load_run(SCHEMA_1 / "bench").summary).client_stats
    assert typed is not None and typed.added_delay is not None and typed.startup_wave is not None
    assert (
        typed.added_delay.median_ms == stats["added_delay"]["median_ms"] and typed.startup_wave.median_send_lag_ms > 0
    )
    console = Console(record=True, width=120)
    console.print(summary_table(Summary.model_validate(load_run(SCHEMA_1 / "bench").summary)))
    rows = {
        cells[1].strip(): cells[2].strip()
        for line in console.export_text().splitlines()
        if len(cells := line.split("│")) == 4
    }
    assert (
        rows["Client send lag p99 (ms)"] == f"{typed.p99_schedule_lag_ms:.2f}"
        and rows["Client CPU (share of a core)"] == "5%"
    )

    diagnosed = json.loads(
        cli(
            "diagnose",
            str(SCHEMA_1 / "bench"),
            "--calibration",
            str(SCHEMA_1 / "profile.json"),
            "--json",
            "--save",
            str(tmp_path / "diagnosis.json"),
        )
    )
    assert diagnosed["evidence"]["median_ttft_ms"] > 0 and diagnosed["workload"]["requests"] == 8
    cli("report", str(SCHEMA_1 / "sweep"), str(SCHEMA_1 / "validation.json"), "-o", str(tmp_path / "report.html"))
    html = (tmp_path / "report.html").read_text()
    assert "TTFT p50 (ms)" in html and "max_num_seqs" in html
    cli("report", str(SCHEMA_1 / "tune"), "-o", str(tmp_path / "tune.html"))
    study = json.loads((SCHEMA_1 / "tune" / "tune.json").read_text())
    html = (tmp_path / "tune.html").read_text()
    assert (
        "Ranking (simulated)" in html
        and f"{study['search']['evaluated']} of {study['search']['space_size']} configurations" in html
    )
    assert load_profile(SCHEMA_1 / "profile.json").schema_version == 3


def test_a_schema_3_profile_has_its_probe_figures_renamed_on_reading_and_a_schema_4_one_is_read_as_written(
    tmp_path: Path,
) -> None:
    data = json.loads((SCHEMA_1 / "profile.json").read_text())
    assert data["schema_version"] == 3
    old = {"ttft_p50_ms": 5.0, "tpot_p50_ms": None, "output_throughput": 80.0}
    data["simulated_probes"] = [
        {"probe": "prefill-256", "kind": "prefill", "measured": old, "simulated": old, "error_pct": old}
    ]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    renamed = {"median_ttft_ms": 5.0, "median_tpot_ms": None, "output_throughput": 80.0}
    assert load_profile(path).simulated_probes[0]["measured"] == renamed
    path.write_text(json.dumps(data | {"schema_version": 4}))
    assert load_profile(path).simulated_probes[0]["measured"] == old  # only older versions are renamed
