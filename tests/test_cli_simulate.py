"""`servelab simulate` through the real command line: bench's flags and results format, on the simulator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app, main
from servelab.flags.options import spread_goodput_values
from servelab.metrics.results import RECORDS, RUN, SUMMARY, SWEEP, TIMELINE, load_run

runner = CliRunner()
A100 = ["--gpu", "a100-80gb", "--model", "qwen2.5-7b"]
SMALL = ["--random-input-len", "512", "--random-output-len", "32", "--num-prompts", "40"]


def simulate(*args: str):
    return runner.invoke(app, ["simulate", *args])


def test_a_run_writes_bench_format_with_the_deployment(tmp_path: Path):
    out = tmp_path / "run"
    result = simulate(*A100, *SMALL, "--request-rate", "4", "--goodput", "ttft:500 tpot:50", "--result-dir", str(out))
    assert result.exit_code == 0, result.output
    assert {RUN, RECORDS, TIMELINE, SUMMARY} <= {p.name for p in out.iterdir()}
    run = load_run(out)
    info = json.loads((out / RUN).read_text())
    assert info["source"] == "sim" and info["verb"] == "simulate"
    assert info["deployment"]["gpu"] == "A100-80GB-SXM" and info["deployment"]["num_gpu_blocks"] > 0
    assert info["server_info"]["simulated"]
    assert len(run.records) == 40 and all(r.ok for r in run.records)
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["completed"] == 40 and summary["request_goodput"] > 0
    assert "Simulated serving result" in result.output


def test_a_sweep_saturates_and_writes_sweep_json(tmp_path: Path):
    out = tmp_path / "sweep"
    result = simulate(*A100, *SMALL, "--sweep", "max-concurrency=1,4,32", "--result-dir", str(out), "--json")
    assert result.exit_code == 0, result.output
    index = json.loads((out / SWEEP).read_text())
    assert [p["summary"]["completed"] for p in index["points"]] == [40, 40, 40]
    thr = [p["summary"]["output_throughput"] for p in index["points"]]
    assert thr[0] < thr[1] < thr[2]
    tpot = [p["summary"]["mean_tpot_ms"] for p in index["points"]]
    assert tpot[0] < tpot[2]  # bigger batches: each step slower
    for point in index["points"]:
        info = json.loads((out / point["directory"] / RUN).read_text())
        assert info["source"] == "sim" and info["sweep_point"] == {"max-concurrency": point["max-concurrency"]}
    assert json.loads(result.stdout[result.stdout.index("{") :]) == index


def test_the_same_seed_gives_the_same_files_and_another_seed_does_not(tmp_path: Path):
    args = [*A100, *SMALL, "--request-rate", "8", "--tp", "2", "--replicas", "2", "--router", "least-loaded"]
    dirs = []
    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        dirs.append(tmp_path / name)
        assert simulate(*args, "--seed", seed, "--result-dir", str(dirs[-1])).exit_code == 0
    same = [(dirs[0] / f).read_text() == (dirs[1] / f).read_text() for f in (RECORDS, TIMELINE, SUMMARY)]
    assert same == [True, True, True]
    assert (dirs[0] / RECORDS).read_text() != (dirs[2] / RECORDS).read_text()
    deployment = json.loads((dirs[0] / RUN).read_text())["deployment"]["engine_config"]
    assert deployment["tensor_parallel_size"] == 2 and deployment["data_parallel_size"] == 2


def test_an_obsolete_flag_is_reported_and_the_run_goes_on(tmp_path: Path):
    result = simulate(
        *A100, *SMALL, "--engine-args", "--use-v2-block-manager --max-num-seqs 16", "--result-dir", str(tmp_path / "r")
    )
    assert result.exit_code == 0, result.output
    assert "warning" in result.output and "--use-v2-block-manager" in result.output and "obsolete" in result.output
    info = json.loads((tmp_path / "r" / RUN).read_text())
    assert info["deployment"]["engine_config"]["max_num_seqs"] == 16
    assert any("--use-v2-block-manager" in w for w in info["deployment"]["warnings"])


def test_the_served_vllm_release_sets_the_defaults_the_run_uses(tmp_path: Path):
    result = simulate(*A100, *SMALL, "--vllm-version", "0.11.0", "--result-dir", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    deployment = json.loads((tmp_path / "r" / RUN).read_text())["deployment"]
    assert deployment["vllm_version"] == "0.11"
    assert deployment["engine_config"]["async_scheduling"] is False
    assert deployment["engine_config"]["gpu_memory_utilization"] == 0.9


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--gpu", "tpu-v9", "--model", "qwen2.5-7b"], ["tpu-v9"]),
        (["--gpu", "a100-80gb", "--model", "mixtral-8x7b"], ["mixtral-8x7b"]),
        (["--gpu", "a10g", "--model", "qwen2.5-72b"], ["does not fit"]),
        (["--gpu", "a100-80gb", "--model", "qwen2.5-7b", "--engine-args", "--bogus-flag 3"], ["--bogus-flag"]),
        (["--gpu", "a100-80gb", "--model", "qwen2.5-7b", "--router", "sticky"], ["--router"]),
        (["--model", "qwen2.5-7b"], ["--gpu"]),
        (["--calibration", "no-such-profile.json"], ["no-such-profile.json"]),
        ([*A100, "--num-prompts", "5", "--duration", "3"], ["--num-prompts", "--duration"]),
        ([*A100, "--sweep", "prompts=1,2"], ["--sweep"]),
        ([*A100, "--vllm-version", "0.4.3"], ["0.4.3", "0.5"]),
    ],
)
def test_bad_input_is_one_clear_error_with_exit_code_2(tmp_path: Path, args, named):
    out = tmp_path / "never"
    result = simulate(*args, "--result-dir", str(out))
    assert result.exit_code == 2, result.output
    for word in named:
        assert word in result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_an_moe_config_is_refused(tmp_path: Path):
    model = tmp_path / "moe"
    model.mkdir()
    config = {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "torch_dtype": "bfloat16",
    }
    (model / "config.json").write_text(json.dumps(config))
    result = simulate("--gpu", "h100-sxm", "--model", str(model), "--result-dir", str(tmp_path / "never"))
    assert result.exit_code == 2, result.output
    assert "not supported" in result.output.lower() or "moe" in result.output.lower()


def test_goodput_takes_several_values_after_one_flag_as_vllm_does(tmp_path):
    out = tmp_path / "sim"
    argv = [
        "simulate",
        *A100,
        *SMALL,
        "--request-rate",
        "4",
        "--goodput",
        "ttft:500",
        "tpot:50",
        "--result-dir",
        str(out),
    ]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    assert json.loads((out / "run.json").read_text())["flags"]["goodput"] == ["ttft:500", "tpot:50"]
    assert spread_goodput_values(["--goodput", "ttft:5", "RESULTS:dir", "--goodput", "e2el:9 x"]) == [
        "--goodput",
        "ttft:5",
        "RESULTS:dir",
        "--goodput",
        "e2el:9 x",
    ]


@pytest.mark.parametrize("verb", ["bench", "simulate", "tune"])
def test_every_shared_load_flag_is_offered_by_each_verb_that_takes_load(verb):
    from dataclasses import fields

    from servelab.flags.options import LoadFlags

    result = CliRunner().invoke(app, [verb, "--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0
    flags = [f.name.replace("_", "-") for f in fields(LoadFlags)]
    assert len(flags) == 28 and [f for f in flags if f"--{f}" not in result.output] == []


SHARED_DEPLOYMENT_FLAGS = {
    "simulate": ("gpu", "model", "engine_args", "tp", "replicas", "router", "gpu_file", "calibration", "vllm_version"),
    "diagnose": ("gpu", "model", "engine_args", "tp", "replicas", "gpu_file", "calibration", "vllm_version", "goodput"),
    "tune": ("gpu", "model", "engine_args", "calibration", "goodput"),
    "calibrate": ("gpu", "model", "engine_args", "base_url", "served_model", "api_key"),
    "validate": ("calibration", "engine_args", "base_url", "served_model", "api_key"),
    "bench": ("api_key", "goodput"),  # its --base-url repeats (replicas)
}


def test_deployment_server_and_slo_flags_are_one_declaration_in_every_verb():
    """Each shared flag (servelab.flags.options) reads the same in every verb that takes it: same option name, help,
    type, environment variable and help panel, whether the verb needs it (calibrate's --gpu) or not (simulate's)."""
    import typer.main

    group = typer.main.get_command(app)
    commands = {
        verb: group.get_command(None, verb) for verb in SHARED_DEPLOYMENT_FLAGS
    }  # built on demand (servelab.cli.VERBS)
    seen: dict[str, tuple] = {}
    for verb, names in SHARED_DEPLOYMENT_FLAGS.items():
        params = {p.name: p for p in commands[verb].params}
        for name in names:
            p = params[name]
            shape = (tuple(p.opts), p.help, p.type_descriptor.annotation, p.envvar, p.multiple, p.rich_help_panel)
            assert seen.setdefault(name, shape) == shape, (verb, name)
    assert commands["calibrate"].params[[p.name for p in commands["calibrate"].params].index("gpu")].required
