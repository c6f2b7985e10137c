"""Published runs: every entry complete and resolvable, none above its physical roofline ceiling."""

from __future__ import annotations

import pytest
import yaml

from servelab.perf.engine_args import parse_engine_args
from servelab.perf.hardware import get_gpu
from servelab.perf.models import get_model
from servelab.perf.published import (
    PublishedDataError,
    ThroughputFormula,
    client_warmup_requests,
    published_entries,
    roofline_ceiling,
    throughput_formula,
)

ENTRIES = published_entries()
SUMMARY_KEYS = {"request_throughput", "output_throughput"} | {
    f"{stat}_{name}_ms" for stat in ("mean", "median", "p90", "p99") for name in ("ttft", "tpot", "itl", "e2el")
}


def test_entries_have_unique_ids_sources_and_known_metrics():
    assert len({e["id"] for e in ENTRIES}) == len(ENTRIES)
    for entry in ENTRIES:
        assert entry["era"] in ("v1", "v0"), entry["id"]
        assert entry["source"]["url"].startswith("https://") and entry["source"]["location"], entry["id"]
        assert entry["vllm_version"], entry["id"]
        assert entry["measured"] and set(entry["measured"]) <= SUMMARY_KEYS, entry["id"]
        assert all(v > 0 for v in entry["measured"].values()), entry["id"]
        assert entry.get("in_summary", True) in (True, False), entry["id"]
        get_gpu(entry["gpu"]), get_model(entry["model"]), parse_engine_args(entry.get("engine_args") or "")


def test_the_v1_table_has_the_spread_the_issue_asks_for():
    v1 = [e for e in ENTRIES if e["era"] == "v1" and e.get("gpu_stated", True)]
    assert len({get_gpu(e["gpu"]).name for e in v1}) >= 3
    assert len({get_model(e["model"]).name for e in v1}) >= 3
    assert any("--tensor-parallel-size 4" in e["engine_args"] for e in v1)
    loads = {
        "burst"
        if not w.get("max_concurrency") and str(w.get("request_rate")) == "inf"
        else "closed"
        if w.get("max_concurrency")
        else "poisson"
        if w.get("burstiness", 1) == 1
        else "constant"
        for w in (e["workload"] for e in v1)
    }
    assert loads == {"burst", "poisson", "constant", "closed"}


@pytest.mark.parametrize(
    "entry",
    [e for e in ENTRIES if e["measured"].get("output_throughput") and roofline_ceiling(e)],
    ids=lambda e: e["id"],
)
def test_measurement_is_below_its_roofline_ceiling(entry):
    ceiling = roofline_ceiling(entry)
    assert entry["measured"]["output_throughput"] < ceiling.output_throughput


def test_single_stream_decode_is_memory_bound():
    entry = next(e for e in ENTRIES if e["workload"].get("max_concurrency") == 1 and roofline_ceiling(e))
    assert roofline_ceiling(entry).bound == "memory"


def _published_file(tmp_path, **fields):
    """A published-runs file of one closed-loop entry (concurrency 4) with `fields` added."""
    entry = {"id": "one-run", "workload": {"max_concurrency": 4}, **fields}
    path = tmp_path / "published.yaml"
    path.write_text(yaml.safe_dump([entry]))
    return path


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"client_warmup_requests": "2X"}, "client_warmup_requests"),
        ({"client_warmup_requests": -1}, "client_warmup_requests"),
        ({"client_warmup_requests": True}, "client_warmup_requests"),
        ({"throughput": "elapsed"}, "throughput"),
    ],
)
def test_a_bad_replay_field_is_one_error_naming_the_entry_and_field(tmp_path, fields, field):
    with pytest.raises(PublishedDataError, match=f"^one-run: {field} "):
        published_entries(_published_file(tmp_path, **fields))


def test_a_warm_up_per_concurrency_and_the_source_throughput_need_the_concurrency(tmp_path):
    for fields in ({"client_warmup_requests": "2C"}, {"throughput": "concurrency_over_sum_e2e"}):
        path = _published_file(tmp_path, **fields)
        path.write_text(path.read_text().replace("max_concurrency: 4", "request_rate: inf"))
        with pytest.raises(PublishedDataError, match=f"^one-run: {next(iter(fields))} "):
            published_entries(path)


def test_replay_fields_read_as_the_source_ran_and_scored_its_runs(tmp_path):
    [entry] = published_entries(
        _published_file(tmp_path, client_warmup_requests="2C", throughput="concurrency_over_sum_e2e")
    )
    assert client_warmup_requests(entry) == 8
    assert throughput_formula(entry) is ThroughputFormula.CONCURRENCY_OVER_SUM_E2E
    [plain] = published_entries(_published_file(tmp_path))
    assert client_warmup_requests(plain) == 0 and throughput_formula(plain) is ThroughputFormula.OVER_ELAPSED
    [counted] = published_entries(_published_file(tmp_path, client_warmup_requests=5))
    assert client_warmup_requests(counted) == 5
