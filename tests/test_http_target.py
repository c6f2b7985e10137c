"""HttpTarget against the in-process fault server: faults, both endpoints, release logic, interrupt, pre-flight."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import pytest
from support.fault_server import MODEL, FaultServer

from servelab.metrics.records import MemorySink
from servelab.targets.errors import TargetError
from servelab.targets.http import HttpTarget
from servelab.workload.spec import LoadPlan, RequestSpec
from servelab.schemas.results import RunInfo


@pytest.fixture
def server():
    with FaultServer() as srv:
        yield srv


def specs(n, max_tokens=4, **kw):
    return [RequestSpec(i, [1, 2, 3], max_tokens, **kw) for i in range(n)]


def run(server, plan, **target_kw):
    sink, samples = MemorySink(), []
    result = HttpTarget(server.base_url, **target_kw).run(plan, sink, samples.append)
    return sink.records, samples, result


def test_completions_happy_path_counts_tokens_from_usage_and_times_every_chunk(server):
    records, samples, result = run(server, LoadPlan(specs(3)), ignore_eos=True)
    assert len(records) == 3 and all(r.ok for r in records)
    for r in records:
        assert (r.prompt_tokens, r.output_tokens, len(r.chunk_times)) == (3, 4, 4)
        assert r.send_time <= r.first_token_time == r.chunk_times[0] <= r.chunk_times[-1] <= r.finish_time
    body = server.received[-1].body
    assert body["prompt"] == [1, 2, 3] and body["ignore_eos"] is True and body["model"] == MODEL
    assert body["stream_options"] == {"include_usage": True}
    assert result.server_info["model"] == MODEL and not result.interrupted
    assert len(samples) >= 2 and samples[0].t == 0.0 and "vllm:num_requests_running" in samples[0].values


def test_chat_sends_messages_and_ignores_the_role_only_chunk(server):
    # One at a time: two requests in flight at once reach the server in either order.
    plan = LoadPlan(
        [
            RequestSpec(0, [1], 3, messages=[{"role": "user", "content": "hello"}]),
            RequestSpec(1, [1], 3, prompt_text="hi"),
        ],
        max_concurrency=1,
    )
    records, _, _ = run(server, plan, endpoint="/v1/chat/completions")
    assert all(r.ok and len(r.chunk_times) == 3 for r in records)
    sent = [rec.body["messages"] for rec in server.received if rec.body.get("stream")]
    assert sent == [[{"role": "user", "content": "hello"}], [{"role": "user", "content": "hi"}]]


def test_text_prompts_are_sent_only_when_asked(server):
    run(server, LoadPlan([RequestSpec(0, [5, 6], 2, prompt_text="five six")]), send_text=True)
    run(server, LoadPlan([RequestSpec(0, [5, 6], 2, prompt_text="five six")]))
    assert [r.body["prompt"] for r in server.received if r.body.get("stream")] == ["five six", [5, 6]]


@pytest.mark.parametrize(
    ("fault", "kind", "chunks"),
    [
        ("http_500", "http_500", 0),
        ("http_503", "http_503", 0),
        ("reset", "connection_reset", 1),
        ("malformed", "malformed_sse", 1),
        ("early_close", "incomplete_stream", 4),
        ("stream_error", "stream_error", 4),
        ("stall", "timeout", 1),
    ],
)
def test_every_fault_yields_one_record_with_its_kind_and_what_arrived(server, fault, kind, chunks):
    records, _, _ = run(server, LoadPlan(specs(4), max_concurrency=2), extra_body={"fault": fault}, request_timeout=0.5)
    assert sorted(r.index for r in records) == [0, 1, 2, 3]
    for r in records:
        assert (r.status, r.error_kind, len(r.chunk_times)) == ("error", kind, chunks)
        assert r.error and r.finish_time >= r.send_time
    if kind.startswith("http_"):
        assert records[0].error == f"injected {kind[-3:]}"


def test_idle_timeout_ends_a_stalled_stream_before_the_total_limit(server):
    records, _, _ = run(server, LoadPlan(specs(1)), extra_body={"fault": "stall"}, request_timeout=60, idle_timeout=0.3)
    assert records[0].error_kind == "timeout" and "idle_timeout=0.3s" in records[0].error


def test_closed_loop_caps_concurrency_and_intends_each_send_when_a_slot_freed(server):
    records, _, result = run(server, LoadPlan(specs(12, max_tokens=5), max_concurrency=3), extra_body={"delay": 0.01})
    assert len(records) == 12 and all(r.ok for r in records)
    assert server.peak_active == 3
    finishes = {r.finish_time for r in records}
    later = sorted(records, key=lambda r: r.send_time)[3:]
    assert all(r.intended_time in finishes for r in later)
    assert (
        result.client_stats["median_schedule_lag_ms"] is not None and "client_may_be_bottleneck" in result.client_stats
    )


def test_open_loop_follows_arrival_times(server):
    plan = LoadPlan([RequestSpec(i, [i], 1, arrival_time=0.1 * i) for i in range(4)])
    records, _, _ = run(server, plan)
    for r in records:
        assert r.intended_time == pytest.approx(0.1 * r.index) and r.send_time >= r.intended_time
    assert [rec.body["prompt"][0] for rec in server.received if rec.body.get("stream")] == [0, 1, 2, 3]


def test_depends_on_waits_for_the_previous_turn_plus_think_time(server):
    plan = LoadPlan(
        [
            RequestSpec(0, [0], 3),
            RequestSpec(1, [1], 1),
            RequestSpec(2, [2], 1, depends_on=0, think_time=0.05),
        ]
    )
    records, _, _ = run(server, plan, extra_body={"delay": 0.02})
    by = {r.index: r for r in records}
    assert by[2].intended_time == pytest.approx(by[0].finish_time + 0.05)
    assert by[2].send_time >= by[0].finish_time + 0.05
    assert by[1].send_time < by[0].finish_time  # an independent request is not held back by the dependency


def test_dependency_on_a_later_request_is_a_plan_error(server):
    with pytest.raises(TargetError, match="depends on request 5"):
        run(server, LoadPlan([RequestSpec(0, [0], 1, depends_on=5)]))


def test_duration_stops_releasing(server):
    plan = LoadPlan([RequestSpec(i, [i], 1, arrival_time=0.2 * i) for i in range(50)], duration=0.5)
    records, _, _ = run(server, plan)
    assert sorted(r.index for r in records) == [0, 1, 2]


def test_duration_bounds_an_endless_closed_loop(server):
    endless = (RequestSpec(i, [i], 2) for i in itertools.count())
    records, _, _ = run(server, LoadPlan(endless, max_concurrency=2, duration=0.3), extra_body={"delay": 0.01})
    # The schedule's bound: no request is due at or after the duration. Its send stamp is taken in the request's
    # own task, which a loaded host may run a moment after the release.
    assert records and all(r.ok and r.intended_time < 0.3 for r in records)
    assert len({r.index for r in records}) == len(records)


def test_sigint_cancels_in_flight_requests_and_returns_interrupted(server):
    def interrupt_when_all_streaming():
        while len(server.received) < 3:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_all_streaming, daemon=True).start()
    before = signal.getsignal(signal.SIGINT)
    records, _, result = run(
        server, LoadPlan(specs(3) + [RequestSpec(3, [3], 1, arrival_time=60)]), extra_body={"fault": "stall"}
    )
    assert result.interrupted
    assert sorted(r.index for r in records) == [0, 1, 2]
    assert all(r.status == "cancelled" and len(r.chunk_times) == 1 for r in records)
    assert signal.getsignal(signal.SIGINT) is before


def test_api_key_goes_in_the_header_and_nowhere_else(server):
    records, _, result = run(server, LoadPlan(specs(1)), api_key="sk-secret")
    assert all(r.authorization == "Bearer sk-secret" for r in server.received)
    assert "sk-secret" not in repr(result) + records[0].to_json()


def test_failing_metrics_endpoint_never_fails_the_run(server):
    server.metrics_status = 500
    records, samples, result = run(server, LoadPlan(specs(2)))
    assert all(r.ok for r in records) and samples == []
    assert result.server_info["metrics_scrape"]["failures"] >= 2


def test_preflight_names_the_unknown_model(server):
    with pytest.raises(TargetError, match="model 'nope' is not served .*fake-model"):
        HttpTarget(server.base_url, model="nope").preflight()
    assert server.received == []


def test_preflight_names_a_missing_endpoint():
    with FaultServer(serve_chat=False) as srv:
        with pytest.raises(TargetError, match=r"/v1/chat/completions does not exist"):
            HttpTarget(srv.base_url, endpoint="/v1/chat/completions").preflight()


def test_preflight_names_an_unreachable_url():
    with FaultServer() as srv:
        url = srv.base_url
    with pytest.raises(TargetError, match=f"cannot reach {url}"):
        HttpTarget(url).preflight()


def test_unsupported_endpoint_is_rejected_up_front():
    with pytest.raises(TargetError, match="not supported"):
        HttpTarget("http://127.0.0.1:1", endpoint="/v1/embeddings")


def test_a_refused_connection_mid_run_ends_the_release_of_new_requests():
    with FaultServer() as srv:
        target = HttpTarget(srv.base_url)
        target.preflight()
    sink = MemorySink()
    result = target.run(LoadPlan(specs(50), max_concurrency=2), sink)
    assert [r.error_kind for r in sink.records] == ["connection_refused", "connection_refused"]
    assert "connection refused" in result.client_stats["server_gone"]
    assert not result.interrupted


class _StallingSink:
    """Writes on the client's event loop and blocks it: a client too busy to read its sockets."""

    def __init__(self, block_s: float) -> None:
        self.block_s = block_s
        self.records = []

    def write(self, record) -> None:
        self.records.append(record)
        time.sleep(self.block_s)


