"""diagnose on SGLang and TensorRT-LLM deployments (simulated runs): the engine is picked from run.json, advice is in
that engine's flags, and --compare-engines gives `servelab compare`'s numbers for the same deployment and load."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import servelab
from typer.testing import CliRunner

from servelab.cli import app
from servelab.targets.engine_terms import Terms, served_engine
from servelab.diagnose.evidence import gather
from servelab.diagnose.scenario import simulate, synthetic
from servelab.schemas.diagnosis import Diagnosis
from servelab.schemas.results import EngineIdentity, ServerInfo
from servelab.compare.compare import EngineComparison
from servelab.metrics.scrape import parse_metrics
from servelab.metrics.timeline import TimelineSample
from servelab.perf import sglang_args, trtllm_args
from servelab.sim.engines import VLLM
from servelab.targets.deployment import VLLM_FLAGS, VLLM_SWITCHES
from servelab.targets.engine_deployment import build_engine_deployment

runner = CliRunner()
H100 = ["--gpu", "h100-sxm", "--model", "llama-3.1-8b"]
LOAD = ["--random-input-len", "600", "--random-output-len", "40", "--num-prompts", "60", "--request-rate", "20"]
# A batch cap far below what the load needs: a queue forms, so the finding and its what-ifs name the cap's flag.
CAPPED = {"sglang": "--max-running-requests 4", "trtllm": "--max_batch_size 4"}
VLLM_ONLY = ("vllm serve", "--api-server-count", "--vllm-version", "--async-scheduling", "cache_config_info", "vllm:")


def _vllm_only_flags(table) -> set[str]:
    """vLLM's flags that the other engine does not spell the same way (both have --quantization, for one)."""
    theirs = {name.replace("_", "-") for name in (*table.modelled, *table.aliases)}
    ours = {
        *VLLM_FLAGS.values(),
        *(f"--{s}" for s in VLLM_SWITCHES.values()),
        *(f"--no-{s}" for s in VLLM_SWITCHES.values()),
    }
    return {flag for flag in ours if flag.removeprefix("--").removeprefix("no-") not in theirs}


def _simulated(tmp_path: Path, engine: str) -> Path:
    out = tmp_path / engine
    result = runner.invoke(
        app, ["simulate", *H100, "--engine", engine, "--engine-args", CAPPED[engine], *LOAD, "--result-dir", str(out)]
    )
    assert result.exit_code == 0, result.output
    return out


