"""Does `servelab bench`'s self-report stay silent on healthy runs against the real vLLM CPU server?

The warning "THE CLIENT MAY BE THE BOTTLENECK" used to fire on every run: it
judged the send-lag p99, which is the start-up of a closed loop's first wave.
It now judges the distortion (servelab/targets/client_stats.py). Whether a
run on a shared host is "healthy" depends on what else the host runs, so
this is a benchmark, not a test: it takes /tmp/servelab-heavy.lock itself
(run it without an outer flock), starts the tiny model's vLLM CPU server,
and runs one point per concurrency exactly as `servelab bench` does
(run_point), printing what the old verdict looked at next to the new one.
The loud side (a saturated or throttled client warns, with its size) is
tests/test_http_target.py's throttled-client test and the capacity phase of
benchmarks/client_capacity.py.

    .venv/bin/python benchmarks/client_self_report.py [--concurrency 1,2,4,8] [--requests-per-slot 6]

Needs the vLLM venv and the tiny model that scripts/test builds
($SERVELAB_VLLM_PYTHON, $SERVELAB_TINY_MODEL, defaults under ~/.cache/servelab).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from servelab.experiment.runner import run_point
from servelab.metrics.host import HostWatch
from servelab.targets.http import HttpTarget
from servelab.targets.server_process import vllm_cpu_server
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount, build_plan
from servelab.schemas.results import RunInfo

from heavy_run import TINY_MODEL, VLLM_PYTHON, heavy_lock


def point(base_url: str, concurrency: int, requests: int, out: Path) -> dict:
    plan = build_plan(
        WorkloadConfig(input_len=128, output_len=32),
        ArrivalConfig(max_concurrency=concurrency),
        Amount(num_prompts=requests),
    )
    summary = run_point(HttpTarget(base_url, ignore_eos=True), plan, out, RunInfo.begun()).model_dump(
        exclude_unset=True
    )
    stats = summary["client_stats"]
    delay = stats.get("added_delay") or {}
    return {
        "concurrency": concurrency,
        "old_trigger_send_lag_p99_ms": stats["p99_schedule_lag_ms"],
        "startup_wave_left_within_ms": stats["startup_wave"]["left_within_ms"],
        "mean_steady_send_lag_ms": stats["mean_steady_send_lag_ms"],
        "cpu_share": stats["cpu_share"],
        "added_delay_mean_ms": delay.get("mean_ms"),
        "added_delay_p99_ms": delay.get("p99_ms"),
        "median_itl_ms": summary["median_itl_ms"],
        "median_ttft_ms": summary["median_ttft_ms"],
        "warned": stats["client_may_be_bottleneck"],
        "reason": stats["reason"],
    }


COLUMNS = [
    ("conc.", "concurrency", "d"),
    ("old trigger: send lag p99 ms", "old_trigger_send_lag_p99_ms", ".1f"),
    ("start-up wave left within ms", "startup_wave_left_within_ms", ".1f"),
    ("steady send lag mean ms", "mean_steady_send_lag_ms", ".2f"),
    ("client CPU", "cpu_share", ".0%"),
    ("est. added ms mean", "added_delay_mean_ms", ".2f"),
    ("est. added ms p99", "added_delay_p99_ms", ".2f"),
    ("ITL p50 ms", "median_itl_ms", ".1f"),
    ("TTFT p50 ms", "median_ttft_ms", ".1f"),
    ("warned", "warned", ""),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--requests-per-slot", type=int, default=6)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    with heavy_lock(), tempfile.TemporaryDirectory(prefix="servelab-self-report-") as tmp:
        host = HostWatch().start()
        server = vllm_cpu_server(
            VLLM_PYTHON,
            TINY_MODEL,
            log_path=Path(tmp) / "vllm.log",
            served_model_name="tiny-qwen",
            extra_args=("--max-model-len", "4096", "--max-num-seqs", "32"),
            startup_timeout=600,
        )
        with server:
            for c in (int(v) for v in args.concurrency.split(",")):
                rows.append(point(server.base_url, c, c * args.requests_per_slot, Path(tmp) / f"c{c}"))
        conditions = host.conditions()
    print(f"host during the run: {json.dumps(conditions)}")
    print("| " + " | ".join(h for h, _, _ in COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join("-" if row[k] is None else format(row[k], f) for _, k, f in COLUMNS) + " |")
    for row in rows:
        print(f"c={row['concurrency']}: {row['reason']}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
