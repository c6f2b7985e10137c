"""Client edge cases a real vLLM cannot be made to show (unit tests against the hand-written fault server).

Each fault gets one clear record in a run, and, where the pre-flight probe can
see it, one clear sentence before any load: an empty stream, a stream from
another model, a 429/503 with Retry-After refuse the run; a stream without
usage is a warning and records that say their token counts are estimates.
The same faults on the real server (killed, restarted, wrong model name) are
in tests/test_faults_vllm.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.fault_server import MODEL, OTHER_MODEL, FaultServer
from support.synthetic_results import write_toy_run
from typer.testing import CliRunner

from servelab.cli import app
from servelab.metrics.records import JsonlSink, MemorySink, RequestRecord, read_records
from servelab.metrics.results import RECORDS, load_run
from servelab.report.inputs import PARTIAL, load_inputs
from servelab.targets.errors import TargetError
from servelab.targets.http import HttpTarget
from servelab.workload.spec import LoadPlan, RequestSpec


def _plan(n: int = 3) -> LoadPlan:
    return LoadPlan([RequestSpec(i, [1, 2, 3], 4) for i in range(n)], max_concurrency=2)


def _run(server: FaultServer, fault: str) -> list[RequestRecord]:
    target = HttpTarget(server.base_url, extra_body={"fault": fault}, request_timeout=5)
    target.preflight()  # the server is healthy for the probe (no fault field); the run's requests carry it
    sink = MemorySink()
    target.run(_plan(), sink)
    return sorted(sink.records, key=lambda r: r.index)


@pytest.fixture
def server():
    with FaultServer() as srv:
        yield srv


@pytest.mark.parametrize(
    ("fault", "kind", "message"),
    [
        ("empty_stream", "empty_stream", "HTTP 200 with no event in the stream before data: [DONE]"),
        ("wrong_model", "wrong_model", f"asked for model '{MODEL}', the stream came from '{OTHER_MODEL}'"),
    ],
)
def test_a_stream_that_cannot_be_a_measurement_is_a_failed_record(server, fault, kind, message):
    records = _run(server, fault)
    assert [r.index for r in records] == [0, 1, 2]
    assert all((r.status, r.error_kind, r.error) == ("error", kind, message) for r in records)


def test_a_stream_without_usage_is_measured_with_its_counts_marked_estimated(server):
    records = _run(server, "no_usage")
    assert all(r.ok and r.tokens_estimated for r in records)
    assert all((r.prompt_tokens, r.output_tokens, len(r.chunk_times)) == (3, 4, 4) for r in records)
    assert not any(r.tokens_estimated for r in _run(server, "ok"))


@pytest.mark.parametrize("status", [429, 503])
def test_a_refusal_with_retry_after_says_when_to_come_back(server, status):
    server.retry_after = "7"
    records = _run(server, f"http_{status}")
    assert all(r.error_kind == f"http_{status}" and r.error == f"injected {status} (Retry-After: 7)" for r in records)


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ("empty_stream", "answered HTTP 200 with an empty stream"),
        ("wrong_model", f"asked for model '{MODEL}' and the stream came from '{OTHER_MODEL}'"),
        ("http_429", "refused with HTTP 429, Retry-After: 30 (injected 429): the server is not taking load now"),
        ("http_503", "refused with HTTP 503, Retry-After: 30 (injected 503)"),
    ],
)
def test_preflight_refuses_a_server_whose_every_request_would_fail(fault, said):
    with FaultServer(fault=fault, retry_after="30") as srv:
        with pytest.raises(TargetError, match=f"^POST {srv.base_url}/v1/completions .*{_escaped(said)}"):
            HttpTarget(srv.base_url).preflight()
        assert srv.received == []  # nothing but the probe was sent


def _escaped(text: str) -> str:
    return text.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")


def test_preflight_warns_that_a_stream_without_usage_means_estimated_counts():
    with FaultServer(fault="no_usage") as srv:
        info = HttpTarget(srv.base_url).preflight()
    assert info["warnings"] == [
        f"{srv.base_url}/v1/completions streams no usage (stream_options.include_usage is "
        "ignored): token counts are estimated, prompt tokens from the plan and output "
        "tokens as chunks with output"
    ]
    with FaultServer() as srv:
        assert HttpTarget(srv.base_url).preflight()["warnings"] == []


def test_bench_prints_the_preflight_refusal_and_sends_nothing(tmp_path):
    with FaultServer(fault="wrong_model") as srv:
        result = CliRunner().invoke(
            app,
            [
                "bench",
                "--base-url",
                srv.base_url,
                "--random-input-len",
                "8",
                "--random-output-len",
                "2",
                "--num-prompts",
                "3",
                "--result-dir",
                str(tmp_path / "r"),
            ],
        )
        assert srv.received == []
    assert result.exit_code == 2
    assert f"the stream came from '{OTHER_MODEL}'" in " ".join(result.output.split())


def test_bench_exits_3_when_connections_were_dropped_and_still_writes_everything(tmp_path):
    out = tmp_path / "r"
    with FaultServer() as srv:
        result = CliRunner().invoke(
            app,
            [
                "bench",
                "--base-url",
                srv.base_url,
                "--random-input-len",
                "8",
                "--random-output-len",
                "4",
                "--num-prompts",
                "4",
                "--max-concurrency",
                "2",
                "--result-dir",
                str(out),
            ],
            env={"COLUMNS": "200"},
        )
        assert result.exit_code == 0, result.output
        srv.fault = "reset"
        result = CliRunner().invoke(
            app,
            [
                "bench",
                "--base-url",
                srv.base_url,
                "--random-input-len",
                "8",
                "--random-output-len",
                "4",
                "--num-prompts",
                "4",
                "--max-concurrency",
                "2",
                "--result-dir",
                str(out),
                "--overwrite",
            ],
            env={"COLUMNS": "200"},
        )
    assert result.exit_code == 3, result.output
    assert "disturbed" in result.output and "4 connection_reset" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["errors_by_kind"] == {"connection_reset": 4}
    assert (out / "timeline.jsonl").is_file()


def test_a_long_record_is_one_line_and_a_torn_last_line_is_left_out(tmp_path):
    path = tmp_path / RECORDS
    sink = JsonlSink(path)
    long = RequestRecord(0, 0.0, 0.0, 1.0, chunk_times=[i / 3 for i in range(20_000)])  # ~400 kB, many buffers
    sink.write(long)
    sink.write(RequestRecord(1, 0.0, 0.0, 1.0))
    sink.close()
    lines = path.read_bytes().split(b"\n")
    assert len(lines) == 3 and lines[-1] == b"" and len(json.loads(lines[0])["chunk_times"]) == 20_000
    with path.open("a") as fh:
        fh.write('{"index": 2, "intended_t')  # what a writer killed mid-line would leave
    assert [r.index for r in read_records(path)] == [0, 1]


def test_a_run_without_summary_is_read_back_as_partial(tmp_path):
    done = write_toy_run(tmp_path / "done")
    cut = write_toy_run(tmp_path / "cut", with_summary=False)
    assert not load_run(done).partial and load_run(done).partial_note() == ""
    run = load_run(cut)
    assert run.partial and f"partial run: {cut} has no summary.json" in run.partial_note()
    inputs = load_inputs([done, cut])
    assert [r.label.endswith(PARTIAL) for r in inputs.runs] == [False, True]
    derived = inputs.runs[1].summary
    assert derived.completed + derived.failed == len(run.records)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def test_a_killed_bench_takes_its_client_workers_with_it(tmp_path):
    """SIGKILL of `bench --workers 2`: each worker gets its parent-death signal and stops at once, not when its
    streams (a minute long here) would have ended."""
    out = tmp_path / "r"
    with FaultServer(delay=0.3) as srv:
        bench = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "servelab"),
                "bench",
                "--base-url",
                srv.base_url,
                "--workers",
                "2",
                "--random-input-len",
                "8",
                "--random-output-len",
                "200",
                "--num-prompts",
                "100",
                "--max-concurrency",
                "4",
                "--result-dir",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 120
            while srv.active < 4 and time.monotonic() < deadline and bench.poll() is None:
                time.sleep(0.05)
            workers = _children(bench.pid)
            assert srv.active == 4 and len(workers) >= 2, (srv.active, workers)
            bench.kill()
            bench.wait()
            deadline = time.monotonic() + 20
            while any(_alive(w) for w in workers) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not [w for w in workers if _alive(w)]
        finally:
            bench.kill()
            bench.wait()
    assert whole_lines(out / RECORDS)


def _alive(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False


def whole_lines(path: Path) -> bool:
    data = path.read_bytes() if path.exists() else b""
    return data == b"" or data.endswith(b"\n")


def test_a_refused_connection_stops_every_worker_from_releasing_more():
    with FaultServer() as srv:
        target = HttpTarget(srv.base_url, workers=2)
        target.preflight()
    sink = MemorySink()  # the server is gone before the run: each worker's first requests are refused, no more
    result = target.run(LoadPlan([RequestSpec(i, [1, 2, 3], 4) for i in range(200)], max_concurrency=4), sink)
    assert {r.error_kind for r in sink.records} == {"connection_refused"} and len(sink.records) < 20
    assert result.client_stats["server_gone"].startswith("connection refused at ") and not result.interrupted