def test_a_throttled_client_warns_with_the_delay_it_added(server, tmp_path):
    """Each record blocks the loop for 0.3 s while other streams' chunks arrive: their timestamps are late by up
    to that much, far more than any material bar (10% of the inter-chunk gap), however slow the host makes the
    server."""
    from servelab.experiment.runner import run_point

    plan = LoadPlan(specs(8, max_tokens=8), max_concurrency=4)  # two waves: every stall lands among live streams
    target = HttpTarget(server.base_url, extra_body={"delay": 0.01})
    summary = run_point(target, plan, tmp_path, RunInfo.begun(), observers=[_StallingSink(0.3)]).model_dump(
        exclude_unset=True
    )
    stats = summary["client_stats"]
    assert stats["client_may_be_bottleneck"] is True
    assert stats["added_delay"]["mean_ms"] > stats["typical_gap_ms"] * 0.1
    warning = summary["warnings"][0]
    assert warning.startswith("THE CLIENT MAY BE THE BOTTLENECK: ")
    assert f"added ~{stats['added_delay']['mean_ms']:.1f} ms" in warning and "to each timestamp" in warning


def test_the_start_up_wave_is_reported_on_its_own(server):
    records, _, result = run(server, LoadPlan(specs(12, max_tokens=5), max_concurrency=4), extra_body={"delay": 0.01})
    wave = result.client_stats["startup_wave"]
    assert wave["requests"] == 4 and wave["left_within_ms"] >= 0
    assert wave["ended_at_s"] == max(r.send_time for r in records if r.intended_time == 0.0)
    assert result.client_stats["mean_steady_send_lag_ms"] is not None  # the 8 later requests


