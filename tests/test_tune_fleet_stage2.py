"""tune's stage 2 for a fleet, without vLLM: which configurations are fleets, a replica's own flags, and the two ways
a fleet goes unmeasured (a router no client can play; a replica that will not start), each leaving its prediction
and no process behind. The real fleet is measured in tests/test_tune_fleet_vllm.py."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import pytest
from support.profiles import TINY_CONFIG

from servelab.metrics.slo import SLO
from servelab.targets.deployment import build_deployment
from servelab.targets.server_process import group_alive
from servelab.tune.confirm import ServerCommand, Stage2Config, confirm
from servelab.tune.fleet_stage2 import is_fleet, measure_fleet, replica_args
from servelab.tune.objectives import Objective
from servelab.tune.space import apply
from servelab.tune.workload import TuneWorkload
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount

LINE = "--max-model-len 4096 --block-size 128 --kv-cache-memory-bytes 1G"
OBJECTIVE = Objective("goodput", SLO.parse("ttft:500"))
WORKLOAD = TuneWorkload(WorkloadConfig(input_len=64, output_len=8), ArrivalConfig(max_concurrency=4), Amount(16))


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-config")
    (directory / "config.json").write_text(json.dumps(TINY_CONFIG))
    return directory


def _config(tiny_config: Path, **params: object) -> Stage2Config:
    deployment = apply(build_deployment("cpu", tiny_config, LINE), params)
    return Stage2Config("trial-1", dict(params), deployment.engine_args(), deployment)


def test_a_searched_router_over_several_replicas_is_a_fleet_unless_it_is_vllms_own_balancer(tiny_config: Path) -> None:
    assert is_fleet(_config(tiny_config, data_parallel_size=2, router="session"))
    assert is_fleet(_config(tiny_config, data_parallel_size=2, router="prefix-aware"))  # a fleet, refused later
    assert not is_fleet(_config(tiny_config, data_parallel_size=2, router="least-loaded"))  # vLLM's DP balancer
    assert not is_fleet(_config(tiny_config, data_parallel_size=2))  # no router searched: the user's one server
    assert not is_fleet(_config(tiny_config, data_parallel_size=1, router="session"))


def test_each_replica_is_started_with_the_configurations_flags_less_the_replica_count() -> None:
    assert replica_args("--max-num-seqs 8 --data-parallel-size 2 --enable-prefix-caching") == (
        "--max-num-seqs 8 --enable-prefix-caching"
    )
    assert replica_args("-dp 4 --max-model-len 4096") == "--max-model-len 4096"
    assert replica_args("--data-parallel-size=2 --served-model-name 'a b'") == "--served-model-name 'a b'"


@pytest.mark.parametrize(
    ("router", "reads"), [("prefix-aware", "KV-cache events"), ("prefix-estimate", "its own routing history")]
)
def test_a_router_with_no_client_side_route_keeps_its_prediction_and_says_why_it_was_not_measured(
    tiny_config: Path, tmp_path: Path, router: str, reads: str
) -> None:
    touched = tmp_path / "started"
    command = ServerCommand(f"touch {touched} {{engine_args}}")
    config = _config(tiny_config, data_parallel_size=2, router=router)
    [row] = confirm([config], command, WORKLOAD, OBJECTIVE, tmp_path / "tune")
    assert row.measured is None and row.predicted.request_throughput is not None
    assert row.error is not None and "no client-side route" in row.error and router in row.error and reads in row.error
    assert row.route == router
    assert not touched.exists()  # nothing was started
    written = json.loads((tmp_path / "tune" / "stage2" / "trial-1" / "stage2.json").read_text())
    assert written["error"] == row.error


def test_a_replica_that_will_not_start_is_the_rows_error_and_leaves_no_server(
    tiny_config: Path, tmp_path: Path
) -> None:
    crash = f"{sys.executable} -c 'import sys; print(\"bad flags:\", sys.argv[1:]); sys.exit(3)' {{engine_args}}"
    config = _config(tiny_config, data_parallel_size=2, router="round-robin")
    row = measure_fleet(config, ServerCommand(crash, startup_timeout=30), WORKLOAD, OBJECTIVE, tmp_path / "trial-1")
    assert row.measured is None and row.predicted_score is not None
    assert row.error is not None and "would not start: server exited with code 3" in row.error, row.error
    logs = [(tmp_path / "trial-1" / f"replica-{i}" / "server.log") for i in range(2)]
    said = [log.read_text() for log in logs if log.exists()]
    assert any("bad flags" in text for text in said)  # (the other may have been stopped before it said anything)
    assert all("--data-parallel-size" not in text for text in said)  # each replica got its own flags
    assert not (tmp_path / "live-server.json").exists()
    assert all(server.pid is None or not group_alive(server.pid) for server in row.fleet)


def test_tune_says_it_starts_a_fleet_and_why_the_fleet_failed(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from servelab.cli import app

    crash = f"{sys.executable} -c 'import sys; sys.exit(3)' {{engine_args}}"
    result = CliRunner().invoke(
        app,
        [
            "tune", "--gpu", "l4", "--model", "qwen2.5-7b", "--engine-args", "--max-model-len 4096",
            "--space", "data_parallel_size=2", "--space", "router=session",
            "--random-input-len", "128", "--random-output-len", "16", "--num-prompts", "16", "--sim-prompts", "16",
            "--goodput", "ttft:2000", "--server-cmd", crash, "--top-k", "1", "--startup-timeout", "30",
            "--result-dir", str(tmp_path / "tune"),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "baseline: starting the server with --max-model-len 4096" in said
    assert "starting 2 servers behind servelab's session route with --max-model-len 4096 --data-parallel-size 2" in said
    assert "failed: replica 0 would not start" in said


def test_a_ctrl_c_while_the_replicas_start_stops_every_one_of_them(tiny_config: Path, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    never_ready = (
        f"sh -c 'echo $$ >> {pids}; exec {sys.executable} -c \"import time; time.sleep(3600)\"' {{engine_args}}"
    )
    config = _config(tiny_config, data_parallel_size=2, router="session")
    command = ServerCommand(never_ready, startup_timeout=120)  # the Ctrl-C ends the wait long before
    # A process started in the background by a non-interactive shell (CI) inherits SIGINT ignored: a Ctrl-C is
    # Python's KeyboardInterrupt only with its default handler, which a terminal's foreground process has.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupt = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))  # a Ctrl-C
    interrupt.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            measure_fleet(config, command, WORKLOAD, OBJECTIVE, tmp_path / "trial-1")
    finally:
        interrupt.cancel()
        signal.signal(signal.SIGINT, before)
    started = [int(pid) for pid in pids.read_text().split()]
    assert len(started) == 2 and not any(group_alive(pid) for pid in started)
    assert not (tmp_path / "live-server.json").exists()
