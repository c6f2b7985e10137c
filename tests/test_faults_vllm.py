"""Faults on the real vLLM CPU server: what a user's run survives, and what it leaves behind.

- bench's client SIGKILLed mid-run: records.jsonl ends on a whole record, and
  `report` / `diagnose` read the partial run and say it is partial;
- the server's process group SIGKILLed mid-bench: the run ends by itself well
  within --request-timeout, every request released has a record (completed,
  reset or refused), summary and timeline are written, exit code 3; a
  restarted server then serves a clean bench;
- a model name the server does not serve: refused at pre-flight, and a
  request sent anyway is a record naming it;
- tune stage 2: a bad flag and a start-up past --startup-timeout are failed
  trials with the server's log tail; a SIGKILLed `servelab tune` leaves no
  server process (its watchdog stops the group); `--resume` continues, and a
  server killed mid-measurement is a failed trial while the study goes on.

Every assertion is structural (records, error kinds, exit codes, processes);
the only times asserted are generous upper bounds, so a busy second core
cannot turn them red. The bench tests use the session's default server and the
last of them kills it (the pool restarts it for whoever needs it next); the tune
tests start their own. Server starts dominate the time (one to two minutes
each on two shared cores): four full starts, two cut short.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.metrics.records import MemorySink
from servelab.metrics.slo import SLO
from servelab.targets.deployment import build_deployment
from servelab.targets.http import HttpTarget
from servelab.targets.server_process import free_port, group_members
from servelab.tune.confirm import LIVE_SERVER, STAGE2_DIR, ServerCommand, Stage2Config, confirm
from servelab.tune.objectives import Objective
from servelab.tune.workload import TuneWorkload
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount
from servelab.workload.spec import LoadPlan, RequestSpec
from support.schemas import assert_files_match_schemas

pytestmark = pytest.mark.vllm

SERVELAB = str(Path(sys.executable).parent / "servelab")
REQUEST_TIMEOUT = 30.0
LOAD = [
    "--random-input-len",
    "64",
    "--random-output-len",
    "128",
    "--ignore-eos",
    "--max-concurrency",
    "8",
    "--num-prompts",
    "400",
    "--request-timeout",
    f"{REQUEST_TIMEOUT:g}",
    "--scrape-interval",
    "0.5",
]
"""Far more than a test waits for: every run here is cut short by a kill, long before its end."""
SIM_ARGS = "--block-size 128 --kv-cache-memory-bytes 1G"
"""What the simulator needs to know of the CPU backend (tests/test_tune_vllm.py)."""


# -- helpers ------------------------------------------------------------------


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.1)


def record_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def server_pgid(port: int) -> int | None:
    """The process group of the vLLM server listening on `port` (found by its command line)."""
    wanted = [b"vllm.entrypoints.openai.api_server", str(port).encode()]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if all(w in argv for w in wanted):
                    return os.getpgid(int(entry.name))
            except (OSError, ProcessLookupError):
                continue
    return None


def bench_process(url: str, out: Path) -> subprocess.Popen[bytes]:
    log = (out.parent / f"{out.name}.log").open("wb")
    return subprocess.Popen(
        [SERVELAB, "bench", "--base-url", url, *LOAD, "--result-dir", str(out)], stdout=log, stderr=subprocess.STDOUT
    )


def whole_records(path: Path) -> list[dict]:
    """Every line of records.jsonl as JSON; fails on a torn one."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), f"torn last line: {data[-200:]!r}"
    return [json.loads(line) for line in data.splitlines()]


# -- bench ----------------------------------------------------------------------


def test_a_model_the_server_does_not_serve_is_refused_before_load(vllm_server, tmp_path: Path) -> None:
    url = vllm_server.base_url
    out = tmp_path / "wrong-model"
    result = CliRunner().invoke(
        app, ["bench", "--base-url", url, "--model", "not-served", *LOAD, "--result-dir", str(out)]
    )
    assert result.exit_code == 2
    assert f"model 'not-served' is not served by {url}; it serves: tiny-qwen" in " ".join(result.output.split())
    assert not (out / "records.jsonl").exists()

    sink = MemorySink()  # sent anyway (no pre-flight): each request is a record that names the model
    HttpTarget(url, model="not-served", run_preflight=False).run(
        LoadPlan([RequestSpec(i, [1, 2, 3], 4) for i in range(3)]), sink
    )
    assert len(sink.records) == 3
    assert all(r.error_kind == "http_404" and "not-served" in r.error for r in sink.records), sink.records[0]

    info = HttpTarget(url).preflight()  # vLLM streams usage and names its model: nothing to warn about
    assert info["warnings"] == [] and info["model_names"] == ["tiny-qwen"]


