"""Reading files of the previous schema version: the statistics renamed when every one took `vllm bench serve`'s
spelling, `{stat}_{metric}_ms` (mean_ttft_ms, median_ttft_ms, p99_ttft_ms).

Before (results schema 1, calibration profile schema 3 and earlier) diagnose, validate, calibrate and the client's
self-report spelled some of them `{metric}_{stat}_ms` (ttft_p50_ms, schedule_lag_p99_ms): one statistic three
ways. Readers pass an older document through `upgraded`, so everything past the reader sees one name.
Imports nothing from servelab, so the reader of every layer (perf's profile included) can use it.
"""

from __future__ import annotations

from typing import Any

STATISTICS_RENAMED: dict[str, str] = {
    "ttft_mean_ms": "mean_ttft_ms",
    "ttft_p50_ms": "median_ttft_ms",
    "ttft_p99_ms": "p99_ttft_ms",
    "tpot_p50_ms": "median_tpot_ms",
    "tpot_p99_ms": "p99_tpot_ms",
    "itl_p99_ms": "p99_itl_ms",
    "e2el_p50_ms": "median_e2el_ms",
    "server_ttft_mean_ms": "mean_server_ttft_ms",
    "d_ttft_p99": "d_p99_ttft",
    "d_tpot_p99": "d_p99_tpot",
    "schedule_lag_p50_ms": "median_schedule_lag_ms",
    "schedule_lag_p99_ms": "p99_schedule_lag_ms",
    "schedule_lag_max_ms": "max_schedule_lag_ms",
    "loop_lag_p50_ms": "median_loop_lag_ms",
    "loop_lag_p99_ms": "p99_loop_lag_ms",
    "loop_lag_max_ms": "max_loop_lag_ms",
    "steady_send_lag_mean_ms": "mean_steady_send_lag_ms",
    "send_lag_p50_ms": "median_send_lag_ms",
}
"""Old key -> new key, wherever the key sits in a document (these names are used for nothing else)."""

ADDED_DELAY_RENAMED = {"p50_ms": "median_ms"}
"""client_stats.added_delay's own keys (short, so renamed only inside that object)."""


def upgraded(document: Any, current: int) -> Any:
    """`document` (a file's parsed JSON) with every renamed statistic under its new name when its schema_version is
    below `current` (or absent: the files of before the models had one anyway); its schema_version stays what the
    file says, so a reader can still tell which parts an old file lacks. Anything else is returned as it is."""
    if not isinstance(document, dict):
        return document
    version = document.get("schema_version", 1)
    return _renamed(document) if isinstance(version, int) and version < current else document


def _renamed(document: Any) -> Any:
    if isinstance(document, list):
        return [_renamed(item) for item in document]
    if not isinstance(document, dict):
        return document
    out = {}
    for key, value in document.items():
        if key == "added_delay" and isinstance(value, dict):
            value = {ADDED_DELAY_RENAMED.get(k, k): v for k, v in value.items()}
        out[STATISTICS_RENAMED.get(key, key)] = _renamed(value)
    return out
