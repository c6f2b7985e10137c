"""diagnose's what-ifs in parallel processes give what the serial loop gives, and come back into the caches."""

import os
import time

import pytest

from servelab.diagnose import capacity, parallel, recommend
from servelab.diagnose.scenario import synthetic
from servelab.metrics.slo import SLO
from servelab.targets.deployment import build_deployment

pytestmark = pytest.mark.skipif(parallel.cpus() < 2, reason="one CPU: parallel_map runs serially")


def test_parallel_map_runs_in_other_processes_and_keeps_the_order():
    pids = parallel.parallel_map(lambda x: (x, os.getpid()), list(range(6)))
    assert [x for x, _ in pids] == list(range(6))
    assert os.getpid() not in {pid for _, pid in pids}


def test_prefetched_outcomes_and_ceilings_equal_the_serial_ones():
    d = build_deployment("a100-80gb", "qwen2.5-7b")
    jobs = [(d, synthetic(300, 40, request_rate=rate, num_requests=30), None) for rate in (1.0, 4.0, 16.0)]
    recommend._OUTCOMES.clear()
    capacity._CEILINGS.clear()
    recommend.prefetch(jobs, ceilings=True)
    assert all(recommend._key(*job) in recommend._OUTCOMES for job in jobs)  # simulated in the workers, kept here
    assert all(capacity.ceiling_known(d, s) for _, s, _ in jobs)
    fetched = [recommend.run(*job).summary for job in jobs]
    ceilings = [capacity.saturation_rps(d, s) for _, s, _ in jobs]
    recommend._OUTCOMES.clear()
    capacity._CEILINGS.clear()
    assert [recommend.run(*job).summary for job in jobs] == fetched
    assert [capacity.saturation_rps(d, s) for _, s, _ in jobs] == ceilings


def _nap(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def test_a_queued_background_item_is_taken_back_and_skipped_by_the_workers():
    # Two workers take the two naps; the third item waits in the queue until one ends, so it is still queued when
    # claimed: the caller gets it back (False: nobody has begun it) and no worker runs it.
    batch = parallel.start(_nap, [1.5, 1.5, 0.0], [{"a"}, {"b"}, {"c"}])
    assert batch is not None
    assert parallel.claim("c") is False
    pids = batch.wait()
    assert pids[2] is None
    assert os.getpid() not in pids[:2] and None not in pids[:2]
    assert not parallel._PENDING


def test_background_prefetch_gives_the_serial_outcomes_and_leaves_no_batch():
    d = build_deployment("a100-80gb", "qwen2.5-7b")
    jobs = [(d, synthetic(300, 40, request_rate=rate, num_requests=30), None) for rate in (1.0, 4.0, 16.0)]
    recommend._OUTCOMES.clear()
    capacity._CEILINGS.clear()
    with parallel.settled():
        recommend.prefetch(jobs, ceilings=True, background=True)
        fetched = [recommend.run(*job).summary for job in jobs]  # waited for, or taken back and run here
        ceilings = [capacity.saturation_rps(d, s) for _, s, _ in jobs]
    assert not parallel._PENDING
    recommend._OUTCOMES.clear()
    capacity._CEILINGS.clear()
    assert [recommend.run(*job).summary for job in jobs] == fetched
    assert [capacity.saturation_rps(d, s) for _, s, _ in jobs] == ceilings


def test_a_described_baseline_is_kept_as_the_outcome_a_fresh_simulation_gives():
    d = build_deployment("a100-80gb", "qwen2.5-7b")
    scenario = synthetic(300, 40, request_rate=4.0, num_requests=30)
    slo = SLO.parse("ttft:200 tpot:50")
    recommend._OUTCOMES.clear()
    capacity._CEILINGS.clear()
    with parallel.settled():
        recommend.simulated_baseline(d, scenario, slo)
        kept = [recommend._OUTCOMES[recommend._key(d, scenario, s)] for s in (slo, None)]
    assert capacity.ceiling_known(d, scenario)  # simulated beside the baseline
    recommend._OUTCOMES.clear()
    assert [recommend.run(d, scenario, s) for s in (slo, None)] == kept


def test_a_failure_stops_the_background_workers():
    with pytest.raises(ValueError), parallel.settled():
        batch = parallel.start(_nap, [30.0, 30.0], [{"a"}, {"b"}])
        raise ValueError("the diagnosis failed")
    assert batch is not None and not parallel._PENDING
    assert all(not child.is_alive() for child in batch._pool._pool)
