"""Calibration without a server: fits recover known coefficients, probes close the loop on a simulated "server"."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from servelab.perf.vllm_cpu_costs import ApiServerCosts
from servelab.calibrate.calibrate import (
    DECODE,
    IDLE,
    PREFILL,
    Probe,
    ProbeRuns,
    fit_report,
    fit_runs,
    mirrored_engine_args,
    observations,
    prefill_steps,
    probe_plan,
    run_probes,
    simulate_probes,
    bunched_fraction,
)
from servelab.targets.profile import deployment_from_profile
from servelab.calibrate.request import CalibrateRequest
from servelab.errors import InputError
from servelab.perf.calibration import (
    PARAMETERS,
    ProfileError,
    StepObservation,
    fit_cost_model,
    load_profile,
    model_spec_dict,
)
from servelab.schemas.profile import CalibrationProfile
from servelab.perf.cost_model import CostCoefficients, RooflineCostModel, StepBatch
from servelab.metrics.records import RequestRecord
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import get_gpu
from servelab.perf.models import get_model
from servelab.targets.deployment import Deployment
from servelab.perf.engine_args import parse_engine_args
from servelab.perf.engine_config import EngineConfig
from servelab.schemas.results import RunInfo

CPU_TRUTH = CostCoefficients(
    compute_efficiency=0.4,
    memory_efficiency=0.5,
    attention_compute_efficiency=0.9,
    attention_memory_efficiency=0.6,
    step_overhead_s=1.5e-3,
    per_request_overhead_s=2e-4,
    prefill_step_overhead_s=4e-4,
    idle_wake_s=2e-3,
    idle_wake_time_constant_s=0.02,
)
LATENCY = 3e-3
TURNAROUND = 2 * LATENCY + 1e-3
"""How long the engine idles between back-to-back requests at concurrency 1 (the client's round trip)."""
TINY_CONFIG = {  # the shape of the tiny Qwen2 the vLLM tests serve (tests/support/make_tiny_model.py)
    "architectures": ["Qwen2ForCausalLM"],
    "num_hidden_layers": 2,
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 352,
    "vocab_size": 4096,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("tiny-config")
    (directory / "config.json").write_text(json.dumps(TINY_CONFIG))
    return get_model(directory)


def probed(model, gpu: str = "cpu", coefficients: CostCoefficients | None = None, latency: float = 0.0) -> Deployment:
    config = EngineConfig(max_num_seqs=32, max_model_len=4096, block_size=128, kv_cache_memory_bytes=2**30)
    return Deployment.build(get_gpu(gpu), model, config, coefficients=coefficients, network_latency=latency)


def synthetic(cost, config: EngineConfig, latency: float) -> list[StepObservation]:
    """What the probes would measure on a server that is `cost`: back-to-back and spaced prefills, decode batches."""
    obs = []
    for n, idle in [(n, TURNAROUND) for n in (16, 128, 512, 1024, 2048)] + [(16, 0.008), (16, 0.02), (16, 0.06)]:
        steps = prefill_steps(n, config)
        engine = sum(cost.step_time(b) for b in steps) + cost.wake_time(idle)
        obs += [
            StepObservation(f"prefill-{n}-idle-{idle}", steps, engine + 2 * latency, 2, 1.0, idle),
            StepObservation(f"engine-{n}-idle-{idle}", steps, engine, 0, 1.0, idle),
        ]
    for b, ctx in itertools.product((1, 4, 16, 32), (48, 1024)):
        batch = StepBatch(decode_contexts=[ctx] * b)
        obs.append(StepObservation(f"decode-b{b}-c{ctx}", (batch,), cost.step_time(batch)))
    return obs


def test_fit_recovers_every_rate_of_the_cpu_device(tiny) -> None:
    truth_hw = get_gpu("cpu").model_copy(update={"bf16_tflops": 0.3, "memory_bandwidth_gbs": 12})
    d = probed(tiny)
    cost = RooflineCostModel(truth_hw, tiny, d.config, CPU_TRUTH)
    fit = fit_cost_model(d.hardware, tiny, d.config, synthetic(cost, d.config, LATENCY))
    assert fit.converged
    assert fit.rms_rel_error < 0.01
    # The weight-streaming floor's kink leaves overheads a few % apart from the truth; rates and latency land close.
    assert fit.rates["linear_flops"] == pytest.approx(0.3e12 * 0.4, rel=0.1)
    assert fit.rates["per_request_overhead_s"] == pytest.approx(2e-4, rel=0.1)
    assert fit.network_latency_s == pytest.approx(LATENCY, rel=0.05)
    # The prefill step's own cost and the wake from idle are told apart by the spaced prefills.
    c = fit.coefficients
    assert c.prefill_step_overhead_s == pytest.approx(4e-4, rel=0.25)
    assert c.idle_wake_s == pytest.approx(2e-3, rel=0.1)
    assert c.idle_wake_time_constant_s == pytest.approx(0.02, rel=0.2)
    # The fitted device is no longer a placeholder and reproduces the truth through the real cost model.
    assert not fit.hardware.placeholder and "fitted" in fit.hardware.sources["datasheet"]
    refit = RooflineCostModel(fit.hardware, tiny, d.config, fit.coefficients)
    for batch in (
        StepBatch(prefill_chunks=[(700, 0)], decode_contexts=[300] * 10),
        StepBatch(decode_contexts=[500] * 24),
    ):
        assert refit.step_time(batch) == pytest.approx(cost.step_time(batch), rel=0.02)
    assert refit.wake_time(0.03) == pytest.approx(cost.wake_time(0.03), rel=0.05)


def test_fit_on_a_catalogue_gpu_moves_efficiencies_not_peaks(tiny) -> None:
    d = probed(tiny, "a100-80gb")
    truth = CostCoefficients(
        compute_efficiency=0.5, memory_efficiency=0.6, step_overhead_s=2e-3, per_request_overhead_s=5e-5
    )
    cost = RooflineCostModel(d.hardware, tiny, d.config, truth)
    fit = fit_cost_model(d.hardware, tiny, d.config, synthetic(cost, d.config, 1e-3))
    assert fit.hardware == d.hardware
    assert fit.coefficients.step_overhead_s == pytest.approx(2e-3, rel=0.02)
    assert all(0 < getattr(fit.coefficients, f) <= 1 for f in ("compute_efficiency", "memory_efficiency"))


def test_fit_refuses_fewer_observations_than_parameters(tiny) -> None:
    d = probed(tiny)
    one = StepObservation("x", (StepBatch(decode_contexts=[10]),), 1e-3)
    with pytest.raises(PerfConfigError, match="cannot determine"):
        fit_cost_model(d.hardware, tiny, d.config, [one] * (len(PARAMETERS) - 1))


def test_observation_needs_a_positive_time() -> None:
    with pytest.raises(PerfConfigError, match="non-positive"):
        StepObservation("x", (StepBatch(decode_contexts=[1]),), 0.0)


def test_probe_plan_stays_within_the_engine_limits(tiny) -> None:
    config = probed(tiny).with_changes(max_num_seqs=8, max_num_batched_tokens=1024).config
    plan = probe_plan(config)
    assert {p.kind for p in plan} == {PREFILL, DECODE, IDLE, "mixed"}
    assert all(p.spacing_s > 0 for p in plan if p.kind == IDLE) and len({p.spacing_s for p in plan}) >= 3
    assert max(p.prompt_len for p in plan if p.kind == PREFILL) == 1024
    assert max(p.concurrency for p in plan) <= 8
    assert all(p.prompt_len + p.max_tokens < config.max_model_len for p in plan)


def test_prefill_steps_are_chunks_of_the_token_budget(tiny) -> None:
    config = probed(tiny).with_changes(max_num_batched_tokens=512).config
    steps = prefill_steps(1100, config)
    assert [b.prefill_chunks for b in steps] == [[(512, 0)], [(512, 512)], [(76, 1024)]]


def test_decode_observation_uses_the_engines_realized_batch(tiny) -> None:
    config = probed(tiny).config
    probe = Probe("decode-b8", DECODE, 16, 64, 8, 16)
    runs = ProbeRuns(probe, passes=[{"median_tpot_ms": 3.0, "tokens_per_step": 6.2, "failed": 0}])
    (obs,) = observations([runs], config)
    assert len(obs.steps[0].decode_contexts) == 6
    assert obs.seconds == pytest.approx(3e-3)
    runs.passes[0]["tokens_per_step"] = None
    assert len(observations([runs], config)[0].steps[0].decode_contexts) == 8


def test_prefill_observations_carry_the_engines_idle_time(tiny) -> None:
    config = probed(tiny).config
    back_to_back = ProbeRuns(
        Probe("prefill-16", PREFILL, 16, 1, 1, 6),
        passes=[{"median_ttft_ms": 6.0, "server_prefill_ms": 2.5, "failed": 0}],
    )
    spaced = ProbeRuns(
        Probe("idle-16", IDLE, 16, 1, 1, 8, spacing_s=0.05),
        passes=[{"median_ttft_ms": 8.0, "server_prefill_ms": 4.0, "failed": 0}],
    )
    client, engine, client_spaced, engine_spaced = observations([back_to_back, spaced], config)
    # Back to back, the engine idles while the token goes out and the next request comes in: the TTFT's non-engine part.
    assert client.idle_before_s == engine.idle_before_s == pytest.approx(3.5e-3)
    assert (client.latency_legs, engine.latency_legs) == (2, 0) and engine.seconds == pytest.approx(2.5e-3)
    # Spaced, it idles for the rest of each period.
    assert client_spaced.idle_before_s == engine_spaced.idle_before_s == pytest.approx(0.046)
    no_engine = ProbeRuns(back_to_back.probe, passes=[{"median_ttft_ms": 6.0, "failed": 0}])
    (only,) = observations([no_engine], config)
    assert only.idle_before_s == 0.0


def test_probe_figure_is_the_quiet_quartile() -> None:
    runs = ProbeRuns(
        Probe("p", PREFILL, 16, 1, 1, 6),
        passes=[{"median_ttft_ms": v, "output_throughput": 10 * v, "failed": 0} for v in (10, 11, 12, 30, 40)],
    )
    assert runs.figure("median_ttft_ms") == pytest.approx(11.0)
    assert runs.figure("output_throughput") == pytest.approx(300.0)


def test_mirrored_engine_args_adds_what_the_server_reports() -> None:
    cache = {"block_size": "128", "kv_cache_memory_bytes": "1073741824"}
    line = mirrored_engine_args("--max-num-seqs 32", cache, {"max_model_len": 4096})
    assert line == "--max-num-seqs 32 --block-size 128 --kv-cache-memory-bytes 1073741824 --max-model-len 4096"
    kept = mirrored_engine_args("--block-size 16 --max-model-len 2048", cache, {"max_model_len": 4096})
    config = parse_engine_args(kept).config
    assert (config.block_size, config.max_model_len, config.kv_cache_memory_bytes) == (128, 2048, 2**30)


def calibrated_on_simulator(tiny, tmp_path: Path) -> tuple[list[ProbeRuns], Deployment, Deployment]:
    """Probe a simulated "server" with known coefficients and fit a placeholder cpu device to it."""
    truth_hw = get_gpu("cpu").model_copy(update={"bf16_tflops": 0.3, "memory_bandwidth_gbs": 12})
    server = probed(tiny, coefficients=CPU_TRUTH, latency=LATENCY)
    server = Deployment.build(truth_hw, tiny, server.requested, coefficients=CPU_TRUTH, network_latency=LATENCY)
    ticks = itertools.count()
    start = probed(tiny)
    runs = run_probes(
        server.sim_target(),
        probe_plan(start.config),
        vocab_size=tiny.vocab_size,
        budget_s=200,
        directory=tmp_path,
        run_info=RunInfo.begun(),
        clock=lambda: float(next(ticks)),
    )
    fit, fitted = fit_runs(runs, start, "test")
    return runs, fit, fitted


def test_probing_a_simulated_server_recovers_it(tiny, tmp_path: Path) -> None:
    runs, fit, fitted = calibrated_on_simulator(tiny, tmp_path)
    assert all(len(r.passes) >= 2 for r in runs)  # the fake clock allows several passes
    assert (tmp_path / "pass-01" / runs[0].probe.name / "records.jsonl").is_file()
    assert (tmp_path / "warmup").is_dir()
    checks = simulate_probes(fitted.sim_target(), runs, tiny.vocab_size)
    for row in checks:
        for metric, err in row["error_pct"].items():
            if err is not None:
                assert abs(err) < 10, (row["probe"], metric, err)
    assert fitted.network_latency == pytest.approx(LATENCY, rel=0.1)
    assert fitted.api.per_request_s < 2e-4  # the server has no frontend cost: none is found


def test_profile_round_trip_and_engine_arg_override(tiny, tmp_path: Path) -> None:
    runs, fit, fitted = calibrated_on_simulator(tiny, tmp_path / "probes")
    profile = CalibrationProfile(
        created_at=0.0,
        hardware=fitted.hardware,
        gpu="cpu",
        model_source="tiny",
        model_spec=model_spec_dict(tiny),
        engine_args="--max-num-seqs 32 --max-model-len 4096 --block-size 128 --kv-cache-memory-bytes 1073741824",
        engine_config={},
        coefficients=fitted.coefficients,
        network_latency_s=fitted.network_latency,
        rates=fit.rates,
        fit=fit_report(fit),
        simulated_probes=[],
        probes=[r.describe() for r in runs],
        budget_s=60,
        elapsed_s=1,
    )
    path = tmp_path / "profile.json"
    profile.save(path)
    loaded = load_profile(path)
    assert loaded == profile
    same = deployment_from_profile(loaded)
    assert same.config.max_num_seqs == 32 and same.config.block_size == 128
    assert same.coefficients == fitted.coefficients and same.network_latency == fitted.network_latency
    other = deployment_from_profile(loaded, "--max-num-seqs 8")
    assert other.config.max_num_seqs == 8 and other.config.block_size == 128 and other.config.max_model_len == 4096

    # A schema-2 profile (no host conditions, no reference step time) still opens, without them.
    old = json.loads(path.read_text())
    old.update(schema_version=2)
    del old["host"], old["reference"]
    path.write_text(json.dumps(old))
    assert (
        load_profile(path).reference is None and deployment_from_profile(load_profile(path)).config.max_num_seqs == 32
    )


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not JSON"),
        (json.dumps({"kind": "other"}), "not a servelab calibration profile"),
        (json.dumps({"kind": "servelab.calibration", "schema_version": 99}), "schema version 99"),
        (
            json.dumps({"kind": "servelab.calibration", "schema_version": 1}),
            "schema version 1, whose per-prefill-chunk",
        ),
        (json.dumps({"kind": "servelab.calibration", "schema_version": 2}), "invalid"),
    ],
)
def test_bad_profiles_are_refused_with_the_file_named(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(path)
    assert str(path) in str(info.value)


def test_missing_profile_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "absent.json")


