"""The one error path: every exception servelab raises derives from ServelabError, and the CLI maps it to an exit code.

A failure nobody raised on purpose (a bug) is exit 1 with its traceback and a
request to report it, never exit 2 ("bad input"): that is what these tests pin.
"""

from __future__ import annotations

import importlib
import json
import inspect
import pkgutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import servelab
from servelab.cli import app
from servelab.cli.exits import BUG_HINT
from servelab.errors import EXIT_BAD_INPUT, EXIT_BUG, EXIT_INTERRUPTED, InputError, ServelabError, ServerFault


def _servelab_exceptions() -> list[type[BaseException]]:
    found = []
    for info in pkgutil.walk_packages(servelab.__path__, "servelab."):
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == info.name:
                found.append(obj)
    return found


def test_every_exception_servelab_defines_is_a_servelab_error():
    classes = _servelab_exceptions()
    assert len(classes) >= 16  # the layers' own classes, found by the walk (not an empty list that passes)
    strays = [f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, ServelabError)]
    assert strays == []


def test_no_servelab_exception_shadows_pydantics_validation_error():
    assert "ValidationError" not in {c.__name__ for c in _servelab_exceptions()}


def test_layer_errors_keep_the_builtin_bases_callers_catch():
    from servelab.metrics.results import ResultsDirError
    from servelab.targets.stream_client import ConnectError, ResetError
    from servelab.workload.errors import WorkloadError

    assert issubclass(WorkloadError, InputError) and issubclass(WorkloadError, ValueError)
    assert issubclass(ConnectError, ServerFault) and issubclass(ConnectError, OSError)
    assert issubclass(ResetError, ConnectionResetError)
    assert issubclass(ResultsDirError, FileNotFoundError) and ResultsDirError.exit_code == EXIT_BAD_INPUT


