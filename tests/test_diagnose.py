"""diagnose on the simulator: each planted fault must come out ranked first, with its evidence."""

import json
import re

import pytest
from typer.testing import CliRunner

from servelab.perf.vllm_cpu_costs import ApiServerCosts
from servelab.cli import app
from servelab.diagnose import findings as fk
from servelab.diagnose.analysis import analyse, diagnose_described, diagnose_run
from servelab.diagnose.evidence import gather
from servelab.errors import InputError
from servelab.diagnose.scenario import simulate, synthetic
from servelab.targets.profile import deployment_from_profile
from servelab.metrics.records import RequestRecord
from servelab.metrics.results import ResultWriter, load_run
from servelab.metrics.slo import SLO
from servelab.perf.calibration import load_profile
from servelab.targets.deployment import build_deployment
from servelab.schemas.results import RunInfo
from support.profiles import PROBED_ARGS, tiny_profile

PLANTED = {
    # prompts of 1,500 tokens at 10 req/s: the first DEVELOPERS.md case; A100 tensor cores saturate.
    fk.PREFILL_COMPUTE_BOUND: ("", dict(input_len=1500, output_len=200, request_rate=10), None),
    # four users on an A100: the GPU waits for work.
    fk.UNDERLOADED: ("", dict(input_len=100, output_len=100, max_concurrency=4), None),
    # a batch cap of 8 under 20 req/s of short requests: a queue forms while KV sits empty.
    fk.MAX_NUM_SEQS_BOUND: ("--max-num-seqs 8", dict(input_len=128, output_len=128, request_rate=20), None),
    # 1,500 blocks (24k tokens) for 64 concurrent 1,500-token sequences: preemptions.
    fk.KV_CAPACITY_BOUND: (
        "--num-gpu-blocks-override 1500 --max-model-len 4096",
        dict(input_len=1000, output_len=500, max_concurrency=64),
        None,
    ),
    # long answers at the full batch: decode steps fill the engine's time. Four API servers: vLLM's measured
    # streaming cost (~0.18 ms of API-server CPU per output token) would otherwise make one API core the limit.
    # At ~250 sequences a 7B model's weight GEMMs do ~190 FLOP per weight byte, above the A100's ridge of ~150: the
    # step is compute-bound, not bandwidth-bound.
    fk.DECODE_COMPUTE_BOUND: ("--api-server-count 4", dict(input_len=128, output_len=1024, max_concurrency=256), None),
    # The same answers 64 at a time: the step reads its 15 GB of weights for a batch far below the ridge.
    fk.DECODE_BANDWIDTH_BOUND: (
        "--api-server-count 4 --max-num-seqs 64",
        dict(input_len=128, output_len=2048, max_concurrency=64),
        None,
    ),
    # a TPOT bound that 2,048-token prefill chunks break at moderate load.
    fk.SLO_TRADEOFF: ("", dict(input_len=1500, output_len=200, request_rate=5), "ttft:3000 tpot:20"),
    # CUDA graphs off at a small batch: launching 28 layers' kernels takes longer than running them.
    fk.LAUNCH_BOUND: ("--enforce-eager", dict(input_len=128, output_len=256, max_concurrency=32), None),
}


def _diagnose(engine_args, workload, slo, **kw):
    d = build_deployment("a100-80gb", "qwen2.5-7b", engine_args)
    w = dict(workload)
    scenario = synthetic(w.pop("input_len"), w.pop("output_len"), **w)
    return diagnose_described(d, scenario, slo=SLO.parse(slo), **kw)


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(PLANTED))
def test_planted_fault_is_ranked_first(kind):
    engine_args, workload, slo = PLANTED[kind]
    dx = _diagnose(engine_args, workload, slo, with_recommendations=False)
    assert dx.bottleneck == kind, [(f.kind, round(f.score, 2)) for f in dx.findings]
    assert dx.findings[0].evidence, "a finding without numbers is folklore"


def test_a_lagging_client_is_a_caveat_above_the_findings_never_the_servers_bottleneck():
    d = build_deployment("a100-80gb", "qwen2.5-7b")
    scenario = synthetic(100, 100, max_concurrency=4)
    run = simulate(d, scenario)
    # What HttpTarget reports when it cannot keep its own schedule (see targets/client_stats.py).
    run.run_info = run.run_info.with_keys(
        client_stats={"client_may_be_bottleneck": True, "reason": "send lag p99 120 ms"}
    )
    dx = analyse(d, scenario, run, source="measured", with_recommendations=False)
    assert [c.kind for c in dx.caveats] == [fk.CLIENT_BOUND]
    assert "120 ms" in dx.caveats[0].evidence[0]
    assert dx.bottleneck == fk.UNDERLOADED  # the server's own limit, from its own evidence
    assert fk.CLIENT_BOUND not in [f.kind for f in dx.findings]