def test_calibrate_refuses_a_tiny_budget_before_any_request(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="too small"):
        CalibrateRequest("cpu", "qwen2.5-7b", tmp_path / "p.json", base_url="http://127.0.0.1:9", budget_s=5)


def test_bunched_tokens_mark_a_stalled_client_and_its_pass_is_left_out() -> None:
    def record(times: list[float]) -> RequestRecord:
        return RequestRecord(index=0, intended_time=0, send_time=0, finish_time=times[-1], chunk_times=times)

    assert bunched_fraction([record([0.01, 0.012, 0.014, 0.016])]) == 0.0
    assert bunched_fraction([record([0.01, 0.2, 0.2, 0.2, 0.2])]) == pytest.approx(0.75)
    assert bunched_fraction([record([0.01])]) == 0.0  # one token: nothing to judge
    runs = ProbeRuns(
        Probe("decode-b4", DECODE, 16, 64, 4, 8),
        passes=[
            {"median_tpot_ms": 0.0, "server_prefill_ms": 2.0, "bunched": 0.9, "failed": 0},
            {"median_tpot_ms": 1.8, "server_prefill_ms": 3.0, "bunched": 0.02, "failed": 0},
        ],
    )
    assert runs.figure("median_tpot_ms") == pytest.approx(1.8)  # the stalled pass's TPOT of 0 is not a measurement
    assert runs.figure("server_prefill_ms") == pytest.approx(2.25)  # the server's own figures stay
    assert runs.describe()["stalled_passes"] == 1


def test_the_api_servers_serial_admission_is_fitted_from_the_bursts(tiny, tmp_path: Path) -> None:
    truth_hw = get_gpu("cpu").model_copy(update={"bf16_tflops": 0.3, "memory_bandwidth_gbs": 12})
    start = probed(tiny)
    server = Deployment.build(
        truth_hw,
        tiny,
        start.requested,
        coefficients=CPU_TRUTH,
        network_latency=LATENCY,
        api=ApiServerCosts(per_request_s=1e-3),
    )
    ticks = itertools.count()
    runs = run_probes(
        server.sim_target(),
        probe_plan(start.config),
        vocab_size=tiny.vocab_size,
        budget_s=60,
        directory=tmp_path,
        run_info=RunInfo.begun(),
        clock=lambda: float(next(ticks)),
    )
    _, fitted = fit_runs(runs, start, "test")
    assert fitted.api.per_request_s == pytest.approx(1e-3, rel=0.25)
    assert fitted.network_latency == pytest.approx(LATENCY, rel=0.15)
    burst = next(r for r in simulate_probes(fitted.sim_target(), runs, tiny.vocab_size) if r["probe"] == "decode-b32")
    assert abs(burst["error_pct"]["median_ttft_ms"]) < 10
