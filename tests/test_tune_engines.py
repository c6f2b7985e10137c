"""tune --engine sglang|trtllm on the simulator: each engine's knobs in its own launch line, the same score when that
line is simulated again, stage 2's template filled with the engine's flags, and the refusals before any trial."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

from servelab.cli import app
from servelab.perf.sglang_args import parse_sglang_args
from servelab.perf.trtllm_args import parse_trtllm_args
from servelab.targets.engine_deployment import EngineDeployment
from servelab.tune import tuner
from servelab.tune.confirm import Stage2Config, predict
from servelab.tune.engine_lines import engine_line, launch_line
from servelab.tune.objectives import key_metrics
from servelab.tune.outcome import read_tune_json
from servelab.schemas.tune import Stage2Row, TuneDocument
from support.profiles import tiny_profile

DEPLOYMENT = ["--gpu", "h100-sxm", "--model", "llama-3.1-8b"]
LOAD = ["--random-input-len", "512", "--random-output-len", "32", "--max-concurrency", "64", "--goodput", "ttft:2000"]
SIM_PROMPTS = "40"
SCHEMA_1_TUNE = Path(__file__).parent / "data" / "results-schema-1" / "tune"


def _cli(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})


def _tune(*args: str) -> Result:
    return _cli("tune", *DEPLOYMENT, *LOAD, "--objective", "throughput", "--sim-prompts", SIM_PROMPTS, *args)


def _study(*args: str) -> dict[str, Any]:
    result = _tune(*args, "--json")
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def _resimulated(engine: str, engine_args: str) -> float:
    """The trial's flags run by `simulate --engine`: the objective (output tok/s of the same workload) again."""
    result = _cli(
        "simulate",
        "--engine",
        engine,
        *DEPLOYMENT,
        "--engine-args",
        engine_args,
        *LOAD,
        "--num-prompts",
        SIM_PROMPTS,
        "--json",
    )
    assert result.exit_code == 0, result.output
    return float(json.loads(result.stdout)["output_throughput"])


@pytest.mark.slow
def test_an_sglang_study_writes_sglang_lines_that_simulate_to_the_same_score(tmp_path: Path) -> None:
    doc = _study(
        "--engine",
        "sglang",
        "--engine-args",
        "--max-running-requests 8 --chunked-prefill-size 2048",
        "--space",
        "max_running_requests=default,16,64",
        "--space",
        "schedule_policy",
        "--space",
        "chunked-prefill-size=default,-1",
        "--result-dir",
        str(tmp_path / "study"),
    )
    assert doc["deployment"]["engine"] == "sglang" and len(doc["trials"]) == 3 * 2 * 2
    for trial in doc["trials"]:
        parsed = parse_sglang_args(trial["engine_args"])
        assert not parsed.warnings, trial["engine_args"]
        params = trial["params"]
        assert parsed.settings.max_running_requests == params["max_running_requests"]
        assert parsed.settings.schedule_policy == params["schedule_policy"]
        assert parsed.settings.chunked_prefill_size == params["chunked_prefill_size"]
    best = next(t for t in doc["trials"] if t["number"] == doc["ranking"][0])
    assert best["status"] == "ok"
    assert _resimulated("sglang", best["engine_args"]) == pytest.approx(best["score"], rel=1e-12)
    recommended = doc["recommendation"]
    assert recommended["launch_line"] == launch_line("sglang", recommended["engine_args"], "Llama-3.1-8B")
    assert recommended["launch_line"].startswith("python -m sglang.launch_server --model-path Llama-3.1-8B")


