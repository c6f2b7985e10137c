"""Abandoned requests and the per-request HTTP phases, on the fake server (client edge cases; the real server's
side is in test_bench_features_vllm.py)."""

from __future__ import annotations

import pytest
from support.fault_server import FaultServer

from servelab.metrics.records import MemorySink
from servelab.metrics.summary import summarize
from servelab.targets.errors import TargetError
from servelab.targets.http import ABANDONED, HttpTarget
from servelab.workload.spec import LoadPlan, RequestSpec


def _run(target: HttpTarget, n: int, tokens: int, cap: int = 4):
    target.preflight()
    sink = MemorySink()
    target.run(LoadPlan([RequestSpec(i, [1, 2, 3], tokens) for i in range(n)], max_concurrency=cap), sink)
    return sorted(sink.records, key=lambda r: r.index)


def test_a_share_of_requests_abandons_mid_stream_and_is_counted_apart_from_errors():
    with FaultServer(delay=0.05) as srv:  # 40 chunks: a 2 s stream
        target = HttpTarget(srv.base_url, abandon_after=0.3, abandon_share=0.5, request_timeout=60)
        records = _run(target, 8, 40)
        peak_after = srv.active
    chosen = [i for i in range(8) if target.abandons(i)]
    assert 0 < len(chosen) < 8  # the hash spreads the share over the indices
    for rec in records:
        if rec.index in chosen:
            assert rec.status == ABANDONED and rec.abandoned and rec.error_kind is None
            assert rec.e2el > 0.29 and 0 < len(rec.chunk_times) < 40  # gave up mid-stream (timers: ms granularity)
        else:
            assert rec.ok and not rec.abandoned and len(rec.chunk_times) == 40
    assert peak_after == 0  # the server saw every abandoned stream's connection close
    summary = summarize(records)
    assert summary["abandoned"] == len(chosen) and summary["failed"] == 0
    assert summary["completed"] == 8 - len(chosen)
    assert summary["abandoned_output_chunks"] == sum(len(r.chunk_times) for r in records if r.abandoned)
    assert summary["errors_by_kind"] == {}


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
    phases = summarize(records)["http_phases"]
    assert phases["requests"] == 12 and phases["connection_reused_share"] == sum(r.connection_reused for r in records) / 12
    assert phases["median_wait_ms"] is not None and phases["p99_receive_ms"] >= phases["median_receive_ms"]
