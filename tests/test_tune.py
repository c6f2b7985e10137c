"""tune: search space, objectives, the goodput rate search, ranking, the resumable study, server command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from servelab.cli import app
from servelab.targets.profile import deployment_from_profile
from servelab.metrics.slo import SLO
from servelab.perf.calibration import load_profile
from servelab.targets.deployment import build_deployment
from servelab.tune import tuner
from servelab import SCHEMA_VERSION
from servelab.renames import STATISTICS_RENAMED, upgraded
from servelab.schemas.tune import KeyMetrics, Stage2Row, Trial
from servelab.schemas.vocabulary import TrialStatus
from servelab.tune.confirm import (
    LIVE_SERVER,
    STAGE2_DIR,
    ServerCommand,
    Stage2Config,
    confirm,
    predict,
    read_result,
    reap_orphaned_server,
    write_result,
)
from servelab.tune.errors import TuneError
from servelab.tune.objectives import Objective, evaluate, key_metrics, max_goodput_rate
from servelab.tune.outcome import document_text, gain, pareto_front, pick_for_confirmation, rank, read_tune_json
from servelab.tune.space import SearchSpace, apply, candidate_key
from servelab.tune.study import DUPLICATE_OF, SearchSettings, open_study, run_search
from servelab.tune.trial import SimJudge
from servelab.tune.workload import TuneWorkload
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount
from support.profiles import tiny_profile
from support.schemas import assert_files_match_schemas

TTFT_500 = SLO.parse("ttft:500")


def _summary(**overrides: float) -> dict:
    base = {
        "completed": 100,
        "failed": 0,
        "p99_ttft_ms": 100.0,
        "p99_tpot_ms": 10.0,
        "p99_e2el_ms": 1000.0,
        "request_goodput": 5.0,
        "output_throughput": 1000.0,
    }
    return base | overrides


# -- space ----------------------------------------------------------------


def test_space_parses_typed_values_defaults_and_builtins() -> None:
    space = SearchSpace.from_items(
        ["max-num-seqs=default,8,32", "enable_prefix_caching=true,false", "replicas=1,2", "max_num_batched_tokens"]
    )
    assert space.dimensions["max_num_seqs"] == (None, 8, 32)
    assert space.dimensions["enable_prefix_caching"] == (True, False)
    assert space.dimensions["data_parallel_size"] == (1, 2)
    assert space.dimensions["max_num_batched_tokens"][0] is None  # built-ins start at vLLM's default
    assert space.size == 3 * 2 * 2 * len(space.dimensions["max_num_batched_tokens"])
    assert len({candidate_key(c) for c in space.grid()}) == space.size


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["max_num_sequences=8"], "unknown knob"),
        (["max_num_seqs=8,lots"], "bad value 'lots' for max_num_seqs"),
        (["max_num_seqs=0"], "positive"),
        (["enable_prefix_caching=default"], "no vLLM default"),
        (["max_num_seqs=8,8"], "twice"),
        (["gpu"], "no built-in candidates"),
        (["gpu=h100-sxm,tpu-v9"], "bad value 'tpu-v9' for gpu"),
    ],
)
def test_space_rejects_bad_input_before_any_trial(items: list[str], message: str) -> None:
    with pytest.raises(TuneError, match=message):
        SearchSpace.from_items(items)


def test_space_file(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text("max_num_seqs: [default, 64]\nkv_cache_dtype: [auto, fp8]\ngpu: [H100-SXM, a100-80gb-sxm]\n")
    space = SearchSpace.from_file(path)
    assert space.describe() == {
        "max_num_seqs": [None, 64],
        "kv_cache_dtype": ["auto", "fp8"],
        "gpu": ["H100-SXM", "A100-80GB-SXM"],
    }


def test_candidate_default_removes_the_flag_and_gpu_changes_hardware() -> None:
    base = build_deployment("H100-SXM", "Llama-3.1-8B", "--max-num-seqs 64")
    assert "--max-num-seqs" not in apply(base, {"max_num_seqs": None}).engine_args()
    moved = apply(base, {"gpu": "A100-80GB-SXM", "tensor_parallel_size": 2})
    assert moved.hardware.name == "A100-80GB-SXM" and moved.config.tensor_parallel_size == 2
    assert moved.config.max_num_seqs == 64


# -- objectives -----------------------------------------------------------


def test_violation_is_zero_when_every_bound_holds_at_the_percentile() -> None:
    goal = Objective("goodput", SLO.parse("ttft:200 tpot:20"))
    assert goal.violation(_summary()) == 0
    assert goal.violation(_summary(p99_ttft_ms=300.0)) == pytest.approx(0.5)
    assert goal.violation(_summary(failed=5)) == pytest.approx(5 / 105 - 0.01)


def test_objective_needs_what_it_measures() -> None:
    with pytest.raises(TuneError, match="needs an SLO"):
        Objective("goodput", None)
    with pytest.raises(TuneError, match="--request-rate"):
        Objective("cost", TTFT_500, gpu_cost_per_hour={"*": 2.0})
    with pytest.raises(TuneError, match="prices"):
        Objective("cost", TTFT_500, target_rate=5.0)
    with pytest.raises(TuneError, match="unknown objective"):
        Objective("latency", TTFT_500)  # type: ignore[arg-type]


def test_cost_per_million_output_tokens() -> None:
    goal = Objective("cost", TTFT_500, target_rate=1.0, gpu_cost_per_hour={"H100-SXM": 3.6, "*": 1.0})
    # 2 GPUs x $3.6/h at 1,000 output tok/s: $7.2 per 3.6 M tokens = $2/Mtok.
    assert goal.score_point(_summary(), "H100-SXM", 2) == pytest.approx(2.0)
    assert goal.score_point(_summary(), "L4", 1) == pytest.approx(1.0 / 3.6)


def _threshold_runner(limit: float, calls: list[float]):
    def run_at(rate: float) -> dict:
        calls.append(rate)
        return _summary(p99_ttft_ms=100.0 if rate <= limit else 900.0)

    return run_at


@pytest.mark.parametrize("limit", [0.7, 3.3, 47.0])
def test_goodput_search_brackets_the_highest_rate_that_holds(limit: float) -> None:
    goal = Objective("goodput", TTFT_500, rate_tolerance=0.02)
    calls: list[float] = []
    result = max_goodput_rate(_threshold_runner(limit, calls), goal, capacity=50.0)
    assert result.feasible and result.rate == result.score
    assert limit / 1.02 <= result.score <= limit
    assert len(calls) <= 16


def test_goodput_search_is_capped_by_capacity_and_reports_zero_when_nothing_holds() -> None:
    goal = Objective("goodput", TTFT_500)
    assert max_goodput_rate(_threshold_runner(1e9, []), goal, capacity=12.0).score == 12.0
    nothing = max_goodput_rate(_threshold_runner(0.0, []), goal, capacity=12.0)
    assert nothing.score == 0.0 and not nothing.feasible


def _cpu_workload(n: int = 120, concurrency: int | None = 32) -> TuneWorkload:
    return TuneWorkload(
        WorkloadConfig(input_len=256, output_len=32), ArrivalConfig(max_concurrency=concurrency), Amount(num_prompts=n)
    )


def _cpu_judge(tiny_config: Path, objective: Objective, n: int = 120) -> SimJudge:
    line = "--max-model-len 4096 --max-num-seqs 2"
    sim = build_deployment("cpu", tiny_config, line + " --block-size 128 --kv-cache-memory-bytes 1G")
    return SimJudge(sim, build_deployment("cpu", tiny_config, line), _cpu_workload(n), objective)


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2's config.json alone: the simulator needs the shape, not the weights."""
    directory = tmp_path_factory.mktemp("tiny-config")
    (directory / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen2ForCausalLM"],
                "model_type": "qwen2",
                "hidden_size": 128,
                "intermediate_size": 352,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "num_hidden_layers": 2,
                "vocab_size": 4096,
                "max_position_embeddings": 8192,
                "tie_word_embeddings": True,
                "torch_dtype": "bfloat16",
            }
        )
    )
    return directory