def test_the_client_caveat_carries_the_delay_the_client_added_and_stays_silent_when_immaterial():
    d = build_deployment("a100-80gb", "qwen2.5-7b")
    scenario = synthetic(100, 100, max_concurrency=4)
    run = simulate(d, scenario)
    run.run_info = run.run_info.with_keys(
        client_stats={
            "client_may_be_bottleneck": True,
            "reason": "it added ~12.0 ms",
            "added_delay": {"mean_ms": 12.0, "median_ms": 10.0, "p99_ms": 40.0, "samples": 200},
        }
    )
    dx = analyse(d, scenario, run, source="measured", with_recommendations=False)
    assert "estimated client-added delay 12.0 ms per timestamp" in dx.caveats[0].evidence[1]
    assert "% of it)" in dx.caveats[0].evidence[1]  # the size of the distortion, against the TTFT it inflates
    run.run_info = run.run_info.with_keys(
        client_stats={
            "client_may_be_bottleneck": False,
            "added_delay": {"mean_ms": 0.2, "median_ms": 0.2, "p99_ms": 0.9, "samples": 200},
        }
    )
    dx = analyse(d, scenario, run, source="measured", with_recommendations=False)
    assert dx.caveats == []


def test_a_results_part_servelab_cannot_read_is_one_error_naming_it_before_any_simulation():
    d = build_deployment("a100-80gb", "qwen2.5-7b")
    scenario = synthetic(100, 100, max_concurrency=4)
    run = simulate(d, scenario)
    run.run_info = run.run_info.with_keys(
        client_stats={"client_may_be_bottleneck": True, "added_delay": {"mean_ms": "a lot"}}
    )
    with pytest.raises(InputError, match=r"the client_stats of .* not one this servelab reads: \('added_delay'"):
        gather(run)
    run.run_info = run.run_info.with_keys(
        client_stats={}, server_info={"replicas": [{"url": "http://a/metrics", "samples": "twenty", "failures": 0}]}
    )
    with pytest.raises(InputError, match=r"server_info.replicas in run.json of .*\('samples',\)"):
        analyse(d, scenario, run, source="measured", with_recommendations=False)


@pytest.mark.slow
def test_prefill_bound_case_explains_with_a_physical_ceiling_and_priced_fixes():
    dx = _diagnose(*PLANTED[fk.PREFILL_COMPUTE_BOUND])
    c = dx.ceilings
    # 1,500 tokens x ~14 GFLOP/token on 312 TFLOP/s at ~70%: about 10 req/s of prefill at most.
    assert 8 < c.prefill_compute_rps < 13
    assert c.saturation_rps < c.prefill_compute_rps
    assert dx.evidence.request_rate < 10  # the offered 10 req/s cannot be served
    recs = dx.findings[0].recommendations
    assert recs and all(r.after > r.before for r in recs)
    changes = " ".join(r.change for r in recs)
    assert "replicas" in changes or "H100" in changes
    assert all("servelab bench" in r.confirm for r in recs)


def test_max_num_seqs_fix_is_raising_it_and_the_simulator_agrees():
    dx = _diagnose(*PLANTED[fk.MAX_NUM_SEQS_BOUND])
    recs = dx.findings[0].recommendations
    assert recs and "--max-num-seqs" in recs[0].change
    assert recs[0].after > 1.5 * recs[0].before


def test_launch_bound_fix_is_cuda_graphs_and_its_launch_line_drops_the_flag():
    dx = _diagnose(*PLANTED[fk.LAUNCH_BOUND])
    finding = dx.findings[0]
    assert "--enforce-eager is set" in finding.evidence[0] and "layers' kernels" in finding.evidence[1]
    rec = finding.recommendations[0]
    assert "CUDA graphs on" in rec.change and "--enforce-eager" not in (rec.engine_args or "")
    assert rec.after > 1.3 * rec.before  # the launches were most of each step


@pytest.mark.slow
def test_kv_finding_cites_preemptions():
    dx = _diagnose(*PLANTED[fk.KV_CAPACITY_BOUND], with_recommendations=False)
    assert dx.evidence.preemptions > 0
    assert "preemptions" in dx.findings[0].evidence[0]


