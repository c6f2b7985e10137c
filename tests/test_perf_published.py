"""Published measurements: complete entries, and none above its physical roofline ceiling."""

from __future__ import annotations

import pytest

from servelab.perf.hardware import get_gpu
from servelab.perf.models import get_model
from servelab.perf.published import published_entries, roofline_ceiling

ENTRIES = published_entries()


def test_at_least_five_entries_with_sources():
    assert len(ENTRIES) >= 5
    assert len({e["id"] for e in ENTRIES}) == len(ENTRIES)
    for entry in ENTRIES:
        assert entry["source"].strip() and "http" in entry["source"], entry["id"]
        assert entry["measured"]["output_throughput"] > 0
        get_gpu(entry["gpu"]), get_model(entry["model"])


@pytest.mark.parametrize("entry", [e for e in ENTRIES if roofline_ceiling(e)], ids=lambda e: e["id"])
def test_measurement_is_below_its_roofline_ceiling(entry):
    ceiling = roofline_ceiling(entry)
    assert entry["measured"]["output_throughput"] < ceiling.output_throughput


def test_single_stream_decode_is_memory_bound():
    entry = next(e for e in ENTRIES if e["workload"].get("max_concurrency") == 1 and roofline_ceiling(e))
    assert roofline_ceiling(entry).bound == "memory"
