"""The experiment runner and sweeps, driven by a fake Target (no server, no simulator)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from servelab.errors import InputError, RunInterrupted
from servelab.calibrate.probes import run_into
from servelab.experiment.runner import run_point
from servelab.experiment.sweep import Sweep, SweepError, run_sweep
from servelab.metrics.records import MemorySink, RequestRecord
from servelab.metrics.results import load_run
from servelab.metrics.slo import SLO
from servelab.metrics.timeline import RUNNING, TimelineSample
from servelab.targets.base import TargetRun
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount, build_plan
from servelab.schemas.results import RunFlags, RunInfo, ServerInfo


class FakeTarget:
    """Serves each request in `service` seconds of fake time, `concurrency` at a time.

    `stop_after` raises KeyboardInterrupt (or sends SIGTERM to this process)
    once that many records are written, like a user pressing Ctrl-C mid-run.
    """

    def __init__(
        self, service: float = 0.1, stop_after: int | None = None, sigterm: bool = False, bottleneck: bool = False
    ):
        self.service = service
        self.stop_after = stop_after
        self.sigterm = sigterm
        self.bottleneck = bottleneck
        self.plans = []

    def run(self, plan, sink, on_sample=None):
        self.plans.append(plan)
        slots = plan.max_concurrency or 1
        free = [0.0] * slots
        last = 0.0
        for n, spec in enumerate(plan.requests):
            if self.stop_after is not None and n == self.stop_after:
                if self.sigterm:
                    os.kill(os.getpid(), signal.SIGTERM)
                raise KeyboardInterrupt
            k = min(range(slots), key=free.__getitem__)
            send = max(free[k], spec.arrival_time)
            finish = send + self.service
            free[k] = finish
            chunks = [send + self.service * (i + 1) / spec.max_tokens for i in range(spec.max_tokens)]
            sink.write(
                RequestRecord(
                    index=spec.index,
                    intended_time=spec.arrival_time,
                    send_time=send,
                    finish_time=finish,
                    first_token_time=chunks[0],
                    chunk_times=chunks,
                    prompt_tokens=spec.prompt_len,
                    output_tokens=spec.max_tokens,
                )
            )
            if on_sample is not None:
                on_sample(TimelineSample(finish, {RUNNING: float(slots)}))
            last = max(last, finish)
        stats = {
            "client_may_be_bottleneck": self.bottleneck,
            "reason": "client CPU at 95% of a core" if self.bottleneck else "ok",
        }
        return TargetRun(duration=last, server_info={"model": "fake"}, client_stats=stats)


def plan(n: int = 20, concurrency: int | None = 4, rate: float = float("inf"), warmup: float = 0.0):
    return build_plan(
        WorkloadConfig(input_len=32, output_len=8),
        ArrivalConfig(request_rate=rate, max_concurrency=concurrency),
        Amount(num_prompts=n, warmup=warmup),
    )


def test_run_point_writes_every_file(tmp_path):
    summary = run_point(
        FakeTarget(), plan(), tmp_path / "run", RunInfo.begun(flags={"model": "x"}), slo=SLO.parse("ttft:50")
    ).model_dump(exclude_unset=True)
    run = load_run(tmp_path / "run")
    assert len(run.records) == 20 and len(run.timeline) == 20
    assert run.summary["completed"] == summary["completed"] == 20
    assert summary["request_throughput"] == pytest.approx(20 / 0.5)
    assert summary["request_goodput"] == pytest.approx(20 / 0.5)  # first chunk after 12.5 ms < 50 ms
    assert run.run_info.flags == RunFlags(model="x")
    assert run.run_info.workload.workload.dataset_name == "random"
    assert run.run_info.server_info == ServerInfo(model="fake") and run.run_info.interrupted is False
    assert run.run_info.client_host["cpu_count"] >= 1 and run.run_info.client_host["gpus"] == []  # no GPU here
    assert summary["warnings"] == [] and summary["interrupted"] is False


def test_warmup_requests_are_recorded_but_not_counted(tmp_path):
    summary = run_point(FakeTarget(), plan(n=20, concurrency=1, warmup=0.95), tmp_path, RunInfo.begun()).model_dump(
        exclude_unset=True
    )
    assert summary["requests_recorded"] == 20
    assert summary["completed"] == 10  # sends at 0.0, 0.1, ...; those from 1.0 on count


def test_client_bottleneck_is_a_loud_warning(tmp_path):
    summary = run_point(FakeTarget(bottleneck=True), plan(), tmp_path, RunInfo.begun()).model_dump(exclude_unset=True)
    assert summary["warnings"][0].startswith("THE CLIENT MAY BE THE BOTTLENECK: client CPU at 95%")
    assert summary["client_stats"]["client_may_be_bottleneck"] is True


@pytest.mark.parametrize("sigterm", [False, True])
def test_interruption_keeps_records_and_writes_a_summary(tmp_path, sigterm):
    summary = run_point(FakeTarget(stop_after=7, sigterm=sigterm), plan(), tmp_path, RunInfo.begun()).model_dump(
        exclude_unset=True
    )
    run = load_run(tmp_path)
    assert len(run.records) == 7
    assert run.summary["interrupted"] is True and run.summary["completed"] == 7
    assert run.run_info.interrupted is True
    assert "interrupted" in summary["warnings"][-1]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_failing_target_records_the_error_and_raises(tmp_path):
    class Broken:
        def run(self, plan, sink, on_sample=None):
            raise RuntimeError("engine exploded")

    with pytest.raises(RuntimeError):
        run_point(Broken(), plan(), tmp_path, RunInfo.begun())
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["error"] == "RuntimeError: engine exploded"
    assert not (tmp_path / "summary.json").exists()


def test_sweep_parse():
    s = Sweep.parse("max-concurrency=1,8,32")
    assert s.values == (1, 8, 32) and s.label(8) == "max-concurrency=8"
    r = Sweep.parse("request-rate=0.5, 2,inf")
    assert r.values == (0.5, 2.0, float("inf")) and r.label(0.5) == "request-rate=0.5"
    for bad, message in [
        ("num-prompts=1,2", "KEY one of request-rate, max-concurrency"),
        ("request-rate", "KEY=V1"),
        ("request-rate=", "no values"),
        ("max-concurrency=1,0", "'0' is not an integer >= 1"),
        ("request-rate=fast", "'fast' is not a rate"),
        ("max-concurrency=2,2", "repeated"),
    ]:
        with pytest.raises(SweepError, match=message):
            Sweep.parse(bad)


def test_sweep_writes_one_directory_per_point_and_the_curve(tmp_path):
    target = FakeTarget()
    sweep = Sweep.parse("max-concurrency=1,4,16")
    base = ArrivalConfig()

    def make(arrival):
        return build_plan(WorkloadConfig(input_len=16, output_len=4), arrival, Amount(num_prompts=32))

    seen = []

    from contextlib import contextmanager

    @contextmanager
    def observe(label, plan):
        sink = MemorySink()
        yield sink
        seen.append((label, len(sink.records)))

    index = run_sweep(target, sweep, base, make, tmp_path, RunInfo.begun(flags={}), observe=observe)
    assert [p.directory for p in index.points] == ["max-concurrency=1", "max-concurrency=4", "max-concurrency=16"]
    assert seen == [(p.directory, 32) for p in index.points]
    assert [p.max_concurrency for p in target.plans] == [1, 4, 16]
    on_disk = json.loads((tmp_path / "sweep.json").read_text())
    tput = [p["request_throughput"] for p in on_disk["points"]]
    assert tput[0] < tput[1] < tput[2]
    assert load_run(tmp_path / "max-concurrency=4").run_info.model_extra["sweep_point"] == {"max-concurrency": 4}


def test_sweep_stops_at_an_interrupted_point(tmp_path):
    sweep = Sweep.parse("request-rate=1,2,4")

    def make(arrival):
        return build_plan(WorkloadConfig(input_len=16, output_len=4), arrival, Amount(num_prompts=10))

    index = run_sweep(FakeTarget(stop_after=3), sweep, ArrivalConfig(), make, tmp_path, RunInfo.begun())
    assert len(index.points) == 1 and index.interrupted is True
    assert json.loads((tmp_path / "sweep.json").read_text())["points"][0]["completed"] == 3


def test_an_interrupted_probe_run_ends_the_experiment_as_interrupted_not_as_bad_input(tmp_path):
    plan = build_plan(WorkloadConfig(input_len=16, output_len=4), ArrivalConfig(), Amount(num_prompts=10))
    with pytest.raises(RunInterrupted, match="kept under") as raised:
        run_into(FakeTarget(stop_after=3), plan, tmp_path / "probe", RunInfo.begun(verb="calibrate"))
    assert raised.value.exit_code == 130 and not isinstance(raised.value, InputError)