@pytest.mark.slow
def test_advice_catalogue_has_every_item_with_a_verdict():
    dx = _diagnose(*PLANTED[fk.PREFILL_COMPUTE_BOUND], with_recommendations=False, with_advice=True)
    assert [a.id for a in dx.advice] == list(range(1, 26))
    verdicts = {a.id: a.verdict for a in dx.advice}
    assert verdicts[7] == "obsolete" and verdicts[22] == "obsolete"
    assert verdicts[14] == "no effect"  # continuous batching is always on
    status = {a.id: a.flag_status for a in dx.advice}
    assert status[9] == "default already" and status[5] == "default already"
    assert verdicts[5] == "helps"  # a shared prefix skips most of the prefill that limits this case
    assert all(
        a.verdict in {"helps", "no effect", "hurts", "trade-off", "obsolete", "outside the model"} for a in dx.advice
    )


def test_measured_run_directory_round_trip(tmp_path):
    d = build_deployment("a100-80gb", "qwen2.5-7b", "--max-num-seqs 8")
    scenario = synthetic(128, 128, request_rate=20)
    sim = simulate(d, scenario)
    writer = ResultWriter(tmp_path, RunInfo.begun(source="sim", arrival={"request_rate": 20, "max_concurrency": None}))
    for r in sim.records:
        writer.records.write(r)
    for s in sim.timeline:
        writer.write_sample(s)
    writer.close()
    dx = diagnose_run(load_run(tmp_path), d, with_recommendations=False)
    assert dx.bottleneck == fk.MAX_NUM_SEQS_BOUND
    assert dx.workload.requests == len(sim.records)


