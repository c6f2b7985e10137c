"""diagnose's what-ifs in parallel processes give what the serial loop gives, and come back into the caches."""

import os

import pytest

from servelab.diagnose import capacity, parallel, recommend
from servelab.diagnose.scenario import synthetic
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