def test_connections_are_opened_and_first_wave_bodies_built_before_the_clock_starts(server, monkeypatch):
    """Connecting is not a request: the first wave must not carry N handshakes and N JSON encodings made at t0."""
    from servelab.targets import stream_client

    connected, built = [], {}
    real_connect, real_body = stream_client.StreamingClient._connect, HttpTarget.body

    async def connect(self):
        conn = await real_connect(self)
        connected.append(time.perf_counter())
        return conn

    def body(self, spec):
        built.setdefault(spec.index, time.perf_counter())
        return real_body(self, spec)

    monkeypatch.setattr(stream_client.StreamingClient, "_connect", connect)
    monkeypatch.setattr(HttpTarget, "body", body)
    records, _, result = run(server, LoadPlan(specs(12, max_tokens=3), max_concurrency=4), extra_body={"delay": 0.01})
    assert len(records) == 12 and all(r.ok for r in records)
    zero = result.client_stats["clock_zero_perf_counter"]
    assert len(connected) == 4 and max(connected) < zero  # one per slot, all before t0, none during the run
    first = sorted(built, key=built.get)[:4]
    assert sorted(first) == [0, 1, 2, 3] and all(built[i] < zero for i in first)
    assert all(built[i] > zero for i in range(4, 12))  # later bodies are built when their turn comes, not all upfront
    assert sum(1 for r in server.received if r.body.get("stream")) == 12  # the prebuilt bodies went out, once each


def test_first_wave_stops_at_the_cap_a_later_arrival_or_a_dependent_turn():
    from servelab.targets.http import first_wave

    closed = [RequestSpec(i, [1], 1) for i in range(10)]
    wave, rest = first_wave(closed, 4)
    assert [s.index for s in wave] == [0, 1, 2, 3] and [s.index for s in rest] == list(range(4, 10))
    poisson = [RequestSpec(i, [1], 1, arrival_time=0.1 * i) for i in range(3)]
    wave, rest = first_wave(poisson, 1024)
    assert [s.index for s in wave] == [0] and [s.index for s in rest] == [1, 2]
    chat = [RequestSpec(0, [1], 1), RequestSpec(1, [1], 1, depends_on=0), RequestSpec(2, [1], 1)]
    wave, rest = first_wave(iter(chat), 1024)
    assert [s.index for s in wave] == [0] and [s.index for s in rest] == [1, 2]


@pytest.mark.parametrize("offered", [True, False])
def test_a_sweep_resets_the_prefix_cache_before_each_point_where_the_server_offers_it(tmp_path, offered):
    from servelab.experiment.sweep import Sweep, run_sweep
    from servelab.metrics.results import load_run
    from servelab.workload.arrival import ArrivalConfig

    with FaultServer(serve_cache_reset=offered) as srv:
        target = HttpTarget(srv.base_url)
        index = run_sweep(
            target,
            Sweep.parse("max-concurrency=1,2"),
            ArrivalConfig(),
            lambda arrival: LoadPlan(specs(2), max_concurrency=arrival.max_concurrency),
            tmp_path,
            RunInfo.begun(),
        )
        assert len(index.points) == 2
        assert srv.cache_resets == (2 if offered else 0)
    for label in ("max-concurrency=1", "max-concurrency=2"):
        reset = load_run(tmp_path / label).run_info.model_extra["prefix_cache_reset"]
        assert reset == ("reset" if offered else "not offered")
