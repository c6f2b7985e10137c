"""The one summary function: definitions as `vllm bench serve` uses them."""

import pytest
from rich.console import Console

from servelab.metrics.records import RequestRecord
from servelab.schemas.results import SweepIndex
from servelab.metrics.slo import SLO, SLOError, tpot_seconds
from servelab.metrics.summary import summarize
from servelab.cells import MISSING as NO_DATA
from servelab.report.terminal import summary_table, sweep_table


def record(i: int, send: float, first: float, finish: float, out: int, **kw) -> RequestRecord:
    step = (finish - first) / max(out - 1, 1)
    chunks = [first + k * step for k in range(out)]
    return RequestRecord(
        index=i,
        intended_time=send,
        send_time=send,
        first_token_time=first,
        finish_time=finish,
        chunk_times=chunks,
        prompt_tokens=100,
        output_tokens=out,
        **kw,
    )


def test_throughput_and_latency_definitions():
    recs = [record(0, 0.0, 0.1, 1.1, 11), record(1, 1.0, 1.3, 2.0, 8)]
    s = summarize(recs)
    assert s.completed == 2 and s.failed == 0
    assert s.duration == pytest.approx(2.0)
    assert s.request_throughput == pytest.approx(1.0)
    assert s.output_throughput == pytest.approx(19 / 2.0)
    assert s.total_token_throughput == pytest.approx(219 / 2.0)
    assert s.mean_ttft_ms == pytest.approx(200.0)
    # TPOT excludes the first token: (1.1-0.1)/10 = 100 ms, (2.0-1.3)/7 = 100 ms
    assert s.mean_tpot_ms == pytest.approx(100.0)
    assert s.median_itl_ms == pytest.approx(100.0)
    assert s.statistic("p99_e2el_ms") == pytest.approx(1100 - 0.01 * 100, rel=1e-3)


def test_failures_counted_by_kind_and_excluded_from_latency():
    ok = record(0, 0.0, 0.1, 1.0, 5)
    bad = RequestRecord(index=1, intended_time=0, send_time=0, finish_time=0.2, status="error", error_kind="http_500")
    reset = RequestRecord(
        index=2, intended_time=0, send_time=0, finish_time=0.3, status="error", error_kind="connection_reset"
    )
    s = summarize([ok, bad, reset])
    assert s.completed == 1 and s.failed == 2
    assert s.errors_by_kind == {"http_500": 1, "connection_reset": 1}
    assert s.mean_ttft_ms == pytest.approx(100.0)


def test_warmup_excludes_early_sends():
    recs = [record(0, 0.0, 5.0, 6.0, 2), record(1, 2.0, 2.1, 3.0, 2)]
    s = summarize(recs, warmup=1.0)
    assert s.completed == 1
    assert s.mean_ttft_ms == pytest.approx(100.0)


def test_goodput_counts_requests_meeting_every_bound():
    fast = record(0, 0.0, 0.1, 1.0, 10)  # ttft 100 ms, tpot 100 ms
    slow = record(1, 0.0, 0.9, 1.8, 10)  # ttft 900 ms
    s = summarize([fast, slow], slo=SLO.parse("ttft:500 tpot:150"), duration=2.0)
    assert s.request_goodput == pytest.approx(0.5)
    s = summarize([fast, slow], slo=SLO.parse("tpot:50"), duration=2.0)
    assert s.request_goodput == 0.0


def test_slo_parse_rejects_bad_items():
    for bad in ("ttft", "latency:5", "ttft:abc", "ttft:-1"):
        with pytest.raises(SLOError):
            SLO.parse(bad)
    assert SLO.parse(["e2el:10000"]).terms().model_dump(exclude_unset=True) == {"e2el": 10000.0}


def test_tpot_undefined_for_single_token():
    assert tpot_seconds(record(0, 0, 0.1, 0.1, 1)) is None


def test_empty_input_gives_no_latency_not_zeros_or_errors():
    s = summarize([])
    assert s.completed == 0 and s.request_throughput == 0.0 and s.mean_ttft_ms is None


def failed_run() -> list[RequestRecord]:
    return [
        RequestRecord(
            index=i,
            intended_time=0.0,
            send_time=0.0,
            finish_time=0.01 * (i + 1),
            status="error",
            error_kind="connection_refused",
            error="refused",
        )
        for i in range(3)
    ]


def test_a_failed_run_has_no_latencies_not_zero_ones():
    s = summarize(failed_run(), percentiles=(50, 99))
    latency = [k for k in s.model_dump() if k.endswith("_ms")]
    assert len(latency) == 4 * 5 and all(
        s.statistic(k) is None for k in latency
    )  # mean, median, std, p50, p99 x 4 metrics
    assert s.failed == 3 and s.request_throughput == 0.0  # a rate of nothing completed is a measured zero


def test_single_token_outputs_have_a_ttft_but_no_tpot_or_itl():
    s = summarize([record(0, 0.0, 0.1, 0.1, 1), record(1, 0.0, 0.3, 0.3, 1)])
    assert s.mean_ttft_ms == pytest.approx(200.0)
    assert s.mean_tpot_ms is None and s.statistic("p99_itl_ms") is None


def rendered(table) -> str:
    console = Console(record=True, width=120)
    console.print(table)
    return console.export_text()


def test_the_terminal_shows_a_dash_for_a_metric_without_data_never_0_00():
    text = rendered(summary_table(summarize(failed_run())))
    latency_rows = [line for line in text.splitlines() if "_ms" in line]
    assert latency_rows and all(line.rstrip(" │").endswith(NO_DATA) for line in latency_rows), text
    assert "0.00" not in "".join(latency_rows)
    ok = rendered(summary_table(summarize([record(0, 0.0, 0.1, 1.1, 11)])))
    assert NO_DATA not in ok and "100.00" in ok  # measured values are still numbers
    point = {
        "max-concurrency": 4,
        "directory": "max-concurrency=4",
        **summarize(failed_run()).model_dump(exclude_unset=True),
    }
    sweep = rendered(
        sweep_table(SweepIndex.model_validate({"sweep": {"key": "max-concurrency", "values": [4]}, "points": [point]}))
    )
    assert sweep.count(NO_DATA) == 4  # TTFT mean and p99, TPOT, E2EL; req/s is a measured 0.00


def test_a_statistic_is_read_by_its_key_and_a_misspelt_key_fails_instead_of_showing_a_dash():
    summary = summarize([record(0, 0.0, 0.1, 1.1, 11)], percentiles=(50, 99))
    assert summary.statistic("p99_ttft_ms") == summary.model_extra["p99_ttft_ms"]
    assert summary.statistic("median_ttft_ms") == summary.median_ttft_ms
    assert summary.statistic("p90_ttft_ms") is None  # a percentile the run did not ask for
    for misspelt in ("ttft_p99_ms", "mean_ttft", "output_througput"):
        with pytest.raises(AttributeError, match=misspelt):
            summary.statistic(misspelt)


def test_the_terminal_shows_the_median_once_though_summary_json_keeps_p50_beside_it():
    stats = summarize([record(0, 0.0, 0.1, 1.1, 11), record(1, 0.0, 0.3, 1.3, 11)], percentiles=(50, 90, 99))
    assert stats.statistic("p50_ttft_ms") == stats.median_ttft_ms  # vLLM's keys: both stay in the file
    text = rendered(summary_table(stats))
    for metric in ("ttft", "tpot", "itl", "e2el"):
        assert text.count(f"median_{metric}_ms") == 1 and f"p50_{metric}_ms" not in text, text
        assert f"p90_{metric}_ms" in text and f"p99_{metric}_ms" in text