def test_simulated_goodput_ranks_batch_size_on_the_cpu_model(tiny_config: Path) -> None:
    judge = _cpu_judge(tiny_config, Objective("goodput", TTFT_500))
    scores = {n: judge.judge({"max_num_seqs": n}) for n in (2, 8, 32)}
    assert all(o.status == TrialStatus.OK and o.feasible for o in scores.values())
    assert scores[2].score < scores[8].score < scores[32].score
    assert scores[32].engine_args == "--max-num-seqs 32 --max-model-len 4096"  # no simulator-only flags


def test_throughput_objective_scores_the_workload_as_given(tiny_config: Path) -> None:
    judge = _cpu_judge(tiny_config, Objective("throughput", SLO.parse("ttft:1")))
    outcome = judge.judge({"max_num_seqs": 8})
    assert outcome.score == pytest.approx(outcome.metrics.output_throughput)
    assert not outcome.feasible and outcome.violation > 0  # 1 ms TTFT at p99 cannot hold


def test_configuration_that_cannot_run_is_a_verdict_not_a_crash(tiny_config: Path) -> None:
    judge = _cpu_judge(tiny_config, Objective("goodput", TTFT_500))
    outcome = judge.judge({"max_num_seqs": 64, "max_num_batched_tokens": 16})
    assert outcome.status == TrialStatus.INVALID and "max_num_batched_tokens" in (outcome.error or "")
    assert outcome.model_dump()["metrics"] == {}  # no statistics at all, as tune.json has always written them