@pytest.mark.slow
def test_cli_example_runs_without_arguments_and_json_has_the_stable_keys():
    result = CliRunner().invoke(app, ["diagnose", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data["ceilings"]) >= {
        "prefill_compute_rps",
        "decode_bandwidth_tps",
        "kv_capacity_seqs",
        "max_num_seqs",
        "slo_max_rps",
    }
    # The example's own figures (10 QPS at 30% utilisation) cannot both hold: that comes first (issue 13), then
    # what limits the server.
    assert [f["kind"] for f in data["findings"][:2]] == ["observations_inconsistent", fk.PREFILL_COMPUTE_BOUND]
    assert {"kind", "title", "evidence", "recommendations"} <= set(data["findings"][1])


def test_cli_slo_gives_the_highest_rate_meeting_it():
    result = CliRunner().invoke(
        app,
        [
            "diagnose",
            "--gpu",
            "a100-80gb",
            "--model",
            "qwen2.5-7b",
            "--input-len",
            "500",
            "--output-len",
            "100",
            "--request-rate",
            "4",
            "--goodput",
            "ttft:500",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert 0 < data["ceilings"]["slo_max_rps"] <= 1.2 * data["ceilings"]["saturation_rps"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--gpu", "a100"], "--model"),
        (
            [
                "--gpu",
                "nope",
                "--model",
                "qwen2.5-7b",
                "--input-len",
                "10",
                "--output-len",
                "10",
                "--request-rate",
                "1",
            ],
            "unknown GPU",
        ),
        (["--json", "--markdown"], "pick one"),
        ([".", "--input-len", "5"], "not both"),
        (["--gpu", "a100", "--model", "qwen2.5-7b", "--input-len", "5", "--output-len", "5"], "--request-rate"),
        (
            [
                "--gpu",
                "a100",
                "--model",
                "qwen2.5-7b",
                "--engine-args",
                "--max-num-seqz 4",
                "--input-len",
                "5",
                "--output-len",
                "5",
                "--request-rate",
                "1",
            ],
            "max-num-seqs",
        ),
    ],
)
def test_cli_bad_input_is_one_clear_error(args, needle):
    result = CliRunner().invoke(app, ["diagnose", *args])
    assert result.exit_code == 2
    assert needle in result.output


def test_frontend_cpu_bound_when_the_api_server_saturates():
    from dataclasses import replace

    # 30 ms of API-server CPU per request caps the frontend at ~33 req/s, far below the engine's capacity.
    d = replace(
        build_deployment("a100-80gb", "qwen2.5-7b"), api=ApiServerCosts(per_request_s=0.03, per_prompt_token_s=1e-5)
    )
    dx = diagnose_described(d, synthetic(100, 50, request_rate=40), with_recommendations=False)
    assert dx.bottleneck == fk.FRONTEND_CPU_BOUND, [(f.kind, round(f.score, 2)) for f in dx.findings]
    assert dx.evidence.mean_ttft_ms > 10 * dx.evidence.mean_server_ttft_ms


# -- a calibration profile as the deployment --------------------------------


def _diagnose_cli(*args):
    result = CliRunner().invoke(app, ["diagnose", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_cli_described_deployment_on_a_calibration_profile_uses_its_hardware_and_cost_model(tmp_path):
    fast = tiny_profile(tmp_path / "fast")
    slow = tiny_profile(tmp_path / "slow", bf16_tflops=0.1)  # a third of the fitted compute
    workload = ("--input-len", "512", "--output-len", "32", "--request-rate", "4")
    data = {
        name: _diagnose_cli("--calibration", str(path), *workload) for name, path in (("fast", fast), ("slow", slow))
    }

    profile = load_profile(fast)
    deployment = deployment_from_profile(profile)
    expected = diagnose_described(deployment, synthetic(512, 32, request_rate=4), with_recommendations=False)
    assert data["fast"]["deployment"]["coefficients"] == profile.coefficients.model_dump()
    assert data["fast"]["deployment"]["engine_config"]["max_num_seqs"] == 32  # the calibrated server's flag
    assert data["fast"]["ceilings"]["prefill_compute_rps"] == pytest.approx(expected.ceilings.prefill_compute_rps)
    assert data["slow"]["ceilings"]["prefill_compute_rps"] < data["fast"]["ceilings"]["prefill_compute_rps"]
    overridden = _diagnose_cli("--calibration", str(fast), "--engine-args", "--max-num-seqs 4", *workload)
    assert overridden["deployment"]["engine_config"]["max_num_seqs"] == 4


def test_cli_results_directory_on_a_calibration_profile(tmp_path):
    path = tiny_profile(tmp_path)
    run = tmp_path / "run"
    simulated = CliRunner().invoke(
        app,
        [
            "simulate",
            "--calibration",
            str(path),
            "--random-input-len",
            "256",
            "--random-output-len",
            "32",
            "--num-prompts",
            "80",
            "--max-concurrency",
            "16",
            "--result-dir",
            str(run),
        ],
    )
    assert simulated.exit_code == 0, simulated.output
    # run.json records this host's CPU steal during the run, which a loaded CI host can push past the threshold:
    # state the profile's own conditions (no steal) so that "same conditions" holds under any load.
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "client_host": {"cpu_count": 2, "cpu_steal_share": 0.0}}))
    data = _diagnose_cli(str(run), "--calibration", str(path))
    assert json.loads((run / "diagnosis.json").read_text())["deployment"] == data["deployment"]
    assert data["deployment"]["coefficients"] == load_profile(path).coefficients.model_dump()
    assert data["workload"]["requests"] == 80
    uncalibrated = _diagnose_cli(
        str(run), "--gpu", "cpu", "--model", str(tmp_path / "tiny-config"), "--engine-args", PROBED_ARGS
    )
    assert data["ceilings"]["decode_bandwidth_tps"] != uncalibrated["ceilings"]["decode_bandwidth_tps"]
    assert not any("at calibration" in note for note in data["notes"])  # same host conditions: nothing to say

    # The same run as if measured while the hypervisor took a fifth of the CPUs: the notes say it is not comparable.
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "client_host": {"cpu_count": 2, "cpu_steal_share": 0.2}}))
    stolen = _diagnose_cli(str(run), "--calibration", str(path))
    assert any("20% of the host's CPU time" in note and "at calibration" in note for note in stolen["notes"])


@pytest.mark.parametrize("flag", [["--gpu", "cpu"], ["--vllm-version", "0.11.0"]])
def test_cli_calibration_beside_gpu_or_version_is_one_error_naming_both(tmp_path, flag):
    """(--model beside a profile is another model on the calibrated hardware: tests/test_calibrate_from.py.)"""
    path = tiny_profile(tmp_path)
    result = CliRunner().invoke(
        app,
        ["diagnose", "--calibration", str(path), *flag, "--input-len", "5", "--output-len", "5", "--request-rate", "1"],
    )
    assert result.exit_code == 2
    assert flag[0] in result.output and "--calibration" in result.output and "Traceback" not in result.output


def test_cli_a_run_where_nothing_completed_is_one_clear_error_not_a_diagnosis_of_zeros(tmp_path):
    writer = ResultWriter(tmp_path, RunInfo.begun(verb="bench", source="http"))
    for i in range(3):
        writer.records.write(
            RequestRecord(
                index=i,
                intended_time=0.0,
                send_time=0.0,
                finish_time=0.01,
                status="error",
                error_kind="http_500",
                error="Internal Server Error",
            )
        )
    writer.close()
    result = CliRunner().invoke(app, ["diagnose", str(tmp_path), "--gpu", "a100-80gb", "--model", "qwen2.5-7b"])
    assert result.exit_code == 2 and "no request completed" in result.output and "3 http_500" in result.output


