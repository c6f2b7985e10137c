"""HttpTarget with several client processes: the same release rules, records and faults as one process."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import threading
import time

import pytest
from support.fault_server import FaultServer

from servelab.metrics.records import MemorySink
from servelab.targets.errors import TargetError
from servelab.targets.http import HttpTarget
from servelab.targets.workers import WORKER_DIED, split_cap
from servelab.workload.spec import LoadPlan, RequestSpec


@pytest.fixture
def server():
    with FaultServer() as srv:
        yield srv


def specs(n, max_tokens=4, **kw):
    return [RequestSpec(i, [1, 2, 3], max_tokens, **kw) for i in range(n)]


def run(server, plan, workers=2, **target_kw):
    sink, samples = MemorySink(), []
    result = HttpTarget(server.base_url, workers=workers, **target_kw).run(plan, sink, samples.append)
    return sink.records, samples, result


def test_cap_shares_differ_by_at_most_one_and_sum_to_the_cap():
    assert split_cap(7, 3) == [3, 2, 2]
    assert split_cap(None, 2) == [None, None]


def test_closed_loop_over_two_processes_keeps_the_global_cap_and_records_every_request(server):
    records, samples, result = run(
        server, LoadPlan(specs(12, max_tokens=5), max_concurrency=3), extra_body={"delay": 0.01}
    )
    assert sorted(r.index for r in records) == list(range(12))
    assert all(r.ok and len(r.chunk_times) == 5 and r.send_time >= r.intended_time for r in records)
    assert server.peak_active <= 3
    stats = result.client_stats
    assert stats["processes"] == 2 and stats["workers"] == 2 and stats["median_schedule_lag_ms"] is not None
    assert len(samples) >= 2 and samples[0].t == 0.0


def test_a_cap_below_the_worker_count_uses_one_process_per_slot(server):
    records, _, result = run(server, LoadPlan(specs(4), max_concurrency=1), workers=4)
    assert len(records) == 4 and server.peak_active == 1
    assert result.client_stats["processes"] == 1


def test_open_loop_send_times_follow_the_plan_across_processes(server):
    plan = LoadPlan([RequestSpec(i, [i], 1, arrival_time=0.1 * i) for i in range(6)])
    records, _, _ = run(server, plan)
    for r in records:
        assert r.intended_time == pytest.approx(0.1 * r.index) and r.send_time >= r.intended_time
    sent = [rec.body["prompt"][0] for rec in server.received if rec.body.get("stream")]
    assert sent == list(range(6))


def test_a_later_turn_runs_where_its_conversation_is_and_waits_for_it(server):
    plan = LoadPlan(
        [
            RequestSpec(0, [0], 3),
            RequestSpec(1, [1], 3),
            RequestSpec(2, [2], 1, depends_on=0, think_time=0.05),
            RequestSpec(3, [3], 1, depends_on=1, think_time=0.05),
        ]
    )
    records, _, _ = run(server, plan, extra_body={"delay": 0.02})
    by = {r.index: r for r in records}
    for turn, previous in ((2, 0), (3, 1)):
        assert by[turn].intended_time == pytest.approx(by[previous].finish_time + 0.05)
        assert by[turn].send_time >= by[previous].finish_time + 0.05


def test_dependency_on_a_later_request_is_a_plan_error(server):
    with pytest.raises(TargetError, match="depends on request 5"):
        run(server, LoadPlan([RequestSpec(0, [0], 1), RequestSpec(1, [0], 1, depends_on=5)]))


def test_duration_bounds_an_endless_closed_loop(server):
    endless = (RequestSpec(i, [i], 2) for i in itertools.count())
    records, _, _ = run(server, LoadPlan(endless, max_concurrency=4, duration=0.5), extra_body={"delay": 0.01})
    # Released within the duration; the send is stamped after the release, which a starved 2-core host can delay.
    assert records and all(r.ok and r.intended_time < 0.5 and r.send_time < 0.5 + 0.25 for r in records)
    assert len({r.index for r in records}) == len(records)


def test_faults_in_workers_become_records_with_their_kind(server):
    records, _, _ = run(server, LoadPlan(specs(4), max_concurrency=2), extra_body={"fault": "reset"})
    assert sorted(r.index for r in records) == [0, 1, 2, 3]
    assert all(r.error_kind == "connection_reset" for r in records)


def _when_streaming(server, n, action):
    def wait_then_act():
        while len(server.received) < n:
            time.sleep(0.01)
        action()

    threading.Thread(target=wait_then_act, daemon=True).start()


def test_sigint_stops_every_worker_and_keeps_what_they_measured(server):
    _when_streaming(server, 4, lambda: os.kill(os.getpid(), signal.SIGINT))
    before = signal.getsignal(signal.SIGINT)
    plan = LoadPlan(specs(4) + [RequestSpec(4, [4], 1, arrival_time=60)])
    records, _, result = run(server, plan, extra_body={"fault": "stall"})
    assert result.interrupted
    assert sorted(r.index for r in records) == [0, 1, 2, 3]
    assert all(r.status == "cancelled" and len(r.chunk_times) == 1 for r in records)
    assert signal.getsignal(signal.SIGINT) is before
    assert not multiprocessing.active_children()


def test_a_worker_that_dies_leaves_an_error_record_for_each_request_it_held(server):
    def kill_one_worker():
        os.kill(multiprocessing.active_children()[0].pid, signal.SIGKILL)

    _when_streaming(server, 4, kill_one_worker)
    records, _, result = run(server, LoadPlan(specs(4)), extra_body={"fault": "stall"}, request_timeout=2)
    assert sorted(r.index for r in records) == [0, 1, 2, 3]
    kinds = sorted(r.error_kind for r in records)
    assert kinds == [WORKER_DIED] * 2 + ["timeout"] * 2
    assert "exited with code -9" in result.client_stats["worker_faults"][0]


def test_a_freed_slot_is_refilled_by_the_worker_that_freed_it(server):
    """Two long requests land on one worker and two short ones on the other: the next request must take
    the first slot that frees anywhere, as under one global cap, not queue behind a long one."""
    lengths = [20, 2, 20, 2, 2, 2]
    plan = LoadPlan([RequestSpec(i, [i], n) for i, n in enumerate(lengths)], max_concurrency=4)
    records, _, _ = run(server, plan, extra_body={"delay": 0.01})
    by = {r.index: r for r in records}
    short_finishes = {by[1].finish_time, by[3].finish_time}
    assert by[4].intended_time in short_finishes and by[5].intended_time in short_finishes
    assert by[4].send_time < by[0].finish_time and by[5].send_time < by[2].finish_time