def test_a_killed_client_leaves_whole_records_that_report_and_diagnose_read_as_partial(
    vllm_server, tiny_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "cut"
    bench = bench_process(vllm_server.base_url, out)
    try:
        wait_for(lambda: record_lines(out / "records.jsonl") >= 5 or bench.poll() is not None, 120, "5 records")
        assert bench.poll() is None, (tmp_path / "cut.log").read_text()
        bench.kill()  # SIGKILL: no handler, no summary
        bench.wait()
    finally:
        bench.kill()
        bench.wait()
    records = whole_records(out / "records.jsonl")
    assert len(records) >= 5 and len({r["index"] for r in records}) == len(records)
    assert not (out / "summary.json").exists()
    assert "finished_at" not in json.loads((out / "run.json").read_text())

    html = tmp_path / "report.html"
    report = subprocess.run(
        [SERVELAB, "report", str(out), "-o", str(html)], capture_output=True, text=True, timeout=120
    )
    assert report.returncode == 0, report.stderr
    assert "cut (measured) (partial)" in html.read_text()

    diagnose = subprocess.run(
        [
            SERVELAB,
            "diagnose",
            str(out),
            "--gpu",
            "cpu",
            "--model",
            str(tiny_model),
            "--engine-args",
            f"{' '.join(vllm_server.extra_args)} --block-size 128",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert diagnose.returncode == 0, diagnose.stderr
    assert f"partial run: {out} has no summary.json, no end time in run.json" in diagnose.stderr
    assert json.loads(diagnose.stdout)["partial_run"].startswith("partial run:")
    print(f"client killed after {len(records)} records; no torn line")


def test_a_killed_server_ends_the_run_with_every_request_recorded_and_a_restart_serves(
    vllm_server, tmp_path: Path
) -> None:
    url, pgid = vllm_server.base_url, vllm_server.pid  # the session's default server, restarted below
    out = tmp_path / "killed"
    bench = bench_process(url, out)
    try:
        wait_for(lambda: record_lines(out / "records.jsonl") >= 5 or bench.poll() is not None, 120, "5 records")
        assert bench.poll() is None, (tmp_path / "killed.log").read_text()
        os.killpg(pgid, signal.SIGKILL)
        killed = time.monotonic()
        code = bench.wait(REQUEST_TIMEOUT + 60)
        ended_after = time.monotonic() - killed
    finally:
        bench.kill()
        bench.wait()
    output = (tmp_path / "killed.log").read_text()
    assert code == 3, output
    assert ended_after < REQUEST_TIMEOUT, f"the run took {ended_after:.1f} s to end after the kill"
    records = whole_records(out / "records.jsonl")
    kinds = Counter(r["error_kind"] or "ok" for r in records)
    # A closed loop releases in plan order: a record for every index up to the last one means one for every request
    # sent.
    assert sorted(r["index"] for r in records) == list(range(len(records)))
    assert set(kinds) <= {"ok", "connection_reset", "connection_refused"} and kinds["ok"] >= 5, kinds
    assert kinds["connection_reset"] + kinds["connection_refused"] >= 1, kinds
    summary = json.loads((out / "summary.json").read_text())
    assert summary["errors_by_kind"] == {k: n for k, n in kinds.items() if k != "ok"}
    assert summary["client_stats"]["server_gone"].startswith("connection refused at ")
    assert (out / "timeline.jsonl").stat().st_size > 0
    assert "disturbed" in output
    wait_for(lambda: not group_members(pgid), 30, "the killed server's processes gone")
    print(f"server killed: run ended {ended_after:.1f} s later, records {dict(kinds)}")

    # The session's server pool sees its server dead and starts another, as a user would restart it.
    again = CliRunner().invoke(
        app,
        [
            "bench",
            "--base-url",
            vllm_server.base_url,
            "--random-input-len",
            "64",
            "--random-output-len",
            "16",
            "--ignore-eos",
            "--max-concurrency",
            "4",
            "--num-prompts",
            "12",
            "--result-dir",
            str(tmp_path / "again"),
        ],
    )
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "again" / "summary.json").read_text())["completed"] == 12


# -- tune stage 2 ------------------------------------------------------------


def _server_cmd(vllm_python: Path, tiny_model: Path, port: int, startup_timeout: float) -> ServerCommand:
    return ServerCommand(
        f"{vllm_python} -m vllm.entrypoints.openai.api_server --model {tiny_model} --served-model-name tiny-qwen "
        "{engine_args}",
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        port=port,
        startup_timeout=startup_timeout,
    )


def test_stage2_servers_that_do_not_start_are_failed_trials_with_their_log_tail(
    tmp_path: Path, tiny_model: Path, vllm_python: Path, _vllm_pool, launch_vllm
) -> None:
    _vllm_pool.stop_default()  # one vLLM at a time: these start their own
    line = "--max-model-len 4096"
    deployment = build_deployment("cpu", tiny_model, f"{line} {SIM_ARGS}")
    workload = TuneWorkload(
        WorkloadConfig(input_len=64, output_len=16), ArrivalConfig(max_concurrency=4), Amount(num_prompts=20)
    )
    objective = Objective("goodput", SLO.parse("ttft:2000"))
    port = free_port()
    cases = [
        (
            "bad-flag",
            f"{line} --no-such-flag",
            300.0,
            r"server exited with code \d+ before it was ready(?s:.*)--no-such-flag",
        ),
        ("too-slow", line, 3.0, r"server not ready at .*/health after 3 s(?s:.*)\S"),
    ]
    for label, args, startup_timeout, error in cases:
        began = time.monotonic()
        [result] = confirm(
            [Stage2Config(label, {}, args, deployment)],
            _server_cmd(vllm_python, tiny_model, port, startup_timeout),
            workload,
            objective,
            tmp_path / label,
        )
        assert not result.ok and result.measured is None
        assert result.error and re.search(error, result.error), result.error
        stored = json.loads((tmp_path / label / STAGE2_DIR / label / "stage2.json").read_text())
        assert stored["error"] == result.error
        assert assert_files_match_schemas(tmp_path / label) == {"stage2": 1}
        assert server_pgid(port) is None and not (tmp_path / label / STAGE2_DIR / LIVE_SERVER).exists()
        print(f"{label}: failed trial after {time.monotonic() - began:.0f} s: {result.error.splitlines()[0]}")


def test_a_killed_tune_leaves_no_server_and_resume_goes_on_past_a_server_crash(
    tmp_path: Path, tiny_model: Path, vllm_python: Path, _vllm_pool, launch_vllm
) -> None:
    _vllm_pool.stop_default()
    out, port = tmp_path / "study", free_port()
    argv = [
        SERVELAB,
        "tune",
        "--gpu",
        "cpu",
        "--model",
        str(tiny_model),
        "--result-dir",
        str(out),
        "--engine-args",
        "--max-model-len 4096 --max-num-seqs 2",
        "--sim-args",
        SIM_ARGS,
        "--space",
        "max_num_seqs=2,8",
        "--goodput",
        "ttft:5000",
        "--sim-prompts",
        "40",
        "--top-k",
        "1",
        "--random-input-len",
        "64",
        "--random-output-len",
        "64",
        "--max-concurrency",
        "4",
        "--num-prompts",
        "60",
        "--server-cmd",
        _server_cmd(vllm_python, tiny_model, port, 300).template,
        "--server-env",
        "VLLM_CPU_KVCACHE_SPACE=1",
        "--server-port",
        str(port),
    ]
    baseline = out / STAGE2_DIR / "baseline"

    # 1. SIGKILL tune while its first server loads (engine core forked): the watchdog stops the whole group.
    first = subprocess.Popen(argv, stdout=(tmp_path / "first.log").open("wb"), stderr=subprocess.STDOUT)
    try:
        log = baseline / "server.log"
        wait_for(
            lambda: log.exists() and "EngineCore" in log.read_text(errors="replace") or first.poll() is not None,
            240,
            "the baseline server's engine core starting",
        )
        assert first.poll() is None, (tmp_path / "first.log").read_text()
        pgid = server_pgid(port)
        assert pgid is not None and len(group_members(pgid)) >= 2
        first.kill()
        first.wait()
        killed = time.monotonic()
    finally:
        first.kill()
        first.wait()
    wait_for(lambda: not group_members(pgid), 60, f"server group {pgid} gone after tune was SIGKILLed")
    print(f"tune SIGKILLed: its server's group was gone {time.monotonic() - killed:.1f} s later")

    # 2. --resume: kill the baseline's server mid-measurement; the study goes on to the next configuration.
    crashed: list[int] = []

    def crash_baseline() -> None:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and record_lines(baseline / "records.jsonl") < 3:
            time.sleep(0.1)
        group = server_pgid(port)
        if group is not None:
            os.killpg(group, signal.SIGKILL)
            crashed.append(group)

    crasher = threading.Thread(target=crash_baseline, daemon=True)
    crasher.start()
    second = subprocess.run([*argv, "--resume", "--json"], capture_output=True, text=True, timeout=540)
    crasher.join(5)
    assert second.returncode == 0, second.stderr[-3000:]
    assert crashed, "the baseline's measurement ended before it could be crashed"
    doc = json.loads(second.stdout)
    results = {r["label"]: r for r in doc["stage2"]["results"]}
    assert len(results) == 2
    failed = results.pop("baseline")
    assert failed["error"].startswith("server exited with code -9 during the measurement ("), failed["error"]
    assert "(APIServer pid=" in failed["error"]  # the log tail
    [(label, measured)] = results.items()
    assert measured["error"] is None and measured["measured"]["failed"] == 0
    assert doc["recommendation"]["source"] == "stage2" and doc["recommendation"]["label"] == label
    assert server_pgid(port) is None and not group_members(crashed[0])
    print(f"resumed: baseline failed ({failed['error'].splitlines()[0][:90]}...), {label} measured")