@pytest.mark.slow
def test_a_tensorrt_llm_study_writes_flags_and_its_own_options_yaml(tmp_path: Path) -> None:
    """The capacity policy only the YAML sets goes into a YAML of the candidate's own (the user's, with the knob
    written in); a flag the user's YAML also sets is taken out of it, since the YAML would override the flag."""
    user = tmp_path / "llm_api.yaml"
    user.write_text("max_batch_size: 512\nkv_cache_config:\n  enable_block_reuse: false\n")
    doc = _study(
        "--engine",
        "trtllm",
        "--engine-args",
        f"--extra_llm_api_options {user}",
        "--space",
        "max_batch_size=16,64",
        "--space",
        "capacity_scheduler_policy",
        "--space",
        "enable_chunked_prefill",
        "--result-dir",
        str(tmp_path / "study"),
    )
    assert doc["deployment"]["engine"] == "trtllm" and len(doc["trials"]) == 8
    for trial in doc["trials"]:
        parsed = parse_trtllm_args(trial["engine_args"])
        assert not parsed.warnings, trial["engine_args"]
        params, settings = trial["params"], parsed.settings
        assert (settings.max_batch_size, settings.capacity_scheduler_policy, settings.enable_chunked_prefill) == (
            params["max_batch_size"],
            params["capacity_scheduler_policy"],
            params["enable_chunked_prefill"],
        )
        assert settings.enable_block_reuse is False  # the rest of the user's YAML still holds
    best = next(t for t in doc["trials"] if t["number"] == doc["ranking"][0])
    assert _resimulated("trtllm", best["engine_args"]) == pytest.approx(best["score"], rel=1e-12)
    assert doc["recommendation"]["launch_line"].startswith("trtllm-serve Llama-3.1-8B ")
    assert yaml.safe_load(user.read_text())["max_batch_size"] == 512  # the user's file is never written