# -- ranking --------------------------------------------------------------


def _trial(
    number: int,
    score: float | None,
    feasible: bool = True,
    violation: float = 0.0,
    thr: float = 0.0,
    ttft: float = 0.0,
    args: str | None = None,
) -> Trial:
    return _judged(
        {"n": number},
        score,
        feasible,
        violation,
        args=args or f"--n {number}",
        number=number,
        metrics=KeyMetrics(output_throughput=thr, p99_ttft_ms=ttft),
    )


def _judged(
    params: dict,
    score: float | None,
    feasible: bool = True,
    violation: float = 0.0,
    *,
    args: str = "",
    number: int | None = None,
    metrics: KeyMetrics | None = None,
) -> Trial:
    """A trial as a judge returns it: runnable with a score, or invalid without one."""
    return Trial(
        number=number,
        params=params,
        engine_args=args,
        status=TrialStatus.OK if score is not None else TrialStatus.INVALID,
        score=score,
        violation=violation,
        feasible=feasible,
        rate=None,
        gpu=None,
        gpus=None,
        cost_per_million_tokens=None,
        metrics=metrics or KeyMetrics(),
        probes=[],
        error=None,
        sim_wall_s=0.0,
        engine_config={},
    )


def test_rank_puts_feasible_first_then_nearest_misses_then_invalid() -> None:
    trials = [_trial(0, 5.0, False, 0.9), _trial(1, None), _trial(2, 3.0), _trial(3, 4.0), _trial(4, 9.0, False, 0.1)]
    assert [t.number for t in rank(trials, "maximize")] == [3, 2, 4, 0, 1]
    assert [t.number for t in rank(trials, "minimize")] == [2, 3, 4, 0, 1]


def test_pareto_front_keeps_only_undominated_points() -> None:
    trials = [
        _trial(0, 1, thr=100, ttft=50),
        _trial(1, 1, thr=200, ttft=80),
        _trial(2, 1, thr=150, ttft=90),
        _trial(3, 1, thr=50, ttft=40),
        _trial(4, None),
    ]
    assert [t.number for t in pareto_front(trials)] == [1, 0, 3]


