"""`servelab bench` through the real command line, against the in-process fake server.

Bad input must be one clear line and exit code 2 before any load is sent;
a good run writes the results directory; Ctrl-C leaves a summary and exits 130.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.metrics.results import load_run
from support.fault_server import MODEL, FaultServer

runner = CliRunner()
SMALL = ["--random-input-len", "16", "--random-output-len", "4"]


def bench(*args: str, env: dict[str, str] | None = None):
    return runner.invoke(app, ["bench", *args], env=env)


@pytest.fixture
def server():
    with FaultServer() as s:
        yield s


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--num-prompts", "5", "--duration", "3"], ["--num-prompts", "--duration"]),
        (["--sweep", "request-rate=1,2", "--request-rate", "3"], ["--sweep request-rate", "--request-rate"]),
        (
            ["--sweep", "max-concurrency=1,2", "--max-concurrency", "3"],
            ["--sweep max-concurrency", "--max-concurrency"],
        ),
        (["--sweep", "prompts=1,2"], ["--sweep", "request-rate, max-concurrency"]),
        (["--dataset-path", "x.jsonl"], ["--dataset-path", "--dataset-name", "random"]),
        (["--prefix-len", "10"], ["--prefix-len", "--dataset-name random"]),
        (
            ["--multiturn-turns", "2", "--dataset-name", "prefix", "--prefix-len", "4"],
            ["--multiturn-turns", "--dataset-name prefix"],
        ),
        (["--burstiness", "0.5"], ["--burstiness", "--request-rate"]),
        (["--goodput", "ttft:abc"], ["--goodput"]),
        (["--length-distribution", "zipf"], ["zipf"]),
        (["--max-concurrency", "0"], ["--max-concurrency"]),
        (["--warmup", "5", "--duration", "2"], ["--warmup", "--duration"]),
        (["--metric-percentiles", "50,101"], ["--metric-percentiles"]),
        (["--workers", "0"], ["--workers"]),
    ],
)
def test_impossible_flags_name_both_and_send_nothing(server, args, named):
    result = bench("--base-url", server.base_url, *SMALL, *args)
    assert result.exit_code == 2, result.output
    assert "error:" in result.output
    for flag in named:
        assert flag in result.output
    assert server.received == []


def test_random_flags_do_not_apply_to_file_datasets(server, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": "hi", "max_tokens": 2}\n')
    result = bench(
        "--base-url", server.base_url, "--dataset-name", "jsonl", "--dataset-path", str(path), "--random-input-len", "5"
    )
    assert result.exit_code == 2 and "--random-input-len" in result.output and "jsonl" in result.output


def test_malformed_dataset_names_file_and_line(server, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "hi", "max_tokens": 2}\n{"prompt": "hi", "max_tokens": 0}\n')
    result = bench("--base-url", server.base_url, "--dataset-name", "jsonl", "--dataset-path", str(path))
    assert result.exit_code == 2
    assert f"{path}:2:" in result.output.replace("\n", "") and server.received == []


def test_unreachable_url_is_one_error_before_load(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    result = bench("--base-url", url, *SMALL, "--num-prompts", "3", "--result-dir", str(tmp_path / "r"))
    assert result.exit_code == 2 and "cannot reach" in result.output and url in result.output
    assert not (tmp_path / "r").exists()


def test_unknown_model_and_wrong_endpoint(server):
    result = bench("--base-url", server.base_url, "--model", "nope", *SMALL, "--num-prompts", "3")
    assert result.exit_code == 2 and "'nope' is not served" in result.output and MODEL in result.output
    result = bench("--base-url", server.base_url, "--endpoint", "/v1/embeddings", *SMALL)
    assert result.exit_code == 2 and "/v1/embeddings" in result.output
    assert not any(r.body.get("stream") for r in server.received)


def test_chat_without_text_needs_a_tokenizer(server):
    result = bench("--base-url", server.base_url, "--endpoint", "/v1/chat/completions", *SMALL)
    assert result.exit_code == 2 and "--tokenizer" in result.output and server.received == []


def test_a_run_writes_the_results_and_never_the_api_key(server, tmp_path):
    out = tmp_path / "run"
    result = bench(
        "--base-url",
        server.base_url,
        *SMALL,
        "--num-prompts",
        "12",
        "--max-concurrency",
        "4",
        "--goodput",
        "ttft:1000 e2el:5000",
        "--result-dir",
        str(out),
        "--json",
        env={"OPENAI_API_KEY": "sk-very-secret"},
    )
    assert result.exit_code == 0, result.output
    run = load_run(out)
    assert len(run.records) == 12 and all(r.ok and r.output_tokens == 4 for r in run.records)
    assert run.summary["completed"] == 12 and run.summary["request_goodput"] is not None
    assert run.run_info.flags.max_concurrency == 4 and run.run_info.server_info.model == MODEL
    assert run.run_info.workload.workload.dataset_name == "random"
    assert server.received[-1].authorization == "Bearer sk-very-secret"
    assert all("sk-very-secret" not in p.read_text() for p in out.iterdir())
    assert all(len(r.body["prompt"]) == 16 for r in server.received if r.body.get("stream"))
    printed = json.loads(result.stdout[result.stdout.index("{") :])
    assert printed["completed"] == 12


def test_sweep_runs_one_point_per_value(server, tmp_path):
    result = bench(
        "--base-url",
        server.base_url,
        *SMALL,
        "--num-prompts",
        "6",
        "--sweep",
        "max-concurrency=1,3",
        "--result-dir",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    index = json.loads((tmp_path / "sweep.json").read_text())
    assert [p["directory"] for p in index["points"]] == ["max-concurrency=1", "max-concurrency=3"]
    assert all(p["completed"] == 6 for p in index["points"])
    assert load_run(tmp_path / "max-concurrency=3").run_info.model_extra["sweep_point"] == {"max-concurrency": 3}


def test_ctrl_c_keeps_records_writes_a_summary_and_exits_130(tmp_path):
    with FaultServer(delay=0.05) as server:
        out = tmp_path / "run"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from servelab.cli import main; main()",
                "bench",
                "--base-url",
                server.base_url,
                "--random-input-len",
                "8",
                "--random-output-len",
                "10",  # half-second streams: the fourth record lands ~1 s in, long before the 200th
                "--num-prompts",
                "200",
                "--max-concurrency",
                "2",
                "--result-dir",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            records = out / "records.jsonl"
            while time.monotonic() < deadline and not (records.exists() and records.read_text().count("\n") >= 4):
                time.sleep(0.1)
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert rc == 130, proc.stderr.read()
    run = load_run(out)
    assert run.summary["interrupted"] is True and 4 <= run.summary["completed"] < 200
    assert len(run.records) >= run.summary["completed"]


def test_text_dataset_is_sent_as_text_and_estimates_are_declared(server, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"hello number {i}", "max_tokens": 3}) + "\n" for i in range(4)))
    out = tmp_path / "run"
    result = bench(
        "--base-url", server.base_url, "--dataset-name", "jsonl", "--dataset-path", str(path), "--result-dir", str(out)
    )
    assert result.exit_code == 0, result.output
    prompts = sorted(r.body["prompt"] for r in server.received if r.body.get("stream"))
    assert prompts == [f"hello number {i}" for i in range(4)]
    assert "lengths_estimated" in load_run(out).run_info.workload.model_extra["dataset_notes"]


def test_multiturn_turns_wait_for_the_previous_reply(server, tmp_path):
    out = tmp_path / "run"
    result = bench(
        "--base-url",
        server.base_url,
        "--dataset-name",
        "multiturn",
        "--multiturn-turns",
        "3",
        *SMALL,
        "--num-prompts",
        "9",
        "--max-concurrency",
        "3",
        "--result-dir",
        str(out),
    )
    assert result.exit_code == 0, result.output
    records = {r.index: r for r in load_run(out).records}
    assert len(records) == 9
    for conversation in range(3):
        first, second, third = (records[conversation * 3 + t] for t in range(3))
        assert second.send_time >= first.finish_time and third.send_time >= second.finish_time
        assert first.prompt_tokens < second.prompt_tokens < third.prompt_tokens