def test_engine_line_edits_only_what_it_must(tmp_path: Path) -> None:
    line = "python -m sglang.launch_server --model-path m --tp 2 --max-running-requests=8 --frobnicate 3"
    assert engine_line("sglang", line, {"tp_size": 4, "max_running_requests": None}, None) == (
        "python -m sglang.launch_server --model-path m --frobnicate 3 --tp-size 4"
    )
    assert engine_line("trtllm", "m --enable_chunked_prefill", {"enable_chunked_prefill": False}, None) == "m"
    user = tmp_path / "u.yaml"
    user.write_text("scheduler_config:\n  capacity_scheduler_policy: MAX_UTILIZATION\n")
    same = engine_line(
        "trtllm", f"m --extra_llm_api_options {user}", {"capacity_scheduler_policy": "MAX_UTILIZATION"}, None
    )
    assert same == f"m --extra_llm_api_options {user}"  # nothing to change: the user's own file
    assert engine_line("trtllm", f"m --extra_llm_api_options {user}", {"capacity_scheduler_policy": None}, None) == "m"
    own = engine_line("trtllm", "m", {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT"}, tmp_path / "o")
    assert own == engine_line("trtllm", "m", {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT"}, tmp_path / "o")
    assert parse_trtllm_args(own).settings.capacity_scheduler_policy == "GUARANTEED_NO_EVICT"
    assert len(list((tmp_path / "o").iterdir())) == 1


def test_stage2_fills_the_template_with_the_engines_own_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang cannot run here: stage 2's servers are replaced, and what they would be started with is checked."""
    seen: list[tuple[Stage2Config, list[str]]] = []

    def start_nothing(configs, command, workload, objective, directory, *, on_result, **_):  # noqa: ANN001, ANN202
        for config in configs:
            seen.append((config, command.argv(config.engine_args, 30000)))
            predicted, score, violation = predict(config, workload, objective)
            on_result(
                Stage2Row(
                    label=config.label,
                    params=config.params,
                    engine_args=config.engine_args,
                    launch_line=command.launch_line(config.engine_args),
                    predicted=key_metrics(predicted),
                    predicted_score=score,
                    predicted_violation=violation,
                    measured=key_metrics(predicted),
                    measured_score=score,
                    measured_violation=violation,
                    startup_s=1.0,
                    bench_s=1.0,
                )
            )

    monkeypatch.setattr(tuner, "confirm", start_nothing)
    template = "python -m sglang.launch_server --model-path /models/llama {engine_args}"
    result = _tune(
        "--engine",
        "sglang",
        "--space",
        "max_running_requests=16,64",
        "--top-k",
        "2",
        "--num-prompts",
        "40",
        "--server-cmd",
        template,
        "--result-dir",
        str(tmp_path / "study"),
    )
    assert result.exit_code == 0, result.output
    assert [c.label for c, _ in seen][0] == "baseline" and len(seen) == 3
    for config, argv in seen[1:]:
        assert isinstance(config.deployment, EngineDeployment) and config.deployment.engine == "sglang"
        assert config.deployment.config.max_num_seqs == config.params["max_running_requests"]
        assert argv[:5] == ["python", "-m", "sglang.launch_server", "--model-path", "/models/llama"]
        assert argv[-4:] == ["--host", "127.0.0.1", "--port", "30000"]
        parsed = parse_sglang_args(argv)
        assert parsed.settings.max_running_requests == config.params["max_running_requests"] and not parsed.warnings
    recommended = read_tune_json(tmp_path / "study").recommendation
    assert recommended is not None and recommended.source == "stage2"
    assert (recommended.launch_line or "").startswith(template.split(" {")[0])


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (
            ["--engine", "sglang", "--space", "max_num_seqs=8"],
            ["max_num_seqs", "--engine sglang", "max_running_requests"],
        ),
        (["--engine", "sglang", "--space", "mem_fraction_static=0.8,1.5"], ["1.5", "mem_fraction_static", "(0, 1]"]),
        (["--engine", "sglang", "--space", "schedule_policy=lof"], ["lof", "fcfs, lpm"]),
        (["--engine", "trtllm", "--space", "capacity_scheduler_policy=STATIC_BATCH"], ["STATIC_BATCH"]),
        (["--engine", "trtllm", "--space", "tp_size=default"], ["tp_size", "TensorRT-LLM default"]),
        (["--engine", "tgi"], ["--engine", "tgi"]),
        (["--engine", "tgi", "--space", "max_batch_size=8"], ["--engine", "tgi"]),
    ],
)
def test_bad_engine_spaces_are_refused_before_any_trial(tmp_path: Path, args: list[str], named: list[str]) -> None:
    out = tmp_path / "never"
    result = _tune(*args, "--result-dir", str(out))
    assert result.exit_code == 2, result.output
    assert all(word in result.output for word in named), result.output
    assert "Traceback" not in result.output and not out.exists()


def test_a_calibration_profile_is_vllms(tmp_path: Path) -> None:
    out = tmp_path / "never"
    result = _cli(
        "tune", "--engine", "trtllm", "--calibration", str(tiny_profile(tmp_path)), *LOAD, "--result-dir", str(out)
    )
    assert result.exit_code == 2 and "--engine trtllm" in result.output and "calibration" in result.output, (
        result.output
    )
    assert not out.exists()


def test_resuming_with_another_engine_is_one_error(tmp_path: Path) -> None:
    out = tmp_path / "study"
    assert _tune("--space", "max_num_seqs=8,16", "--result-dir", str(out)).exit_code == 0
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    other = _tune("--engine", "sglang", "--space", "max_running_requests=8,16", "--result-dir", str(out), "--resume")
    assert other.exit_code == 2, other.output
    assert "searched --engine vllm, not --engine sglang" in other.output, other.output
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before  # nothing ran, nothing written


def test_engine_vllm_is_the_study_tune_always_ran(tmp_path: Path) -> None:
    """The golden study of tests/data/results-schema-1 (written before tune took --engine) again, with --engine vllm;
    that file reads as vLLM's."""
    result = _cli(
        "tune",
        "--engine",
        "vllm",
        "--gpu",
        "a100-80gb",
        "--model",
        "qwen2.5-7b",
        "--space",
        "max_num_seqs=8,64",
        "--sim-prompts",
        "30",
        "--random-input-len",
        "256",
        "--random-output-len",
        "32",
        "--request-rate",
        "4",
        "--goodput",
        "ttft:500",
        "--goodput",
        "tpot:50",
        "--result-dir",
        str(tmp_path / "study"),
        "--json",
    )
    assert result.exit_code == 0, result.output
    now, golden = json.loads(result.stdout), read_tune_json(SCHEMA_1_TUNE).model_dump(mode="json")
    same = ("params", "engine_args", "status", "score", "violation", "feasible", "rate", "engine_config")

    def as_golden(trial: dict[str, Any], golden_trial: dict[str, Any]) -> dict[str, Any]:
        """The trial's fields the golden file has (EngineConfig fields added since, at their defaults, left out)."""
        config = {k: trial["engine_config"][k] for k in golden_trial["engine_config"]}
        return {k: config if k == "engine_config" else trial[k] for k in same}

    assert [as_golden(t, g) for t, g in zip(now["trials"], golden["trials"], strict=True)] == [
        {k: g[k] for k in same} for g in golden["trials"]
    ]
    assert as_golden(now["baseline"], golden["baseline"]) == {k: golden["baseline"][k] for k in same}
    assert (now["ranking"], now["recommendation"]) == (golden["ranking"], golden["recommendation"])
    assert "engine" not in golden["deployment"]
    assert TuneDocument.model_validate(golden).deployment.engine == "vllm" and now["deployment"]["engine"] == "vllm"
