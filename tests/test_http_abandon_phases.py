"""Abandoned requests and the per-request HTTP phases, on the fake server (client edge cases; the real server's
side is in test_bench_features_vllm.py)."""

from __future__ import annotations

import time

import pytest
from support.fault_server import FaultServer
from support.schemas import assert_files_match_schemas
from typer.testing import CliRunner

from servelab.cli import app
from servelab.metrics.results import load_run

from servelab.metrics.records import MemorySink
from servelab.metrics.summary import summarize
from servelab.schemas.results import Summary
from servelab.targets.errors import TargetError
from servelab.targets.http import ABANDONED, HttpTarget
from servelab.workload.spec import LoadPlan, RequestSpec


def _run(target: HttpTarget, n: int, tokens: int, cap: int = 4):
    target.preflight()
    sink = MemorySink()
    target.run(LoadPlan([RequestSpec(i, [1, 2, 3], tokens) for i in range(n)], max_concurrency=cap), sink)
    return sorted(sink.records, key=lambda r: r.index)


def test_a_share_of_requests_abandons_mid_stream_and_is_counted_apart_from_errors():
    with FaultServer(delay=0.05) as srv:  # 20 chunks: a 1 s stream, abandoned at 0.3 s
        target = HttpTarget(srv.base_url, abandon_after=0.3, abandon_share=0.5, request_timeout=60)
        records = _run(target, 8, 20)
        # The server notices a closed stream at its next write (<= 50 ms later, longer on a loaded host), so the
        # last abandoned streams may still count as active when the run ends: wait for them, bounded.
        deadline = time.monotonic() + 10
        while srv.active and time.monotonic() < deadline:
            time.sleep(0.02)
        peak_after = srv.active
    chosen = [i for i in range(8) if target.abandons(i)]
    assert 0 < len(chosen) < 8  # the hash spreads the share over the indices
    for rec in records:
        if rec.index in chosen:
            assert rec.status == ABANDONED and rec.abandoned and rec.error_kind is None
            assert rec.e2el > 0.29 and 0 < len(rec.chunk_times) < 20  # gave up mid-stream (timers: ms granularity)
        else:
            assert rec.ok and not rec.abandoned and len(rec.chunk_times) == 20
    assert peak_after == 0  # the server saw every abandoned stream's connection close
    summary = summarize(records)
    assert summary.abandoned == len(chosen) and summary.failed == 0
    assert summary.completed == 8 - len(chosen)
    assert summary.abandoned_output_chunks == sum(len(r.chunk_times) for r in records if r.abandoned)
    assert summary.errors_by_kind == {}


@pytest.mark.parametrize(("after", "share"), [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0), (1.0, 1.5)])
def test_bad_abandon_settings_are_refused(after, share):
    with pytest.raises(TargetError, match="abandon"):
        HttpTarget("http://127.0.0.1:1", abandon_after=after, abandon_share=share)


def test_every_record_has_its_http_phases_and_the_first_wave_reuses_connections_opened_before_the_clock():
    with FaultServer() as srv:
        records = _run(HttpTarget(srv.base_url), 12, 4, cap=4)
    for rec in records:
        assert rec.connection_reused is not None
        assert rec.http_send_s is not None and rec.http_send_s >= 0
        assert rec.http_wait_s is not None and rec.http_wait_s >= 0
        assert rec.http_receive_s is not None and rec.http_receive_s >= 0
        assert (rec.http_connect_s is None) == rec.connection_reused
        # the phases tile the request: connect + send + wait + receive is send_time to the last byte
        total = (rec.http_connect_s or 0) + rec.http_send_s + rec.http_wait_s + rec.http_receive_s
        assert total == pytest.approx(rec.e2el, abs=1e-6)
    assert all(r.connection_reused for r in records[:4])  # opened ahead by prepare()
    phases = summarize(records).http_phases
    assert phases.requests == 12 and phases.connection_reused_share == sum(r.connection_reused for r in records) / 12
    assert phases.median_wait_ms is not None and phases.p99_receive_ms >= phases.median_receive_ms


@pytest.mark.parametrize("route", ["round-robin", "least-outstanding"])
def test_load_spread_over_replicas_names_the_one_that_served_each_request(route):
    with FaultServer() as a, FaultServer(delay=0.02) as b:  # b streams slower: it keeps its requests longer
        records = _run(HttpTarget([a.base_url, b.base_url], route=route), 24, 10, cap=4)
        served = {a.base_url: len(a.received), b.base_url: len(b.received)}
    assert {r.base_url for r in records} == set(served)
    assert {url: sum(r.base_url == url for r in records) for url in served} == served
    assert all(r.ok for r in records)
    if route == "round-robin":
        assert served[a.base_url] == served[b.base_url] == 12
    else:
        assert served[a.base_url] > served[b.base_url]  # the faster replica frees its slots sooner
    replicas = summarize(records).replicas
    assert {url: share.completed for url, share in replicas.items()} == served


def test_one_replica_records_no_url_and_a_repeated_url_is_refused():
    with FaultServer() as srv:
        records = _run(HttpTarget(srv.base_url), 2, 2)
        with pytest.raises(TargetError, match="twice"):
            HttpTarget([srv.base_url, srv.base_url + "/"])
    assert all(r.base_url is None for r in records) and summarize(records).replicas is None


def test_bench_spreads_over_replicas_abandons_and_writes_it_all_in_typed_files(tmp_path):
    out = tmp_path / "run"
    with FaultServer(delay=0.05) as a, FaultServer(delay=0.05) as b:
        result = CliRunner().invoke(
            app,
            [
                "bench",
                "--base-url",
                a.base_url,
                "--base-url",
                b.base_url,
                "--route",
                "least-outstanding",
                "--random-input-len",
                "16",
                "--random-output-len",
                "20",
                "--num-prompts",
                "6",
                "--max-concurrency",
                "2",
                "--abandon-after",
                "0.3",
                "--abandon-share",
                "0.5",
                "--result-dir",
                str(out),
            ],
        )
    assert result.exit_code == 0, result.output
    run = load_run(out)
    assert run.run_info.flags.model_extra["base_urls"] == [a.base_url, b.base_url]
    assert run.run_info.server_info.model_extra["base_urls"] == [a.base_url, b.base_url]
    summary = Summary.model_validate(run.summary)
    assert summary.abandoned == sum(r.abandoned for r in run.records) > 0 and summary.failed == 0
    assert set(summary.replicas) == {a.base_url, b.base_url}
    assert summary.http_phases.requests == summary.completed
    for said in ("Abandoned requests (not errors)", "HTTP phases", "Replicas", a.base_url):
        assert said in result.output
    assert assert_files_match_schemas(out) == {"run": 1, "record": 1, "summary": 1, "timeline": 1}


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--abandon-after", "0"], "--abandon-after"),
        (["--abandon-share", "0.5"], "needs --abandon-after"),
        (["--route", "random"], "--route"),
        (["--base-url", "http://127.0.0.1:1", "--base-url", "http://127.0.0.1:1"], "twice"),
    ],
)
def test_bad_bench_flags_are_refused_before_any_load(tmp_path, args, words):
    result = CliRunner().invoke(app, ["bench", *args, "--result-dir", str(tmp_path / "x")])
    assert result.exit_code == 2 and words in result.output, result.output
    assert not (tmp_path / "x").exists()