def _advice_text(doc: dict) -> str:
    """Everything a diagnosis tells the user to do or reads as evidence (not the deployment's own description)."""
    return json.dumps([doc["findings"], doc["alternatives"], doc["notes"]])


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "flag"), [("sglang", []), ("trtllm", ["--engine", "trtllm"])])
def test_diagnose_picks_the_recorded_engine_and_advises_in_its_flags(tmp_path: Path, engine: str, flag: list[str]):
    """SGLang by auto (run.json's flags.engine), TensorRT-LLM named: either way the advice is that engine's."""
    results = _simulated(tmp_path, engine)
    result = runner.invoke(
        app, ["diagnose", str(results), *H100, *flag, "--engine-args", CAPPED[engine], "--price-options", "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    dx = Diagnosis.model_validate(doc)
    assert dx.deployment.engine == engine
    cap = CAPPED[engine].split()[0]
    assert dx.findings[0].title.startswith(cap)  # max_num_seqs_bound, in the engine's word for the cap
    changes = [r for f in dx.findings for r in f.recommendations]
    assert changes and all(r.engine_args is None or cap in r.engine_args for r in changes)
    assert any(f"raise {cap} to" in r.change for r in changes)
    launch = {"sglang": "python -m sglang.launch_server", "trtllm": "trtllm-serve MODEL"}[engine]
    assert all(launch in r.confirm for r in changes if r.engine_args is not None)
    text = _advice_text(doc)
    table = {"sglang": sglang_args.FLAGS, "trtllm": trtllm_args.FLAGS}[engine]
    named = {flag for flag in _vllm_only_flags(table) if re.search(re.escape(flag) + r"(?![\w-])", text)}
    assert not named, f"vLLM's flags offered for {engine}: {named}"
    assert not [word for word in VLLM_ONLY if word in text]
    assert (
        servelab.diagnosis(results, "h100-sxm", "llama-3.1-8b", CAPPED[engine]).deployment.engine == engine
    )  # the API too


@pytest.mark.slow
def test_an_explicit_engine_wins_over_the_record_with_a_warning_naming_both(tmp_path: Path):
    results = _simulated(tmp_path, "sglang")
    result = runner.invoke(
        app, ["diagnose", str(results), *H100, "--engine", "trtllm", "--engine-args", CAPPED["trtllm"], "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["deployment"]["engine"] == "trtllm"
    warning = next(n for n in doc["notes"] if n.startswith("--engine trtllm"))
    assert "sglang" in warning and "trtllm" in warning
    assert "--engine trtllm but run.json records" in result.stderr


@pytest.mark.slow
def test_compare_engines_gives_servelab_compares_numbers_for_the_same_deployment_and_load(tmp_path: Path):
    results = _simulated(tmp_path, "sglang")
    result = runner.invoke(
        app, ["diagnose", str(results), *H100, "--engine-args", CAPPED["sglang"], "--compare-engines", "--json"]
    )
    assert result.exit_code == 0, result.output
    section = Diagnosis.model_validate_json(result.stdout).engine_comparison
    assert section is not None and section.current == "sglang"
    compared = runner.invoke(
        app, ["compare", *H100, *LOAD, "--sglang-args", CAPPED["sglang"], "--engines", "sglang,vllm,trtllm", "--json"]
    )
    assert compared.exit_code == 0, compared.output
    expected = EngineComparison.model_validate_json(compared.stdout)
    assert [e.engine for e in section.comparison.engines] == ["sglang", "vllm", "trtllm"]
    for ours, theirs in zip(section.comparison.engines, expected.engines):
        assert ours.memory == theirs.memory
        assert ours.launch_flags == theirs.launch_flags
        assert ours.points[0].model_dump(exclude={"label"}) == theirs.points[0].model_dump(exclude={"label"})
    assert section.comparison.ranking == expected.ranking
    assert [v.split(" instead of ")[0] for v in section.verdicts] == ["vLLM", "TensorRT-LLM"]
    markdown = runner.invoke(
        app,
        [
            "diagnose",
            str(results),
            *H100,
            "--engine-args",
            CAPPED["sglang"],
            "--compare-engines",
            "--engines",
            "sglang,trtllm",
            "--markdown",
            "--report",
        ],
    )
    assert markdown.exit_code == 0, markdown.output
    assert "Other engines at this load" in markdown.stdout and "TensorRT-LLM instead of SGLang" in markdown.stdout
    assert "vLLM instead of" not in markdown.stdout
    page = (results / "report.html").read_text()  # the HTML view of the same section, from diagnosis.json
    assert '<table class="engines">' in page and "TensorRT-LLM instead of SGLang" in page


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--engine", "tgi"], "--engine 'tgi': choose one of vllm, sglang, trtllm or auto"),
        (
            ["--engine", "sglang", "--vllm-version", "0.11.0"],
            "--vllm-version describes a vLLM server, not --engine sglang",
        ),
        (["--compare-engines", "--engines", "vllm,tgi"], "--engines 'vllm,tgi': give a comma-separated subset"),
        (["--engines", "vllm"], "--engines chooses the engines --compare-engines runs"),
        (["--engine", "sglang", "--check-advice"], "--check-advice judges vLLM's common tuning tips"),
    ],
)
def test_bad_engine_flags_are_one_clear_error_before_anything_runs(tmp_path: Path, flags: list[str], message: str):
    save = tmp_path / "diagnosis.json"
    result = runner.invoke(
        app,
        [
            "diagnose",
            *H100,
            "--input-len",
            "600",
            "--output-len",
            "40",
            "--request-rate",
            "2",
            *flags,
            "--save",
            str(save),
        ],
    )
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split())
    assert not save.exists()


def test_a_burst_run_says_how_requests_arrived_not_concurrency_none(tmp_path: Path):
    out = tmp_path / "burst"
    result = runner.invoke(
        app,
        [
            "simulate",
            *H100,
            "--random-input-len",
            "200",
            "--random-output-len",
            "20",
            "--num-prompts",
            "20",
            "--result-dir",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    shown = runner.invoke(app, ["diagnose", str(out), *H100, "--markdown"])
    assert shown.exit_code == 0, shown.output
    assert "concurrency None" not in shown.stdout
    assert "every request sent at once" in shown.stdout.splitlines()[2]


@pytest.mark.parametrize(
    ("engine", "flags", "changes"),
    [
        (
            "sglang",
            "--max-running-requests 64 --schedule-policy lpm --disable-radix-cache",
            dict(max_num_seqs=256, enable_prefix_caching=True, kv_cache_dtype="fp8", tensor_parallel_size=2),
        ),
        ("trtllm", "--max_batch_size=64 --max_num_tokens 4096", dict(max_num_seqs=128, max_num_batched_tokens=2048)),
    ],
)
def test_a_what_if_is_the_users_launch_line_with_the_engines_flag_set(engine: str, flags: str, changes: dict):
    """What a recommendation prints is what it simulated: its flags, read back by the engine's parser, give the same
    deployment; the flag the user gave is replaced, not repeated."""
    base = build_engine_deployment(engine, "h100-sxm", "llama-3.1-8b", flags)
    changed = base.with_changes(**changes)
    line = changed.engine_args()
    again = build_engine_deployment(engine, "h100-sxm", "llama-3.1-8b", line)
    assert (
        again.config == changed.config
        and again.memory == changed.memory
        and again.engine_settings == changed.engine_settings
    )
    cap = {"sglang": "--max-running-requests", "trtllm": "--max_batch_size"}[engine]
    assert line.count(cap) == 1 and changed.config.max_num_seqs == changes["max_num_seqs"]


def test_a_trtllm_option_only_its_yaml_takes_is_printed_for_that_file():
    base = build_engine_deployment("trtllm", "h100-sxm", "llama-3.1-8b", "--max_batch_size 64")
    changed = base.with_changes(capacity_scheduler_policy="MAX_UTILIZATION", enable_prefix_caching=False)
    assert changed.engine_settings["capacity_scheduler_policy"] == "MAX_UTILIZATION"
    assert changed.engine_args() == (
        "--max_batch_size 64 (in the --extra_llm_api_options YAML: "
        "scheduler_config.capacity_scheduler_policy: MAX_UTILIZATION, "
        "kv_cache_config.enable_block_reuse: false)"
    )


@pytest.mark.parametrize(("engine", "running", "kv"), [("sglang", 20, 0.4), ("trtllm", 16, 0.45)])
def test_a_measured_runs_engine_comes_from_the_server_and_its_gauges_reach_the_evidence(
    engine: str, running: int, kv: float
):
    """A bench run of SGLang or TensorRT-LLM: run.json names the engine the server reported, and its /metrics,
    mapped onto the timeline's common names at scrape time, are what the evidence reads."""
    deployment = build_engine_deployment(engine, "h100-sxm", "llama-3.1-8b")
    run = simulate(deployment, synthetic(600, 40, request_rate=2, num_requests=20))
    scraped = parse_metrics((Path(__file__).parent / "fixtures" / "engine_metrics" / f"{engine}.prom").read_text())
    run.timeline = [TimelineSample(t, dict(scraped)) for t in (0.0, 1.0)]
    identity = EngineIdentity(name=engine, version="x", reported_by="GET /version")
    run.run_info = run.run_info.with_keys(source="http", server_info=ServerInfo(engine=identity))
    assert served_engine("auto", run.run_info) == (engine, None)
    e = gather(run)
    assert (e.mean_running, e.max_kv_usage) == (running, pytest.approx(kv))


def test_sglang_decode_batches_above_its_captured_graphs_are_launch_bound_and_the_fix_captures_them():
    """SGLang on a 40 GB A100 captures decode batches up to 32 (its memory-bucket default): at 64 concurrent chats the
    steps run eagerly, and the what-if raises --cuda-graph-max-bs in SGLang's own launch line."""
    from servelab.diagnose import findings as fk
    from servelab.diagnose.analysis import diagnose_described

    d = build_engine_deployment("sglang", "a100-40gb", "qwen2.5-7b")
    dx = diagnose_described(d, synthetic(128, 256, max_concurrency=64))
    found = {f.kind: f for f in dx.findings}
    assert fk.LAUNCH_BOUND in found, [(f.kind, round(f.score, 2)) for f in dx.findings]
    assert "--cuda-graph-max-bs 32" in found[fk.LAUNCH_BOUND].evidence[0]
    rec = found[fk.LAUNCH_BOUND].recommendations[0]
    assert "--cuda-graph-max-bs 64" in rec.change and "--cuda-graph-max-bs 64" in (rec.engine_args or "")
    assert "--enforce-eager" not in json.dumps([f.model_dump() for f in dx.findings])


def test_a_restart_line_puts_the_environment_before_the_launcher():
    """`restart the server with ...` must run as pasted: a shell reads NAME=VALUE only before the command."""
    assert (
        Terms(VLLM).launch_command("VLLM_MXFP4_USE_MARLIN=1 --max-num-seqs 64")
        == "VLLM_MXFP4_USE_MARLIN=1 vllm serve MODEL --max-num-seqs 64"
    )
    assert Terms(VLLM).launch_command("--max-num-seqs 64") == "vllm serve MODEL --max-num-seqs 64"