# -- reported figures checked against the physics (issue 13, section 4) --------------------------------------------


def _reported(qps=None, ttft_ms=None, gpu_util=None, rate=10.0, prompt=1500):
    from servelab.diagnose.analysis import Observed

    d = build_deployment("a100-80gb", "qwen2.5-7b", "--max-num-seqs 256")
    return diagnose_described(
        d,
        synthetic(prompt, 200, request_rate=rate),
        with_recommendations=False,
        observed=Observed(qps, ttft_ms, gpu_util),
    )


@pytest.mark.slow
def test_ten_qps_of_long_prompts_at_thirty_percent_utilisation_is_named_first_as_impossible():
    from servelab.diagnose.observations import OBSERVATIONS_INCONSISTENT

    dx = _reported(qps=10.0, gpu_util=0.3)
    first = dx.findings[0]
    assert first.kind == OBSERVATIONS_INCONSISTENT and "QPS" in first.title and "GPU utilisation" in first.title
    text = " ".join(first.evidence)
    assert "cannot read 30%" in text and "servelab bench" in text and "nvidia-smi dmon" in text
    # What would reconcile them, solved on the simulator (issue 26): a far lower rate, not shorter prompts, since
    # decoding alone keeps the GPU busy at 10 req/s.
    rate = re.search(r"~([\d.]+) req/s arriving", text)
    assert rate is not None and float(rate.group(1)) < 1.0
    assert "not reproducing GPU utilisation 30%" in text and "prompts of 188-12000 tokens" in text
    # The server's own bottleneck is still named, after the contradiction.
    assert dx.bottleneck != OBSERVATIONS_INCONSISTENT and dx.bottleneck in fk.KINDS


@pytest.mark.slow
def test_figures_that_fit_the_deployment_raise_no_contradiction():
    from servelab.diagnose.observations import OBSERVATIONS_INCONSISTENT

    dx = _reported(qps=4.0, gpu_util=0.95, ttft_ms=2000.0, rate=4.0)
    assert all(f.kind != OBSERVATIONS_INCONSISTENT for f in dx.findings)


@pytest.mark.slow
def test_a_ttft_below_an_idle_gpus_prefill_is_a_contradiction():
    from servelab.diagnose.observations import idle_prefill_ms

    d = build_deployment("a100-80gb", "qwen2.5-7b", "--max-num-seqs 256")
    least = idle_prefill_ms(d, 1500)
    assert least > 0
    dx = _reported(ttft_ms=0.5 * least, rate=1.0)
    assert dx.findings[0].title.startswith("The reported TTFT cannot hold")


@pytest.mark.slow
def test_the_issues_own_command_without_observed_qps_names_the_contradiction_from_the_described_rate():
    """`--request-rate 10 --observed-gpu-util 0.3`, as a new user types it (issue 13): a described deployment that
    comes with a figure seen in production is that production, so its rate is the QPS checked against the 30%."""
    result = CliRunner().invoke(
        app,
        [
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
            "--observed-gpu-util",
            "0.3",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    first = data["findings"][0]
    assert first["kind"] == "observations_inconsistent" and "GPU utilisation" in first["title"], first["title"]
    assert any("10.00 req/s offered (your --request-rate)" in line for line in first["evidence"])
    assert any("cannot read 30%" in line for line in first["evidence"])
    assert data["observed"]["qps"] is None  # the user did not say they see it: the JSON keeps what they said


def test_a_described_rate_alone_is_a_what_if_not_a_reported_figure():
    from servelab.diagnose.observations import OBSERVATIONS_INCONSISTENT

    dx = _reported(rate=10.0)  # above the ceiling, but nothing was reported as seen in production
    assert all(f.kind != OBSERVATIONS_INCONSISTENT for f in dx.findings)


def test_the_confirm_line_sends_a_shared_prefix_as_one_and_a_burst_as_a_burst():
    from dataclasses import replace

    from servelab.diagnose.recommend import confirm_command

    shared = synthetic(32, 16, max_concurrency=4, prefix_len=512)
    line = confirm_command(shared, None)
    assert f"--dataset-name prefix --prefix-len 512 --random-input-len {shared.mean_input - 512:.0f} " in line, line
    burst = replace(synthetic(16, 2, max_concurrency=4), max_concurrency=None)  # every arrival at 0, no cap
    assert "--request-rate inf --num-prompts" in confirm_command(burst, None)