def test_confirmation_picks_distinct_lines_other_than_the_baseline() -> None:
    ranked = [
        _trial(0, 9, args="--a"),
        _trial(1, 8, args="--base"),
        _trial(2, 7, args="--a"),
        _trial(3, 6, args="--b"),
        _trial(4, 5, args="--c"),
    ]
    assert [t.number for t in pick_for_confirmation(ranked, 2, "--base")] == [0, 3]
    assert (
        gain(3.0, 1.5, "maximize") == 2.0 and gain(1.0, 2.0, "minimize") == 2.0 and gain(1.0, 0.0, "maximize") is None
    )


# -- the study ------------------------------------------------------------


class _CountingJudge:
    """A deterministic objective over two knobs that remembers every candidate it was asked about."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, candidate: dict) -> Trial:
        self.calls.append(dict(candidate))
        score = -abs(candidate["max_num_seqs"] - 64) - abs(candidate["max_num_batched_tokens"] - 4096) / 100
        return _judged(dict(candidate), score)


SPACE = SearchSpace.from_items(["max_num_seqs=8,16,32,64,128,256", "max_num_batched_tokens=1024,2048,4096,8192,16384"])


def test_small_space_is_searched_exhaustively_once_each(tmp_path: Path) -> None:
    judge = _CountingJudge()
    trials = run_search(SPACE, judge, tmp_path, direction="maximize", settings=SearchSettings(n_trials=100))
    assert len(trials) == SPACE.size == len(judge.calls)
    assert {candidate_key(c) for c in judge.calls} == {candidate_key(c) for c in SPACE.grid()}
    assert rank(trials, "maximize")[0].params == {"max_num_seqs": 64, "max_num_batched_tokens": 4096}
    assert all((tmp_path / "stage1" / f"trial-{t.number:04d}" / "trial.json").is_file() for t in trials)


def test_tpe_budget_counts_distinct_configurations_and_resume_adds_only_new_ones(tmp_path: Path) -> None:
    first = _CountingJudge()
    run_search(SPACE, first, tmp_path, direction="maximize", settings=SearchSettings(n_trials=10, sampler="tpe"))
    assert len(first.calls) == len({candidate_key(c) for c in first.calls}) == 10
    more = _CountingJudge()
    trials = run_search(
        SPACE, more, tmp_path, direction="maximize", resume=True, settings=SearchSettings(n_trials=16, sampler="tpe")
    )
    assert len(trials) == 16 and len(more.calls) == 6
    assert not {candidate_key(c) for c in first.calls} & {candidate_key(c) for c in more.calls}


def test_study_directory_is_not_silently_reused(tmp_path: Path) -> None:
    run_search(
        SPACE, _CountingJudge(), tmp_path, direction="maximize", settings=SearchSettings(n_trials=2, sampler="tpe")
    )
    with pytest.raises(TuneError, match="--resume"):
        open_study(tmp_path, "maximize", SearchSettings(), SPACE, resume=False)
    with pytest.raises(TuneError, match="another search space"):
        open_study(tmp_path, "maximize", SearchSettings(), SearchSpace.from_items(["max_num_seqs=8,16"]), resume=True)
    with pytest.raises(TuneError, match="no tune study"):
        open_study(tmp_path / "elsewhere", "maximize", SearchSettings(), SPACE, resume=True)


def _stage1_trials(directory: Path) -> dict[int, dict]:
    return {int(p.parent.name.split("-")[1]): json.loads(p.read_text()) for p in directory.glob("stage1/*/trial.json")}


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_study_resumes_without_repeating_completed_trials(tmp_path: Path, tiny_config: Path, sig: int) -> None:
    out = tmp_path / "study"
    argv = [
        str(Path(sys.executable).parent / "servelab"),
        "tune",
        "--gpu",
        "cpu",
        "--model",
        str(tiny_config),
        "--result-dir",
        str(out),
        "--engine-args",
        "--max-model-len 4096",
        "--sim-args",
        "--block-size 128 --kv-cache-memory-bytes 1G",
        "--space",
        "max_num_seqs=2,4,8,16,32,64",
        "--space",
        "max_num_batched_tokens=default,256,512,1024",
        "--goodput",
        "ttft:500",
        "--random-input-len",
        "256",
        "--random-output-len",
        "32",
        "--sim-prompts",
        "300",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = (tmp_path / "first-run.log").open("w")
    # A suite started in the background (`cmd &`, nohup) inherits SIGINT ignored, and Python keeps it ignored:
    # the study would never see the Ctrl-C this test sends. A terminal's servelab has the default, as here.
    proc = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while len(_stage1_trials(out)) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, (
            f"the study ended before it could be interrupted: {(tmp_path / 'first-run.log').read_text()}"
        )
        proc.send_signal(sig)
        proc.wait(30)
    finally:
        proc.kill()
        proc.wait()
    before = _stage1_trials(out)
    assert 3 <= len(before) < 24
    if sig == signal.SIGINT:
        assert proc.returncode == 130
    before_mtimes = {n: (out / "stage1" / f"trial-{n:04d}" / "trial.json").stat().st_mtime_ns for n in before}

    done = subprocess.run([*argv, "--resume", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    after = _stage1_trials(out)
    keys = [candidate_key(t["params"]) for t in doc["trials"]]
    assert len(keys) == len(set(keys)) == 24  # every point once, none twice
    assert {n: (out / "stage1" / f"trial-{n:04d}" / "trial.json").stat().st_mtime_ns for n in before} == before_mtimes
    assert set(after) == {t["number"] for t in doc["trials"]} and set(before) <= set(after)
    study = open_study(
        out, "maximize", SearchSettings(), SearchSpace({k: tuple(v) for k, v in doc["space"].items()}), resume=True
    )
    fresh = [t for t in study.trials if t.state.name == "COMPLETE" and DUPLICATE_OF not in t.user_attrs]
    assert len(fresh) == 24


# -- stage 2 plumbing -----------------------------------------------------


def test_server_command_template() -> None:
    cmd = ServerCommand("python -m vllm.entrypoints.openai.api_server --model /m {engine_args}")
    assert cmd.argv("--max-num-seqs 8", 18400)[-6:] == ["--max-num-seqs", "8", "--host", "127.0.0.1", "--port", "18400"]
    assert ServerCommand("srv --listen {host}:{port} {engine_args}").argv("", 5)[-1] == "127.0.0.1:5"
    assert (
        cmd.launch_line("--max-num-seqs 8")
        == "python -m vllm.entrypoints.openai.api_server --model /m --max-num-seqs 8"
    )
    with pytest.raises(TuneError, match=r"\{engine_args\}"):
        ServerCommand("vllm serve /m")
    with pytest.raises(TuneError, match="unknown placeholders"):
        ServerCommand("vllm serve {model} {engine_args}")


def test_orphaned_server_from_a_killed_tune_is_reaped(tmp_path: Path) -> None:
    argv = ["sleep", f"4242.{os.getpid()}"]  # unique: a parallel run's orphan is not this test's
    orphan = subprocess.Popen(argv, start_new_session=True)
    try:
        cmdline = Path(f"/proc/{orphan.pid}/cmdline")
        while cmdline.read_bytes().rstrip(b"\0") != "\0".join(argv).encode():  # until the fork has exec'd sleep
            time.sleep(0.01)
        (tmp_path / STAGE2_DIR).mkdir()
        (tmp_path / STAGE2_DIR / LIVE_SERVER).write_text(json.dumps({"argv": argv}))
        assert reap_orphaned_server(tmp_path, grace=5) == [orphan.pid]
        assert orphan.wait(5) == -signal.SIGTERM
        assert not (tmp_path / STAGE2_DIR / LIVE_SERVER).exists()
    finally:
        orphan.kill()
        orphan.wait()


def test_evaluate_is_deterministic(tiny_config: Path) -> None:
    judge = _cpu_judge(tiny_config, Objective("goodput", TTFT_500), n=60)
    target = judge.base.sim_target()
    first = evaluate(target, judge.workload, judge.objective, gpu="cpu", gpus=1)
    again = evaluate(judge.base.sim_target(), judge.workload, judge.objective, gpu="cpu", gpus=1)
    assert first.score == again.score and [p.rate for p in first.probes] == [p.rate for p in again.probes]


# -- a calibration profile --------------------------------------------------

CALIBRATED_LOAD = ["--goodput", "ttft:300", "--random-input-len", "256", "--random-output-len", "32"]


def _tune(*args: str) -> Result:
    return CliRunner().invoke(app, ["tune", *args], env={"COLUMNS": "400"})


def _calibrated_judge(profile_path: Path, sim_prompts: int) -> SimJudge:
    """What stage 1 must compute for a profile, built without the CLI."""
    deployment = deployment_from_profile(load_profile(profile_path))
    workload = TuneWorkload(
        WorkloadConfig(input_len=256, output_len=32), ArrivalConfig(), Amount(num_prompts=sim_prompts)
    )
    return SimJudge(deployment, deployment, workload, Objective("goodput", SLO.parse("ttft:300")))


def test_tune_with_a_calibration_profile_scores_every_trial_on_its_coefficients(tmp_path: Path) -> None:
    fast = tiny_profile(tmp_path / "fast")
    slow = tiny_profile(tmp_path / "slow", step_overhead_s=6e-3)  # 4x the fixed cost of every engine step
    docs = {}
    for name, path in (("fast", fast), ("slow", slow)):
        result = _tune(
            "--calibration",
            str(path),
            "--space",
            "max_num_seqs=2,8,32",
            *CALIBRATED_LOAD,
            "--sim-prompts",
            "60",
            "--result-dir",
            str(tmp_path / f"tune-{name}"),
            "--json",
        )
        assert result.exit_code == 0, result.output
        docs[name] = json.loads(result.stdout)
    scores = {name: {t["params"]["max_num_seqs"]: t["score"] for t in doc["trials"]} for name, doc in docs.items()}

    judge = _calibrated_judge(fast, sim_prompts=60)
    assert scores["fast"] == pytest.approx({n: judge.judge({"max_num_seqs": n}).score for n in (2, 8, 32)})
    assert all(scores["slow"][n] < scores["fast"][n] for n in (2, 8, 32)), scores
    ranked = [docs["fast"]["trials"][i]["params"]["max_num_seqs"] for i in docs["fast"]["ranking"]]
    assert ranked == sorted(scores["fast"], key=scores["fast"].get, reverse=True)
    deployment = docs["fast"]["deployment"]
    assert deployment["calibration"] == str(fast)
    assert deployment["simulated"]["coefficients"] == load_profile(fast).coefficients.model_dump()
    assert (
        deployment["engine_args"] == "--max-num-seqs 32 --max-model-len 4096 --block-size 128"
    )  # the profile's server


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--calibration", "PROFILE", "--gpu", "cpu"], ["--gpu", "--calibration"]),
        (["--calibration", "PROFILE", "--space", "gpu=h100-sxm,a100-80gb-sxm"], ["gpu", "--calibration"]),
        (["--calibration", "absent.json"], ["absent.json"]),
        (["--model", "qwen2.5-7b"], ["--gpu", "--calibration"]),
    ],
)
def test_tune_refuses_what_contradicts_or_lacks_a_deployment_before_any_trial(
    tmp_path: Path, args: list[str], named: list[str]
) -> None:
    profile = str(tiny_profile(tmp_path))
    out = tmp_path / "never"
    result = _tune(*[profile if a == "PROFILE" else a for a in args], *CALIBRATED_LOAD, "--result-dir", str(out))
    assert result.exit_code == 2, result.output
    assert all(word in result.output for word in named), result.output
    assert "Traceback" not in result.output and not out.exists()


def test_resuming_a_study_on_another_calibration_is_refused(tmp_path: Path) -> None:
    fast, slow = tiny_profile(tmp_path / "fast"), tiny_profile(tmp_path / "slow", step_overhead_s=6e-3)
    args = ["--space", "max_num_seqs=2,8", *CALIBRATED_LOAD, "--sim-prompts", "40", "--result-dir", str(tmp_path / "t")]
    assert _tune("--calibration", str(fast), *args).exit_code == 0
    other = _tune("--calibration", str(slow), *args, "--resume")
    assert other.exit_code == 2 and "scored with another deployment" in other.output, other.output
    same = _tune("--calibration", str(fast), *args, "--resume", "--json")
    assert same.exit_code == 0, same.output
    assert len(json.loads(same.stdout)["trials"]) == 2


def test_stage2_predictions_come_from_the_calibrated_simulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stage 2 with its servers replaced: every prediction must be the profile's, printed next to the measurement."""
    path = tiny_profile(tmp_path)
    profile = load_profile(path)
    seen: list[Stage2Config] = []

    def measure_nothing(configs, command, workload, objective, directory, *, on_result, **_):  # noqa: ANN001, ANN202
        for config in configs:
            seen.append(config)
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
                    measured_score=0.5 * score,
                    measured_violation=0.0,
                    startup_s=1.0,
                    bench_s=1.0,
                )
            )

    monkeypatch.setattr(tuner, "confirm", measure_nothing)
    out = tmp_path / "tune"
    result = _tune(
        "--calibration",
        str(path),
        "--space",
        "max_num_seqs=2,8",
        *CALIBRATED_LOAD,
        "--sim-prompts",
        "40",
        "--num-prompts",
        "40",
        "--top-k",
        "1",
        "--server-cmd",
        "vllm serve /m {engine_args}",
        "--result-dir",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert [c.label for c in seen][0] == "baseline" and len(seen) == 2
    assert all(
        c.deployment.hardware == profile.hardware and c.deployment.coefficients == profile.coefficients for c in seen
    )
    stage2 = read_tune_json(out).stage2
    assert stage2 is not None
    first = stage2.results[0]
    assert f"measured {first.measured_score:,.4g} req/s (predicted {first.predicted_score:,.4g})" in result.output
    assert f"predicted: simulated, calibrated by {path}" in result.output


def test_stage2_resume_reads_a_result_of_schema_1_under_this_releases_statistic_names(
    tmp_path: Path, tiny_config: Path
) -> None:
    """A stage2.json written before the statistics took vLLM's names (no schema_version) is renamed on --resume, as
    every older file is (servelab.renames); the configuration is not measured again, and a result written now says
    its schema version."""
    old_names = {new: old for old, new in STATISTICS_RENAMED.items()}
    measured = {"completed": 20, "failed": 0, "median_ttft_ms": 12.0, "p99_ttft_ms": 30.0, "median_tpot_ms": 4.0}
    result = Stage2Row(
        label="baseline",
        params={},
        engine_args="--max-num-seqs 2",
        launch_line="vllm serve m --max-num-seqs 2",
        predicted=KeyMetrics(**measured),
        predicted_score=1.0,
        predicted_violation=0.0,
        measured_score=0.9,
    ).model_dump()
    result["measured"] = {old_names.get(k, k): v for k, v in measured.items()}  # the file as schema 1 spelled it
    done = tmp_path / STAGE2_DIR / "baseline" / "stage2.json"
    done.parent.mkdir(parents=True)
    done.write_text(json.dumps(result))
    config = Stage2Config(
        "baseline", {}, "--max-num-seqs 2", build_deployment("cpu", tiny_config, "--max-model-len 4096")
    )
    started: list[str] = []
    [resumed] = confirm(
        [config],
        ServerCommand("false {engine_args}"),
        _cpu_workload(20),
        Objective("goodput", TTFT_500),
        tmp_path,
        resume=True,
        on_start=lambda c: started.append(c.label),
    )
    assert not started and resumed.measured == KeyMetrics(**measured) and resumed.measured_score == 0.9
    assert assert_files_match_schemas(tmp_path) == {"stage2": 1}  # the old file, as servelab reads it
    write_result(done, resumed)
    assert json.loads(done.read_text())["schema_version"] == SCHEMA_VERSION
    assert assert_files_match_schemas(tmp_path) == {"stage2": 1}
    assert read_result(done) == resumed


def test_no_new_statistic_name_is_an_old_one_so_reading_a_current_file_as_old_changes_nothing() -> None:
    assert not set(STATISTICS_RENAMED.values()) & set(STATISTICS_RENAMED)
    current = {"schema_version": SCHEMA_VERSION - 1, "metrics": {new: 1.0 for new in STATISTICS_RENAMED.values()}}
    assert upgraded(current, SCHEMA_VERSION) == current


def test_the_python_api_runs_the_verb_and_returns_the_document_it_wrote(tmp_path: Path) -> None:
    """servelab.api.tune is the verb's other face: the tune.json it writes is the document it returns, and a
    directory holding that study is refused unless asked to resume it."""
    from servelab import api
    from servelab.errors import InputError

    space = ["max_num_seqs=8,64"]
    small = {"input_len": 256, "output_len": 16, "request_rate": 4.0, "goodput": {"ttft": 500.0}, "sim_prompts": 20}
    doc = api.tune("a100-80gb", "qwen2.5-7b", space, result_dir=tmp_path / "study", **small)
    assert (tmp_path / "study" / "tune.json").read_text() == document_text(doc) + "\n"
    assert sorted(t.params["max_num_seqs"] for t in doc.trials) == [8, 64] and doc.stage2 is None
    assert doc.recommendation is not None and doc.recommendation.source == "stage1"
    with pytest.raises(InputError):
        api.tune("a100-80gb", "qwen2.5-7b", space, result_dir=tmp_path / "study", **small)
    again = api.tune("a100-80gb", "qwen2.5-7b", space, result_dir=tmp_path / "study", resume=True, **small)
    assert [t.model_dump(mode="json") for t in again.trials] == [
        t.model_dump(mode="json") for t in doc.trials
    ]  # read back from the study (sim_wall_s too), not simulated again


def test_a_search_over_gpus_names_every_gpu_it_priced_and_the_one_it_recommends(tmp_path: Path) -> None:
    result = _tune(
        "--gpu",
        "a100-80gb",
        "--model",
        "qwen2.5-7b",
        "--space",
        "gpu=a100-80gb-sxm,h100-sxm",
        *CALIBRATED_LOAD,
        "--request-rate",
        "4",
        "--sim-prompts",
        "30",
        "--result-dir",
        str(tmp_path / "tune"),
    )
    assert result.exit_code == 0, result.output
    assert "catalogue rates of A100-80GB-SXM, H100-SXM" in result.output
    chosen = read_tune_json(tmp_path / "tune").recommendation
    assert chosen is not None and f"on {chosen.params['gpu']}" in result.output


def test_api_server_count_is_a_knob_a_candidate_applies() -> None:
    """One API-server process paces every stream of a busy vLLM server (docs/simulator.md): tune can search more of
    them, `default` being vLLM's one per data-parallel rank."""
    space = SearchSpace.from_items(["api_server_count=default,2,4"])
    assert space.dimensions["api_server_count"] == (None, 2, 4)
    base = build_deployment("h100", "llama-3.1-8b")
    assert [apply(base, c).config.api_servers for c in space.grid()] == [1, 2, 4]
    assert "--api-server-count 4" in apply(base, {"api_server_count": 4}).engine_args()