def test_a_bug_is_reported_as_a_bug_with_its_traceback_not_as_bad_input(monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("some_internal_key")

    monkeypatch.setattr("servelab.diagnose.analysis.diagnose_described", broken)
    result = CliRunner().invoke(app, ["diagnose", "--json"])
    assert result.exit_code == EXIT_BUG, result.output
    assert "Traceback" in result.output and "some_internal_key" in result.output
    assert BUG_HINT in result.output and "error:" not in result.output


def test_ctrl_c_is_exit_130(monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("servelab.diagnose.analysis.diagnose_described", interrupted)
    result = CliRunner().invoke(app, ["diagnose"])
    assert result.exit_code == EXIT_INTERRUPTED and "interrupted" in result.output


@pytest.mark.parametrize(
    "make",
    [
        lambda d: d,  # no run.json
        lambda d: (d / "run.json").write_text("{not json"),
    ],
)
def test_diagnose_of_a_directory_that_is_not_results_is_one_line_exit_2(tmp_path: Path, make):
    make(tmp_path)
    result = CliRunner().invoke(app, ["diagnose", str(tmp_path), "--gpu", "a100-80gb", "--model", "qwen2.5-7b"])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.output.startswith("error: ") and str(tmp_path) in result.output and "Traceback" not in result.output


def test_a_described_deployment_with_no_tokens_is_bad_input_not_a_bug():
    result = CliRunner().invoke(
        app,
        [
            "diagnose",
            "--gpu",
            "a100-80gb",
            "--model",
            "qwen2.5-7b",
            "--input-len",
            "0",
            "--output-len",
            "10",
            "--request-rate",
            "1",
        ],
    )
    assert result.exit_code == EXIT_BAD_INPUT and "--input-len" in result.output, result.output


def test_a_file_servelab_cannot_write_is_one_line_exit_2_naming_it(tmp_path: Path):
    run = tmp_path / "run"
    assert (
        CliRunner()
        .invoke(
            app,
            ["simulate", "--gpu", "a100-80gb", "--model", "qwen2.5-7b", "--num-prompts", "5", "--result-dir", str(run)],
        )
        .exit_code
        == 0
    )
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(app, ["report", str(run), "-o", str(blocker / "report.html")])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.output.startswith("error: ") and str(blocker) in result.output and "Traceback" not in result.output


# -- every bad input: exit 2, one line naming it, nothing written (docs/bad-input.md shows these messages) --

SIM = ["simulate", "--gpu", "a100-80gb", "--model", "qwen2.5-7b", "--num-prompts", "5", "--result-dir", "out"]
DESCRIBED = [
    "diagnose",
    "--gpu",
    "a100-80gb",
    "--model",
    "qwen2.5-7b",
    "--input-len",
    "1500",
    "--output-len",
    "200",
    "--request-rate",
    "10",
]
TUNE = ["tune", "--gpu", "a100-80gb", "--model", "qwen2.5-7b", "--result-dir", "out"]
COMPARE = ["compare", "--gpu", "a100-80gb", "--model", "qwen2.5-7b", "--num-prompts", "5"]
BENCH = ["bench", "--base-url", "http://127.0.0.1:9", "--num-prompts", "5", "--result-dir", "out"]
CALIBRATE = [
    "calibrate",
    "--base-url",
    "http://127.0.0.1:9",
    "--gpu",
    "cpu",
    "--model",
    "qwen2.5-7b",
    "--out",
    "p.json",
]

BAD_INPUTS: list[tuple[str, list[str], str]] = [
    # (input class, argv, the words the one line must hold)
    ("count of zero", [*SIM, "--tp", "0"], "Invalid value for '--tp'"),
    ("negative seed", [*SIM, "--seed", "-1"], "Invalid value for '--seed'"),
    ("zero replicas", [*SIM, "--replicas", "0"], "Invalid value for '--replicas'"),
    (
        "integer overflow",
        [*SIM, "--random-input-len", "99999999999999999999"],
        "Invalid value for '--random-input-len'",
    ),
    ("count beyond the request cap", [*SIM, "--num-prompts", "1000000000000"], "Invalid value for '--num-prompts'"),
    ("prompt of 1e9 tokens", [*SIM, "--random-input-len", "1000000000"], "raise --max-plan-tokens"),
    ("NaN rate", [*SIM, "--request-rate", "nan"], "Invalid value for '--request-rate'"),
    ("infinite warm-up", [*SIM, "--warmup", "inf"], "Invalid value for '--warmup'"),
    ("NaN interval", [*SIM, "--scrape-interval", "nan"], "Invalid value for '--scrape-interval'"),
    ("unbalanced quote", [*SIM, "--engine-args", "--max-num-seqs '8"], "Invalid value for '--engine-args'"),
    ("--max-model-len 0", [*SIM, "--engine-args", "--max-model-len 0"], "--max-model-len"),
    ("block size no kernel takes", [*SIM, "--engine-args", "--block-size 7"], "--block-size 7"),
    (
        "two flags disagree",
        [*SIM, "--engine-args", "--tensor-parallel-size 2", "--tp", "1"],
        "--tp 1 and --tensor-parallel-size 2",
    ),
    (
        "two flags disagree (SGLang)",
        [*SIM, "--engine", "sglang", "--engine-args", "--tp-size 2", "--tp", "1"],
        "--tp 1 and --tp-size 2",
    ),
    ("NaN SLO bound", [*SIM, "--goodput", "ttft:nan"], "invalid --goodput item 'ttft:nan'"),
    (
        "scorer weight not a number",
        [*SIM, "--replicas", "2", "--router", "prefix-aware", "--router-weights", "prefix=2,kv=x"],
        "--router-weights 'prefix=2,kv=x': kv='x' is not a number",
    ),
    ("NaN observation", [*DESCRIBED, "--observed-e2e-ms", "nan"], "Invalid value for '--observed-e2e-ms'"),
    ("share above 1", [*DESCRIBED, "--slo-attainment", "5"], "Invalid value for '--slo-attainment'"),
    ("fraction above 1", [*DESCRIBED, "--observed-gpu-util", "1.5"], "Invalid value for '--observed-gpu-util'"),
    (
        "NaN spread",
        [*DESCRIBED, "--output-len-distribution", "lognormal:nan"],
        "--output-len-distribution 'lognormal:nan'",
    ),
    (
        "prompt longer than the model's context",
        [
            "diagnose",
            "--gpu",
            "a100-80gb",
            "--model",
            "qwen2.5-7b",
            "--input-len",
            "1000000000",
            "--output-len",
            "100",
            "--request-rate",
            "1",
        ],
        "exceed the deployment's max_model_len 32,768",
    ),
    ("pasted [--flag]", [*DESCRIBED, "[--check-advice]"], "square brackets"),
    ("tune's own count", [*TUNE, "--sim-prompts", "0"], "Invalid value for '--sim-prompts'"),
    ("percentile above 100", [*TUNE, "--slo-percentile", "101"], "Invalid value for '--slo-percentile'"),
    ("quote in --sim-args", [*TUNE, "--sim-args", "'"], "Invalid value for '--sim-args'"),
    ("port out of range", [*TUNE, "--server-port", "70000"], "Invalid value for '--server-port'"),
    ("compare's --tp", [*COMPARE, "--tp", "0"], "Invalid value for '--tp'"),
    ("quote in --vllm-args", [*COMPARE, "--vllm-args", '"'], "Invalid value for '--vllm-args'"),
    ("zero workers", [*BENCH, "--workers", "0"], "Invalid value for '--workers'"),
    ("share above 1 (bench)", [*BENCH, "--abandon-share", "2"], "Invalid value for '--abandon-share'"),
    ("negative timeout", [*BENCH, "--request-timeout", "-1"], "Invalid value for '--request-timeout'"),
    ("NaN budget", [*CALIBRATE, "--budget", "nan"], "Invalid value for '--budget'"),
    ("report into a directory", ["report", ".", "-o", "."], "is a directory"),
]


@pytest.mark.parametrize(
    "argv, words", [(argv, words) for _, argv, words in BAD_INPUTS], ids=[name for name, _, _ in BAD_INPUTS]
)
def test_each_bad_input_is_one_line_naming_it_exit_2_and_nothing_written(tmp_path: Path, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], result.output
    assert list(tmp_path.iterdir()) == []


# -- no silent overwrite --


def _simulate(directory: Path, *extra: str):
    return CliRunner().invoke(
        app,
        [
            "simulate",
            "--gpu",
            "a100-80gb",
            "--model",
            "qwen2.5-7b",
            "--num-prompts",
            "5",
            "--result-dir",
            str(directory),
            *extra,
        ],
    )


def test_a_results_directory_holding_a_run_is_refused_and_left_as_it_was(tmp_path: Path):
    run = tmp_path / "run"
    assert _simulate(run, "--report").exit_code == 0
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    result = _simulate(run, "--seed", "7")
    assert result.exit_code == EXIT_BAD_INPUT and "already holds a run; pass --overwrite" in result.output, (
        result.output
    )
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_overwrite_empties_the_directory_first_so_no_stale_report_is_left(tmp_path: Path):
    run = tmp_path / "run"
    assert _simulate(run, "--report").exit_code == 0
    assert (run / "report.html").exists()
    result = _simulate(run, "--seed", "7", "--overwrite")
    assert result.exit_code == 0, result.output
    assert not (run / "report.html").exists()
    assert json.loads((run / "run.json").read_text())["flags"]["seed"] == 7


def test_overwrite_never_clears_a_directory_of_other_files(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("mine")
    result = _simulate(tmp_path, "--overwrite")
    assert result.exit_code == EXIT_BAD_INPUT and "not a servelab result (notes.txt)" in result.output, result.output
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_overwrite_never_deletes_a_file_servelab_did_not_write(tmp_path: Path):
    run = tmp_path / "run"
    assert _simulate(run).exit_code == 0
    (run / "my-notes.txt").write_text("mine")
    result = _simulate(run, "--overwrite")
    assert result.exit_code == EXIT_BAD_INPUT and "not servelab's (my-notes.txt)" in result.output, result.output
    assert (run / "my-notes.txt").read_text() == "mine" and (run / "run.json").exists()


def test_overwrite_never_empties_the_working_directory(tmp_path: Path, monkeypatch):
    assert _simulate(tmp_path).exit_code == 0
    monkeypatch.chdir(tmp_path)
    result = _simulate(Path("."), "--overwrite")
    assert result.exit_code == EXIT_BAD_INPUT and "the directory you are working in" in result.output, result.output
    assert (tmp_path / "run.json").exists()


def test_tune_refuses_a_runs_directory_before_any_trial(tmp_path: Path):
    run = tmp_path / "run"
    assert _simulate(run).exit_code == 0
    result = CliRunner().invoke(
        app, ["tune", "--gpu", "a100-80gb", "--model", "qwen2.5-7b", "--n-trials", "2", "--result-dir", str(run)]
    )
    assert result.exit_code == EXIT_BAD_INPUT and "already holds a run" in result.output, result.output
    assert sorted(p.name for p in run.iterdir()) == ["records.jsonl", "run.json", "summary.json", "timeline.jsonl"]


def test_compare_result_dir_holds_its_json_and_is_not_overwritten(tmp_path: Path):
    out = tmp_path / "cmp"
    argv = [
        "compare",
        "--gpu",
        "a100-80gb",
        "--model",
        "qwen2.5-7b",
        "--num-prompts",
        "5",
        "--engines",
        "vllm,sglang",
        "--result-dir",
        str(out),
    ]
    assert CliRunner().invoke(app, argv).exit_code == 0
    assert json.loads((out / "compare.json").read_text())["kind"] == "servelab.compare"
    again = CliRunner().invoke(app, argv)
    assert again.exit_code == EXIT_BAD_INPUT and "already holds a comparison" in again.output, again.output


def test_a_report_that_fails_to_land_leaves_no_temporary_file(tmp_path: Path, monkeypatch):
    run = tmp_path / "run"
    assert _simulate(run).exit_code == 0

    def full_disk(self: Path, target: Path) -> Path:
        raise OSError(28, "No space left on device", str(target))

    monkeypatch.setattr(Path, "replace", full_disk)
    result = CliRunner().invoke(app, ["report", str(run), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert not list(tmp_path.glob("*.tmp")) and not (tmp_path / "r.html").exists()


# -- a bound on the work --


def test_a_slow_open_loop_writes_a_few_timeline_samples_not_one_per_simulated_second(tmp_path: Path):
    result = _simulate(tmp_path / "run", "--request-rate", "1e-9", "--num-prompts", "3")
    assert result.exit_code == 0, result.output
    samples = (tmp_path / "run" / "timeline.jsonl").read_text().splitlines()
    assert 3 <= len(samples) <= 30  # ~3e9 simulated seconds at 1 s: every idle gap kept as its first and last sample


def test_the_plan_limit_is_the_flag_the_message_names(tmp_path: Path):
    refused = _simulate(tmp_path / "a", "--random-input-len", "20000", "--max-plan-tokens", "80000")
    assert refused.exit_code == EXIT_BAD_INPUT and "over the 80,000 one run may plan" in refused.output, refused.output
    assert not (tmp_path / "a").exists()
    assert _simulate(tmp_path / "b", "--random-input-len", "20000", "--max-plan-tokens", "120000").exit_code == 0


# -- what a run says about itself --


def test_an_overloaded_simulation_says_so_and_a_healthy_one_does_not(tmp_path: Path):
    heavy = _simulate(
        tmp_path / "heavy",
        "--random-input-len",
        "1500",
        "--random-output-len",
        "400",
        "--request-rate",
        "30",
        "--num-prompts",
        "300",
    )
    assert heavy.exit_code == 0 and "OVERLOADED: 30 req/s offered" in heavy.output, heavy.output
    assert any("OVERLOADED" in w for w in json.loads((tmp_path / "heavy" / "summary.json").read_text())["warnings"])
    light = _simulate(tmp_path / "light", "--request-rate", "2", "--num-prompts", "20")
    assert light.exit_code == 0 and "OVERLOADED" not in light.output


def test_a_simulated_run_whose_every_request_exceeds_the_context_exits_2_with_the_reason(tmp_path: Path):
    result = _simulate(tmp_path / "run", "--random-input-len", "40000")
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert (
        result.output.strip()
        .splitlines()[-1]
        .startswith(
            "error: every request failed (http_400 5), so nothing was measured; the server's first error: 40000 prompt"
        )
    )
    assert (tmp_path / "run" / "records.jsonl").read_text().count("\n") == 5  # the records stay


def test_equal_peaks_are_ranked_as_ties():
    from servelab.compare.compare import ranking_line

    assert ranking_line([("vLLM", 1657.2), ("SGLang", 1656.9), ("TensorRT-LLM", 900.0)]) == (
        "vLLM 1,657 tok/s = SGLang 1,657 tok/s > TensorRT-LLM 900 tok/s: vLLM peaks 1.84x TensorRT-LLM"
    )
    assert ranking_line([("vLLM", 1657.2), ("SGLang", 1656.9)]) == "vLLM 1,657 tok/s = SGLang 1,657 tok/s"


def test_diagnose_of_a_simulated_run_reads_its_deployment_from_run_json(tmp_path: Path):
    run = tmp_path / "run"
    assert _simulate(run, "--engine-args", "--max-num-seqs 64").exit_code == 0
    result = CliRunner().invoke(app, ["diagnose", str(run), "--json"])
    assert result.exit_code == 0, result.output
    deployment = json.loads(result.output)["deployment"]
    assert "A100" in json.dumps(deployment) and "64" in json.dumps(deployment)
